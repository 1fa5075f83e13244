"""bench/pages.py run as a user runs it, small: it builds a 2,000-trajectory store, serves
it, visits the pages in Chromium and writes its medians as pages.json rows (issue 35's
done-when reads them from there). A second run on the kept store keeps the build figures
and replaces only its own rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_pages_bench_writes_one_row_per_size_page_and_step(tmp_path: Path) -> None:
    out = tmp_path / "pages.json"
    out.write_text(json.dumps({"rows": [{"size": 7, "runs": 1, "page": "Labels",
                                         "step": "visit (warm)", "kind": "visit"}]}))

    def run() -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(ROOT / "bench" / "pages.py"), "--sizes", "2000",
             "--repeats", "1", "--pages", "Trajectories,Rankings", "--timeout", "300",
             "--stores", str(tmp_path / "stores"), "--out", str(out)],
            capture_output=True, text=True, timeout=900, cwd=ROOT,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})

    proc = run()
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    mine = [r for r in rows if r["size"] == 2000]
    assert [r for r in rows if r["size"] == 7]  # another size's row stays
    kinds = {(r["page"], r["kind"]) for r in mine}
    assert {("Trajectories", "first_visit"), ("Trajectories", "visit"),
            ("Trajectories", "action"), ("Rankings", "first_visit"),
            ("Rankings", "action")} <= kinds
    # A step past the limit is a figure too ("> limit", null seconds): on a loaded box a
    # 2,000-trajectory page can take that long, so only the rows' shape is asserted,
    # and that every page was timed at least once.
    for r in mine:
        assert r["runs"] == 1 and r["server_cpu_s"] >= 0, r
        if r["over_limit"]:
            assert r["settle_s"] is None, r
        else:
            assert r["settle_s"] > 0 and r["script_s"] > 0, r
            assert r["drawn_s"] is None or r["drawn_s"] >= r["settle_s"] - 1e-3, r
        assert r["store_bytes_per_trajectory"] > 0 and r["source_bytes_per_trajectory"] > 0
        assert r["build_wall_s"] >= r["import_wall_s"] > 0
    timed = {r["page"] for r in mine if not r["over_limit"]}
    assert timed == {"Trajectories", "Rankings"}, proc.stdout[-3000:]
    first = {(r["page"], r["step"]): r for r in mine}
    # the kept store is reused: its build figures come back, the rows are replaced
    proc = run()
    assert proc.returncode == 0 and "reusing" in proc.stdout, proc.stderr[-3000:]
    again = [r for r in json.loads(out.read_text())["rows"] if r["size"] == 2000]
    assert len(again) == len(mine)
    assert {r["build_wall_s"] for r in again} == {mine[0]["build_wall_s"]}
    assert any(r["measured_at"] >= first[(r["page"], r["step"])]["measured_at"]
               for r in again)
