"""Failure signatures: group failed trajectories by *how* they failed, in SQL.

Design decisions
- A signature is four levels, coarse to fine, so it draws as a treemap/sunburst and a
  prefix is itself a cluster:
  1. termination reason (user_stop, max_steps, too_many_errors, ...);
  2. the first tool that returned an error (or "(no tool error)");
  3. that error's kind (`store.derived.error_kind_sql`: ids and numbers masked);
  4. the first deviation from the benchmark's expected actions: the first expected
     action (in the benchmark's order) that no agent call reproduces — "missing: X" when
     the agent never called X, "wrong args: X" when it called X with other arguments;
     "(all expected actions made)" when every one was reproduced (the failure lies
     elsewhere: an extra write, a wrong answer), "(no expected actions)" when the
     benchmark ships none for the task. Each side is compared with its own calls: an
     expected action whose `requestor` is the user (tau2 telecom's device actions) is
     matched against the user simulator's calls and labelled as the user's
     ("missing (user): toggle_roaming"), never as a missing agent action.
- Matching is order-insensitive (positional matching would flag every interleaved read
  as a deviation) and by exact arguments compared as JSON with keys sorted at every depth
  (tau2 files hold the agent's nested keys sorted and the expected actions' as authored).
  The canonical form comes from a small Python UDF registered on the connection and is
  computed once per *distinct* argument text (far fewer than calls), then compared by a
  hash join.
- Everything runs in one SQL statement per call (aggregates with `arg_min` rather than
  window functions), so the page stays interactive at 100k trajectories.
- Only failures (`success = false`) get a signature; the filter narrows further.
- Computed once per trajectory, at import (`store.derived`: the `trajectory_derived`
  columns error_tool, error_kind, deviation); counts and members filter those rows. The
  SQL above is the definition, and the path for a store not (yet) derived.
- What a person reads (`shown_levels`, `path_label`): a failure with no tool error has
  "(no tool error)" as its tool and as its error kind, and drawn as they are the two read
  "(no tool error) › (no tool error)" (issue 34). The second is left out of the treemap's
  boxes and of the cluster picker's labels; the data keep all four levels, so a cluster's
  key and its members are unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from trace_lib.explore.queries import TrajectoryFilter, filter_sql
from trace_lib.store import derived
from trace_lib.store.connection import Connection
from trace_lib.store.derived import NO_ERROR, signature_parts_sql

LEVELS: tuple[str, ...] = ("termination", "error_tool", "error_kind", "deviation")
PATH_SEP = " / "


def shown_levels(levels: Sequence[str]) -> list[tuple[str, int]]:
    """The levels of a signature (or a prefix of one) a person reads, each with how many
    of the data's levels it stands for: the error kind is left out when the tool level
    already says there was no tool error."""
    out: list[tuple[str, int]] = []
    for depth, value in enumerate(levels, start=1):
        if depth == 3 and value == NO_ERROR and levels[1] == NO_ERROR:
            out[-1] = (out[-1][0], depth)
            continue
        out.append((str(value), depth))
    return out


def path_label(path: str) -> str:
    """A cluster key (levels joined by `PATH_SEP`) as a person reads it."""
    if not path:
        return path
    return PATH_SEP.join(v for v, _ in shown_levels(path.split(PATH_SEP)))


def _signature_sql(con: Connection, where: str) -> str:
    # Derived at import (one row per trajectory): filter them. A store whose rows are not
    # all derived yet (written before the derived table, or by hand) computes them here.
    if not derived.ready(con):
        return signature_parts_sql(con, where)
    return f"""
        WITH sig AS MATERIALIZED (
            SELECT t.id, t.dataset_id, t.task_id, t.termination, t.trial, t.agent_model,
                   t.domain, t.reward,
                   coalesce(t.termination, '(none)') AS sig_termination,
                   d.error_tool AS sig_error_tool, d.error_kind AS sig_error_kind,
                   d.deviation AS sig_deviation
            FROM trajectories t JOIN {derived.TABLE} d ON d.trajectory_id = t.id
            WHERE NOT t.success AND {where}
        )
    """


def failure_signatures(
    con: Connection,
    flt: TrajectoryFilter | None = None,
    *,
    limit: int = 100_000,
) -> pd.DataFrame:
    """One row per failed trajectory with its four signature levels."""
    where, params = filter_sql(con, flt)
    sql = _signature_sql(con, where) + """
        SELECT id AS trajectory_id, dataset_id, task_id, trial, domain, agent_model,
               sig_termination AS termination, sig_error_tool AS error_tool,
               sig_error_kind AS error_kind, sig_deviation AS deviation
        FROM sig ORDER BY termination, error_tool, error_kind, deviation, id LIMIT ?
    """
    return con.execute(sql, [*params, int(limit)]).df()


def signature_counts(
    con: Connection, flt: TrajectoryFilter | None = None
) -> pd.DataFrame:
    """Failures per full signature, largest first, with a `path` key and a few examples."""
    where, params = filter_sql(con, flt)
    sql = _signature_sql(con, where) + """
        SELECT sig_termination AS termination, sig_error_tool AS error_tool,
               sig_error_kind AS error_kind, sig_deviation AS deviation,
               count(*) AS n, count(DISTINCT task_id) AS n_tasks,
               list(id ORDER BY id)[1:3] AS examples
        FROM sig GROUP BY ALL
        ORDER BY n DESC, termination, error_tool, error_kind, deviation
    """
    out = con.execute(sql, params).df()
    out.insert(0, "path", [PATH_SEP.join(r) for r in out[list(LEVELS)].itertuples(index=False)])
    total = int(out["n"].sum()) if len(out) else 0
    out["share"] = out["n"] / total if total else 0.0
    return out


def signature_members(
    con: Connection,
    flt: TrajectoryFilter | None = None,
    *,
    path: Sequence[str] = (),
    limit: int = 500,
) -> pd.DataFrame:
    """The failed trajectories whose signature starts with `path` (1 to 4 levels)."""
    path = list(path)
    if len(path) > len(LEVELS):
        raise ValueError(f"signature path has {len(path)} levels; at most {len(LEVELS)}")
    where, params = filter_sql(con, flt)
    conds = " AND ".join(f"sig_{lvl} = ?" for lvl in LEVELS[: len(path)]) or "TRUE"
    sql = _signature_sql(con, where) + f"""
        SELECT id AS trajectory_id, task_id, trial, domain, agent_model, reward,
               sig_termination AS termination, sig_error_tool AS error_tool,
               sig_error_kind AS error_kind, sig_deviation AS deviation
        FROM sig WHERE {conds}
        ORDER BY try_cast(task_id AS BIGINT), task_id, trial, id LIMIT ?
    """
    args: list[Any] = [*params, *path, int(limit)]
    return con.execute(sql, args).df()

