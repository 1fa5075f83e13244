"""The job table family: `jobs` and the rows a finished job leaves behind, `adapters`,
`moe_models` and `routing_traces`.

Design decisions
- Every statement on these four tables is here, in functions that take an open
  connection: the caller (`trace_lib.workbench.jobs`, and the training / composition /
  evaluation use cases that read what jobs made) decides when a connection opens and
  what shares a transaction; this module decides the SQL and the column encoding (JSON
  columns go in as dicts and come out as dicts).
- Rows are idempotent by construction, because the one sync runs on every page view:
  a job row is inserted once (`ON CONFLICT DO NOTHING`) and only its state moves; an
  adapter's id is derived from its job (`a_<job id>`); a composed model's id is a hash of
  its folder's resolved path (`moe_id_for`), and recording it again merges the new
  metrics into the old ones and keeps `created_at` (the same model, new gates or
  numbers).
- A `jobs` row is a pointer, not a copy: the job's state is read from its run directory
  (`status.json`) and mirrored here by the sync; `run_dir` is what a row is for (a job
  is found where it was submitted even after `TRACE_RUNS_DIR` changes).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import duckdb

Con = duckdb.DuckDBPyConnection


def _json(value: Any) -> dict[str, Any] | list[Any]:
    if isinstance(value, str):
        decoded: dict[str, Any] | list[Any] = json.loads(value)
        return decoded
    return value or {}


# ----------------------------------------------------------------------------- jobs


def insert_job(con: Con, *, job_id: str, kind: str, spec: dict[str, Any], backend: str,
               run_dir: str, state: str = "queued", external_id: str | None = None) -> None:
    """A job's row, once (a second insert of the same id changes nothing)."""
    con.execute(
        "INSERT INTO jobs (id, kind, spec, backend, run_dir, external_id, status) "
        "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
        [job_id, kind, json.dumps(spec), backend, run_dir, external_id, state],
    )


def job_states(con: Con) -> dict[str, str | None]:
    """Every recorded job's id -> the state the store last saw."""
    return {r[0]: r[1] for r in con.execute("SELECT id, status FROM jobs").fetchall()}


def set_job_state(con: Con, job_id: str, state: str, *, ended: bool) -> None:
    """Mirror a run directory's state; `ended` stamps `finished_at` (once per change)."""
    con.execute(
        "UPDATE jobs SET status = ?, finished_at = CASE WHEN ? THEN current_timestamp "
        "ELSE finished_at END WHERE id = ?",
        [state, ended, job_id],
    )


def job_run_dir(con: Con, job_id: str) -> str | None:
    """The run directory a job's row recorded (None: no such row)."""
    row = con.execute("SELECT run_dir FROM jobs WHERE id = ?", [job_id]).fetchone()
    return str(row[0]) if row and row[0] else None


def active_job_run_dirs(con: Con) -> list[tuple[str, str]]:
    """(id, run directory) of every job the store last saw queued or running."""
    return [(r[0], str(r[1])) for r in con.execute(
        "SELECT id, run_dir FROM jobs WHERE status IN ('queued', 'running') "
        "AND run_dir IS NOT NULL ORDER BY id").fetchall()]


# ------------------------------------------------------------------------- adapters


def adapter_id_for(job_id: str) -> str:
    return f"a_{job_id}"


def insert_adapter(con: Con, *, job_id: str, capability: str, environment: str | None,
                   path: str, base_model: str, metrics: dict[str, Any]) -> str:
    """A trained adapter's row (id `a_<job id>`, once); returns its id."""
    adapter_id = adapter_id_for(job_id)
    con.execute(
        "INSERT INTO adapters (id, capability, environment, job_id, path, base_model, "
        "metrics) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
        [adapter_id, capability, environment, job_id, path, base_model,
         json.dumps(metrics, default=str)],
    )
    return adapter_id


def adapter_job_ids(con: Con) -> set[str]:
    """Jobs whose adapter is recorded already."""
    return {r[0] for r in con.execute("SELECT job_id FROM adapters").fetchall()}


def adapters(con: Con) -> list[dict[str, Any]]:
    """Every adapter row, newest first (`metrics` decoded)."""
    rows = con.execute(
        "SELECT id, capability, environment, job_id, path, base_model, metrics, created_at "
        "FROM adapters ORDER BY created_at DESC"
    ).fetchall()
    cols = ("id", "capability", "environment", "job_id", "path", "base_model", "metrics",
            "created_at")
    out = []
    for row in rows:
        item = dict(zip(cols, row, strict=True))
        item["metrics"] = _json(item["metrics"])
        out.append(item)
    return out


def adapter_at(con: Con, path: str) -> dict[str, Any] | None:
    """The adapter recorded at `path` (id, capability, environment, job_id), if any."""
    row = con.execute(
        "SELECT id, capability, environment, job_id FROM adapters WHERE path = ? "
        "ORDER BY created_at DESC LIMIT 1", [path]).fetchone()
    if row is None:
        return None
    return {"id": row[0], "capability": row[1], "environment": row[2], "job_id": row[3]}


# ----------------------------------------------------------------------- moe_models


def moe_id_for(folder: str | Path) -> str:
    """A composed model's id: a hash of its folder's resolved path."""
    return "moe-" + hashlib.sha256(str(Path(folder).resolve()).encode()).hexdigest()[:10]


def record_moe_model(con: Con, folder: str | Path, meta: dict[str, Any],
                     job_id: str | None = None,
                     metrics: dict[str, Any] | None = None) -> str:
    """Insert or update a composed model's row from its folder's `meta` (base_model,
    adapters, mode, gate_params); new metrics merge into the old ones, an absent `job_id`
    keeps the old one, and `created_at` stays. Returns the id. The caller holds the
    transaction."""
    root = Path(folder).resolve()
    moe_id = moe_id_for(root)
    old = con.execute("SELECT metrics, job_id FROM moe_models WHERE id = ?",
                      [moe_id]).fetchone()
    merged = {**(_json(old[0]) if old and old[0] else {}), **(metrics or {})}
    values = [str(root), meta["base_model"], json.dumps(meta["adapters"]), meta["mode"],
              int(meta["gate_params"]), job_id or (old[1] if old else None),
              json.dumps(merged, default=str)]
    if old:
        con.execute("UPDATE moe_models SET path = ?, base_model = ?, adapters = ?, mode = ?,"
                    " gate_params = ?, job_id = ?, metrics = ? WHERE id = ?",
                    values + [moe_id])
    else:
        con.execute("INSERT INTO moe_models (path, base_model, adapters, mode, gate_params,"
                    " job_id, metrics, id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    values + [moe_id])
    return moe_id


def moe_models(con: Con) -> list[dict[str, Any]]:
    """Every composed model's row, newest first (`adapters`, `metrics` decoded)."""
    rows = con.execute(
        "SELECT id, path, base_model, adapters, mode, gate_params, job_id, metrics, "
        "created_at FROM moe_models ORDER BY created_at DESC").fetchall()
    cols = ("id", "path", "base_model", "adapters", "mode", "gate_params", "job_id",
            "metrics", "created_at")
    out = []
    for row in rows:
        item = dict(zip(cols, row, strict=True))
        item["adapters"] = _json(item["adapters"]) if item["adapters"] else []
        item["metrics"] = _json(item["metrics"]) if item["metrics"] else {}
        out.append(item)
    return out


def moe_model_paths(con: Con) -> set[str]:
    """The folders of every recorded composed model (resolved, as recorded)."""
    return {r[0] for r in con.execute("SELECT path FROM moe_models").fetchall()}


def moe_model_at(con: Con, path: str) -> dict[str, Any] | None:
    """The composed model recorded at `path` (id, job_id), if any."""
    row = con.execute("SELECT id, job_id FROM moe_models WHERE path = ? LIMIT 1",
                      [path]).fetchone()
    return {"id": row[0], "job_id": row[1]} if row else None


# ------------------------------------------------------------------- routing_traces


def insert_routing_trace(con: Con, *, trace_id: str, moe_id: str, path: str, source: str,
                         n_tokens: int, n_layers: int, meta: dict[str, Any]) -> str:
    con.execute(
        "INSERT INTO routing_traces (id, moe_id, path, source, n_tokens, n_layers, meta) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        [trace_id, moe_id, path, source, n_tokens, n_layers, json.dumps(meta, default=str)],
    )
    return trace_id


def routing_traces(con: Con, moe_id: str | None = None) -> list[dict[str, Any]]:
    """Saved routing traces (of one composed model, or all), newest first."""
    sql = ("SELECT id, moe_id, path, source, n_tokens, n_layers, meta, created_at "
           "FROM routing_traces")
    params: list[Any] = []
    if moe_id:
        sql += " WHERE moe_id = ?"
        params.append(moe_id)
    rows = con.execute(sql + " ORDER BY created_at DESC", params).fetchall()
    cols = ("id", "moe_id", "path", "source", "n_tokens", "n_layers", "meta", "created_at")
    out = []
    for row in rows:
        item = dict(zip(cols, row, strict=True))
        item["meta"] = _json(item["meta"]) if item["meta"] else {}
        out.append(item)
    return out
