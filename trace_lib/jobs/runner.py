"""The job entry point: `python -m trace_lib.jobs.runner SPEC.json` (or `job run SPEC.json`).

Design decisions
- Every backend starts exactly this; it reads the spec, points its own stdout/stderr at the
  run directory's log.txt (so every backend gets a log), records `running` with its pid
  and process group, keeps a heartbeat, runs the kind's function from the table in
  `kinds.py` and records how it ended: `succeeded` (+ result.json), `cancelled` (exit 143),
  or `failed` with the exception (exit 1, traceback in the log).
- SIGTERM and SIGINT only set a flag the job polls at safe points (`should_stop`), so a
  cancelled job ends at a group boundary with its checkpoints intact.
- This module imports no CLI, no store, no DuckDB, and neither does anything a job kind
  needs: the job process never opens the database (`tests/jobs/test_runner.py` runs a
  real job under `-X importtime` and checks).
- Resume is the kind's business: running the same spec.json again continues from the run
  directory's last checkpoint.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from pathlib import Path

from trace_lib.jobs.kinds import Cancelled, job_function
from trace_lib.jobs.run_dir import HEARTBEAT_S, LOG, update_status, write_result
from trace_lib.jobs.spec import JobSpec, now_iso


def _log_to_run_dir(run_dir: Path) -> None:
    log_fd = os.open(run_dir / LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)


def run_job(spec_path: str | Path) -> int:
    """Run the job of `spec_path` in this process; returns the exit code."""
    spec = JobSpec.load(spec_path)
    run_dir = spec.path
    run_dir.mkdir(parents=True, exist_ok=True)
    _log_to_run_dir(run_dir)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    update_status(run_dir, state="running", pid=os.getpid(), pgid=os.getpgid(0),
                  host=os.uname().nodename, started_at=now_iso(), heartbeat=now_iso(),
                  backend=spec.backend, kind=spec.kind)
    done = threading.Event()

    def beat() -> None:
        while not done.wait(HEARTBEAT_S):
            update_status(run_dir, heartbeat=now_iso())

    threading.Thread(target=beat, daemon=True).start()
    print(f"[job] {spec.id} ({spec.kind}) started pid={os.getpid()}", flush=True)
    try:
        result = job_function(spec.kind)(spec, run_dir, stop.is_set)
        if stop.is_set():
            raise Cancelled()
        write_result(run_dir, result)
        done.set()
        update_status(run_dir, state="succeeded", exit_code=0, finished_at=now_iso())
        print(f"[job] {spec.id} succeeded", flush=True)
        return 0
    except Cancelled:
        done.set()
        update_status(run_dir, state="cancelled", exit_code=143, finished_at=now_iso())
        print(f"[job] {spec.id} cancelled", flush=True)
        return 143
    except BaseException as exc:  # noqa: BLE001 - any failure must end as `failed`
        done.set()
        traceback.print_exc()
        update_status(run_dir, state="failed", exit_code=1, finished_at=now_iso(),
                      error=f"{type(exc).__name__}: {exc}")
        print(f"[job] {spec.id} failed", flush=True)
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] in ("-h", "--help"):
        print("usage: python -m trace_lib.jobs.runner RUN_DIR/spec.json", file=sys.stderr)
        return 2
    from trace_lib.errors import UserInputError

    try:
        return run_job(args[0])
    except UserInputError as exc:  # a bad spec file: nothing started, say why
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
