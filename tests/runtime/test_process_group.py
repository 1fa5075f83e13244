"""`stop_process_group` on real process groups: a leader that forked a child which
ignores SIGTERM (what a vLLM engine core or a Ray raylet can be), and a leader that ignores
it too. Neither may outlive the stop."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from trace_lib.runtime.process_group import stop_process_group

# The leader forks a child that ignores SIGTERM, writes the child's pid, then waits.
LEADER = """
import os, signal, sys, time
ignore = sys.argv[2] == "1"
pid = os.fork()
if pid == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(0.05)
if ignore:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(pid))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
while True:
    time.sleep(0.05)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purpose: its parent has not reaped it yet
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


def _start(tmp_path: Path, leader_ignores_term: bool) -> tuple[subprocess.Popen, int]:
    child_file = tmp_path / f"child-{int(leader_ignores_term)}"
    proc = subprocess.Popen([sys.executable, "-c", LEADER, str(child_file),
                             "1" if leader_ignores_term else "0"], start_new_session=True)
    deadline = time.monotonic() + 30
    while not child_file.exists():  # the leader writes it after the fork
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    return proc, int(child_file.read_text())


def test_a_child_that_ignores_sigterm_is_killed_with_its_group(tmp_path: Path) -> None:
    proc, child = _start(tmp_path, leader_ignores_term=False)
    assert _alive(child)
    stop_process_group(proc, wait_s=5)
    assert proc.poll() is not None  # the leader ended on SIGTERM
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_a_leader_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    proc, child = _start(tmp_path, leader_ignores_term=True)
    started = time.monotonic()
    stop_process_group(proc, wait_s=1)
    assert proc.returncode == -9 and time.monotonic() - started >= 1
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_a_group_that_already_ended_is_left_alone(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    proc.wait()
    stop_process_group(proc)  # no error: nothing left to signal
    assert proc.returncode == 0
