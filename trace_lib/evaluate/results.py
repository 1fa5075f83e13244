"""The store side of evaluation: a finished run becomes a dataset, like any import.

Design decisions
- An evaluation's episodes file is imported through the ingest stage (`ingest_paths`,
  format openai_jsonl), not written row by row here: the same parser, the same
  all-or-nothing transaction, the same expected actions and tool schemas, so explore,
  diagnose, rank and compare read it like a user's file.
- Background runs never open the store (one writer): the job leaves `result.json` with
  the episodes path in its run directory, and the one job sync
  (`trace_lib.workbench.jobs.sync`, called by every page and verb that shows jobs)
  imports each succeeded `evaluate` job once through `import_episodes`. "Once" is the
  dataset whose `source` is that file (`is_imported`): re-syncing imports nothing.
- A result carries the pass rate's Wilson interval, so every front end prints the same.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trace_lib import store
from trace_lib.compare import wilson
from trace_lib.store import trajectories as store_trajectories


def import_episodes(db: str | Path | None, result: dict[str, Any],
                    job_id: str | None = None) -> dict[str, Any]:
    """Import a run's episodes file; return the `evaluate --json` document."""
    from trace_lib.ingest import ingest_paths

    path = Path(result["episodes_path"]).resolve()
    report = ingest_paths([path], db=db, fmt="openai_jsonl")
    ds = report.datasets[0]
    return summary(result, ds, job_id)


def summary(result: dict[str, Any], ds: dict[str, Any], job_id: str | None) -> dict[str, Any]:
    n, k = int(result["trajectories"]), int(result["successes"])
    lo, hi = wilson(k, n)
    return {
        "dataset": ds["name"],
        "dataset_id": ds["id"],
        "trajectories": n,
        "successes": k,
        "failures": n - k,
        "pass_rate": k / n if n else None,
        "ci95": [lo, hi],
        "write_tasks": result.get("write_tasks"),
        "floor": result.get("floor"),
        "policy": result.get("policy"),
        "domain": result.get("domain"),
        "split": result.get("split"),
        "tasks": result.get("tasks"),
        "trials": result.get("trials"),
        "run_id": result.get("run_id"),
        "job_id": job_id,
        "episodes_path": result.get("episodes_path"),
        "wall_s": result.get("wall_s"),
    }


def is_imported(db: str | Path | None, episodes_path: str | Path) -> bool:
    """Whether a dataset was imported from this episodes file already (its `source`)."""
    return imported_dataset(db, episodes_path) is not None


def imported_dataset(db: str | Path | None, episodes_path: str | Path
                     ) -> dict[str, str] | None:
    """{id, name} of the dataset imported from this episodes file, None when none was."""
    from trace_lib.store import trajectories as store_trajectories

    with store.connect(db) as con:
        row = store_trajectories.dataset_from_source(con, str(Path(episodes_path).resolve()))
    return {"id": row[0], "name": row[1]} if row else None


def evaluation_datasets(db: str | Path | None) -> list[dict[str, Any]]:
    """Datasets with their outcome counts, agent models and, for evaluations, the
    provenance: what the Compare page offers, newest first. `agent_model` is the one agent
    model when there is one (None for several or none: `agent_models` lists them)."""
    path = store.resolve_db_path(db)
    if not path.exists():
        return []
    with store.connect(db, read_only=True) as con:
        rows = store_trajectories.dataset_summaries(con)
    out = []
    for id_, name, fmt, at, n, k, tasks, agents, prov in rows:
        agents = list(agents or [])
        out.append({"id": id_, "name": name, "format": fmt, "imported_at": str(at),
                    "trajectories": n, "successes": k, "tasks": tasks,
                    "agent_model": agents[0] if len(agents) == 1 else None,
                    "agent_models": agents,
                    "provenance": json.loads(prov) if prov else None})
    return out
