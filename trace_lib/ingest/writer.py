"""The bulk writer: parsed files -> rows, in one transaction, column by column.

Design decisions
- Rows are built as Python column lists, wrapped in pyarrow tables, registered with DuckDB
  and inserted with one `INSERT ... SELECT` per table. DuckDB reads Arrow without copying
  row by row, which is what makes 100k trajectories import in seconds (bench/ingest.py
  compares it with executemany).
- Identity: a trajectory is its `content_sha256` (trace_lib.data_model); its id is the
  `t_` + 16-hex prefix. Duplicates — already in the store, or twice in this import — are
  counted, not inserted. A dataset is its file's SHA-256 (`d_` + 16 hex): re-importing
  the same bytes reuses the row.
- The caller holds the transaction (`store.transaction`), so a failure anywhere leaves the
  file as it was; this module only issues statements.
- Expected actions are keyed (dataset_id, task_id, idx) and only written with a new dataset.
- Tool schemas go through `schemas.resolve` (given beats inferred; inferred merge) and are
  upserted with INSERT OR REPLACE.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa

from trace_lib.data_model import ToolSchema, Trajectory
from trace_lib.ingest import schemas as schema_mod
from trace_lib.ingest.records import ParsedFile

DATASET_COLUMNS = ("id", "name", "format", "source", "content_sha256", "n_records")
TRAJECTORY_COLUMNS = (
    "id", "dataset_id", "source_id", "task_id", "trial", "agent_model", "domain", "reward",
    "success", "termination", "n_messages", "n_tool_calls", "n_tool_errors", "content_sha256",
    "meta",
)  # fmt: skip
MESSAGE_COLUMNS = ("trajectory_id", "idx", "role", "content", "tool_call_id", "name", "turn_idx")
TOOL_CALL_COLUMNS = (
    "trajectory_id", "message_idx", "call_idx", "call_id", "name", "arguments", "requestor",
    "error",
)  # fmt: skip
EXPECTED_ACTION_COLUMNS = ("dataset_id", "task_id", "idx", "name", "arguments")


def dataset_id(sha256: str) -> str:
    return "d_" + sha256[:16]


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


@dataclass
class FileResult:
    dataset_id: str
    name: str
    format: str
    records: int
    new_dataset: bool
    new: list[Trajectory] = field(default_factory=list)
    duplicates: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.dataset_id,
            "name": _short_name(self.name),
            "source": self.name,
            "format": self.format,
            "records": self.records,
            "trajectories": len(self.new),
            "duplicates": self.duplicates,
            "new_dataset": self.new_dataset,
        }


def _insert(
    con: duckdb.DuckDBPyConnection,
    table: str,
    columns: dict[str, pa.Array],
    json_cols: tuple[str, ...] = (),
) -> None:
    if not columns or len(next(iter(columns.values()))) == 0:
        return
    view = f"_ingest_{table}"
    con.register(view, pa.table(columns))
    try:
        cols = ", ".join(columns)
        select = ", ".join(f"CAST({c} AS JSON)" if c in json_cols else c for c in columns)
        con.execute(f"INSERT INTO {table} ({cols}) SELECT {select} FROM {view}")
    finally:
        con.unregister(view)


def _existing_shas(con: duckdb.DuckDBPyConnection, shas: list[str]) -> set[str]:
    if not shas:
        return set()
    con.register("_ingest_shas", pa.table({"sha": pa.array(shas, pa.string())}))
    try:
        rows = con.execute(
            "SELECT t.content_sha256 FROM trajectories t JOIN _ingest_shas s ON t.content_sha256 = s.sha"
        ).fetchall()
    finally:
        con.unregister("_ingest_shas")
    return {r[0] for r in rows}


def write_files(
    con: duckdb.DuckDBPyConnection,
    files: list[ParsedFile],
    sources: dict[str, str],
) -> list[FileResult]:
    """Write `files` (inside the caller's transaction); `sources` maps a file's name to its
    origin (absolute path or `upload:NAME`), stored as `datasets.source`."""
    known_datasets = {r[0] for r in con.execute("SELECT id FROM datasets").fetchall()}
    shas_per_file = [[t.content_sha256() for t in f.trajectories] for f in files]
    existing = _existing_shas(con, [s for shas in shas_per_file for s in shas])
    seen: set[str] = set(existing)

    ds_rows: dict[str, list[Any]] = {k: [] for k in DATASET_COLUMNS}
    traj_cols: dict[str, list[Any]] = {k: [] for k in TRAJECTORY_COLUMNS}
    msg_cols: dict[str, list[Any]] = {k: [] for k in MESSAGE_COLUMNS}
    call_cols: dict[str, list[Any]] = {k: [] for k in TOOL_CALL_COLUMNS}
    ea_cols: dict[str, list[Any]] = {k: [] for k in EXPECTED_ACTION_COLUMNS}

    # Bound appends: this loop runs once per message (350k times in the benchmark).
    m_tid, m_idx, m_role, m_content, m_call_id, m_name, m_turn = (
        msg_cols[k].append for k in msg_cols
    )
    call_rows: list[tuple[Any, ...]] = []
    c_row = call_rows.append

    results: list[FileResult] = []
    for f, shas in zip(files, shas_per_file, strict=True):
        ds = dataset_id(f.sha256)
        new_dataset = ds not in known_datasets
        result = FileResult(ds, f.name, f.format, f.n_records, new_dataset)
        results.append(result)
        if new_dataset:
            known_datasets.add(ds)
            for k, v in zip(
                ds_rows,
                (
                    ds,
                    _short_name(f.name),
                    f.format,
                    sources.get(f.name, f.name),
                    f.sha256,
                    len(f.trajectories),
                ),
                strict=True,
            ):
                ds_rows[k].append(v)
            for task_id, actions in f.expected_actions.items():
                for i, a in enumerate(actions):
                    for k, v in zip(
                        ea_cols, (ds, task_id, i, a.name, _dumps(a.arguments)), strict=True
                    ):
                        ea_cols[k].append(v)
        for traj, sha in zip(f.trajectories, shas, strict=True):
            if sha in seen:
                result.duplicates += 1
                continue
            seen.add(sha)
            result.new.append(traj)
            tid = Trajectory.id_from_sha(sha)
            n_calls = n_errors = 0
            for idx, m in enumerate(traj.messages):
                m_tid(tid)
                m_idx(idx)
                m_role(m.role)
                m_content(m.content)
                m_call_id(m.tool_call_id)
                m_name(m.name)
                m_turn(m.turn_idx)
                for ci, c in enumerate(m.tool_calls):
                    n_calls += 1
                    n_errors += c.error is not None
                    c_row(
                        (tid, idx, ci, c.call_id, c.name, _dumps(c.arguments), c.requestor, c.error)
                    )
            row = (
                tid,
                ds,
                traj.source_id,
                traj.task_id,
                traj.trial,
                traj.agent_model,
                traj.domain,
                traj.reward,
                traj.success,
                traj.termination,
                len(traj.messages),
                n_calls,
                n_errors,
                sha,
                _dumps(traj.meta),
            )
            for k, v in zip(traj_cols, row, strict=True):
                traj_cols[k].append(v)

    for k, column in zip(
        call_cols, zip(*call_rows, strict=True) if call_rows else [[]] * len(call_cols), strict=True
    ):
        call_cols[k] = list(column)
    string = pa.string()
    i32 = pa.int32()
    _insert(
        con,
        "datasets",
        {
            "id": pa.array(ds_rows["id"], string),
            "name": pa.array(ds_rows["name"], string),
            "format": pa.array(ds_rows["format"], string),
            "source": pa.array(ds_rows["source"], string),
            "content_sha256": pa.array(ds_rows["content_sha256"], string),
            "n_records": pa.array(ds_rows["n_records"], i32),
        },
    )
    types = {
        "trial": i32,
        "reward": pa.float64(),
        "success": pa.bool_(),
        "n_messages": i32,
        "n_tool_calls": i32,
        "n_tool_errors": i32,
    }
    _insert(
        con,
        "trajectories",
        {k: pa.array(v, types.get(k, string)) for k, v in traj_cols.items()},
        ("meta",),
    )
    int_cols = {"idx", "turn_idx", "message_idx", "call_idx"}
    _insert(
        con,
        "messages",
        {k: pa.array(v, i32 if k in int_cols else string) for k, v in msg_cols.items()},
    )
    _insert(
        con,
        "tool_calls",
        {k: pa.array(v, i32 if k in int_cols else string) for k, v in call_cols.items()},
        ("arguments",),
    )
    _insert(
        con,
        "expected_actions",
        {k: pa.array(v, i32 if k == "idx" else string) for k, v in ea_cols.items()},
        ("arguments",),
    )
    _write_schemas(con, files, [t for r in results for t in r.new])
    return results


def _short_name(name: str) -> str:
    return name.replace("\\", "/").rsplit("/", 1)[-1]


def _write_schemas(
    con: duckdb.DuckDBPyConnection, files: list[ParsedFile], new: list[Trajectory]
) -> None:
    given: list[ToolSchema] = [s for f in files for s in f.given_schemas]
    existing = {
        (d, n): (s, src)
        for d, n, s, src in con.execute(
            "SELECT domain, name, CAST(schema AS VARCHAR), source FROM tool_schemas"
        ).fetchall()
    }
    covered = {(s.domain, s.name) for s in given} | {
        k for k, (_, src) in existing.items() if src == "given"
    }
    inferred = schema_mod.infer_schemas(new, skip=covered)
    rows = schema_mod.resolve(existing, given + inferred)
    if not rows:
        return
    con.executemany(
        "INSERT OR REPLACE INTO tool_schemas (domain, name, schema, source) VALUES (?, ?, CAST(? AS JSON), ?)",
        [(s.domain, s.name, _dumps(s.schema_), s.source) for s in rows],
    )
