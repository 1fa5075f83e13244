"""bench/ingest.py's OpenTelemetry rows, run as a user runs it (a subprocess), small: the
script writes an OTLP file of N spans, imports it with `ingest_paths --format otel` in a
child process and prints wall, CPU and peak RSS. Issue 30's done-when keeps the 100k-span
peak in this script's output (and in bench/README.md); this keeps the script working."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_otel_rows_print_wall_cpu_and_peak_rss() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "ingest.py"), "--otel-spans", "1000,3000",
         "--n", ""],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = re.findall(r"== OTLP ([\d,]+) spans \(([\d,]+) traces\).*?ingest_paths --format otel "
                      r"([\d.]+) s wall ([\d.]+) s CPU  peak RSS (\d+) MiB \(([\d,]+) trajectories",
                      proc.stdout)
    assert [(r[0], r[1], r[5]) for r in rows] == [("1,000", "100", "100"),
                                                  ("3,000", "300", "300")], proc.stdout
    for _, _, wall, cpu, peak, _ in rows:
        assert float(wall) > 0 and float(cpu) > 0 and 0 < int(peak) < 2048
