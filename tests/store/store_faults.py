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
