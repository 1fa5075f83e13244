"""The Trajectories page's charts under a filter, from a rollup stored at import (issue 35).

Design decisions
- A filter change recomputed six aggregates over the filtered trajectories (summary, the
  success-rate bars, terminations, the tool-call histogram, tool usage, tool-error kinds):
  ~0.5 s of CPU at 1M trajectories, ~5 s at 10M, most of it two semi-joins of every tool
  call with the filtered ids. The filters people touch first (dataset, domain, agent,
  outcome, termination, has-a-tool-error) are all trajectory columns with few values, so
  every one of those aggregates is a sum over the cells those columns make: computed once
  where trajectories change (`store_default`, an import's finish) and stored, a filter
  change reads a few thousand cells instead of millions of rows.
- Exact, not an estimate: each count is additive over cells because a trajectory lies in
  exactly one cell; the distinct counts are kept per cell in a form that stays additive
  (trajectories with an error from a tool, per cell: a trajectory is in one cell) or as
  distinct rows (task ids per cell, counted distinct after the filter); an example error
  text is `left(min(error), 200)`, and truncation keeps order, so the minimum of the
  cells' examples is the whole set's. `tests/explore/test_overview_rollup.py` holds the
  frames equal to the computed ones over filters of every servable field.
- One definition of the filter: the cells keep the trajectory columns' names (the
  outcome reduced to 'error' or NULL, the tool-error count to 0/1: what the filter reads
  of them), so `queries.where_sql` applies to a cell as to a trajectory.
- Anything else in the filter (tools used, error kinds, task or trajectory ids, text) is
  not a cell column: `frames` answers None. Those filters are evaluated once instead of
  seven times (`filtered`): the matching trajectories go into a temporary table, the
  same cells are built over it and summed by the same queries (`frames_of`), and the
  listing's 500 rows are taken from it. Each of the six aggregates and the listing used
  to semi-join the filter (a text search's hits, the tool calls of a tools-used filter)
  on its own; a search matching every trajectory of 1M spent ~1.9 s CPU there.
- Stored like the unfiltered view (`store.explore_stored`, Parquet frames under the
  trajectories' fingerprint): a store written otherwise, or changed since, has no rollup
  for its fingerprint, and filters are computed. Task ids per cell are not stored past
  `TASK_ROWS` rows (a store where every trajectory is its own task): `n_tasks` is then
  one distinct count over the filtered trajectories.
"""

from __future__ import annotations

import contextlib
import io
import json
import threading
import time
import uuid
import warnings
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import fields

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from trace_lib.explore import queries
from trace_lib.explore.queries import TrajectoryFilter
from trace_lib.store import derived, explore_stored, search
from trace_lib.store.connection import Connection
from trace_lib.store.derived import error_kind_sql

KEY = json.dumps({"rollup": 1})
# The filter's fields a cell can answer; any other field set -> computed.
SERVED = frozenset({"datasets", "domains", "agent_models", "outcomes", "terminations",
                    "tool_error"})
TASK_ROWS = 2_000_000  # distinct (cell, task) rows stored at most

# The cell: what `queries.where_sql` reads of a trajectory, reduced to what it compares.
_DIMS = """t.dataset_id, t.domain, t.agent_model, t.termination, t.success,
           CASE WHEN t.outcome = 'error' THEN 'error' END AS outcome,
           (coalesce(t.n_tool_errors, 0) > 0)::INTEGER AS n_tool_errors"""
_DIM_NAMES = "dataset_id, domain, agent_model, termination, success, outcome, n_tool_errors"

# The rollup's tables over `{src}`, a relation with the trajectory columns (the store's
# `trajectories`, or one filter's matching trajectories, `filtered`).
_BUILD: dict[str, str] = {
    "cells": f"""
        SELECT {_DIMS}, t.n_tool_calls, count(*) AS n, sum(t.reward) AS sum_reward,
               count(t.reward) AS n_reward, sum(t.n_tool_errors) AS sum_tool_errors
        FROM {{src}} t GROUP BY ALL""",
    "tasks": f"SELECT DISTINCT {_DIMS}, t.task_id FROM {{src}} t",
    "tools": f"""
        SELECT {_DIMS}, c.name AS tool, count(*) AS n_calls, count(c.error) AS n_errors,
               count(DISTINCT CASE WHEN c.error IS NOT NULL THEN c.trajectory_id END)
                   AS n_trajectories_with_error
        FROM tool_calls c JOIN {{src}} t ON t.id = c.trajectory_id GROUP BY ALL""",
    # Per trajectory first, then per cell: a trajectory's row counts it once, where
    # count(DISTINCT trajectory_id) cost ~1.5x the CPU (DuckDB splits the aggregate).
    "errors": f"""
        SELECT {_DIM_NAMES}, tool, error_kind, sum(n)::BIGINT AS n,
               count(*) AS n_trajectories, left(min(example), 200) AS example
        FROM (SELECT {_DIMS}, c.trajectory_id, c.name AS tool,
                     {error_kind_sql("c.error")} AS error_kind, count(*) AS n,
                     min(c.error) AS example
              FROM tool_calls c JOIN {{src}} t ON t.id = c.trajectory_id
              WHERE c.error IS NOT NULL GROUP BY ALL) GROUP BY ALL""",
}
# What a filtered rollup keeps of each matching trajectory: what `_DIMS`, the cells and the
# listing (`queries.list_trajectories(source=...)`) read.
_COLUMNS = ("id, task_id, dataset_id, domain, agent_model, termination, success, outcome, "
            "n_tool_errors, n_tool_calls, reward, trial, n_messages")


def servable(flt: TrajectoryFilter | None) -> bool:
    """Whether every field `flt` sets is a cell column (and it sets one)."""
    if flt is None:
        return False
    base = TrajectoryFilter()
    changed = {f.name for f in fields(flt) if getattr(flt, f.name) != getattr(base, f.name)}
    if not flt.text.strip():
        changed -= {"text", "text_mode", "text_system"}
    return bool(changed) and changed <= SERVED


def compute(con: Connection, src: str = "trajectories", *, tasks: bool = True
            ) -> dict[str, pa.Table]:
    """The rollup's tables over `src` (`tasks` left out past `TASK_ROWS` rows, or when
    not asked for)."""
    out = {}
    for name, template in _BUILD.items():
        sql = template.format(src=src)
        if name == "tasks":
            if not tasks or con.execute(f"SELECT count(*) FROM ({sql})"
                                        ).fetchall()[0][0] > TASK_ROWS:
                continue
        # Through the DB-API result (the relation API refuses to run while a statement of
        # the connection's, such as its open's, has a result not fetched); the extra copy
        # it warns about is of a few thousand cells.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            out[name] = con.execute(sql).to_arrow_table()
    return out


def _to_bytes(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def store_default(con: Connection, version: str | None = None) -> str:
    """What an import's finish calls (after the unfiltered view): compute and store the
    rollup unless it is stored for these trajectories; stored | computed | unwritable."""
    v = version or explore_stored.fingerprint(con)
    if explore_stored.read(con, KEY, v) is not None:
        return "stored"
    t0 = time.perf_counter()
    tables = compute(con)
    ok = explore_stored.write(con, KEY, v, {n: _to_bytes(t) for n, t in tables.items()},
                              time.perf_counter() - t0)
    return "computed" if ok else "unwritable"


# Decoded rollups per fingerprint in this process: a filter change reads them from here.
_LOADED: OrderedDict[tuple, dict[str, pa.Table]] = OrderedDict()
_LOCK = threading.Lock()


def _load(con: Connection, version: str) -> dict[str, pa.Table] | None:
    path = search.store_file(con)
    # Two stores of the same trajectories: each its own rollup; an in-memory one: not kept.
    key = (path, version) if path else None
    with _LOCK:
        if key in _LOADED:
            _LOADED.move_to_end(key)
            return _LOADED[key]
    got = explore_stored.read(con, KEY, version)
    if got is None:
        return None
    tables = {name: pq.read_table(io.BytesIO(data)) for name, data in got.items()}
    if key is not None:
        with _LOCK:
            _LOADED[key] = tables
            while len(_LOADED) > 4:
                _LOADED.popitem(last=False)
    return tables


def frames(con: Connection, flt: TrajectoryFilter | None, version: str
           ) -> dict[str, pd.DataFrame] | None:
    """The six aggregate frames of `_overview` for `flt` from the rollup stored at
    `version` (the trajectories' fingerprint), else None (compute them)."""
    if not servable(flt) or derived.computed_paths(con):
        return None
    tables = _load(con, version)
    if tables is None:
        return None
    where, params = queries.where_sql(flt, "c")
    return _registered_frames(con, tables, f"_rollup_{version[:12]}", where, params)


@contextlib.contextmanager
def filtered(con: Connection, flt: TrajectoryFilter | None) -> Iterator[str | None]:
    """A filter the stored cells cannot answer (text, tools used, error kinds, ids),
    evaluated once: the name of a temporary table of its trajectories (the columns the
    cells and the listing read), dropped on exit. None for no filter, and where the
    computed paths are asked for (bench/explore.py's peer)."""
    if flt is None or derived.computed_paths(con):
        yield None
        return
    where, params = queries.filter_sql(con, flt)
    if where == "TRUE":  # no filter (a search mode without text): the unfiltered view's
        yield None
        return
    # A name of its own: two page sessions may share a process (not a connection).
    src = f"_filtered_{uuid.uuid4().hex[:12]}"
    con.execute(f"CREATE TEMP TABLE {src} AS SELECT {_COLUMNS} FROM trajectories t "
                f"WHERE {where}", params)
    try:
        yield src
    finally:
        con.execute(f"DROP TABLE IF EXISTS {src}")


def frames_of(con: Connection, src: str) -> dict[str, pd.DataFrame]:
    """The six frames over `src` (`filtered`'s table): the rollup built over its
    trajectories, summed as the stored one is."""
    return _registered_frames(con, compute(con, src, tasks=False), src, "TRUE", [],
                              trajectories=src)


def filtered_frames(con: Connection, flt: TrajectoryFilter | None
                    ) -> dict[str, pd.DataFrame] | None:
    """The six frames for a filter the stored cells cannot answer; None as `filtered`."""
    with filtered(con, flt) as src:
        return None if src is None else frames_of(con, src)


def _registered_frames(con: Connection, tables: dict[str, pa.Table], prefix: str,
                       where: str, params: list, *, trajectories: str = "trajectories"
                       ) -> dict[str, pd.DataFrame]:
    names = {n: f"{prefix}_{n}" for n in tables}
    for n, table in tables.items():
        con.register(names[n], table)
    try:
        return _frames(con, names, where, params, trajectories)
    finally:
        for name in names.values():
            con.unregister(name)


def _frames(con: Connection, names: dict[str, str], where: str, params: list,
            trajectories: str) -> dict[str, pd.DataFrame]:
    """The six frames as sums over the cells that pass `where`; distinct task ids from
    the cells' `tasks`, else from `trajectories` (a relation with their columns)."""
    cells, tools, errors = names["cells"], names["tools"], names["errors"]

    def df(sql: str, extra: tuple = ()) -> pd.DataFrame:
        return con.execute(sql, [*params, *extra]).df()

    if "tasks" in names:
        n_tasks = df(f"SELECT count(DISTINCT task_id) AS n FROM {names['tasks']} c "
                     f"WHERE {where}").n.iloc[0]
    else:  # not stored (every trajectory its own task): one distinct count
        n_tasks = df(f"SELECT count(DISTINCT task_id) AS n FROM {trajectories} c "
                     f"WHERE {where}").n.iloc[0]
    summary = df(f"""
        SELECT coalesce(sum(n), 0)::BIGINT AS n_trajectories,
               coalesce(sum(n) FILTER (WHERE success), 0)::BIGINT AS n_success,
               coalesce(sum(n) FILTER (WHERE NOT success), 0)::BIGINT AS n_failure,
               coalesce(sum(n) FILTER (WHERE success IS NULL
                                       AND coalesce(outcome, '') <> 'error'), 0)::BIGINT
                   AS n_unknown,
               coalesce(sum(n) FILTER (WHERE outcome = 'error'), 0)::BIGINT AS n_error,
               coalesce(sum(n) FILTER (WHERE success), 0)
                   / nullif(sum(n) FILTER (WHERE success IS NOT NULL), 0) AS success_rate,
               sum(sum_reward) / nullif(sum(n_reward), 0) AS mean_reward,
               {int(n_tasks)}::BIGINT AS n_tasks,
               count(DISTINCT dataset_id) AS n_datasets,
               coalesce(sum(n_tool_calls * n), 0)::HUGEINT AS n_tool_calls,
               coalesce(sum(sum_tool_errors), 0)::HUGEINT AS n_tool_errors
        FROM {cells} c WHERE {where}""")
    return {
        "summary": summary,
        "by_domain": df(queries.success_by_domain_agent_sql(f"""
            SELECT coalesce(domain, '(none)') AS domain,
                   coalesce(agent_model, '(unknown)') AS agent_model,
                   sum(n)::BIGINT AS n,
                   coalesce(sum(n) FILTER (WHERE success IS NOT NULL), 0)::BIGINT AS n_known,
                   coalesce(sum(n) FILTER (WHERE success), 0)::BIGINT AS n_success
            FROM {cells} c WHERE {where} GROUP BY ALL""")),
        "terminations": df(f"""
            SELECT coalesce(termination, '(none)') AS termination,
                   {queries.outcome_sql("c")} AS outcome, sum(n)::BIGINT AS n
            FROM {cells} c WHERE {where} GROUP BY ALL
            ORDER BY n DESC, termination, outcome"""),
        "tool_calls": df(f"""
            SELECT coalesce(n_tool_calls, 0) AS n_tool_calls,
                   {queries.outcome_sql("c")} AS outcome, sum(n)::BIGINT AS n
            FROM {cells} c WHERE {where} GROUP BY ALL ORDER BY n_tool_calls, outcome"""),
        "tool_usage": df(f"""
            SELECT tool, sum(n_calls)::BIGINT AS n_calls, sum(n_errors)::BIGINT AS n_errors,
                   sum(n_errors) / sum(n_calls) AS error_rate,
                   sum(n_trajectories_with_error)::BIGINT AS n_trajectories_with_error
            FROM {tools} c WHERE {where} GROUP BY tool ORDER BY n_calls DESC, tool"""),
        "error_kinds": df(f"""
            SELECT tool, error_kind, sum(n)::BIGINT AS n,
                   sum(n_trajectories)::BIGINT AS n_trajectories, min(example) AS example
            FROM {errors} c WHERE {where} GROUP BY ALL
            ORDER BY n DESC, tool, error_kind LIMIT ?""", (queries.ERROR_KINDS_LIMIT,)),
    }
