"""Synthetic stores with hand-checkable label counts (real DuckDB files)."""

from __future__ import annotations

from pathlib import Path

from trace_lib import store
from trace_lib.diagnose.capability_curation import ensure_builtin


def make_store(db: Path, outcomes: dict[str, bool | None],
               labels: dict[str, dict[str, list[str]]]) -> None:
    """outcomes: trajectory -> success; labels: run -> capability -> values in trajectory order."""
    tids = list(outcomes)
    with store.connect(db) as con:
        ensure_builtin(con)
        con.execute("INSERT INTO datasets (id, name, format, content_sha256) "
                    "VALUES ('d1', 'syn', 'test', 'x')")
        for i, (tid, ok) in enumerate(outcomes.items()):
            con.execute("INSERT INTO trajectories (id, dataset_id, source_id, task_id, success, "
                        "content_sha256, meta) VALUES (?, 'd1', ?, ?, ?, ?, '{}')",
                        [tid, f"src-{tid}", f"task{i % 3}", ok, f"sha{tid}"])
        for run, by_cap in labels.items():
            con.execute("INSERT INTO label_runs (id, labeler) VALUES (?, 'test')", [run])
            for cap, values in by_cap.items():
                for tid, v in zip(tids, values, strict=True):
                    if v is not None:
                        con.execute("INSERT INTO labels (run_id, trajectory_id, capability, value)"
                                    " VALUES (?, ?, ?, ?)", [run, tid, cap, v])
