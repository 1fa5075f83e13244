"""Labeling as a background job, the stage's side: stage the job's inputs, and store what
an ended job wrote. Submitting, recording and syncing the job itself is
`trace_lib.workbench.jobs` (`submit_labeling`, `record_label_job`, `sync`), as for every
other kind.

    spec = stage_label_job(db, "heuristic", scope=Scope(datasets=["demo"]), backend="ray")
    # workbench.jobs submits `spec` and records its row; once the job ended:
    store_label_results(db, spec)      # labels into the store, once

Design decisions
- The split follows the job system's rule that a job never opens the database: this
  side (which may) picks the trajectories with the same selection as an in-process run
  (`labeling._select`: capabilities, scope), exports them as gzip JSONL shards into the
  job's run directory with the labeler config in the spec, and creates the label run
  ('running', its params naming the job). The job (`label_job`) writes result files.
- Storing is exactly once and idempotent: a run already 'finished' is left alone; else
  the shards' labels replace whatever rows the run has and the run becomes 'finished' in
  ONE transaction, then joins the materialised labels (`materialise.sync`) and stores
  the Rankings page's default view (`rank_precompute.store_default`). Storing twice, or
  after a crash between the two, changes nothing.
- A job that failed, was cancelled, or was killed stores no labels: its label run is
  marked 'failed' with the job's error (`mark_failed`), so rank, the review queue and
  exports never count it.
- `waiting_label_jobs` names the jobs this store waits for (label runs still 'running'
  whose params name a job): the sync records only those, never another store's runs.
"""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path
from typing import Any

from trace_lib import jobs, store
from trace_lib.diagnose import rank_precompute
from trace_lib.diagnose.label_grounds import Grounds
from trace_lib.diagnose.label_job import read_labels, result_from_json, shard_name, write_shard
from trace_lib.diagnose.label_runs import create_run
from trace_lib.diagnose.labelers import TrajectoryLabels, get_labeler
from trace_lib.diagnose.labeling import _select, fence_setting, label_batch
from trace_lib.errors import UserInputError
from trace_lib.scope import Scope
from trace_lib.store import labels as store_labels
from trace_lib.trajectories import load_transcripts

SHARD_SIZE = 500  # trajectories per shard (a Ray task): small enough to spread, big enough to pay


def stage_label_job(db: str | Path | None, labeler: str = "heuristic", *,
                    labeler_cfg: dict[str, Any] | None = None,
                    capabilities: list[str] | None = None, scope: Scope | None = None,
                    run_id: str | None = None, seed: int = 0, n_runs: int = 1,
                    backend: str = "local", backend_options: dict[str, Any] | None = None,
                    shard_size: int = SHARD_SIZE) -> jobs.JobSpec:
    """The spec of a `label` job, its inputs staged: the scoped trajectories exported as
    shards into its run directory and its label run created 'running' in the store (to be
    finished by `store_label_results` once the job succeeded). Not submitted yet: the
    caller submits it, and calls `mark_failed` if that fails."""
    if shard_size < 1:
        raise UserInputError(f"shard size {shard_size}: expected at least 1")
    cfg = {k: v for k, v in (labeler_cfg or {}).items() if v is not None}
    lab = get_labeler(labeler, **cfg)
    if labeler in ("anthropic", "openai") and lab.model:
        cfg["model"] = lab.model  # the model the run records is the one the job uses
    # One fence key for every shard (Ray workers build their labelers from the spec), the
    # one the run records: the job's prompts are the ones an in-process run with it sends.
    cfg.update(fence_setting(lab))
    caps, tids = _select(db, capabilities, None, scope)
    scoped = scope is not None and not scope.is_empty()
    run_id = run_id or f"{lab.name}-{uuid.uuid4().hex[:6]}"
    options = dict(backend_options or {})
    if backend == "ray":
        options.setdefault("num_cpus", 0)  # the driver only waits; the shard tasks work
    n_shards = max(1, math.ceil(len(tids) / shard_size))
    spec = jobs.JobSpec(kind=jobs.LABEL, backend=backend, backend_options=options, config={
        "run_id": run_id, "labeler": labeler, "labeler_cfg": cfg,
        "capabilities": [c.model_dump() for c in caps], "seed": seed, "n_runs": n_runs,
        "shards": [shard_name(i) for i in range(n_shards)], "n_trajectories": len(tids)})
    params: dict[str, Any] = {"seed": seed, "run_index": seed, "n_runs": n_runs,
                              "capabilities": [c.name for c in caps],
                              "n_trajectories": len(tids), "job": spec.id,
                              **fence_setting(lab)}
    if scoped:
        params["trajectory_ids"] = list(tids)
        params["scope"] = {"datasets": list(scope.datasets),
                           "agent_models": list(scope.agent_models),
                           "domains": list(scope.domains)}
    with store.connect(db) as con:
        create_run(con, run_id, lab.name, model=lab.model,
                   prompt_sha256=lab.prompt_sha256(caps), params=params, status="running")
    try:
        with store.connect(db) as con:
            for i in range(n_shards):  # read and written a shard at a time: bounded memory
                part = tids[i * shard_size:(i + 1) * shard_size]
                write_shard(spec.path, shard_name(i), load_transcripts(con, part))
    except BaseException as exc:  # the run must not stay 'running' with no job behind it
        mark_failed(db, run_id, f"job {spec.id} could not start: {type(exc).__name__}: {exc}")
        raise
    return spec


def mark_failed(db: str | Path | None, run_id: str, reason: str) -> None:
    """Mark a label run 'failed' with `reason` (unless it finished already)."""
    with store.connect(db) as con, store.transaction(con):
        status = store_labels.run_status(con, run_id)
        if status is not None and status != "finished":
            store_labels.set_run_status(con, run_id, "failed", reason, None)


def _results(run_dir: Path, shards: list[str]) -> list[TrajectoryLabels]:
    return [result_from_json(row) for name in shards for row in read_labels(run_dir, name)]


def store_label_results(db: str | Path | None, spec: jobs.JobSpec) -> dict[str, Any]:
    """Store a succeeded label job's labels, once: `outcome` is `recorded` (labels written
    now, with `n_trajectories`, `n_labels`, `n_failed`, `n_cut`, `n_unsupported`) or
    `already` (finished before)."""
    run_id = spec.config["run_id"]
    result = jobs.read_result(spec.path)
    results = _results(spec.path, list(spec.config["shards"]))
    batch = label_batch(run_id, results)
    grounds = Grounds()
    for r in results:
        grounds.add(r)
    with store.connect(db) as con:
        with store.transaction(con):
            status = store_labels.run_status(con, run_id)
            if status is None:
                raise UserInputError(f"job {spec.id}: label run {run_id!r} is not in this store "
                                     f"(was the job submitted against another database?)")
            if status == "finished":
                return {"outcome": "already"}
            store_labels.delete_run_labels(con, run_id)
            store_labels.insert_labels(con, batch)
            store_labels.set_run_status(con, run_id, "finished", None, result.get("cost"),
                                        result.get("notes") or None)
        rank_precompute.run_finished(con)  # materialised labels, then the default view
    return {"outcome": "recorded", "n_trajectories": len(results),
            "n_labels": batch.num_rows, "n_failed": result.get("n_failed", 0),
            "n_cut": grounds.n_cut, "n_unsupported": grounds.n_unsupported}


def waiting_label_jobs(db: str | Path | None) -> set[str]:
    """The label jobs this store waits for: those named by a label run still 'running'."""
    with store.connect(db) as con:
        open_runs = [json.loads(p) if isinstance(p, str) else (p or {})
                     for _, p in store_labels.running_run_params(con)]
    return {p["job"] for p in open_runs if p.get("job")}
