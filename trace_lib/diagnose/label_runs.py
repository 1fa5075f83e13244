"""Label runs as people see them: creating one, listing them, and which ones do not count.

Design decisions
- A label run is a row with a status, running | finished | failed (store migration
  `LABEL_RUN_STATUS`). Only finished runs count: rank, the review queue and exports read
  finished runs only, and say which runs they left out (`left_out_note`), so a run that
  is still going or failed never silently changes or hides a result.
- Run names are chosen by people (`label --run NAME`) and never reused: creating a run
  whose name exists is an error, not an overwrite.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from trace_lib import store
from trace_lib.errors import UserInputError
from trace_lib.store import labels as store_labels


def create_run(con: store.Connection, run_id: str, labeler: str, *,
               model: str | None = None, prompt_sha256: str | None = None,
               params: dict[str, Any] | None = None, status: str = "running") -> None:
    """A new label run row; the labeler writes 'running' and finishes it (see labeling)."""
    if store_labels.run_exists(con, run_id):
        raise UserInputError(f"label run {run_id!r} already exists; choose another --run name")
    store_labels.insert_run(con, run_id, labeler, model=model, prompt_sha256=prompt_sha256,
                            params=params or {}, status=status)


def label_runs(db: str | Path | None = None) -> pd.DataFrame:
    """Every run, oldest first, with its status, cost and label and failed-pair counts."""
    with store.connect(db) as con:
        return store_labels.label_runs(con)


def left_out_runs(db: str | Path | None = None) -> list[dict[str, Any]]:
    """The runs that rank, the review queue and exports do not count (not finished)."""
    with store.connect(db) as con:
        return store_labels.left_out_runs(con)


def left_out_note(runs: list[dict[str, Any]]) -> str | None:
    """One sentence naming the runs left out, or None when every run finished."""
    if not runs:
        return None
    parts = [f"{r['run']} ({r['status']}, {r['n_trajectories_labeled']} trajectories labeled"
             + (f": {r['reason']}" if r.get("reason") else "") + ")" for r in runs]
    return ("left out (not finished; `label --resume RUN` completes one): "
            + "; ".join(parts))
