"""Labeling as a background job, app side: export, submit, and record the result once.

    spec = submit_label_job(db, "heuristic", scope=Scope(datasets=["demo"]), backend="ray")
    record_label_job(db, spec.id)      # after it ended: labels into the store, once
    sync_label_jobs(db)                # record every ended label job not recorded yet

Design decisions
- The split follows the job system's rule that a job never opens the database: this
  side (which may) picks the trajectories with the same selection as an in-process run
  (`labeling._select`: capabilities, scope), exports them as gzip JSONL shards into the
  job's run directory with the labeler config in the spec, and creates the label run
  ('running', its params naming the job). The job (`label_job`) writes result files.
- Recording is exactly once and idempotent: a run already 'finished' is left alone; else
  the shards' labels replace whatever rows the run has and the run becomes 'finished' in
  ONE transaction, then joins the materialised labels (`materialise.sync`). Recording
  twice, or after a crash between the two, changes nothing.
- A job that failed, was cancelled, or was killed (an orphan, which `job_status` reports
  as failed) records no labels: its label run is marked 'failed' with the job's error,
  so rank, the review queue and exports never count it.
- Nothing is recorded while the job is queued or running: the caller asks again (the
  CLI with `--wait`, the Labels page on its next render via `sync_label_jobs`).
"""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path
from typing import Any

from trace_lib import jobs, store
from trace_lib.diagnose import materialise
from trace_lib.diagnose.label_job import read_labels, shard_name, write_shard
from trace_lib.diagnose.label_runs import create_run
from trace_lib.diagnose.labelers import PairLabel, TrajectoryLabels, get_labeler
from trace_lib.diagnose.labeling import _select, label_batch
from trace_lib.errors import UserInputError
from trace_lib.scope import Scope
from trace_lib.store import labels as store_labels
from trace_lib.trajectories import load_transcripts

KIND = "label"
SHARD_SIZE = 500  # trajectories per shard (a Ray task): small enough to spread, big enough to pay


def submit_label_job(db: str | Path | None, labeler: str = "heuristic", *,
                     labeler_cfg: dict[str, Any] | None = None,
                     capabilities: list[str] | None = None, scope: Scope | None = None,
                     run_id: str | None = None, seed: int = 0, n_runs: int = 1,
                     backend: str = "local", backend_options: dict[str, Any] | None = None,
                     shard_size: int = SHARD_SIZE) -> jobs.JobSpec:
    """Export the scoped trajectories and start a `label` job; the label run is created
    'running' in the store and finished by `record_label_job` once the job succeeded."""
    if shard_size < 1:
        raise UserInputError(f"shard size {shard_size}: expected at least 1")
    cfg = {k: v for k, v in (labeler_cfg or {}).items() if v is not None}
    lab = get_labeler(labeler, **cfg)
    if labeler in ("anthropic", "openai") and lab.model:
        cfg["model"] = lab.model  # the model the run records is the one the job uses
    caps, tids = _select(db, capabilities, None, scope)
    scoped = scope is not None and not scope.is_empty()
    run_id = run_id or f"{lab.name}-{uuid.uuid4().hex[:6]}"
    options = dict(backend_options or {})
    if backend == "ray":
        options.setdefault("num_cpus", 0)  # the driver only waits; the shard tasks work
    n_shards = max(1, math.ceil(len(tids) / shard_size))
    spec = jobs.JobSpec(kind=KIND, backend=backend, backend_options=options, config={
        "run_id": run_id, "labeler": labeler, "labeler_cfg": cfg,
        "capabilities": [c.model_dump() for c in caps], "seed": seed, "n_runs": n_runs,
        "shards": [shard_name(i) for i in range(n_shards)], "n_trajectories": len(tids)})
    params: dict[str, Any] = {"seed": seed, "run_index": seed, "n_runs": n_runs,
                              "capabilities": [c.name for c in caps],
                              "n_trajectories": len(tids), "job": spec.id}
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
        return jobs.submit(spec)
    except BaseException as exc:  # the run must not stay 'running' with no job behind it
        _mark_failed(db, run_id, f"job {spec.id} could not start: {type(exc).__name__}: {exc}")
        raise


def _mark_failed(db: str | Path | None, run_id: str, reason: str) -> None:
    with store.connect(db) as con, store.transaction(con):
        status = store_labels.run_status(con, run_id)
        if status is not None and status != "finished":
            store_labels.set_run_status(con, run_id, "failed", reason, None)


def _results(run_dir: Path, shards: list[str]) -> list[TrajectoryLabels]:
    out = []
    for name in shards:
        for row in read_labels(run_dir, name):
            out.append(TrajectoryLabels(row["trajectory_id"],
                                        [PairLabel(**p) for p in row["labels"]]))
    return out


def record_label_job(db: str | Path | None, job_id: str) -> dict[str, Any]:
    """Record an ended label job into the store, once; returns what happened:
    `recorded` (labels written now), `already` (finished before), `failed` (the run is
    marked failed), or `running` (the job has not ended: nothing done)."""
    spec = jobs.find_spec(job_id)
    if spec.kind != KIND:
        raise UserInputError(f"job {job_id} is a {spec.kind!r} job, not a label job")
    run_id = spec.config["run_id"]
    st = jobs.job_status(spec)
    out = {"job": job_id, "run_id": run_id, "job_state": st.state}
    if st.state in jobs.ACTIVE:
        return {**out, "outcome": "running"}
    if st.state != "succeeded":
        _mark_failed(db, run_id, f"job {job_id} {st.state}: {st.error or 'no error recorded'}")
        return {**out, "outcome": "failed", "error": st.error}
    result = jobs.read_result(spec.path)
    results = _results(spec.path, list(spec.config["shards"]))
    batch = label_batch(run_id, results)
    with store.connect(db) as con:
        with store.transaction(con):
            status = store_labels.run_status(con, run_id)
            if status is None:
                raise UserInputError(f"job {job_id}: label run {run_id!r} is not in this store "
                                     f"(was the job submitted against another database?)")
            if status == "finished":
                return {**out, "outcome": "already"}
            store_labels.delete_run_labels(con, run_id)
            store_labels.insert_labels(con, batch)
            store_labels.set_run_status(con, run_id, "finished", None, result.get("cost"))
        materialise.sync(con)
    return {**out, "outcome": "recorded", "n_trajectories": len(results),
            "n_labels": batch.num_rows, "n_failed": result.get("n_failed", 0)}


def sync_label_jobs(db: str | Path | None) -> list[dict[str, Any]]:
    """Record every ended label job whose label run is still 'running' in this store."""
    with store.connect(db) as con:
        open_runs = {r[0]: json.loads(r[1]) if isinstance(r[1], str) else (r[1] or {})
                     for r in store_labels.running_run_params(con)}
    out = []
    for job_id in sorted({p["job"] for p in open_runs.values() if p.get("job")}):
        try:  # only the jobs the store waits for: no scan of the whole runs directory
            state = jobs.job_status(job_id).state
        except UserInputError:
            continue  # its run directory is elsewhere (another TRACE_RUNS_DIR) or gone
        if state in jobs.TERMINAL:
            out.append(record_label_job(db, job_id))
    return out
