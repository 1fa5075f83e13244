"""CLI verb that serves the Streamlit app: `app [--port N] [--address A] [-- STREAMLIT FLAGS]`.

Design decisions
- `make demo` runs this verb, so the app a user opens is started one way: on 127.0.0.1
  unless told otherwise, with the store from `--db` (or `TRACE_DB`) handed to every page
  through the environment, as the pages read it.
- The verb replaces its process (`exec`) with `app_server.py` beside `app.py`, which
  imports what the pages import before Streamlit listens (the reasons are in its
  docstring). Nothing under `trace_lib` imports streamlit, so the server is not started
  from here; `exec` keeps the process id, so whoever started the verb can stop the server.
- Flags after `--` go to `streamlit run` unchanged.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from trace_lib.errors import UserInputError

LAUNCHER = Path(__file__).resolve().parents[2] / "app_server.py"


def launcher_argv(port: int, address: str, extra: list[str]) -> list[str]:
    """The command line the verb execs: `python app_server.py <streamlit run flags>`."""
    return [sys.executable, str(LAUNCHER), "--server.address", address,
            "--server.port", str(port), *extra]


def _cmd_app(args: argparse.Namespace) -> int:
    if not LAUNCHER.exists():
        raise UserInputError(f"{LAUNCHER}: missing; the app runs from a checkout of the "
                             "workbench (app.py, app_server.py and pages/ beside trace_lib)")
    if args.db:
        os.environ["TRACE_DB"] = str(Path(args.db).resolve())
    argv = launcher_argv(args.port, args.address,
                         [a for a in args.streamlit_flags if a != "--"])
    sys.stdout.flush()
    os.execv(argv[0], argv)
    return 0  # not reached: exec replaced the process


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add the `app` verb to the CLI."""
    app = sub.add_parser(
        "app", parents=[common], help="serve the Streamlit app (127.0.0.1:8501)",
        description="Start the workbench's Streamlit app on this machine, with the libraries "
                    "its pages use loaded before it listens. Flags after `--` go to "
                    "`streamlit run` unchanged (e.g. -- --server.headless true).")
    app.add_argument("--port", type=int, default=8501)
    app.add_argument("--address", default="127.0.0.1",
                     help="interface to listen on (default: this machine only)")
    app.add_argument("streamlit_flags", nargs=argparse.REMAINDER,
                     help="-- then flags for `streamlit run`")
    app.set_defaults(func=_cmd_app)
