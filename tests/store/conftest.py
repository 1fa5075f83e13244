"""Fixtures of the store-fault tests: one real demo store (24 trajectories, a finished
heuristic label run, its search index) built once through the CLI, and a fresh copy of it
per test, so a test may damage its copy freely."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from store_faults import INDEX_SUFFIX, cli, index_of, ok  # noqa: E402


@pytest.fixture(scope="session")
def pristine_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("pristine")
    db = folder / "trace.duckdb"
    ok(cli("demo", "build", "--n", "24", "--out", str(folder / "demo"), db=db))
    ok(cli("label", "--labeler", "heuristic", db=db))
    ok(cli("store", "check", db=db))  # also builds nothing: check is read-only
    assert index_of(db).exists()
    return db


@pytest.fixture
def store_copy(pristine_store: Path, tmp_path: Path) -> Path:
    """A private copy of the pristine store and its search index."""
    db = tmp_path / "trace.duckdb"
    shutil.copyfile(pristine_store, db)
    for suffix in (INDEX_SUFFIX, INDEX_SUFFIX + "-wal", INDEX_SUFFIX + "-shm"):
        src = pristine_store.with_name(pristine_store.name + suffix)
        if src.exists():
            shutil.copyfile(src, db.with_name(db.name + suffix))
    return db
