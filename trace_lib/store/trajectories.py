"""The trajectory tables' SQL: datasets, trajectories, messages, tool calls, expected
actions, tool schemas.

Design decisions
- Every statement that reads or writes these tables outside the analytical queries
  (`explore.queries`, which reads through the same tables with filters) is here; callers
  pass an open connection and get rows back as plain Python values. Rules about what a
  name means (`compare`, `workbench.data`) and the import's batching (`ingest.writer`)
  stay with their callers.
- One exception: the reader of whole trajectories (`trace_lib.trajectories.read_rows`,
  four set-based queries) keeps its SQL beside the models it builds, because the label
  job reads transcripts through it and must import neither the store nor DuckDB, not
  even indirectly (an import-linter contract). It takes a duck-typed connection.
- The bulk import inserts Arrow tables through a relation, not `con.register`: a
  registered table stays referenced until the transaction ends (measured: every batch's
  Arrow buffers held until COMMIT), a relation only for the statement.
- Deleting a dataset reads the catalog for every base table holding a `trajectory_id` or
  `dataset_id`, so tables added by later migrations are cleared too.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from trace_lib.scope import Scope
from trace_lib.store.connection import Connection
from trace_lib.trajectories import json_value as _loads

# ----------------------------------------------------------------------------- datasets


def list_datasets(con: Connection) -> list[dict[str, Any]]:
    """Datasets with their trajectory and failure counts, newest first."""
    rows = con.execute(
        "SELECT d.id, d.name, d.format, d.source, d.imported_at, count(t.id) AS n, "
        "count(t.id) FILTER (WHERE t.success = false) AS failures "
        "FROM datasets d LEFT JOIN trajectories t ON t.dataset_id = d.id "
        "GROUP BY ALL ORDER BY d.imported_at DESC, d.name").fetchall()
    return [{"id": r[0], "name": r[1], "format": r[2], "source": r[3], "imported_at": r[4],
             "trajectories": int(r[5]), "failures": int(r[6])} for r in rows]


def find_datasets(con: Connection, ref: str) -> list[tuple[str, str, str]]:
    """(id, name, format) of the dataset whose id is `ref`, else of every dataset named
    `ref` (by id); [] when none is."""
    rows = con.execute("SELECT id, name, format FROM datasets WHERE id = ?", [ref]).fetchall()
    if rows:
        return [tuple(r) for r in rows]
    return [tuple(r) for r in con.execute(
        "SELECT id, name, format FROM datasets WHERE name = ? ORDER BY id", [ref]).fetchall()]


def dataset_from_source(con: Connection, source: str) -> tuple[str, str] | None:
    """(id, name) of the dataset imported from the file `source` (a resolved path)."""
    row = con.execute("SELECT id, name FROM datasets WHERE source = ? ORDER BY imported_at "
                      "LIMIT 1", [source]).fetchone()
    return (row[0], row[1]) if row else None


def dataset_names(con: Connection) -> list[str]:
    """Every dataset name, sorted."""
    return [r[0] for r in con.execute("SELECT name FROM datasets ORDER BY 1").fetchall()]


def recent_datasets(con: Connection, limit: int) -> list[tuple[str, str]]:
    """(id, name) of the `limit` most recently imported datasets."""
    return [tuple(r) for r in con.execute(
        "SELECT id, name FROM datasets ORDER BY imported_at DESC LIMIT ?", [limit]).fetchall()]


def dataset_ids(con: Connection) -> set[str]:
    return {r[0] for r in con.execute("SELECT id FROM datasets").fetchall()}


def _of_side(dataset_id: str, agent_model: str | None) -> tuple[str, list[Any]]:
    """The WHERE clause (and its parameters) of a dataset's trajectories, optionally only
    one agent model's: a side of a comparison."""
    if agent_model is None:
        return "dataset_id = ?", [dataset_id]
    return "dataset_id = ? AND agent_model = ?", [dataset_id, agent_model]


def dataset_outcomes(con: Connection, dataset_id: str, agent_model: str | None = None
                     ) -> list[tuple[str, str | None, bool | None]]:
    """(trajectory id, task id, success) of a dataset (only `agent_model`'s when given), by
    task, trial and id."""
    where, params = _of_side(dataset_id, agent_model)
    return con.execute(
        f"SELECT id, task_id, success FROM trajectories WHERE {where} "
        "ORDER BY task_id, trial, id", params).fetchall()


def dataset_provenance(con: Connection, dataset_id: str, agent_model: str | None = None
                       ) -> tuple[Any, int, str | None] | None:
    """(an agent model, the number of distinct agent models, one trajectory's
    `meta.provenance` as JSON text) of a dataset (only `agent_model`'s when given)."""
    where, params = _of_side(dataset_id, agent_model)
    return con.execute(
        "SELECT any_value(agent_model), count(DISTINCT agent_model), "
        "any_value(CAST(meta->'provenance' AS VARCHAR)) FROM trajectories "
        f"WHERE {where}", params).fetchone()


def dataset_agent_models(con: Connection, dataset_id: str) -> list[tuple[str, int]]:
    """(agent model, trajectories) of every named agent model in a dataset, by name."""
    return [(r[0], int(r[1])) for r in con.execute(
        "SELECT agent_model, count(*) FROM trajectories WHERE dataset_id = ? "
        "AND agent_model IS NOT NULL GROUP BY 1 ORDER BY 1", [dataset_id]).fetchall()]


def task_origins(con: Connection, dataset_id: str, agent_model: str | None = None
                 ) -> list[tuple[str, str | None, str | None, int | None, bool | None]]:
    """Per task of a dataset (only `agent_model`'s trajectories when given): (task id,
    domain, `meta.source`, `meta.task_set_seed`, `meta.passes_by_doing_nothing`) — what
    its records say about who scored them and on which task set (one value each: a task's
    trials come from one run)."""
    where, params = _of_side(dataset_id, agent_model)
    return con.execute(
        "SELECT task_id, any_value(domain), any_value(meta->>'source'), "
        "any_value(TRY_CAST(meta->>'task_set_seed' AS BIGINT)), "
        "any_value(TRY_CAST(meta->>'passes_by_doing_nothing' AS BOOLEAN)) "
        f"FROM trajectories WHERE {where} AND task_id IS NOT NULL GROUP BY task_id "
        "ORDER BY task_id", params).fetchall()


def side_task_ids(con: Connection) -> list[tuple[str, str | None, list[str]]]:
    """(dataset id, agent model, task ids with a known outcome) for every dataset (agent
    model None: the whole dataset) and every named agent model in it: the sides a
    comparison can take, and what each could pair on."""
    rows = con.execute(
        "SELECT dataset_id, agent_model, GROUPING(agent_model), list(DISTINCT task_id) "
        "FROM trajectories WHERE task_id IS NOT NULL AND success IS NOT NULL "
        "GROUP BY GROUPING SETS ((dataset_id), (dataset_id, agent_model)) "
        "ORDER BY 1, 3 DESC, 2").fetchall()
    # GROUPING = 1: the whole dataset; a NULL agent model's own group is not a side
    return [(r[0], None if r[2] else r[1], list(r[3])) for r in rows
            if r[2] or r[1] is not None]


def dataset_summaries(con: Connection) -> list[tuple[Any, ...]]:
    """(id, name, format, imported_at, trajectories, successes, tasks, agent models (a
    sorted list), one trajectory's `meta.provenance` as JSON text) of every dataset,
    newest first."""
    return con.execute(
        "SELECT d.id, d.name, d.format, d.imported_at, count(t.id), "
        "count(t.id) FILTER (t.success), count(DISTINCT t.task_id), "
        "list(DISTINCT t.agent_model ORDER BY t.agent_model) "
        "FILTER (t.agent_model IS NOT NULL), "
        "any_value(CAST(t.meta->'provenance' AS VARCHAR)) "
        "FROM datasets d LEFT JOIN trajectories t ON t.dataset_id = d.id "
        "GROUP BY d.id, d.name, d.format, d.imported_at ORDER BY d.imported_at DESC, d.name"
    ).fetchall()


def dependent_tables(con: Connection) -> list[tuple[str, str]]:
    """(table, column) for every base table that holds rows of a trajectory or a dataset,
    read from the catalog so that tables added by later migrations are included."""
    rows = con.execute(
        "SELECT c.table_name, c.column_name FROM information_schema.columns c "
        "JOIN information_schema.tables t ON t.table_name = c.table_name "
        "AND t.table_schema = c.table_schema "
        "WHERE c.table_schema = 'main' AND t.table_type = 'BASE TABLE' "
        "AND c.column_name IN ('trajectory_id', 'dataset_id') "
        "AND c.table_name NOT IN ('trajectories', 'datasets') ORDER BY 1, 2").fetchall()
    return [(r[0], r[1]) for r in rows]


def delete_dataset_rows(con: Connection, dataset_id: str) -> dict[str, int]:
    """Delete a dataset, its trajectories and every row that refers to them (run it inside
    `transaction`); the rows removed per table."""
    traj = "(SELECT id FROM trajectories WHERE dataset_id = ?)"
    removed: dict[str, int] = {}
    for table, column in dependent_tables(con):
        where = f"{column} IN {traj}" if column == "trajectory_id" else f"{column} = ?"
        removed[table] = con.execute(f'SELECT count(*) FROM "{table}" WHERE {where}',
                                     [dataset_id]).fetchone()[0]
        con.execute(f'DELETE FROM "{table}" WHERE {where}', [dataset_id])
    removed["trajectories"] = con.execute(
        "SELECT count(*) FROM trajectories WHERE dataset_id = ?", [dataset_id]).fetchone()[0]
    con.execute("DELETE FROM trajectories WHERE dataset_id = ?", [dataset_id])
    con.execute("DELETE FROM datasets WHERE id = ?", [dataset_id])
    removed["datasets"] = 1
    return removed


def store_counts(con: Connection) -> dict[str, Any]:
    """Counts over the whole store: outcomes, messages, calls, expected actions, tool schemas
    by source, datasets (oldest first), trajectories by format and by domain."""
    n, succ, fail, unk, err = con.execute(
        "SELECT count(*), count(*) FILTER (success), count(*) FILTER (NOT success), "
        "count(*) FILTER (success IS NULL AND coalesce(outcome, '') <> 'error'), "
        "count(*) FILTER (outcome = 'error') FROM trajectories"
    ).fetchone()
    n_msgs = con.execute("SELECT count(*) FROM messages").fetchone()[0]
    n_calls, n_err = con.execute("SELECT count(*), count(error) FROM tool_calls").fetchone()
    n_ea = con.execute("SELECT count(*) FROM expected_actions").fetchone()[0]
    schemas = dict(con.execute(
        "SELECT source, count(*) FROM tool_schemas GROUP BY 1 ORDER BY 1").fetchall())
    datasets = [
        {"id": r[0], "name": r[1], "format": r[2], "trajectories": r[3], "successes": r[4],
         "imported_at": str(r[5])}
        for r in con.execute(
            "SELECT d.id, d.name, d.format, count(t.id), count(t.id) FILTER (t.success), "
            "d.imported_at FROM datasets d LEFT JOIN trajectories t ON t.dataset_id = d.id "
            "GROUP BY ALL ORDER BY d.imported_at, d.name").fetchall()
    ]
    formats = dict(con.execute(
        "SELECT d.format, count(*) FROM trajectories t JOIN datasets d ON d.id = t.dataset_id "
        "GROUP BY 1 ORDER BY 1").fetchall())
    domains = dict(con.execute(
        "SELECT coalesce(domain, '(none)'), count(*) FROM trajectories GROUP BY 1 ORDER BY 1"
    ).fetchall())
    return {"trajectories": n, "successes": succ, "failures": fail, "unknown": unk,
            "errors": err, "messages": n_msgs, "tool_calls": n_calls, "tool_errors": n_err,
            "expected_actions": n_ea, "tool_schemas": schemas, "datasets": datasets,
            "formats": formats, "domains": domains}


# ------------------------------------------------------------------------- trajectories


def trajectories_by_id(con: Connection, limit: int) -> list[dict[str, Any]]:
    """The first `limit` trajectories by id: id, domain, task, success, length."""
    rows = con.execute("SELECT id, domain, task_id, success, n_messages FROM trajectories "
                       "ORDER BY id LIMIT ?", [limit]).fetchall()
    return [{"id": r[0], "domain": r[1], "task_id": r[2], "success": r[3], "n_messages": r[4]}
            for r in rows]


def existing_ids(con: Connection, ids: list[str]) -> set[str]:
    """The store ids among `ids` (no source-id matching)."""
    return {r[0] for r in con.execute(
        "SELECT id FROM trajectories WHERE list_contains(?::VARCHAR[], id)", [ids]).fetchall()}


def all_ids(con: Connection) -> list[str]:
    """Every trajectory's store id, sorted."""
    return [r[0] for r in con.execute("SELECT id FROM trajectories ORDER BY id").fetchall()]


def ids_in_scope(con: Connection, scope: Scope) -> list[str]:
    """The store ids of the trajectories in `scope`, sorted."""
    sc, sp = scope.where(con, "t")
    return [r[0] for r in con.execute(
        f"SELECT id FROM trajectories t WHERE {sc} ORDER BY id", sp).fetchall()]


def source_ids(con: Connection) -> list[tuple[str, str]]:
    """(store id, source id) of every trajectory that has a source id."""
    return con.execute("SELECT id, source_id FROM trajectories "
                       "WHERE source_id IS NOT NULL").fetchall()


def known_outcomes_with_expected_tools(con: Connection
                                       ) -> list[tuple[str, Any, Any, bool, list[str] | None]]:
    """(id, task_id, domain, success, distinct expected tool names) of every trajectory with
    a known outcome, by task and id."""
    return con.execute("""
        SELECT t.id, t.task_id, t.domain, t.success,
               list(DISTINCT e.name) FILTER (WHERE e.name IS NOT NULL) AS names
        FROM trajectories t
        LEFT JOIN expected_actions e ON e.dataset_id = t.dataset_id AND e.task_id = t.task_id
        WHERE t.success IS NOT NULL
        GROUP BY ALL ORDER BY t.task_id, t.id
    """).fetchall()


def with_meta_field(con: Connection, key: str) -> list[tuple[str, bool | None, Any]]:
    """(id, success, `meta.<key>` as JSON) of every trajectory whose meta has `key`."""
    path = f"$.{key}"
    return con.execute(
        "SELECT id, success, json_extract(meta, ?) FROM trajectories "
        "WHERE json_extract(meta, ?) IS NOT NULL", [path, path]).fetchall()


def task_of(con: Connection, trajectory_id: str) -> tuple[str, str | None, bool | None] | None:
    """(dataset_id, task_id, success) of a trajectory, None when there is no such id."""
    return con.execute("SELECT dataset_id, task_id, success FROM trajectories WHERE id = ?",
                       [trajectory_id]).fetchone()


def known_outcome_trials(con: Connection, dataset_id: str, task_id: str
                         ) -> list[tuple[str, bool]]:
    """(id, success) of a task's trials with a known outcome, by trial and id."""
    return con.execute(
        "SELECT id, success FROM trajectories WHERE dataset_id = ? AND task_id = ? "
        "AND success IS NOT NULL ORDER BY trial, id", [dataset_id, task_id]).fetchall()


def task_trials(con: Connection, trajectory_id: str) -> pd.DataFrame:
    """Every trial of the trajectory's task in its dataset (itself included), by trial:
    id, trial, outcome (passed | failed | unknown), reward, termination."""
    return con.execute("""
        SELECT t.id, t.trial,
               CASE WHEN t.success THEN 'passed' WHEN NOT t.success THEN 'failed'
                    ELSE 'unknown' END AS outcome,
               t.reward, t.termination
        FROM trajectories t JOIN trajectories me
          ON me.id = ? AND t.dataset_id = me.dataset_id AND t.task_id = me.task_id
        ORDER BY t.trial, t.id""", [trajectory_id]).df()


# --------------------------------------------------------------------------- bulk import


def content_keys(con: Connection) -> tuple[np.ndarray, np.ndarray]:
    """The first and the next 64 bits of every stored trajectory's content hash, as two
    uint64 arrays (the first 64 are the id's hex digits): what an import checks its
    records against, 16 bytes per trajectory, read in one scan."""
    # A hash that is not hex (a fixture's, a row written by hand) matches no import's.
    cols = con.execute("""
        SELECT hi, lo FROM (
            SELECT TRY_CAST('0x' || substr(content_sha256, 1, 16) AS UBIGINT) AS hi,
                   TRY_CAST('0x' || substr(content_sha256, 17, 16) AS UBIGINT) AS lo
            FROM trajectories)
        WHERE hi IS NOT NULL AND lo IS NOT NULL""").fetchnumpy()
    return np.asarray(cols["hi"], np.uint64), np.asarray(cols["lo"], np.uint64)


def insert_arrow(con: Connection, table: str, columns: dict[str, pa.Array],
                 json_cols: tuple[str, ...] = ()) -> None:
    """Append the Arrow `columns` to `table`, casting `json_cols` to JSON."""
    if not columns or len(next(iter(columns.values()))) == 0:
        return
    view = f"_ingest_{table}"
    cols = ", ".join(columns)
    select = ", ".join(f"CAST({c} AS JSON)" if c in json_cols else c for c in columns)
    con.from_arrow(pa.table(columns)).query(
        view, f"INSERT INTO {table} ({cols}) SELECT {select} FROM {view}")


def add_imported(con: Connection, dataset_id: str, n: int) -> None:
    """Count `n` more trajectories added to an existing dataset by a re-import (the import
    report's count; left NULL for a dataset imported before it was kept)."""
    con.execute("UPDATE datasets SET n_trajectories = n_trajectories + ? WHERE id = ?",
                [n, dataset_id])


# --------------------------------------------------------------------------- tool schemas


def tool_schema_rows(con: Connection) -> dict[tuple[str, str], tuple[str, str]]:
    """(domain, name) -> (schema as JSON text, source) of every stored tool schema."""
    return {(d, n): (s, src) for d, n, s, src in con.execute(
        "SELECT domain, name, CAST(schema AS VARCHAR), source FROM tool_schemas").fetchall()}


def upsert_tool_schemas(con: Connection, rows: list[tuple[str, str, str, str]]) -> None:
    """Insert or replace (domain, name, schema JSON text, source) rows."""
    if rows:
        con.executemany(
            "INSERT OR REPLACE INTO tool_schemas (domain, name, schema, source) "
            "VALUES (?, ?, CAST(? AS JSON), ?)", rows)


def domain_tool_schemas(con: Connection, domain: str | None) -> list[dict[str, Any]]:
    """The tool schemas the store keeps for `domain` (given or inferred), by name."""
    if not domain:
        return []
    rows = con.execute("SELECT schema FROM tool_schemas WHERE domain = ? ORDER BY name",
                       [domain]).fetchall()
    return [_loads(r[0]) for r in rows]
