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
- Streamlit's file watcher sees only the project's own modules (`watch_own_modules_only`).
  After every script run it reads the location of every module in `sys.modules` and only
  then drops those under `server.folderWatchBlacklist` (site-packages, `.venv` and other
  dot folders by default). Reading a location can import: `transformers` leaves lazy
  alias modules in `sys.modules` whose `__path__` lookup imports a vision module, and
  once the Semantic clusters tab had loaded the encoder every page action logged ~100
  `ModuleNotFoundError: torchvision` tracebacks (3,708 in 20 minutes, issue 34). No
  setting orders the two steps differently, and `server.fileWatcherType = "none"` would
  also stop the hot reload of `app.py`, `pages/` and `trace_lib/`; so the launcher
  applies the same blacklist first, to where a module says it lives (its own `__dict__`,
  which never runs a module's `__getattr__`), and hands only the other modules to
  Streamlit's reader.
- The server is Streamlit's own command line (`streamlit run`) called in this process, so
  the preloaded modules are shared. This file is a front end beside `app.py`, not part of
  `trace_lib` (nothing under `trace_lib` imports streamlit: an import-linter contract); the
  CLI verb hands over to it with `exec`.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

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


def declared_locations(module: Any) -> list[str]:
    """Where `module` says it lives (`__file__`, its spec's origin, a package's search
    path), read from its own `__dict__`: never through attribute lookup, which on a lazy
    module (a module-level `__getattr__`) can import."""
    try:
        attrs = vars(module)
    except TypeError:  # an object in sys.modules that is no module: nothing to read
        return []
    spec = attrs.get("__spec__")
    found = [attrs.get("__file__"), getattr(spec, "origin", None)]
    search = attrs.get("__path__")
    if search is not None:
        try:
            found.extend(search)
        except TypeError:
            pass
    return [p for p in found if isinstance(p, str) and os.path.exists(p)]


def watch_own_modules_only() -> None:
    """Make Streamlit's watcher skip every module that lives only under the watch
    blacklist (third-party packages), before it reads anything of them (see the module
    docstring); the project's own modules are read and watched as before."""
    from streamlit import config
    from streamlit.watcher import local_sources_watcher
    from streamlit.watcher.folder_black_list import FolderBlackList

    read_paths = local_sources_watcher.get_module_paths
    blacklist: list[FolderBlackList] = []  # built on first use: the config is parsed then

    def own_module_paths(module: ModuleType) -> set[str]:
        if not blacklist:
            blacklist.append(FolderBlackList(config.get_option("server.folderWatchBlacklist")))
        where = declared_locations(module)
        if not where or all(blacklist[0].is_blacklisted(p) for p in where):
            return set()
        return read_paths(module)

    local_sources_watcher.get_module_paths = own_module_paths


def main(flags: list[str]) -> int:
    preload()
    watch_own_modules_only()
    from streamlit.web import cli as streamlit_cli

    sys.argv = ["streamlit", "run", str(APP), *flags]
    return int(streamlit_cli.main(standalone_mode=False) or 0)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
