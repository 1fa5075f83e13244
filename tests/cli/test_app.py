"""`python -m trace_lib app`: the verb `make demo` runs serves the app on 127.0.0.1 and is the
server process itself (it execs `app_server.py`), so stopping what was started stops it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def test_app_verb_serves_and_stops_with_its_process(tmp_path):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k != "TRACE_DB"}
    log = tmp_path / "app.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trace_lib", "app", "--db", str(tmp_path / "t.duckdb"),
             "--port", str(port), "--", "--server.headless", "true",
             "--server.fileWatcherType", "none", "--browser.gatherUsageStats", "false"],
            cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while not _healthy(url) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.3)  # polling a starting server
        assert _healthy(url), log.read_text()[-2000:]
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        assert cmdline[1].endswith(b"app_server.py")  # the verb became the server
        assert b"127.0.0.1" in cmdline and str(port).encode() in cmdline
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert not _healthy(url)
    assert not (tmp_path / "t.duckdb").exists()  # serving creates no store
