"""Helpers of the store-fault tests: the CLI as a person runs it, file hashes, index paths."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
INDEX_SUFFIX = ".search.sqlite"


def cli(*args: str, db: Path, timeout_s: float = 180) -> subprocess.CompletedProcess:
    """`python -m trace_lib ARGS --db DB` as a person types it (never raises)."""
    return subprocess.run(
        [sys.executable, "-m", "trace_lib", *args, "--db", str(db)], cwd=REPO_ROOT,
        capture_output=True, text=True, timeout=timeout_s,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def index_of(db: Path) -> Path:
    return db.with_name(db.name + INDEX_SUFFIX)


def table_hashes(db: Path) -> dict[str, str]:
    """Every table's rows, hashed in a stable order (`ORDER BY ALL`): two stores with the
    same hashes hold the same rows, whatever their files' bytes (DuckDB may grow a file
    or move blocks without changing a row). Read-only; never migrates."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        names = [r[0] for r in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' "
            "AND table_type = 'BASE TABLE' ORDER BY table_name").fetchall()]
        out = {}
        for name in names:
            h = hashlib.sha256()
            for row in con.execute(f'SELECT * FROM "{name}" ORDER BY ALL').fetchall():
                h.update(repr(row).encode())
                h.update(b"\n")
            out[name] = h.hexdigest()
        return out
    finally:
        con.close()


def changed_tables(before: dict[str, str], after: dict[str, str]) -> list[str]:
    return sorted(t for t in set(before) | set(after) if before.get(t) != after.get(t))


def count(db: Path, sql: str) -> int:
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()[0][0]
    finally:
        con.close()
