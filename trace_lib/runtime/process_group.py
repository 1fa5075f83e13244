"""Stopping a server that forks: one rule for every process group the project starts.

Design decisions
- A server the project starts (vLLM, whose API process forks an engine core and workers; a
  Ray head, which forks its raylet and dashboard) is started with `start_new_session=True`,
  so it leads its own process group, and is stopped through the group, never the leader
  alone: a SIGTERM to the leader can leave an engine core holding the port and gigabytes.
- SIGTERM first (vLLM and Ray shut down cleanly on it), SIGKILL when the leader has not
  ended within the grace, then SIGKILL to whatever of the group is still there: children
  need not end with their leader.
- Runtime, not jobs: the vLLM server handle (`runtime.vllm_server`) and the Ray head
  (`jobs.ray`) both stop this way, and runtime sits below jobs in the layers.
"""

from __future__ import annotations

import os
import signal
import subprocess


def stop_process_group(proc: subprocess.Popen, wait_s: float = 10.0) -> None:
    """SIGTERM to the group `proc` leads (started with `start_new_session=True`), SIGKILL
    if it has not ended after `wait_s`, and SIGKILL to whatever of the group is still
    around (its children need not have ended with the leader)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
