"""Fixtures of the store-fault tests: one real demo store (24 trajectories, a finished
heuristic label run, its search index) built once through the CLI, and a fresh copy of it
per test, so a test may damage its copy freely."""

from __future__ import annotations

import os
import shutil
import subprocess
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


class SmallDisk:
    """A real tmpfs of a few megabytes: `fill()` writes a filler file until the device
    refuses (ENOSPC), `free()` deletes it (space is back)."""

    def __init__(self, root: Path, size_kb: int) -> None:
        self.root, self.size_kb = root, size_kb
        self.fillers: list[Path] = []

    def fill(self, leave_kb: int = 0) -> None:
        """Fill the device, then give back `leave_kb` (a little room: a write starts, and
        runs out part way)."""
        filler = self.root / f".filler-{len(self.fillers)}"
        self.fillers.append(filler)
        with filler.open("wb", buffering=0) as fh:  # unbuffered: close has nothing to flush
            for size in (1 << 20, 1 << 16, 1 << 12):
                try:
                    while True:
                        fh.write(b"\0" * size)
                except OSError:
                    pass
        if leave_kb:
            os.truncate(filler, max(filler.stat().st_size - leave_kb * 1024, 0))
        assert shutil.disk_usage(self.root).free <= leave_kb * 1024 + 4096

    def grow(self, size_kb: int) -> None:
        """Remount the same tmpfs bigger (its files stay): space is back."""
        subprocess.run(["mount", "-o", f"remount,size={size_kb}k", str(self.root)], check=True)
        self.size_kb = size_kb

    def free(self) -> None:
        for f in self.fillers:
            f.unlink(missing_ok=True)
        self.fillers.clear()


@pytest.fixture
def small_disk(tmp_path: Path):
    """A factory: `small_disk(size_kb)` mounts a tmpfs of that size (unmounted at the end).
    Skipped, with the reason, only where mounting is impossible (not root, no tmpfs)."""
    if os.geteuid() != 0:
        pytest.skip("full-disk tests mount a tmpfs: needs root (run as root or in a container)")
    mounted: list[Path] = []

    def make(size_kb: int) -> SmallDisk:
        root = tmp_path / f"disk{len(mounted)}"
        root.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs",
                               str(root)], capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"full-disk tests mount a tmpfs: mount failed: {proc.stderr.strip()}")
        mounted.append(root)
        return SmallDisk(root, size_kb)

    yield make
    for root in mounted:
        subprocess.run(["umount", "-l", str(root)], check=False)
