"""`app_server.py`: Streamlit's file watcher reads only the project's own modules.

After the Semantic clusters tab loaded the encoder, Streamlit's watcher looked up
`__path__` on `transformers`' lazy alias modules after every script run, which imported
them and logged a `ModuleNotFoundError: torchvision` traceback each (issue 34). The
launcher applies the watch blacklist before any lookup; these tests pin that with a lazy
module that records every attribute lookup.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def app_server(monkeypatch):
    spec = importlib.util.spec_from_file_location("app_server_under_test",
                                                  ROOT / "app_server.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from streamlit.watcher import local_sources_watcher

    # monkeypatch restores Streamlit's reader after the test
    monkeypatch.setattr(local_sources_watcher, "get_module_paths",
                        local_sources_watcher.get_module_paths)
    module.watch_own_modules_only()
    return local_sources_watcher


def _lazy_module(name: str, file: Path, looked_up: list[str]) -> types.ModuleType:
    """A module like transformers' aliases: any missing attribute imports (here: fails)."""
    module = types.ModuleType(name)
    module.__file__ = str(file)

    def __getattr__(attr: str):  # noqa: N807  (the module protocol's name)
        looked_up.append(attr)
        raise ModuleNotFoundError("No module named 'torchvision'")

    module.__getattr__ = __getattr__
    return module


def test_a_third_party_lazy_module_is_never_looked_up(app_server, tmp_path, caplog):
    pkg = tmp_path / "venv" / "lib" / "site-packages" / "lazypkg"
    pkg.mkdir(parents=True)
    (pkg / "vision.py").write_text("")
    looked_up: list[str] = []
    lazy = _lazy_module("lazypkg.vision", pkg / "vision.py", looked_up)
    assert app_server.get_module_paths(lazy) == set()
    assert looked_up == []  # no __path__ lookup, so no import and no traceback
    assert "raised" not in caplog.text


def test_the_projects_own_modules_are_still_watched(app_server):
    import trace_lib.workbench.data as own

    assert app_server.get_module_paths(own) == {str(Path(own.__file__).resolve())}
    # a package: its __init__ file
    import trace_lib

    assert str(Path(trace_lib.__file__).resolve()) in app_server.get_module_paths(trace_lib)


def test_modules_without_a_location_are_skipped(app_server):
    assert app_server.get_module_paths(sys) == set()  # built in: nothing to watch
    assert app_server.get_module_paths(object()) == set()  # not a module at all


def test_the_watcher_update_logs_nothing_with_lazy_modules_loaded(app_server, tmp_path,
                                                                  monkeypatch, caplog):
    """The whole walk, as Streamlit runs it after a script run, over sys.modules holding
    a lazy third-party module: no warning, no import."""
    pkg = tmp_path / "site-packages" / "lazypkg"
    pkg.mkdir(parents=True)
    (pkg / "vision.py").write_text("")
    looked_up: list[str] = []
    monkeypatch.setitem(sys.modules, "lazypkg.vision",
                        _lazy_module("lazypkg.vision", pkg / "vision.py", looked_up))
    watcher = app_server.LocalSourcesWatcher.__new__(app_server.LocalSourcesWatcher)
    watcher._is_closed = False
    watcher._cached_sys_modules = set()
    registered: list[str] = []
    watcher._exclude_blacklisted_paths = lambda paths: paths
    watcher._register_necessary_watchers = lambda module_paths: registered.extend(
        p for paths in module_paths.values() for p in paths)
    watcher.update_watched_modules()
    assert looked_up == [] and "raised" not in caplog.text
    assert any(p.startswith(str(ROOT / "trace_lib")) for p in registered)
