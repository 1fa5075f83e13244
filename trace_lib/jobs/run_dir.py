"""The run-directory contract: the only channel between a job and everything else.

A job's directory (`$TRACE_RUNS_DIR/<job id>/`) holds:

    spec.json        the JobSpec (written once, by `submit`)
    status.json      state queued -> running -> succeeded | failed | cancelled, pid, pgid,
                     host, backend, kind, exit_code, error, submitted/started/finished_at,
                     heartbeat (every HEARTBEAT_S while running)
    log.txt          the job process's stdout and stderr, appended
    metrics.jsonl    one JSON object per step (`step` at least), appended by the job
    samples.jsonl    sample transcripts (one per group per step), appended by the job
    checkpoints/     step_N/ folders the job writes and resumes from
    result.json      the job function's return value, written once it succeeded
    (and whatever the kind adds: adapter/, eval.json, moe/ ...)

Design decisions
- status.json and result.json are replaced atomically (a temp file, then `os.replace`), so
  a reader never sees half a document; status updates in one process are serialised by a
  lock (the heartbeat thread and the job share it).
- Readers of the append-only files (metrics, samples) skip a line that does not parse:
  it is the one being written.
- The app, the CLI and notebooks read a job only through these files, whichever backend
  ran it; nothing here imports the store (the database has one writer, and a job is
  never it).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

ACTIVE = ("queued", "running")
TERMINAL = ("succeeded", "failed", "cancelled")
HEARTBEAT_S = 5.0

SPEC = "spec.json"
STATUS = "status.json"
LOG = "log.txt"
METRICS = "metrics.jsonl"
SAMPLES = "samples.jsonl"
RESULT = "result.json"
CHECKPOINTS = "checkpoints"


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str))
    os.replace(tmp, path)


def read_status(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / STATUS
    for _ in range(3):  # atomic replace means a retry only covers a missing file race
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            return {}
        except json.JSONDecodeError:
            time.sleep(0.05)
    return {}


_status_lock = threading.Lock()


def update_status(run_dir: str | Path, **fields: Any) -> dict[str, Any]:
    """Merge `fields` into status.json (atomically) and return the new status."""
    with _status_lock:
        status = read_status(run_dir)
        status.update(fields)
        write_json_atomic(Path(run_dir) / STATUS, status)
        return status


def _read_jsonl(path: Path, last: int | None = None) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    rows = []
    for line in lines[-last:] if last else lines:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every complete line of metrics.jsonl (a line being written is skipped)."""
    return _read_jsonl(Path(run_dir) / METRICS)


def read_samples(run_dir: str | Path, last: int = 1) -> list[dict[str, Any]]:
    """The last `last` sample transcripts the job wrote (one per group per step)."""
    return _read_jsonl(Path(run_dir) / SAMPLES, last=last)


def read_log(run_dir: str | Path, tail: int | None = None) -> str:
    path = Path(run_dir) / LOG
    if not path.exists():
        return ""
    text = path.read_text(errors="replace")
    if tail is not None:
        text = "\n".join(text.splitlines()[-tail:])
    return text


def read_result(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / RESULT
    return json.loads(path.read_text()) if path.exists() else {}


def write_result(run_dir: str | Path, result: dict[str, Any]) -> None:
    write_json_atomic(Path(run_dir) / RESULT, result)


def steps_done(run_dir: str | Path) -> int:
    """The last `step` in metrics.jsonl (0 before the first)."""
    rows = read_metrics(run_dir)
    return int(rows[-1].get("step", 0)) if rows else 0
