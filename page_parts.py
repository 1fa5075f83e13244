"""Widgets that more than one front end shows: one home for each, called by Home (`app.py`)
and the pages.

Design decisions
- A front-end module beside `app.py`, like `app_server.py`: not under `trace_lib` (nothing
  there imports streamlit: an import-linter contract) and not under `pages/` (every file
  there is a page of the navigation). It imports only what a page may import (the use
  cases of `trace_lib.workbench` and the UI libraries); tests/test_layers.py checks it as
  it checks the pages, and lets pages and Home import it.
- Streamlit puts `app.py`'s folder on `sys.path` (`streamlit run`, `app_server.py`), so
  the pages import it by name.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from trace_lib.workbench import routing_demo
from trace_lib.workbench.errors import ActionError


def routing_demo_build(db: Path, key: str) -> None:
    """The "Build the routing demo" model picker and button (`key`_model, `key`_build).

    The button submits the build job (`routing_demo.build(background=True)`, what `demo
    adapters` runs) and reruns, so the caller shows the job running; a demo already
    built says where it is; a refused build (settings, store) shows its message, never
    a traceback."""
    c1, c2 = st.columns([1, 3], vertical_alignment="bottom")
    model = c1.selectbox("Base model", list(routing_demo.MODELS), key=f"{key}_model")
    if c2.button("Build the routing demo", key=f"{key}_build", type="primary"):
        try:
            report = routing_demo.build(db, model, background=True)
        except ActionError as exc:
            st.error(str(exc))
            return
        if report["state"] == "built":
            st.success(f"The routing demo is already built in {report['path']}.")
        else:
            st.rerun()
