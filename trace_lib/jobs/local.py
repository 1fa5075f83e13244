"""The local backend: the job's entry point as a detached process on this machine.

Design decisions
- The entry point starts in a new session (its own process group), detached from the
  caller's stdin/stdout, so it outlives a Streamlit restart; its output goes to log.txt.
- Cancel sends SIGTERM to the whole group (the job stops at its next safe point and
  records `cancelled`), then SIGKILL after a grace period.
- "Gone" means the pid no longer exists or is a zombie; the status reader then turns an
  active job into `failed` (orphaned). The pid is the job's own (`status.pid`), else the
  launcher's, which is the same process in a new session.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from trace_lib.jobs.backends import entrypoint, job_env
from trace_lib.jobs.run_dir import LOG, SPEC, update_status
from trace_lib.jobs.spec import REPO_ROOT, JobSpec


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (reaping our own exited child)."""
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
        log = open(spec.path / LOG, "ab")  # noqa: SIM115 - handed to the child
        try:
            proc = subprocess.Popen(
                entrypoint(spec.path / SPEC), cwd=str(REPO_ROOT), env=job_env(),
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
        return bool(pid) and not pid_alive(int(pid))

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
            if not pid or not pid_alive(int(pid)):
                return
            time.sleep(0.1)
        try:
            os.killpg(int(pgid), signal.SIGKILL)
        except ProcessLookupError:
            pass
