"""Fixtures for the diagnose tests: a small real demo store, synthetic label stores, and
the wire-format server from tests/llm."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "llm"))
sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="session")
def demo_db_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store holding 36 demo trajectories (built once per session, copied per test)."""
    from trace_lib.demo import build_demo

    root = tmp_path_factory.mktemp("demo")
    db = root / "demo.duckdb"
    build_demo(root / "files", n=36, seed=0, db=db)
    return db


@pytest.fixture
def demo_db(demo_db_template: Path, tmp_path: Path) -> Path:
    db = tmp_path / "demo.duckdb"
    shutil.copy(demo_db_template, db)
    return db
