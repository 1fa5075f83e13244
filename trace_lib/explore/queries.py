"""Read-only queries behind the Trajectories page, the overview and `explore` verbs.

Design decisions
- Every public function has the shape `f(con, flt=None, **keyword_options)` and returns a
  pandas DataFrame: the page, the CLI, the notebook and the benchmark all call the same
  thing the same way. `flt` is a frozen `TrajectoryFilter`; `None` means "everything".
- All aggregation happens in SQL (DuckDB is columnar and vectorised); pandas only carries
  the small result. Lists of trajectories are paged with `limit` so that a page never
  pulls 100k rows it cannot show. Target: every function under 200 ms at 100k
  trajectories (measured by bench/ingest.py).
- The filter compiles into one `WHERE` over `trajectories t` with bound parameters
  (`list_contains(?, col)`), never string-formatted values: trajectory text is untrusted.
- Error kinds are computed in SQL from the tool's error text (`store.derived.
  error_kind_sql`, the definition the derived column uses): prefixes like "Error:" dropped, quoted values and any token holding a digit replaced by `<id>`, whitespace
  collapsed, lower-cased, cut at 60 characters. "Reservation ZFA04Y not found" and
  "Reservation 8JX2 not found" are one kind; the rule is crude on purpose, stable and
  explainable, and it is the same everywhere (charts, signatures, CLI).
- Text search and derived columns: `filter_sql` resolves a text filter to its matching
  ids once (`store.search`) and reads columns derived at import (`store.derived`)
  when the store has them for every trajectory; the computed SQL stays the definition.
- Missing later-stage tables (an old or foreign file opened read-only) count as empty,
  so the overview never crashes on a half-populated store.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

import duckdb
import pandas as pd

from trace_lib.store import derived
from trace_lib.store.derived import error_kind_sql

# `error`: a run the harness crashed on (trajectories.outcome = 'error', success NULL). It
# is its own outcome: shown and filterable, never counted in a success rate.
Outcome = Literal["success", "failure", "unknown", "error"]
OUTCOMES: tuple[str, ...] = ("success", "failure", "unknown", "error")
TEXT_MODES: tuple[str, ...] = ("words", "substring")


@dataclass(frozen=True)
class TrajectoryFilter:
    """Which trajectories a view shows. Empty tuples mean "no restriction"."""

    datasets: tuple[str, ...] = ()  # dataset ids
    domains: tuple[str, ...] = ()
    agent_models: tuple[str, ...] = ()
    outcomes: tuple[str, ...] = ()  # subset of OUTCOMES
    terminations: tuple[str, ...] = ()
    tools_used: tuple[str, ...] = ()  # the trajectory called at least one of these
    tool_error: bool | None = None  # True: at least one tool error; False: none
    error_kinds: tuple[str, ...] = ()  # at least one tool error of these kinds
    task_ids: tuple[str, ...] = ()
    trajectory_ids: tuple[str, ...] = ()
    # Text search over message content (`store.search`): `words` (default) asks the
    # full-text index for trajectories where every word starts a token; `substring` is
    # the exact case-insensitive substring scan (identifiers, fragments; seconds at 100k).
    # It reads the conversation (user, assistant, tool messages); `text_system` adds the
    # system prompt, the same policy text in every trajectory of a benchmark.
    text: str = ""
    text_mode: str = "words"  # words | substring
    text_system: bool = False

    def __post_init__(self) -> None:
        bad = [o for o in self.outcomes if o not in OUTCOMES]
        if bad:
            raise ValueError(f"TrajectoryFilter.outcomes: {bad} not in {OUTCOMES}")
        if self.text_mode not in TEXT_MODES:
            raise ValueError(f"TrajectoryFilter.text_mode: {self.text_mode!r} not in "
                             f"{TEXT_MODES}")
        # Accept lists from callers (widgets return lists) but keep the filter hashable.
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, list):
                object.__setattr__(self, f.name, tuple(value))

    def is_empty(self) -> bool:
        return self == TrajectoryFilter()


def filter_sql(con: duckdb.DuckDBPyConnection, flt: TrajectoryFilter | None,
               alias: str = "t") -> tuple[str, list[Any]]:
    """The filter as a SQL boolean over `trajectories {alias}` for queries on `con`.

    What every query here uses: the text search's matching ids are computed once (cached
    per store version and query, `search.hits`) and registered on `con`, and the
    error-kind filter reads the kinds derived at import when the store has them.
    """
    from trace_lib.store import search

    flt = flt or TrajectoryFilter()
    hits_table = None
    if flt.text.strip() and not derived.computed_paths(con):
        hits_table = search.bind(con, flt.text, flt.text_mode, system=flt.text_system)
    use_derived = bool(flt.error_kinds) and derived.ready(con)
    return where_sql(flt, alias, hits_table=hits_table, use_derived=use_derived)


def where_sql(flt: TrajectoryFilter | None, alias: str = "t", *, hits_table: str | None = None,
              use_derived: bool = False) -> tuple[str, list[Any]]:
    """The filter as a SQL boolean over `trajectories {alias}` and its parameters.

    Without `hits_table` a text filter becomes the substring scan as a subquery, evaluated
    wherever the condition is (the old path, kept as bench/explore.py's named peer);
    queries use `filter_sql`.
    """
    flt = flt or TrajectoryFilter()
    clauses: list[str] = ["TRUE"]
    params: list[Any] = []

    def among(column: str, values: tuple[str, ...]) -> None:
        if values:
            clauses.append(f"list_contains(?::VARCHAR[], {alias}.{column})")
            params.append(list(values))

    among("dataset_id", flt.datasets)
    among("domain", flt.domains)
    among("agent_model", flt.agent_models)
    among("termination", flt.terminations)
    among("task_id", flt.task_ids)
    among("id", flt.trajectory_ids)
    if flt.outcomes and set(flt.outcomes) != set(OUTCOMES):
        parts = []
        if "success" in flt.outcomes:
            parts.append(f"{alias}.success")
        if "failure" in flt.outcomes:
            parts.append(f"NOT {alias}.success")
        if "unknown" in flt.outcomes:
            parts.append(f"({alias}.success IS NULL AND "
                         f"coalesce({alias}.outcome, '') <> 'error')")
        if "error" in flt.outcomes:
            parts.append(f"coalesce({alias}.outcome, '') = 'error'")
        clauses.append("(" + " OR ".join(parts) + ")")
    if flt.tool_error is True:
        clauses.append(f"coalesce({alias}.n_tool_errors, 0) > 0")
    elif flt.tool_error is False:
        clauses.append(f"coalesce({alias}.n_tool_errors, 0) = 0")
    if flt.tools_used:
        clauses.append(
            f"{alias}.id IN (SELECT trajectory_id FROM tool_calls "
            "WHERE list_contains(?::VARCHAR[], name))"
        )
        params.append(list(flt.tools_used))
    if flt.error_kinds and use_derived:
        clauses.append(
            f"{alias}.id IN (SELECT trajectory_id FROM trajectory_derived "
            "WHERE list_has_any(error_kinds, ?::VARCHAR[]))"
        )
        params.append(list(flt.error_kinds))
    elif flt.error_kinds:
        clauses.append(
            f"{alias}.id IN (SELECT trajectory_id FROM tool_calls WHERE error IS NOT NULL "
            f"AND list_contains(?::VARCHAR[], {error_kind_sql('error')}))"
        )
        params.append(list(flt.error_kinds))
    if flt.text.strip() and hits_table:
        clauses.append(f"{alias}.id IN (SELECT trajectory_id FROM {hits_table})")
    elif flt.text.strip():
        from trace_lib.store.search import scan_sql

        clauses.append(f"{alias}.id IN ({scan_sql(flt.text_system)})")
        params.append(flt.text.strip().lower())
    return " AND ".join(clauses), params


def _df(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any]) -> pd.DataFrame:
    return con.execute(sql, params).df()


def outcome_sql(alias: str = "t") -> str:
    return (
        f"CASE WHEN {alias}.success THEN 'success' WHEN NOT {alias}.success THEN 'failure' "
        f"WHEN {alias}.outcome = 'error' THEN 'error' ELSE 'unknown' END"
    )


# --------------------------------------------------------------------------- lists


def list_trajectories(
    con: duckdb.DuckDBPyConnection,
    flt: TrajectoryFilter | None = None,
    *,
    limit: int = 500,
    offset: int = 0,
    source: str | None = None,
) -> pd.DataFrame:
    """One row per trajectory (newest dataset first), with its first tool error.

    `source`: instead of `flt`, a relation holding exactly the filter's trajectories with
    the columns listed here (`overview_rollup.filtered`'s table: the filter evaluated
    once for the page's aggregates and its listing)."""
    where, params = filter_sql(con, flt) if source is None else ("TRUE", [])
    sql = f"""
        WITH f AS (
            SELECT t.* FROM {source or 'trajectories'} t WHERE {where}
            ORDER BY t.dataset_id, t.domain, try_cast(t.task_id AS BIGINT), t.task_id,
                     t.trial, t.id
            LIMIT ? OFFSET ?
        ),
        first_err AS (
            SELECT c.trajectory_id,
                   arg_min(c.name, c.message_idx * 1000 + c.call_idx) AS first_error_tool,
                   arg_min(c.error, c.message_idx * 1000 + c.call_idx) AS first_error
            FROM tool_calls c JOIN f ON f.id = c.trajectory_id
            WHERE c.error IS NOT NULL GROUP BY c.trajectory_id
        )
        SELECT f.id, d.name AS dataset, f.domain, f.task_id, f.trial, f.agent_model,
               {outcome_sql("f")} AS outcome, f.reward, f.termination,
               f.n_messages, f.n_tool_calls, coalesce(f.n_tool_errors, 0) AS n_tool_errors,
               e.first_error_tool, left(e.first_error, 120) AS first_error
        FROM f
        LEFT JOIN datasets d ON d.id = f.dataset_id
        LEFT JOIN first_err e ON e.trajectory_id = f.id
        ORDER BY f.dataset_id, f.domain, try_cast(f.task_id AS BIGINT), f.task_id,
                 f.trial, f.id
    """
    return _df(con, sql, [*params, int(limit), int(offset)])


def filter_options(
    con: duckdb.DuckDBPyConnection, flt: TrajectoryFilter | None = None
) -> pd.DataFrame:
    """Distinct values (with counts) of every filterable field: `field, value, label, n`.

    `n` counts trajectories, except for `tool` where it counts calls: distinct trajectories
    per tool cost a hash over every call (~250 ms at 100k trajectories); `tool_usage`
    gives both. `flt` narrows the counts; the page passes None so that choosing a domain
    does not hide the other domains from its own widget.
    """
    where, params = filter_sql(con, flt)
    # Unfiltered, the tool counts read tool_calls alone (no semi-join over 1M rows).
    scope = "" if where == "TRUE" else "WHERE c.trajectory_id IN (SELECT id FROM f)"
    scope_err = "WHERE c.error IS NOT NULL" + ("" if where == "TRUE" else
                                                " AND c.trajectory_id IN (SELECT id FROM f)")

    if derived.ready(con):  # the kinds derived at import: no regex per error
        scope_d = "" if where == "TRUE" else "WHERE d.trajectory_id IN (SELECT id FROM f)"
        kinds = f"""SELECT 'error_kind', k, k, count(*) FROM (
            SELECT unnest(d.error_kinds) AS k FROM {derived.TABLE} d {scope_d}
        ) GROUP BY 2"""
    else:
        kinds = f"""SELECT 'error_kind', k, k, count(*) FROM (
            SELECT DISTINCT c.trajectory_id, {error_kind_sql("c.error")} AS k
            FROM tool_calls c {scope_err}
        ) WHERE k IS NOT NULL GROUP BY 2"""
    sql = f"""
        WITH f AS (SELECT t.* FROM trajectories t WHERE {where})
        SELECT 'dataset' AS field, f.dataset_id AS value,
               any_value(coalesce(d.name, f.dataset_id)) AS label, count(*) AS n
        FROM f LEFT JOIN datasets d ON d.id = f.dataset_id GROUP BY f.dataset_id
        UNION ALL
        SELECT 'domain', domain, domain, count(*) FROM f WHERE domain IS NOT NULL GROUP BY 2
        UNION ALL
        SELECT 'agent_model', agent_model, agent_model, count(*) FROM f
        WHERE agent_model IS NOT NULL GROUP BY 2
        UNION ALL
        SELECT 'termination', termination, termination, count(*) FROM f
        WHERE termination IS NOT NULL GROUP BY 2
        UNION ALL
        SELECT 'outcome', {outcome_sql("f")}, {outcome_sql("f")}, count(*) FROM f GROUP BY 2
        UNION ALL
        SELECT 'tool', c.name, c.name, count(*) FROM tool_calls c {scope} GROUP BY 2
        UNION ALL
        {kinds}
    """
    out = _df(con, sql, params)
    return out.sort_values(["field", "n", "value"], ascending=[True, False, True]).reset_index(
        drop=True
    )


# ---------------------------------------------------------------------- aggregates


def outcome_summary(
    con: duckdb.DuckDBPyConnection, flt: TrajectoryFilter | None = None
) -> pd.DataFrame:
    """One row: counts by outcome, success rate over known outcomes, mean reward, sizes."""
    where, params = filter_sql(con, flt)
    sql = f"""
        SELECT count(*) AS n_trajectories,
               count(*) FILTER (WHERE success) AS n_success,
               count(*) FILTER (WHERE NOT success) AS n_failure,
               count(*) FILTER (WHERE success IS NULL AND coalesce(outcome, '') <> 'error')
                   AS n_unknown,
               count(*) FILTER (WHERE outcome = 'error') AS n_error,
               count(*) FILTER (WHERE success) / nullif(count(success), 0) AS success_rate,
               avg(reward) AS mean_reward,
               count(DISTINCT task_id) AS n_tasks,
               count(DISTINCT dataset_id) AS n_datasets,
               coalesce(sum(n_tool_calls), 0) AS n_tool_calls,
               coalesce(sum(n_tool_errors), 0) AS n_tool_errors
        FROM trajectories t WHERE {where}
    """
    return _df(con, sql, params)


def success_by_domain_agent(
    con: duckdb.DuckDBPyConnection, flt: TrajectoryFilter | None = None
) -> pd.DataFrame:
    """Success rate per (domain, agent model) over trajectories with a known outcome.

    Carries a Wilson 95% interval so that a bar over 5 trials does not read like one over
    500.
    """
    where, params = filter_sql(con, flt)
    return _df(con, success_by_domain_agent_sql(f"""
            SELECT coalesce(domain, '(none)') AS domain,
                   coalesce(agent_model, '(unknown)') AS agent_model,
                   count(*) AS n, count(success) AS n_known,
                   count(*) FILTER (WHERE success) AS n_success
            FROM trajectories t WHERE {where} GROUP BY ALL"""), params)


def success_by_domain_agent_sql(grouped: str) -> str:
    """The success-rate bars from `grouped`, a query of (domain, agent_model, n, n_known,
    n_success): the rate and its Wilson interval (also over the stored rollup,
    `explore.overview_rollup`)."""
    return f"""
        WITH g AS ({grouped}),
        r AS (SELECT *, n_success / nullif(n_known, 0) AS p FROM g)
        SELECT domain, agent_model, n, n_known, n_success, p AS success_rate,
               CASE WHEN n_known > 0 THEN
                 (p + 1.9208 / n_known - 1.96 * sqrt(p * (1 - p) / n_known
                   + 0.9604 / (n_known * n_known))) / (1 + 3.8416 / n_known) END AS ci_low,
               CASE WHEN n_known > 0 THEN
                 (p + 1.9208 / n_known + 1.96 * sqrt(p * (1 - p) / n_known
                   + 0.9604 / (n_known * n_known))) / (1 + 3.8416 / n_known) END AS ci_high
        FROM r ORDER BY domain, agent_model
    """


def termination_counts(
    con: duckdb.DuckDBPyConnection, flt: TrajectoryFilter | None = None
) -> pd.DataFrame:
    """Trajectories per (termination reason, outcome)."""
    where, params = filter_sql(con, flt)
    sql = f"""
        SELECT coalesce(termination, '(none)') AS termination,
               {outcome_sql()} AS outcome, count(*) AS n
        FROM trajectories t WHERE {where} GROUP BY ALL ORDER BY n DESC, termination, outcome
    """
    return _df(con, sql, params)


def tool_call_histogram(
    con: duckdb.DuckDBPyConnection, flt: TrajectoryFilter | None = None
) -> pd.DataFrame:
    """How many trajectories made k tool calls, per outcome."""
    where, params = filter_sql(con, flt)
    sql = f"""
        SELECT coalesce(n_tool_calls, 0) AS n_tool_calls, {outcome_sql()} AS outcome,
               count(*) AS n
        FROM trajectories t WHERE {where} GROUP BY ALL ORDER BY n_tool_calls, outcome
    """
    return _df(con, sql, params)


def _calls_scope(where: str) -> str:
    # Tool-call aggregates read tool_calls alone when unfiltered, else semi-join the
    # filtered trajectories (cheaper than joining every call to its trajectory row).
    if where == "TRUE":
        return "TRUE"
    return f"c.trajectory_id IN (SELECT t.id FROM trajectories t WHERE {where})"


def tool_usage(
    con: duckdb.DuckDBPyConnection, flt: TrajectoryFilter | None = None
) -> pd.DataFrame:
    """Per tool: calls, erroring calls, error rate, trajectories with an error from it.

    Distinct trajectories *using* a tool are left out on purpose: that count hashes every
    call (~250 ms at 100k trajectories); filter with `tools_used` to get it.
    """
    where, params = filter_sql(con, flt)
    sql = f"""
        SELECT c.name AS tool, count(*) AS n_calls, count(c.error) AS n_errors,
               count(c.error) / count(*) AS error_rate,
               count(DISTINCT CASE WHEN c.error IS NOT NULL THEN c.trajectory_id END)
                   AS n_trajectories_with_error
        FROM tool_calls c WHERE {_calls_scope(where)}
        GROUP BY c.name ORDER BY n_calls DESC, tool
    """
    return _df(con, sql, params)


ERROR_KINDS_LIMIT = 50  # (tool, kind) rows the page's table shows


def tool_error_kinds(
    con: duckdb.DuckDBPyConnection,
    flt: TrajectoryFilter | None = None,
    *,
    limit: int = ERROR_KINDS_LIMIT,
) -> pd.DataFrame:
    """Tool errors grouped by (tool, error kind), with one example text each."""
    where, params = filter_sql(con, flt)
    sql = f"""
        SELECT c.name AS tool, {error_kind_sql("c.error")} AS error_kind,
               count(*) AS n, count(DISTINCT c.trajectory_id) AS n_trajectories,
               left(min(c.error), 200) AS example
        FROM tool_calls c
        WHERE c.error IS NOT NULL AND {_calls_scope(where)}
        GROUP BY ALL ORDER BY n DESC, tool, error_kind LIMIT ?
    """
    return _df(con, sql, [*params, int(limit)])


# ------------------------------------------------------------------------ overview

# (stage, label, SQL) in the order the overview shows them. Each statement is guarded:
# a table missing from an old or foreign file counts as 0 rather than crashing the page.
_PIPELINE: tuple[tuple[str, str, str], ...] = (
    ("trajectories", "datasets", "SELECT count(*) FROM datasets"),
    ("trajectories", "trajectories", "SELECT count(*) FROM trajectories"),
    ("trajectories", "failures", "SELECT count(*) FROM trajectories WHERE NOT success"),
    ("trajectories", "tool calls", "SELECT count(*) FROM tool_calls"),
    ("diagnose", "label runs", "SELECT count(*) FROM label_runs"),
    ("diagnose", "labels", "SELECT count(*) FROM labels"),
    ("diagnose", "human edits", "SELECT count(*) FROM label_edits"),
    ("diagnose", "capabilities accepted",
     "SELECT count(*) FROM capabilities WHERE status = 'accepted'"),
    ("diagnose", "capabilities proposed",
     "SELECT count(*) FROM capabilities WHERE status = 'proposed'"),
    ("environments", "draft", "SELECT count(*) FROM environments WHERE status = 'draft'"),
    ("environments", "validated",
     "SELECT count(*) FROM environments WHERE status = 'validated'"),
    ("environments", "approved", "SELECT count(*) FROM environments WHERE status = 'approved'"),
    ("environments", "rejected", "SELECT count(*) FROM environments WHERE status = 'rejected'"),
    ("train", "jobs", "SELECT count(*) FROM jobs"),
    ("train", "jobs running",
     "SELECT count(*) FROM jobs WHERE status IN ('queued', 'running')"),
    ("train", "adapters", "SELECT count(*) FROM adapters"),
    ("compose", "composed models", "SELECT count(*) FROM moe_models"),
    ("compose", "routing traces", "SELECT count(*) FROM routing_traces"),
)


def pipeline_counts(
    con: duckdb.DuckDBPyConnection, flt: TrajectoryFilter | None = None
) -> pd.DataFrame:
    """Counts per pipeline stage for the overview: `stage, item, n`.

    `flt` is accepted for the common signature; the overview counts the whole store.
    """
    del flt
    present = {
        r[0]
        for r in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'"
        ).fetchall()
    }
    rows = []
    for stage, item, sql in _PIPELINE:
        table = sql.split(" FROM ")[1].split()[0]
        n = int(con.execute(sql).fetchone()[0]) if table in present else 0
        rows.append({"stage": stage, "item": item, "n": n})
    return pd.DataFrame(rows, columns=["stage", "item", "n"])
