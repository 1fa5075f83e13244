"""The caller's side of jobs: submit, status, list, cancel, wait.

Design decisions
- Everything here works from run directories (`run_dir.py`) and the backend named in the
  spec; nothing reads the store, so a notebook without a database can drive jobs too.
  Recording jobs and their results in the store is the use-case layer's job.
- A job whose status says queued/running but whose process is gone is an orphan (killed
  by the OOM killer, a reboot, SIGKILL): reading its status turns it into `failed` with the
  tail of its log, so no page shows a dead job as running forever. A backend that cannot
  be reached (a Ray head that is down) is not evidence of a dead job.
- `submit` refuses an unknown kind or backend before anything is written, and records a
  failed submission as a `failed` job with the reason (the run directory stays to read).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from trace_lib.errors import UserInputError
from trace_lib.jobs.backends import get_backend
from trace_lib.jobs.kinds import JOB_KINDS
from trace_lib.jobs.run_dir import (
    ACTIVE,
    SPEC,
    TERMINAL,
    read_log,
    read_status,
    steps_done,
    update_status,
    write_json_atomic,
)
from trace_lib.jobs.spec import JobSpec, now_iso, runs_dir


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
    if spec.kind not in JOB_KINDS:
        raise UserInputError(f"job kind {spec.kind!r}: expected one of {sorted(JOB_KINDS)}")
    backend = get_backend(spec.backend)
    # The directory may already hold the job's inputs (a label job's exported transcripts),
    # staged by the submitter; it must not hold a job.
    spec.path.mkdir(parents=True, exist_ok=True)
    if (spec.path / SPEC).exists():
        raise UserInputError(f"job {spec.id}: {spec.path} already holds a job")
    write_json_atomic(spec.path / SPEC, spec.to_dict())
    update_status(spec.path, state="queued", backend=spec.backend, kind=spec.kind,
                  submitted_at=now_iso())
    try:
        external = backend.submit(spec)
    except Exception as exc:
        update_status(spec.path, state="failed", error=f"submit failed: {exc}",
                      finished_at=now_iso())
        raise
    update_status(spec.path, external_id=external)
    return spec


def find_spec(job_id: str) -> JobSpec:
    """The spec of job `job_id` under the current runs directory."""
    path = runs_dir() / job_id / SPEC
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
                    spec.path, state="failed", finished_at=now_iso(),
                    error="interrupted (orphaned): the job's process ended without recording "
                    "an end state "
                    "(killed, out of memory, or the machine restarted)",
                )
            state = status["state"]
    tail = read_log(spec.path, tail=log_lines) if state == "failed" else None
    return JobStatus(
        id=spec.id, kind=spec.kind, backend=spec.backend, state=state, run_dir=spec.run_dir,
        created_at=spec.created_at, pid=status.get("pid") or status.get("launcher_pid"),
        exit_code=status.get("exit_code"), started_at=status.get("started_at"),
        finished_at=status.get("finished_at"), heartbeat=status.get("heartbeat"),
        error=status.get("error"), log_tail=tail, steps_done=steps_done(spec.path),
        config=spec.config,
    )


def list_jobs() -> list[JobStatus]:
    """Every job under the runs directory, newest first."""
    root = runs_dir()
    if not root.exists():
        return []
    out = []
    for spec_path in sorted(root.glob(f"*/{SPEC}")):
        try:
            out.append(job_status(JobSpec.load(spec_path)))
        except UserInputError:
            continue  # not one of ours, or a half-written spec: not a job to list
    return sorted(out, key=lambda s: s.created_at, reverse=True)


def cancel(job_id_or_spec: str | JobSpec, grace_s: float = 10.0) -> JobStatus:
    """SIGTERM the job (it stops at its next safe point), SIGKILL after `grace_s`."""
    spec = job_id_or_spec if isinstance(job_id_or_spec, JobSpec) else find_spec(job_id_or_spec)
    status = read_status(spec.path)
    if status.get("state") in TERMINAL:
        return job_status(spec)
    get_backend(spec.backend).cancel(spec, status, grace_s)
    if read_status(spec.path).get("state") in ACTIVE:
        update_status(spec.path, state="cancelled", finished_at=now_iso(), exit_code=-9)
    return job_status(spec)


def wait(job_id_or_spec: str | JobSpec, timeout_s: float = 600.0, poll_s: float = 0.5
         ) -> JobStatus:
    """Block until the job ends (for the CLI, notebooks and tests)."""
    deadline = time.monotonic() + timeout_s
    while True:
        st = job_status(job_id_or_spec)
        if st.state in TERMINAL:
            return st
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {st.id} still {st.state} after {timeout_s:.0f}s")
        time.sleep(poll_s)
