"""The Ray backend: the same entry point through the Ray Jobs API, for a cluster.

Design decisions
- `JobSubmissionClient.submit_job` with the job id as the submission id, so the Ray job
  and the run directory share one name and a resubmission after a lost answer is
  recognised ("already exists").
- The run directory must be on a filesystem the Ray workers share (true on one machine,
  an NFS mount on a cluster). Only the variables a job needs travel in the runtime env
  (never keys: a job reads its own from the worker's environment).
- Orphans are detected from Ray's own job state, since the pid lives on another host.
- A head that just started answers before its job agent is up, or drops the connection
  while it starts: submission retries those for `agent_wait_s` (default 90 s).
- A local head (`start_local_head`, for tests and benches on one machine) is one home
  for what starting one takes on a loaded box: `ray start --head --block` in its own
  process group, stopped by that group only (never `ray stop`, which stops every Ray on
  the machine); ready once it printed "Ray runtime started" AND its job API answers (the
  dashboard may answer before the node registered); the dashboard's startup timeout
  raised from Ray's 60 s; a start that missed Ray's fixed 30 s node registration window
  ("timed out during startup") retried, nothing else; a short temp dir, since Ray's unix
  socket paths must stay under 108 characters.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from trace_lib.errors import UserInputError
from trace_lib.jobs.backends import entrypoint, job_env
from trace_lib.jobs.run_dir import SPEC, update_status
from trace_lib.jobs.spec import RUNS_ENV, JobSpec
from trace_lib.runtime.process_group import stop_process_group

T = TypeVar("T")

RAY_ENDED = ("SUCCEEDED", "FAILED", "STOPPED")
FORWARDED_ENV = ("PYTHONPATH", "PYTHONUNBUFFERED", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                 "TOKENIZERS_PARALLELISM", RUNS_ENV, "TRACE_MODELS_DIR")


class RayBackend:
    """Ray Jobs API; `address` is the dashboard URL (e.g. http://127.0.0.1:8265)."""

    name = "ray"

    def __init__(self, address: str | None = None):
        self.address = address

    def _client(self, spec: JobSpec) -> Any:
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
        env = {k: v for k, v in job_env().items() if k in FORWARDED_ENV}
        cmd = " ".join(entrypoint(spec.path / SPEC))
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
                transient = "No available agent" in text or "onnection" in text
                if not transient or time.monotonic() > deadline:
                    raise
                time.sleep(1.0)
        update_status(spec.path, ray_submission_id=submission_id)
        return submission_id

    def ray_state(self, spec: JobSpec) -> str:
        return str(self._client(spec).get_job_status(spec.id)).rsplit(".", 1)[-1]

    def is_gone(self, spec: JobSpec, status: dict[str, Any]) -> bool:
        return self.ray_state(spec) in RAY_ENDED

    def cancel(self, spec: JobSpec, status: dict[str, Any], grace_s: float) -> None:
        client = self._client(spec)
        client.stop_job(spec.id)  # SIGTERM to the entrypoint, SIGKILL after Ray's timeout
        deadline = time.monotonic() + grace_s + 5
        while time.monotonic() < deadline:
            if str(client.get_job_status(spec.id)).rsplit(".", 1)[-1] in RAY_ENDED:
                return
            time.sleep(0.2)


def run_tasks(fn: Callable[..., T], calls: list[tuple[Any, ...]], num_cpus: float,
              should_stop: Callable[[], bool], on_result: Callable[[T], None]) -> list[T]:
    """Inside a job's entry point on the ray backend: `fn(*call)` for each call as one Ray
    task, `num_cpus` each, while this process only waits. Results are handed to
    `on_result` as they finish (completion order) and returned. A stop cancels the tasks
    still pending and raises `Cancelled`.

    `ray.init` replaces the SIGTERM handler with a `sys.exit`, so a stopped job would end
    `failed` from inside `ray.wait`: the job's own handler (which sets `should_stop`) is
    put back."""
    import signal
    import threading

    import ray

    from trace_lib.jobs.kinds import Cancelled

    if not calls:
        return []
    on_term = signal.getsignal(signal.SIGTERM)
    # Under the Ray Jobs API the entry point runs on the cluster with RAY_ADDRESS set.
    ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), ignore_reinit_error=True,
             log_to_driver=True)
    if on_term is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_term)
    task = ray.remote(num_cpus=float(num_cpus))(fn)
    pending = [task.remote(*call) for call in calls]
    results: list[T] = []
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=1.0)
            for ref in ready:
                results.append(ray.get(ref))
                on_result(results[-1])
            if pending and should_stop():
                raise Cancelled()
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
    return results


# ------------------------------------------------------------------ a local head

@dataclass
class LocalHead:
    """A running local Ray head: its process (a group leader), dashboard URL and files."""

    process: subprocess.Popen
    address: str  # the dashboard URL, what `backend_options["address"]` takes
    temp_dir: Path
    log_path: Path

    def stop(self) -> None:
        """Stop the head's process group (raylet and workers with it) and remove its
        temp dir; the log is kept."""
        stop_process_group(self.process)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def start_local_head(temp_dir: Path, log_path: Path, *, num_cpus: int = 1,
                     object_store_mb: int = 100, timeout_s: float = 600.0,
                     attempts: int = 3) -> LocalHead:
    """Start a Ray head on 127.0.0.1 with `num_cpus` worker CPUs and wait until its job
    API answers. `temp_dir` should be short (under /tmp: Ray's socket paths); the head's
    output goes to `log_path`. A start that missed Ray's node registration window is
    retried, up to `attempts` in all; any other failure raises RuntimeError with the
    log's tail. Stop it with `LocalHead.stop()`."""
    from trace_lib.runtime.server_kinds import free_port

    ray_bin = shutil.which("ray") or str(Path(sys.executable).parent / "ray")
    problem = ""
    for _ in range(max(1, attempts)):
        port, dash = free_port("127.0.0.1"), free_port("127.0.0.1")
        # On a loaded 2-core box the dashboard takes longer than Ray's default 60 s.
        env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0",
                   RAY_DASHBOARD_STARTUP_TIMEOUT_S=str(int(timeout_s)))
        cmd = [ray_bin, "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
               "--port", str(port), "--dashboard-host", "127.0.0.1",
               "--dashboard-port", str(dash), "--include-dashboard", "true",
               "--num-cpus", str(num_cpus),
               "--object-store-memory", str(object_store_mb * 1024 * 1024),
               "--temp-dir", str(temp_dir), "--disable-usage-stats"]
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        head = LocalHead(proc, f"http://127.0.0.1:{dash}", temp_dir, log_path)
        if _wait_ready(head, timeout_s):
            return head
        head.stop()
        problem = log_path.read_text(errors="replace")[-3000:]
        if "timed out during startup" not in problem:
            break
    raise RuntimeError(f"ray head did not start; its log ends:\n{problem}")


def _wait_ready(head: LocalHead, timeout_s: float) -> bool:
    """True once the head printed that its node is up and its job API answers; False if
    it exited or `timeout_s` passed first."""
    from ray.job_submission import JobSubmissionClient

    deadline = time.monotonic() + timeout_s
    while head.process.poll() is None and time.monotonic() < deadline:
        # `ray start --block` prints this once the node registered; the dashboard may
        # answer before that, and a node that misses the registration window exits.
        if "Ray runtime started" in head.log_path.read_text(errors="replace"):
            try:
                JobSubmissionClient(head.address).list_jobs()
                return True
            except Exception:  # noqa: BLE001 - not answering yet
                pass
        time.sleep(1.0)  # the head's log and job API are the only signals it gives
    return False
