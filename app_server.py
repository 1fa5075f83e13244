"""Serve `app.py` with the pages' libraries loaded first: what `python -m trace_lib app` (and
so `make demo`) runs, as `python app_server.py [STREAMLIT RUN FLAGS]`.

Design decisions
- The libraries every page imports (pandas, DuckDB, plotly and the workbench use cases)
  are imported, and plotly's figure machinery initialised, *before* the server listens
  (the way a pre-forking web server preloads the application). Streamlit has no start-up
  hook: under a bare `streamlit run` the first visit of a page paid for them inside its
  script run (0.4-0.5 s of a 1.3 s first run at 100k trajectories, py-spy). Preloading in
  a background thread instead would compete with that first run for the GIL, which is
  what made the Trajectories page's first visit twice as slow when its encoder warm-up
  started on every visit.
- Not the encoder, scikit-learn or torch: only the semantic map and the training pages
  need them, and they load them in the background or on demand.
- The server is Streamlit's own command line (`streamlit run`) called in this process, so
  the preloaded modules are shared. This file is a front end beside `app.py`, not part of
  `trace_lib` (nothing under `trace_lib` imports streamlit: an import-linter contract); the
  CLI verb hands over to it with `exec`.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

APP = Path(__file__).resolve().parent / "app.py"
# scipy.stats: the Rankings page's first ranking (Fisher's exact test) imports it.
PRELOAD = ("pandas", "duckdb", "pyarrow", "plotly.express", "plotly.graph_objects",
           "scipy.stats", "trace_lib.workbench.data", "trace_lib.workbench.explore",
           "trace_lib.workbench.diagnose")


def preload() -> None:
    """Import `PRELOAD` and build one throw-away figure (plotly loads its trace and layout
    validators on first use)."""
    for name in PRELOAD:
        importlib.import_module(name)
    import pandas as pd
    import plotly.express as px

    px.bar(pd.DataFrame({"x": ["a"], "y": [1]}), x="x", y="y").to_plotly_json()


def main(flags: list[str]) -> int:
    preload()
    from streamlit.web import cli as streamlit_cli

    sys.argv = ["streamlit", "run", str(APP), *flags]
    return int(streamlit_cli.main(standalone_mode=False) or 0)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
