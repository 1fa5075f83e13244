"""Shared fixtures: a fresh DuckDB file per test, paths to the real benchmark data."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
ARTIFACTS = REPO_ROOT / "artifacts"

# Helper modules at the top of tests/ (envs_fixture, plugin_dist) import by name from any
# test folder (pytest runs with --import-mode=importlib, which adds nothing to sys.path).
sys.path.insert(0, str(Path(__file__).resolve().parent))

# The loud end-of-run line listing every skipped group and why; under CI=true a skipped
# group this machine can run fails the run (tests/skip_groups.py).
from skip_groups import (  # noqa: E402, F401
    pytest_collectreport,
    pytest_runtest_logreport,
    pytest_sessionfinish,
    pytest_terminal_summary,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The routing demo's folder (`workbench.routing_demo.demo_root`): an empty one for the
# suite, so a demo built on this machine does not change the Routing page other tests see.
os.environ["TRACE_ROUTING_DEMO_DIR"] = tempfile.mkdtemp(prefix="trace-routing-demo-")


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """A path for a fresh DuckDB file (created on first connect)."""
    return tmp_path / "trace.duckdb"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real tau-bench / tau2-bench files beside the repo (read, never copied)."""
    if not SHARED_DATA.exists():
        pytest.fail(f"expected the shared benchmark data at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS
