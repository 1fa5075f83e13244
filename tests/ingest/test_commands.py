"""`python -m trace_lib ingest` / `stats` through a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from trace_lib.store import REPO_ROOT

TAU = "tau-bench/historical_trajectories/gpt-4o-airline.json"
KEYS = [
    "trajectories",
    "successes",
    "failures",
    "unknown",
    "errors",
    "duplicates",
    "skipped",
    "datasets",
    "formats",
    "notes",
    "warnings",
]


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("TRACE_DB", None)
    return subprocess.run(
        [sys.executable, "-m", "trace_lib", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_ingest_json_then_duplicates_then_stats(db_path: Path, shared_data: Path) -> None:
    first = cli("ingest", str(shared_data / TAU), "--json", "--db", str(db_path))
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)  # exactly one JSON object on stdout
    assert list(report) == KEYS
    assert (report["trajectories"], report["successes"], report["failures"]) == (200, 84, 116)
    assert report["formats"] == {str(shared_data / TAU): "tau_bench"}
    again = json.loads(cli("ingest", str(shared_data / TAU), "--json", "--db", str(db_path)).stdout)
    assert (again["trajectories"], again["duplicates"]) == (0, 200)
    stats = cli("stats", "--json", "--db", str(db_path))
    assert stats.returncode == 0, stats.stderr
    s = json.loads(stats.stdout)
    assert (s["trajectories"], s["successes"], s["failures"], s["unknown"]) == (200, 84, 116, 0)


def test_human_summary_says_which_format(db_path: Path, shared_data: Path) -> None:
    out = cli("ingest", str(shared_data / TAU), "--db", str(db_path))
    assert out.returncode == 0, out.stderr
    assert "format tau_bench" in out.stderr
    assert out.stdout.startswith(
        "imported 200 trajectories (84 successes, 116 failures, 0 unknown, 0 errors)"
    )


def test_bad_input_exits_non_zero_with_the_reason(tmp_path: Path, db_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "messages": []}\n')
    out = cli("ingest", str(bad), "--json", "--db", str(db_path))
    assert out.returncode == 1 and out.stdout == ""
    assert "bad.jsonl: record 0 (line 1): field 'messages': empty" in out.stderr
    assert "Traceback" not in out.stderr
    skipped = cli("ingest", str(bad), "--json", "--skip-invalid", "--db", str(db_path))
    assert skipped.returncode == 0, skipped.stderr
    report = json.loads(skipped.stdout)
    assert report["trajectories"] == 0 and report["skipped"][0]["record"] == 0
    # every record skipped: no dataset registered for nothing
    assert report["datasets"][0]["id"] is None
    stats = json.loads(cli("stats", "--json", "--db", str(db_path)).stdout)
    assert stats["datasets"] == []


def test_cli_format_choices_are_the_registered_importers() -> None:
    from trace_lib.cli.ingest import FORMATS
    from trace_lib.ingest import format_names

    assert sorted(FORMATS) == sorted(["auto", *format_names()])
