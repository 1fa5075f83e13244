"""The store side of jobs: record submitted jobs, and adapters when their jobs end.

Design decisions
- Jobs never open the DuckDB file (one writer at a time); this module is the only place
  job outcomes reach the store, and it runs in the app or the CLI, never inside a job.
- `sync_jobs` is idempotent and cheap: it reads each run directory's status.json (and
  result.json once), updates the `jobs` row, and inserts the `adapters` row the first time
  it sees a succeeded training job. The page calls it on every refresh; the CLI on
  `job list` / `job status`. A run directory not yet in the store (a job submitted from a
  notebook without a database, or from another machine's CLI) is picked up too.
- Adapter ids are derived from the job id (`a_<job id>`), so re-syncing never duplicates.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trace_lib import jobs, store


def record_job(db: str | Path | None, spec: jobs.JobSpec, external_id: str | None = None) -> None:
    with store.connect(db) as con:
        con.execute(
            "INSERT INTO jobs (id, kind, spec, backend, run_dir, external_id, status) "
            "VALUES (?, ?, ?, ?, ?, ?, 'queued') ON CONFLICT (id) DO NOTHING",
            [spec.id, spec.kind, json.dumps(spec.to_dict()), spec.backend, spec.run_dir,
             external_id],
        )


def _adapter_row(status: jobs.JobStatus) -> dict[str, Any] | None:
    result = jobs.read_result(status.run_dir)
    if status.kind != "train_adapter" or not result.get("adapter_path"):
        return None
    metrics = {
        "final_reward": result.get("final_reward"),
        "steps": result.get("steps"),
        "eval_before": result.get("eval_before"),
        "eval_after": result.get("eval_after"),
        "wall_s": result.get("wall_s"),
        "config": status.config,
    }
    return {
        "id": f"a_{status.id}",
        "capability": result.get("capability") or status.config.get("env", ""),
        "environment": result.get("env") or status.config.get("env"),
        "job_id": status.id,
        "path": result["adapter_path"],
        "base_model": result.get("base_model") or status.config.get("model", ""),
        "metrics": json.dumps(metrics, default=str),
    }


def sync_jobs(db: str | Path | None) -> list[jobs.JobStatus]:
    """Bring the store's jobs/adapters up to date with the run directories; return them."""
    statuses = jobs.list_jobs()
    with store.connect(db) as con:
        known = {
            r[0]: r[1]
            for r in con.execute("SELECT id, status FROM jobs").fetchall()
        }
        have_adapter = {r[0] for r in con.execute("SELECT job_id FROM adapters").fetchall()}
        with store.transaction(con):
            for st in statuses:
                if st.id not in known:
                    spec = jobs.find_spec(st.id)
                    con.execute(
                        "INSERT INTO jobs (id, kind, spec, backend, run_dir, status) "
                        "VALUES (?, ?, ?, ?, ?, ?)",
                        [st.id, st.kind, json.dumps(spec.to_dict()), st.backend, st.run_dir,
                         st.state],
                    )
                elif known[st.id] != st.state:
                    con.execute(
                        "UPDATE jobs SET status = ?, finished_at = CASE WHEN ? THEN "
                        "current_timestamp ELSE finished_at END WHERE id = ?",
                        [st.state, st.state in jobs.TERMINAL, st.id],
                    )
                if st.state == "succeeded" and st.id not in have_adapter:
                    row = _adapter_row(st)
                    if row:
                        con.execute(
                            "INSERT INTO adapters (id, capability, environment, job_id, path, "
                            "base_model, metrics) VALUES (?, ?, ?, ?, ?, ?, ?) "
                            "ON CONFLICT (id) DO NOTHING",
                            list(row.values()),
                        )
    return statuses


def record_adapter(db: str | Path | None, result: dict[str, Any], job_id: str) -> str:
    """Record a foreground run's adapter (the CLI `train` without --background)."""
    adapter_id = f"a_{job_id}"
    metrics = {k: result.get(k) for k in ("final_reward", "steps", "eval_before",
                                          "eval_after", "wall_s")}
    with store.connect(db) as con:
        con.execute(
            "INSERT INTO adapters (id, capability, environment, job_id, path, base_model, "
            "metrics) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
            [adapter_id, result["capability"], result["env"], job_id, result["adapter_path"],
             result["base_model"], json.dumps(metrics, default=str)],
        )
    return adapter_id


def list_adapters(db: str | Path | None) -> list[dict[str, Any]]:
    """Adapters with their before/after held-out pass rate, newest first."""
    with store.connect(db) as con:
        rows = con.execute(
            "SELECT id, capability, environment, job_id, path, base_model, metrics, created_at "
            "FROM adapters ORDER BY created_at DESC"
        ).fetchall()
    out = []
    for id_, cap, env, job_id, path, base, metrics, created in rows:
        m = json.loads(metrics) if isinstance(metrics, str) else (metrics or {})
        before = (m.get("eval_before") or {}).get("pass_rate")
        after = (m.get("eval_after") or {}).get("pass_rate")
        out.append({
            "id": id_, "capability": cap, "environment": env, "job_id": job_id, "path": path,
            "base_model": base, "final_reward": m.get("final_reward"), "steps": m.get("steps"),
            "pass_rate_before": before, "pass_rate_after": after, "created_at": created,
        })
    return out


def training_environments(db: str | Path | None, include_builtins: bool = False
                          ) -> list[dict[str, Any]]:
    """Environments the Training page offers: the approved ones (and, for smoke runs, the
    built-ins a person has not reviewed yet when `include_builtins`)."""
    from trace_lib.envs import catalog

    rows = catalog.list_environments(db)
    return [r for r in rows
            if r["status"] == "approved" or (include_builtins and r["source"] == "builtin")]


def launch_training(
    db: str | Path | None,
    config: dict[str, Any],
    backend: str = "local",
    backend_options: dict[str, Any] | None = None,
) -> jobs.JobSpec:
    """Validate a training config, submit it as a job and record the job (the Launch button)."""
    from trace_lib.train.config import TrainConfig

    TrainConfig.from_dict(config, where="training settings")
    config = with_environment_code(db, config)
    spec = jobs.submit(jobs.JobSpec(kind="train_adapter", config=config, backend=backend,
                                    backend_options=backend_options or {}))
    record_job(db, spec)
    return spec


def with_environment_code(db: str | Path | None, config: dict[str, Any]) -> dict[str, Any]:
    """Put a stored (generated) environment's code into the config, since the job cannot
    read the store; built-ins, module:Class and .py paths pass through unchanged."""
    name = str(config.get("env", ""))
    if not name or ":" in name or name.endswith(".py") or config.get("env_code"):
        return config
    from trace_lib.envs import registry

    if name in registry.builtin_names():
        return config
    spec = registry.resolve(name, db=db)
    return {**config, "env_code": spec.code}
