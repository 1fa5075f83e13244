"""The compose stage's rows in DuckDB: composed models and routing traces.

Design decisions
- This is the only compose module that imports `store`, and only the CLI, the pages and
  the notebooks import it: code that runs inside a job (gate training) writes files into
  its run directory and the app records them when it sees the job end (one writer).
- A composed model's id is a hash of its folder's resolved path, so registering the same
  folder again (after gate training rewrote its gates) updates the row instead of adding
  a twin.
- Trace rows point at the `.npz` file; the arrays never go into the database.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from trace_lib import store
from trace_lib.compose.gated import read_moe_meta
from trace_lib.compose.traces import RoutingTrace


def moe_id_for(folder: str | Path) -> str:
    return "moe-" + hashlib.sha256(str(Path(folder).resolve()).encode()).hexdigest()[:10]


def register_moe(db: str | Path | None, folder: str | Path, job_id: str | None = None,
                 metrics: dict[str, Any] | None = None) -> str:
    """Insert or update the `moe_models` row for a composed model folder; returns its id."""
    root = Path(folder).resolve()
    meta = read_moe_meta(root)
    moe_id = moe_id_for(root)
    with store.connect(db) as con, store.transaction(con):
        old = con.execute("SELECT metrics, job_id FROM moe_models WHERE id = ?",
                          [moe_id]).fetchone()
        merged = {**(json.loads(old[0]) if old and old[0] else {}), **(metrics or {})}
        values = [str(root), meta["base_model"], json.dumps(meta["adapters"]), meta["mode"],
                  int(meta["gate_params"]), job_id or (old[1] if old else None),
                  json.dumps(merged)]
        if old:  # keep created_at: the row is the same model with new gates or metrics
            con.execute("UPDATE moe_models SET path = ?, base_model = ?, adapters = ?, mode = ?,"
                        " gate_params = ?, job_id = ?, metrics = ? WHERE id = ?",
                        values + [moe_id])
        else:
            con.execute("INSERT INTO moe_models (path, base_model, adapters, mode, gate_params,"
                        " job_id, metrics, id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        values + [moe_id])
    return moe_id


def list_moe_models(db: str | Path | None = None) -> list[dict[str, Any]]:
    path = store.resolve_db_path(db)
    if not path.exists():
        return []
    with store.connect(db) as con:
        rows = con.execute(
            "SELECT id, path, base_model, adapters, mode, gate_params, job_id, metrics, "
            "created_at FROM moe_models ORDER BY created_at DESC").fetchall()
    cols = ["id", "path", "base_model", "adapters", "mode", "gate_params", "job_id", "metrics",
            "created_at"]
    out = []
    for row in rows:
        item = dict(zip(cols, row, strict=True))
        item["adapters"] = json.loads(item["adapters"]) if item["adapters"] else []
        item["metrics"] = json.loads(item["metrics"]) if item["metrics"] else {}
        out.append(item)
    return out


def index_trace(db: str | Path | None, moe_id: str, trace: RoutingTrace, path: str | Path,
                source: str) -> str:
    with store.connect(db) as con, store.transaction(con):
        con.execute(
            "INSERT INTO routing_traces (id, moe_id, path, source, n_tokens, n_layers, meta) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [trace.id, moe_id, str(Path(path).resolve()), source, trace.n_tokens,
             trace.n_layers, json.dumps(trace.meta, default=str)],
        )
    return trace.id


def list_traces(db: str | Path | None = None, moe_id: str | None = None) -> list[dict[str, Any]]:
    path = store.resolve_db_path(db)
    if not path.exists():
        return []
    sql = ("SELECT id, moe_id, path, source, n_tokens, n_layers, meta, created_at "
           "FROM routing_traces")
    params: list[Any] = []
    if moe_id:
        sql += " WHERE moe_id = ?"
        params.append(moe_id)
    with store.connect(db) as con:
        rows = con.execute(sql + " ORDER BY created_at DESC", params).fetchall()
    cols = ["id", "moe_id", "path", "source", "n_tokens", "n_layers", "meta", "created_at"]
    out = []
    for row in rows:
        item = dict(zip(cols, row, strict=True))
        item["meta"] = json.loads(item["meta"]) if item["meta"] else {}
        out.append(item)
    return out


def save_and_index(db: str | Path | None, folder: str | Path, trace: RoutingTrace,
                   source: str) -> Path:
    """Save a trace under `<moe folder>/traces/` and index it (registering the model)."""
    moe_id = register_moe(db, folder)
    path = trace.save(Path(folder) / "traces")
    index_trace(db, moe_id, trace, path, source)
    return path


def trajectory_messages(
    db: str | Path | None, trajectory_id: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any]]:
    """An ingested trajectory as OpenAI chat messages + its domain's tool schemas + meta."""
    from trace_lib.errors import UserInputError

    with store.connect(db, read_only=True) as con:
        head = con.execute("SELECT domain, success, reward, task_id FROM trajectories "
                           "WHERE id = ?", [trajectory_id]).fetchone()
        if head is None:
            raise UserInputError(f"--trajectory {trajectory_id!r}: no such trajectory in "
                                 f"{store.resolve_db_path(db)}")
        msgs = con.execute("SELECT idx, role, content, tool_call_id, name FROM messages "
                           "WHERE trajectory_id = ? ORDER BY idx", [trajectory_id]).fetchall()
        calls = con.execute("SELECT message_idx, call_id, name, arguments FROM tool_calls "
                            "WHERE trajectory_id = ? ORDER BY message_idx, call_idx",
                            [trajectory_id]).fetchall()
        schemas = con.execute("SELECT schema FROM tool_schemas WHERE domain = ? ORDER BY name",
                              [head[0]]).fetchall() if head[0] else []
    by_msg: dict[int, list[dict[str, Any]]] = {}
    for idx, call_id, name, arguments in calls:
        args = json.loads(arguments) if isinstance(arguments, str) else (arguments or {})
        by_msg.setdefault(idx, []).append(
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}})
    messages: list[dict[str, Any]] = []
    for idx, role, content, tool_call_id, name in msgs:
        msg: dict[str, Any] = {"role": role, "content": content or ""}
        if role == "assistant" and idx in by_msg:
            msg["tool_calls"] = by_msg[idx]
        if role == "tool":
            msg["tool_call_id"] = tool_call_id
            msg["name"] = name
        messages.append(msg)
    tools = [json.loads(s[0]) if isinstance(s[0], str) else s[0] for s in schemas] or None
    outcome = "success" if head[1] else ("failure" if head[1] is not None else "unknown")
    meta = {"trajectory_id": trajectory_id, "domain": head[0], "reward": head[2],
            "task_id": head[3], "outcome": outcome}
    return messages, tools, meta


def list_trajectories(db: str | Path | None = None, limit: int = 200) -> list[dict[str, Any]]:
    """Recent ingested trajectories for a picker (id, domain, task, outcome, length)."""
    path = store.resolve_db_path(db)
    if not path.exists():
        return []
    with store.connect(db, read_only=True) as con:
        rows = con.execute("SELECT id, domain, task_id, success, n_messages FROM trajectories "
                           "ORDER BY id LIMIT ?", [limit]).fetchall()
    return [{"id": r[0], "domain": r[1], "task_id": r[2], "success": r[3], "n_messages": r[4]}
            for r in rows]


def sync_gate_jobs(db: str | Path | None = None) -> list[dict[str, Any]]:
    """Register the composed model of every succeeded `train_gates` job (idempotent).

    Returns the gate jobs' statuses (newest first) for the page to list.
    """
    from trace_lib import jobs
    from trace_lib.compose.gate_training import JOB_KIND, register_job_kind

    register_job_kind()
    try:
        from trace_lib.train.records import sync_jobs

        sync_jobs(db)  # keeps the `jobs` rows' states current, as the Training page does
    except (ImportError, store.StoreError):
        pass
    known = {m["path"]: m for m in list_moe_models(db)}
    out = []
    for status in jobs.list_jobs():
        if status.kind != JOB_KIND:
            continue
        item = status.to_dict()
        if status.state == "succeeded":
            result = jobs.read_result(status.run_dir)
            moe_path = result.get("moe_path")
            item["moe_path"] = moe_path
            if moe_path and str(Path(moe_path).resolve()) not in known and Path(moe_path).exists():
                register_moe(db, moe_path, job_id=status.id,
                             metrics={"final_reward": result.get("final_reward"),
                                      "warm_rewards": result.get("warm_rewards"),
                                      "eval_before": result.get("eval_before"),
                                      "eval_after": result.get("eval_after")})
        out.append(item)
    return out
