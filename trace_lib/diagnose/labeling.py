"""Labeling runs: N independent runs of a labeler over the store, written as label runs.

Design decisions
- One run = one `label_runs` row + one `labels` row per (trajectory, capability); N runs
  get seeds 0..N-1 (and, for LLM labelers, a sampling temperature) so they are
  independent samples, as the K-of-N selection assumes.
- Transcripts are read once with one short connection; labeling happens with no
  connection open (LLM calls take minutes), in a thread pool of `labeler.concurrency`;
  results are written in chunks with short connections, so the app can read meanwhile
  and a crash loses at most one chunk.
- A failed pair is stored with `value NULL` and the reason in `error`, never as `na`;
  the run's tokens and cost go into `label_runs.cost`.
- Progress is a callback (done, total): the CLI wraps it in tqdm, the app in st.progress.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_lib import store
from trace_lib.data_model import Capability
from trace_lib.diagnose.capabilities import capabilities_on, ensure_builtin
from trace_lib.diagnose.labelers import Labeler, TrajectoryLabels, get_labeler
from trace_lib.diagnose.labels import create_run
from trace_lib.diagnose.transcript import load_transcripts
from trace_lib.errors import UserInputError
from trace_lib.llm import Usage

Progress = Callable[[int, int], None]
WRITE_CHUNK = 200


@dataclass
class RunSummary:
    run_id: str
    labeler: str
    n_trajectories: int
    n_labels: int
    n_failed: int
    cost: dict[str, Any]


def _select(db: str | Path | None, capabilities: list[str] | None,
            trajectory_ids: list[str] | None) -> tuple[list[Capability], list[str]]:
    with store.connect(db) as con:
        ensure_builtin(con)
        catalog = {c.name: c for c in capabilities_on(con)}
        if capabilities:
            unknown = [c for c in capabilities if c not in catalog]
            if unknown:
                raise UserInputError(f"--capabilities: unknown {', '.join(unknown)}; known: "
                                     f"{', '.join(sorted(catalog))}")
            caps = [catalog[c] for c in capabilities]
        else:
            caps = [c for c in catalog.values() if c.status == "accepted"]
        if not caps:
            raise UserInputError("no capabilities to label: accept some first")
        if trajectory_ids is None:
            trajectory_ids = [r[0] for r in con.execute(
                "SELECT id FROM trajectories ORDER BY id").fetchall()]
        if not trajectory_ids:
            raise UserInputError("no trajectories in the store: import some first")
    return caps, trajectory_ids


def _write(db: str | Path | None, run_id: str, results: list[TrajectoryLabels]) -> None:
    rows = [[run_id, r.trajectory_id, p.capability, p.value, json.dumps(p.evidence),
             p.confidence, p.error] for r in results for p in r.labels]
    insert_labels(db, rows)


def insert_labels(db: str | Path | None, rows: list[list[Any]]) -> None:
    """Bulk insert (run_id, trajectory_id, capability, value, evidence, confidence, error)
    through a DataFrame: DuckDB's executemany goes row by row and is ~100x slower."""
    import pandas as pd

    df = pd.DataFrame(rows, columns=["run_id", "trajectory_id", "capability", "value",
                                     "evidence", "confidence", "error"]).astype(
        {"value": "object", "evidence": "object", "confidence": "float64", "error": "object"})
    with store.connect(db) as con, store.transaction(con):
        con.register("_new_labels", df)
        con.execute("INSERT INTO labels (run_id, trajectory_id, capability, value, evidence, "
                    "confidence, error) SELECT run_id, trajectory_id, capability, value, "
                    "evidence, confidence, error FROM _new_labels")
        con.unregister("_new_labels")


def run_labeling(
    db: str | Path | None = None,
    labeler: str | Labeler = "heuristic",
    *,
    runs: int = 1,
    capabilities: list[str] | None = None,
    trajectory_ids: list[str] | None = None,
    run_prefix: str | None = None,
    progress: Progress | None = None,
    **labeler_cfg: Any,
) -> list[RunSummary]:
    """Label the store `runs` times; returns one summary per run."""
    if runs < 1:
        raise UserInputError(f"--runs {runs}: expected at least 1")
    lab = get_labeler(labeler, **labeler_cfg) if isinstance(labeler, str) else labeler
    caps, tids = _select(db, capabilities, trajectory_ids)
    with store.connect(db) as con:
        transcripts = load_transcripts(con, tids)
    prefix = run_prefix or f"{lab.name}-{uuid.uuid4().hex[:6]}"
    total, done = runs * len(transcripts), 0
    summaries = []
    for r in range(runs):
        run_id = prefix if runs == 1 else f"{prefix}-r{r}"
        with store.connect(db) as con:
            create_run(con, run_id, lab.name, model=lab.model,
                       prompt_sha256=lab.prompt_sha256(caps),
                       params={"seed": r, "run_index": r, "n_runs": runs,
                               "capabilities": [c.name for c in caps],
                               "n_trajectories": len(transcripts)})
        usage, n_failed, n_labels = Usage(), 0, 0

        def one(t, _r=r):
            return lab.label(t, caps, seed=_r, n_runs=runs)

        pending: list[TrajectoryLabels] = []
        label_many = getattr(lab, "label_many", None)
        if label_many is not None and getattr(lab, "batch", False):
            results_iter = iter(label_many(transcripts, caps, seed=r, n_runs=runs))
            pool = None
        else:
            pool = ThreadPoolExecutor(max_workers=max(1, lab.concurrency))
            results_iter = pool.map(one, transcripts) if lab.concurrency > 1 else map(one, transcripts)
        try:
            for res in results_iter:
                pending.append(res)
                usage.add(res.usage)
                n_failed += sum(p.value is None for p in res.labels)
                n_labels += len(res.labels)
                done += 1
                if progress:
                    progress(done, total)
                if len(pending) >= WRITE_CHUNK:
                    _write(db, run_id, pending)
                    pending = []
        finally:
            if pool is not None:
                pool.shutdown(wait=True)
        if pending:
            _write(db, run_id, pending)
        cost = usage.to_dict(lab.model) if lab.model else usage.to_dict()
        cost["n_failed_pairs"] = n_failed
        with store.connect(db) as con:
            con.execute("UPDATE label_runs SET finished_at = current_timestamp, cost = ? "
                        "WHERE id = ?", [json.dumps(cost), run_id])
        summaries.append(RunSummary(run_id, lab.name, len(transcripts), n_labels, n_failed, cost))
    return summaries
