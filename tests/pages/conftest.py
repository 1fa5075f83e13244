"""Fixtures for the page tests: `env`, a store and a runs directory of the test's own; and
for the browser, the same `streamlit_server`, `browser`, `browser_page`, `wait_for_app` and
the patient `expect` as tests/e2e (one harness, loaded from its file: the test folders are
not packages)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from trace_lib import jobs

_spec = importlib.util.spec_from_file_location(
    "_e2e_harness", Path(__file__).resolve().parents[1] / "e2e" / "conftest.py")
_harness = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _harness  # dataclasses look their module up there
_spec.loader.exec_module(_harness)

streamlit_server = _harness.streamlit_server
browser = _harness.browser
browser_page = _harness.browser_page
wait_for_app = _harness.wait_for_app
_patient_expect = _harness.patient_expect  # autouse: every browser assertion waits


@pytest.fixture
def env(tmp_path, monkeypatch) -> Path:
    """The store file a page opens (`TRACE_DB`, not created yet) and the folder its jobs
    run in (`TRACE_RUNS_DIR`), both under the test's tmp_path; returns the store's path."""
    db = tmp_path / "trace.duckdb"
    monkeypatch.setenv("TRACE_DB", str(db))
    monkeypatch.setenv(jobs.RUNS_ENV, str(tmp_path / "runs"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return db
