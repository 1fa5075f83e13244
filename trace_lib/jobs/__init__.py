"""Background jobs: one entrypoint, a run directory per job, pluggable backends (local, Ray).

Design decisions
- One entrypoint for every backend: `python -m trace_lib job run SPEC.json`. A backend only
  decides where that command runs; the job itself writes everything into its run directory
  (`$TRACE_RUNS_DIR/<job_id>/`, default `data/runs/`): spec.json, status.json, log.txt,
  metrics.jsonl, samples.jsonl, checkpoints/, adapter/, result.json. So the app reads any job the same way,
  whichever backend ran it, and a job never opens the DuckDB file (this module does not
  import `trace_lib.store`; the app records results when it sees a job end).
- status.json is replaced atomically (write a temp file, `os.replace`), so a reader never
  sees half a document. States: queued -> running -> succeeded | failed | cancelled.
- `local` starts the entrypoint in a new session (its own process group), detached from
  the caller's stdin/stdout, so it outlives a Streamlit restart; cancel sends SIGTERM to
  the whole group (the job stops at the next group boundary and records `cancelled`),
  then SIGKILL after a grace period.
- A job whose status says queued/running but whose process is gone is an orphan (killed
  by the OOM killer, a reboot, SIGKILL): reading its status turns it into `failed` with
  the tail of its log, so the page never shows a dead job as running forever.
- `ray` submits the same entrypoint through the Ray Jobs API (`JobSubmissionClient`) with
  the job id as the submission id; the run directory must be on a filesystem the Ray
  workers share (true on one machine, an NFS mount on a cluster). Ray's own job state is
  used to detect orphans there, since the pid lives on another host.
- Backends are a Protocol with a registry, like every extension point; job kinds are a
  registry of functions `(spec, run_dir, should_stop) -> result dict`.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from trace_lib.errors import UserInputError

REPO_ROOT = Path(__file__).resolve().parents[2]
RUNS_ENV = "TRACE_RUNS_DIR"
ACTIVE = ("queued", "running")
TERMINAL = ("succeeded", "failed", "cancelled")
HEARTBEAT_S = 5.0


def runs_dir() -> Path:
    env = os.environ.get(RUNS_ENV)
    return Path(env).expanduser() if env else REPO_ROOT / "data" / "runs"


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def new_job_id(kind: str) -> str:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    return f"{kind}-{stamp}-{uuid.uuid4().hex[:6]}"


@dataclass
class JobSpec:
    kind: str
    config: dict[str, Any]
    backend: str = "local"
    id: str = ""
    run_dir: str = ""
    backend_options: dict[str, Any] = field(default_factory=dict)
    created_at: str = ""

    def __post_init__(self) -> None:
        self.id = self.id or new_job_id(self.kind)
        self.run_dir = self.run_dir or str(runs_dir() / self.id)
        self.created_at = self.created_at or _now()

    @property
    def path(self) -> Path:
        return Path(self.run_dir)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, where: str) -> JobSpec:
        if not isinstance(data, dict):
            raise UserInputError(f"{where}: expected a JSON object with `kind` and `config`")
        if data.get("kind") not in JOB_KINDS:
            raise UserInputError(
                f"{where}: field `kind` is {data.get('kind')!r}; expected one of "
                f"{sorted(JOB_KINDS)}"
            )
        if not isinstance(data.get("config"), dict):
            raise UserInputError(f"{where}: field `config` must be an object")
        if data.get("backend", "local") not in BACKENDS:
            raise UserInputError(
                f"{where}: field `backend` is {data.get('backend')!r}; expected one of "
                f"{sorted(BACKENDS)}"
            )
        known = {f for f in cls.__dataclass_fields__}
        extra = sorted(set(data) - known)
        if extra:
            raise UserInputError(f"{where}: unknown fields {extra}; expected {sorted(known)}")
        return cls(**data)

    @classmethod
    def load(cls, path: str | Path) -> JobSpec:
        p = Path(path)
        try:
            data = json.loads(p.read_text())
        except FileNotFoundError as exc:
            raise UserInputError(f"{p}: no job spec file here") from exc
        except json.JSONDecodeError as exc:
            raise UserInputError(f"{p}: not valid JSON ({exc})") from exc
        return cls.from_dict(data, str(p))


# ------------------------------------------------------------------ run directory files


def _write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str))
    os.replace(tmp, path)


def read_status(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / "status.json"
    for _ in range(3):  # atomic replace means a retry only covers a missing file race
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            return {}
        except json.JSONDecodeError:
            time.sleep(0.05)
    return {}


_status_lock = threading.Lock()


def update_status(run_dir: str | Path, **fields: Any) -> dict[str, Any]:
    with _status_lock:
        status = read_status(run_dir)
        status.update(fields)
        _write_json_atomic(Path(run_dir) / "status.json", status)
        return status


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every complete line of metrics.jsonl (a line being written is skipped)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def read_samples(run_dir: str | Path, last: int = 1) -> list[dict[str, Any]]:
    """The last `last` sample transcripts the trainer wrote (one per group per step)."""
    path = Path(run_dir) / "samples.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines()[-last:]:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def read_log(run_dir: str | Path, tail: int | None = None) -> str:
    path = Path(run_dir) / "log.txt"
    if not path.exists():
        return ""
    text = path.read_text(errors="replace")
    if tail is not None:
        text = "\n".join(text.splitlines()[-tail:])
    return text


def read_result(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / "result.json"
    return json.loads(path.read_text()) if path.exists() else {}


# ------------------------------------------------------------------------- job kinds

JobFn = Callable[[JobSpec, Path, Callable[[], bool]], dict[str, Any]]


def _train_adapter(spec: JobSpec, run_dir: Path, should_stop: Callable[[], bool]) -> dict:
    from trace_lib.train.config import TrainConfig
    from trace_lib.train.trainer import train

    cfg = TrainConfig.from_dict(spec.config, where=f"{run_dir / 'spec.json'}: config")
    return train(cfg, run_dir, should_stop=should_stop, resume=True).to_dict()


JOB_KINDS: dict[str, JobFn] = {"train_adapter": _train_adapter}


def register_job_kind(name: str, fn: JobFn) -> None:
    JOB_KINDS[name] = fn


class Cancelled(Exception):
    """Raised inside a job when a stop was requested; the job ends as `cancelled`."""


def run_job(spec_path: str | Path) -> int:
    """The body of `python -m trace_lib job run SPEC.json`; returns the exit code."""
    spec = JobSpec.load(spec_path)
    run_dir = spec.path
    run_dir.mkdir(parents=True, exist_ok=True)
    # Every backend gets log.txt: point this process's stdout/stderr at it (append).
    log_fd = os.open(run_dir / "log.txt", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    update_status(run_dir, state="running", pid=os.getpid(), pgid=os.getpgid(0),
                  host=os.uname().nodename, started_at=_now(), heartbeat=_now(),
                  backend=spec.backend, kind=spec.kind)
    done = threading.Event()

    def beat() -> None:
        while not done.wait(HEARTBEAT_S):
            update_status(run_dir, heartbeat=_now())

    threading.Thread(target=beat, daemon=True).start()
    print(f"[job] {spec.id} ({spec.kind}) started pid={os.getpid()}", flush=True)
    try:
        result = JOB_KINDS[spec.kind](spec, run_dir, stop.is_set)
        if stop.is_set():
            raise Cancelled()
        _write_json_atomic(run_dir / "result.json", result)
        done.set()
        update_status(run_dir, state="succeeded", exit_code=0, finished_at=_now())
        print(f"[job] {spec.id} succeeded", flush=True)
        return 0
    except Cancelled:
        done.set()
        update_status(run_dir, state="cancelled", exit_code=143, finished_at=_now())
        print(f"[job] {spec.id} cancelled", flush=True)
        return 143
    except BaseException as exc:  # noqa: BLE001 - any failure must end as `failed`
        done.set()
        traceback.print_exc()
        update_status(run_dir, state="failed", exit_code=1, finished_at=_now(),
                      error=f"{type(exc).__name__}: {exc}")
        print(f"[job] {spec.id} failed", flush=True)
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


# --------------------------------------------------------------------------- backends


class Backend(Protocol):
    name: str

    def submit(self, spec: JobSpec) -> str:
        """Start `job run` for `spec` (already written to its run directory)."""
        ...

    def is_gone(self, spec: JobSpec, status: dict[str, Any]) -> bool:
        """True when the job's process no longer exists although its status is active."""
        ...

    def cancel(self, spec: JobSpec, status: dict[str, Any], grace_s: float) -> None: ...


def _entrypoint(spec_path: Path) -> list[str]:
    return [sys.executable, "-m", "trace_lib", "job", "run", str(spec_path)]


def _job_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def _pid_alive(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)  # reap it if it is our own exited child
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie still answers kill(0)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (OSError, IndexError):
        return True


class LocalBackend:
    name = "local"

    def submit(self, spec: JobSpec) -> str:
        log = open(spec.path / "log.txt", "ab")  # noqa: SIM115 - handed to the child
        try:
            proc = subprocess.Popen(
                _entrypoint(spec.path / "spec.json"), cwd=str(REPO_ROOT), env=_job_env(),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, close_fds=True,
            )
        finally:
            log.close()
        # In a new session the child's pid is its process group id.
        update_status(spec.path, launcher_pid=proc.pid, pgid=proc.pid)
        return str(proc.pid)

    def is_gone(self, spec: JobSpec, status: dict[str, Any]) -> bool:
        pid = status.get("pid") or status.get("launcher_pid")
        return bool(pid) and not _pid_alive(int(pid))

    def cancel(self, spec: JobSpec, status: dict[str, Any], grace_s: float) -> None:
        pgid = status.get("pgid")
        pid = status.get("pid") or status.get("launcher_pid")
        if not pgid:
            return
        try:
            os.killpg(int(pgid), signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not pid or not _pid_alive(int(pid)):
                return
            time.sleep(0.1)
        try:
            os.killpg(int(pgid), signal.SIGKILL)
        except ProcessLookupError:
            pass


class RayBackend:
    """Ray Jobs API; `address` is the dashboard URL (e.g. http://127.0.0.1:8265)."""

    name = "ray"

    def __init__(self, address: str | None = None):
        self.address = address

    def _client(self, spec: JobSpec):
        from ray.job_submission import JobSubmissionClient

        address = spec.backend_options.get("address") or self.address or os.environ.get(
            "RAY_ADDRESS"
        )
        if not address:
            raise UserInputError(
                "backend ray: no Ray address; pass backend_options.address or set RAY_ADDRESS "
                "to the dashboard URL (e.g. http://127.0.0.1:8265)"
            )
        return JobSubmissionClient(address)

    def submit(self, spec: JobSpec) -> str:
        env = {k: v for k, v in _job_env().items()
               if k in ("PYTHONPATH", "PYTHONUNBUFFERED", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                        "TOKENIZERS_PARALLELISM", RUNS_ENV, "TRACE_MODELS_DIR")}
        cmd = " ".join(_entrypoint(spec.path / "spec.json"))
        client = self._client(spec)
        deadline = time.monotonic() + float(spec.backend_options.get("agent_wait_s", 90))
        while True:
            try:
                submission_id = client.submit_job(
                    entrypoint=cmd, submission_id=spec.id, runtime_env={"env_vars": env},
                    entrypoint_num_cpus=float(spec.backend_options.get("num_cpus", 1)),
                )
                break
            except Exception as exc:  # noqa: BLE001 - transient ones are retried below
                text = str(exc)
                if "already exists" in text:  # an earlier attempt got through after all
                    submission_id = spec.id
                    break
                # A head that just started answers before its job agent is up, or drops
                # the connection while it starts: wait for it, up to the deadline.
                transient = "No available agent" in text or "onnection" in text
                if not transient or time.monotonic() > deadline:
                    raise
                time.sleep(1.0)
        update_status(spec.path, ray_submission_id=submission_id)
        return submission_id

    def ray_state(self, spec: JobSpec) -> str:
        return str(self._client(spec).get_job_status(spec.id)).rsplit(".", 1)[-1]

    def is_gone(self, spec: JobSpec, status: dict[str, Any]) -> bool:
        return self.ray_state(spec) in ("SUCCEEDED", "FAILED", "STOPPED")

    def cancel(self, spec: JobSpec, status: dict[str, Any], grace_s: float) -> None:
        client = self._client(spec)
        client.stop_job(spec.id)  # SIGTERM to the entrypoint, SIGKILL after Ray's timeout
        deadline = time.monotonic() + grace_s + 5
        while time.monotonic() < deadline:
            if str(client.get_job_status(spec.id)).rsplit(".", 1)[-1] in (
                "SUCCEEDED", "FAILED", "STOPPED"
            ):
                return
            time.sleep(0.2)


BACKENDS: dict[str, Callable[[], Backend]] = {"local": LocalBackend, "ray": RayBackend}


def register_backend(name: str, factory: Callable[[], Backend]) -> None:
    BACKENDS[name] = factory


def get_backend(name: str) -> Backend:
    if name not in BACKENDS:
        raise UserInputError(f"backend {name!r}: expected one of {sorted(BACKENDS)}")
    return BACKENDS[name]()


# ------------------------------------------------------------------------ public API


@dataclass
class JobStatus:
    id: str
    kind: str
    backend: str
    state: str
    run_dir: str
    created_at: str
    pid: int | None = None
    exit_code: int | None = None
    started_at: str | None = None
    finished_at: str | None = None
    heartbeat: str | None = None
    error: str | None = None
    log_tail: str | None = None
    steps_done: int = 0
    config: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def submit(spec: JobSpec) -> JobSpec:
    """Write the spec into a fresh run directory and start it on its backend."""
    backend = get_backend(spec.backend)
    if spec.kind not in JOB_KINDS:
        raise UserInputError(f"job kind {spec.kind!r}: expected one of {sorted(JOB_KINDS)}")
    spec.path.mkdir(parents=True, exist_ok=False)
    _write_json_atomic(spec.path / "spec.json", spec.to_dict())
    update_status(spec.path, state="queued", backend=spec.backend, kind=spec.kind,
                  submitted_at=_now())
    try:
        external = backend.submit(spec)
    except Exception as exc:
        update_status(spec.path, state="failed", error=f"submit failed: {exc}",
                      finished_at=_now())
        raise
    update_status(spec.path, external_id=external)
    return spec


def find_spec(job_id: str) -> JobSpec:
    path = runs_dir() / job_id / "spec.json"
    if not path.exists():
        raise UserInputError(f"job {job_id!r}: no run directory at {path.parent}")
    return JobSpec.load(path)


def job_status(job_id_or_spec: str | JobSpec, *, log_lines: int = 30) -> JobStatus:
    """The job's state from its run directory; an orphan becomes `failed` here."""
    spec = job_id_or_spec if isinstance(job_id_or_spec, JobSpec) else find_spec(job_id_or_spec)
    status = read_status(spec.path)
    state = status.get("state", "queued")
    if state in ACTIVE:
        try:
            gone = get_backend(spec.backend).is_gone(spec, status)
        except Exception:  # noqa: BLE001 - an unreachable Ray head is not a dead job
            gone = False
        if gone:
            status = read_status(spec.path)  # it may have just written its end state
            if status.get("state") in ACTIVE:
                status = update_status(
                    spec.path, state="failed", finished_at=_now(),
                    error="orphaned: the job's process ended without recording an end state "
                    "(killed, out of memory, or the machine restarted)",
                )
            state = status["state"]
    tail = read_log(spec.path, tail=log_lines) if state == "failed" else None
    metrics = read_metrics(spec.path)
    return JobStatus(
        id=spec.id, kind=spec.kind, backend=spec.backend, state=state, run_dir=spec.run_dir,
        created_at=spec.created_at, pid=status.get("pid") or status.get("launcher_pid"),
        exit_code=status.get("exit_code"), started_at=status.get("started_at"),
        finished_at=status.get("finished_at"), heartbeat=status.get("heartbeat"),
        error=status.get("error"), log_tail=tail,
        steps_done=int(metrics[-1]["step"]) if metrics else 0, config=spec.config,
    )


def list_jobs() -> list[JobStatus]:
    root = runs_dir()
    if not root.exists():
        return []
    out = []
    for spec_path in sorted(root.glob("*/spec.json")):
        try:
            out.append(job_status(JobSpec.load(spec_path)))
        except UserInputError:
            continue  # not one of ours, or a half-written spec: not a job to list
    return sorted(out, key=lambda s: s.created_at, reverse=True)


def cancel(job_id: str, grace_s: float = 10.0) -> JobStatus:
    """SIGTERM the job (it stops at the next group boundary), SIGKILL after `grace_s`."""
    spec = find_spec(job_id)
    status = read_status(spec.path)
    if status.get("state") in TERMINAL:
        return job_status(spec)
    get_backend(spec.backend).cancel(spec, status, grace_s)
    if read_status(spec.path).get("state") in ACTIVE:
        update_status(spec.path, state="cancelled", finished_at=_now(), exit_code=-9)
    return job_status(spec)


def wait(job_id: str, timeout_s: float = 600.0, poll_s: float = 0.5) -> JobStatus:
    """Block until the job ends (for the CLI, notebooks and tests)."""
    deadline = time.monotonic() + timeout_s
    while True:
        st = job_status(job_id)
        if st.state in TERMINAL:
            return st
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} still {st.state} after {timeout_s:.0f}s")
        time.sleep(poll_s)
