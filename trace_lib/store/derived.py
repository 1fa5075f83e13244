"""The `trajectory_derived` table: per-trajectory columns computed once, at import, and
the SQL definitions of those columns (error kind, failure-signature levels, the parts of
the embedding text).

Design decisions
- One row per trajectory (store migration `EXPLORE_DERIVED`): the distinct kinds of its
  tool errors (`error_kinds`, what the error-kind filter and its widget's counts read),
  its failure-signature levels (`error_tool`, `error_kind`, `deviation`:
  `signature_parts_sql` is the definition) and the sha256 of its embedding text
  (`text_sha256`; `text_parts_sql` here and `explore.embeddings.compose_text` are the
  definition), so "which vectors are missing" is one SQL join instead of 400k texts
  rebuilt in Python.
- The column definitions live here, beside the table they fill, and are imported by
  every explore module that reads them (`explore.queries`, `explore.clusters`,
  `explore.embeddings`): one home, so the explore modules import this module and never
  each other in a circle.
- Everything here depends only on what an import writes at once (a trajectory's messages
  and calls, its dataset's expected actions), so rows are computed once, when the
  trajectory is imported, inside the import's transaction (`on_import`): an aborted
  import leaves no derived row, as it leaves no trajectory. The same hook writes the new
  trajectories' documents into the full-text index (`store.search.pending_index`), which
  commits after DuckDB's commit. Rows are only
  inserted, never updated; deleting a dataset deletes its rows with the trajectories
  (`store.trajectories.delete_dataset_rows` finds the table by its `trajectory_id`).
- `derive_missing` computes the rows of every trajectory that has none: the same call
  fills a new import, backfills a store written before this table existed (at its next
  import, or with `explore reindex`: `rebuild`, which also rebuilds the index), and repairs rows written with plain SQL (fixtures,
  bench replication).
- Readers use the rows only when every trajectory has one (`ready`); otherwise they fall
  back to computing from the raw tables, so a store opened read-only before its backfill
  still answers correctly, only slower.
- Error kinds are computed in SQL from the tool's error text: prefixes like "Error:"
  dropped, quoted values and any token holding a digit replaced by `<id>`, whitespace
  collapsed, lower-cased, cut at 60 characters. "Reservation ZFA04Y not found" and
  "Reservation 8JX2 not found" are one kind; the rule is crude on purpose, stable and
  explainable, and it is the same everywhere (charts, signatures, CLI).
- The failure signature's matching of expected actions is described in
  `explore.clusters`; its canonical JSON comes from a small Python UDF registered on the
  connection, computed once per distinct argument text.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from duckdb.sqltypes import VARCHAR

from trace_lib.store import chunk_stage, search
from trace_lib.store.connection import Connection, transaction

TABLE = "trajectory_derived"


def table_exists(con: Connection) -> bool:
    return bool(con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'main' "
        "AND table_name = ?", [TABLE]).fetchall()[0][0])


# `SET VARIABLE trace_computed_paths = true` on a connection makes its readers take the
# computed paths (raw tables, the text scan as a subquery): bench/explore.py's named peer.
PEER_VARIABLE = "trace_computed_paths"


def computed_paths(con: Connection) -> bool:
    """True when the connection asks for the computed (pre-derived, pre-index) paths."""
    return bool(con.execute(f"SELECT coalesce(getvariable('{PEER_VARIABLE}'), false)"
                            ).fetchall()[0][0])


def ready(con: Connection) -> bool:
    """True when every trajectory has its derived row (readers may use the columns)."""
    if not table_exists(con) or computed_paths(con):
        return False
    n_traj, n_derived = con.execute(
        f"SELECT (SELECT count(*) FROM trajectories), (SELECT count(*) FROM {TABLE})"
    ).fetchall()[0]
    if n_derived == n_traj:
        return True
    if n_derived < n_traj:
        return False
    # More rows than trajectories cannot happen through the importer (rows go with their
    # trajectories); check exactly rather than trust the counts.
    return not con.execute(
        f"SELECT count(*) FROM trajectories WHERE id NOT IN (SELECT trajectory_id FROM {TABLE})"
    ).fetchall()[0][0]


def derive_missing(con: Connection) -> int:
    """Insert the derived row of every trajectory without one; returns how many.

    Needs a writable, migrated connection. Runs inside the caller's transaction if any.
    A chunk of trajectories at a time (the embedding texts of a 1M import at once are
    ~800 MiB), staged once so the whole pass is linear (`chunk_stage`).
    """
    missing = f"SELECT id FROM trajectories WHERE id NOT IN (SELECT trajectory_id FROM {TABLE})"
    with chunk_stage.staged(con, missing) as stage:
        for prefix in stage.prefixes():
            _derive_chunk(con, prefix)
        return stage.n


# Python's `str.strip()` strips exactly the characters for which `str.isspace()` holds;
# DuckDB's `trim(s, chars)` strips the given ones, so the same set is spelt out.
# Spelt out, not computed at import: a scan of every code point cost ~0.1 s of CPU in each
# process that imports the importer (tests/explore/test_derived.py checks it against
# `str.isspace` over every code point of this Python's Unicode).
_PY_WHITESPACE = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005"
    "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)


def _text_sha256_sql(scope: str) -> str:
    """`trajectory_id, text_sha256` of the trajectories matching `scope`, in SQL.

    The text is `explore.embeddings.compose_text` over `text_parts_sql`
    (the definition; `tests/explore/test_derived.py` checks both agree on hard strings:
    code points, not bytes, are cut; `strip()`'s whitespace set; code-point sort order).
    Computing it here instead of fetching every trajectory's parts into Python to join
    and hash them: 0.4 s of CPU instead of 1.0 s per 100k trajectories at import
    (bench/ingest.py's file, measured side by side).
    """
    req_n, err_n, turn_n = TEXT_CHARS
    ws = "(" + " || ".join(f"chr({ord(c)})" for c in _PY_WHITESPACE) + ")"

    def strip(x: str) -> str:
        # trim() with a character set costs per row; most texts neither start nor end
        # with whitespace, and then stripping them changes nothing (~0.2 s per 100k).
        return (f"(CASE WHEN {x} = '' OR contains({ws}, left({x}, 1)) "
                f"OR contains({ws}, right({x}, 1)) THEN trim({x}, {ws}) ELSE {x} END)")

    return text_parts_sql(scope) + f"""
        SELECT f.id AS trajectory_id, sha256(
            'User request: ' || left({strip("coalesce(u.request, '')")}, {req_n})
            || CASE WHEN coalesce(len(e.errors), 0) = 0 THEN '' ELSE chr(10) || 'Tool errors: '
                    || left(array_to_string(list_sort(e.errors, 'ASC'), ' | '), {err_n}) END
            || CASE WHEN coalesce(len(a.last_turns), 0) = 0 THEN ''
                    ELSE chr(10) || 'Agent''s last turns: ' || left(array_to_string(
                        list_transform(list_reverse(a.last_turns), lambda x: {strip('x')}), ' | '),
                        {turn_n}) END
        ) AS text_sha256
        FROM f LEFT JOIN u ON u.trajectory_id = f.id
        LEFT JOIN a ON a.trajectory_id = f.id LEFT JOIN e ON e.trajectory_id = f.id
    """


def _derive_chunk(con: Connection, prefix: str) -> None:
    """The rows of the trajectories `prefix` (a `chunk_stage` chunk) makes the tables hold."""
    # A temp table, not con.register of an Arrow table: a registered table stays
    # referenced until the transaction commits, so every chunk would be held to the end.
    con.execute(f"CREATE TEMP TABLE _derive_texts AS {prefix} "
                f"SELECT * FROM ({_text_sha256_sql('true')})")
    sql = f"""
        INSERT INTO {TABLE} (trajectory_id, error_kinds, error_tool, error_kind,
                             deviation, text_sha256)
        {prefix} SELECT * FROM (
        {signature_parts_sql(con, 'true', failures_only=False)},
        kinds AS (
            SELECT c.trajectory_id,
                   -- sorted: DISTINCT alone gives the kinds in any order, run to run
                   list(DISTINCT {error_kind_sql("c.error")}
                        ORDER BY {error_kind_sql("c.error")}) FILTER (
                       WHERE {error_kind_sql("c.error")} IS NOT NULL) AS kinds
            FROM tool_calls c
            WHERE c.error IS NOT NULL
            GROUP BY 1
        )
        SELECT s.id, coalesce(k.kinds, []::VARCHAR[]), s.sig_error_tool,
               s.sig_error_kind, s.sig_deviation, x.text_sha256
        FROM sig s
        LEFT JOIN kinds k ON k.trajectory_id = s.id
        LEFT JOIN _derive_texts x ON x.trajectory_id = s.id)
    """
    try:
        con.execute(sql)
    finally:
        con.execute("DROP TABLE IF EXISTS _derive_texts")


@contextlib.contextmanager
def on_import(con: Connection | None, db: str | Path) -> Iterator[None]:
    """Wrap an import's commit: derive the new trajectories' rows and write their search
    documents while the import's transaction is open; the search index commits only if
    the body (DuckDB's COMMIT) succeeds. `con` None (nothing was written) does nothing."""
    if con is None:
        yield
        return
    derive_missing(con)
    with search.pending_index(con, db):
        yield


def rebuild(con: Connection, db: str | Path) -> dict[str, int]:
    """Backfill derived rows and rebuild the search index (`explore reindex`)."""
    with transaction(con):
        n_derived = derive_missing(con)
    return {"derived": n_derived, "indexed": search.rebuild(con, db)}

# ------------------------------------------------------------- column definitions

TEXT_CHARS = (600, 400, 900)  # user request, tool errors, agent's last turns


def error_kind_sql(column: str) -> str:
    """SQL expression mapping a tool's error text to its kind (see module docstring)."""
    text = f"regexp_replace({column}, '^\\s*(error|exception)?\\s*[:\\-]?\\s*', '', 'i')"
    text = f"regexp_replace({text}, '''[^'']*''|\"[^\"]*\"', '<id>', 'g')"
    text = f"regexp_replace({text}, '[^\\s,.;:()]*[0-9][^\\s,.;:()]*', '<id>', 'g')"
    text = f"regexp_replace({text}, '\\s+', ' ', 'g')"
    return f"nullif(left(trim(lower({text})), 60), '')"


def text_parts_sql(where: str) -> str:
    """The WITH clause behind a trajectory's embedding text, for the trajectories matching a
    SQL condition over `t`: `f` (their ids), `u` (first user request), `a` (last three
    agent turns, newest first), `e` (distinct "tool: error" texts). One definition for the
    texts (`trajectory_texts_sql`) and for their hash computed at import (`derived`)."""
    return f"""
        WITH f AS (SELECT t.id FROM trajectories t WHERE {where}),
        u AS (
            SELECT m.trajectory_id, arg_min(m.content, m.idx) AS request
            FROM messages m JOIN f ON f.id = m.trajectory_id
            WHERE m.role = 'user' AND coalesce(m.content, '') <> '' GROUP BY 1
        ),
        a AS (
            SELECT m.trajectory_id, list(m.content ORDER BY m.idx DESC)[1:3] AS last_turns
            FROM messages m JOIN f ON f.id = m.trajectory_id
            WHERE m.role = 'assistant' AND coalesce(m.content, '') <> '' GROUP BY 1
        ),
        e AS (
            SELECT c.trajectory_id, list(DISTINCT c.name || ': ' || c.error) AS errors
            FROM tool_calls c JOIN f ON f.id = c.trajectory_id
            WHERE c.error IS NOT NULL GROUP BY 1
        )
    """


def text_parts(con: Connection, where: str, params: list[Any]
               ) -> list[tuple[str, str | None, list[str] | None, list[str] | None]]:
    """(trajectory_id, first user request, distinct "tool: error" texts, last three agent
    turns newest first) of the trajectories matching a SQL condition over `t`, by id."""
    return con.execute(text_parts_sql(where) + """
        SELECT f.id AS trajectory_id, u.request, e.errors, a.last_turns
        FROM f LEFT JOIN u ON u.trajectory_id = f.id
        LEFT JOIN a ON a.trajectory_id = f.id LEFT JOIN e ON e.trajectory_id = f.id
        ORDER BY f.id
    """, params).fetchall()


NO_ERROR = "(no tool error)"
NO_EXPECTED = "(no expected actions)"
ALL_MADE = "(all expected actions made)"


CANON_UDF = "trace_canonical_json"


def _canonical_json(text: str | None) -> str | None:
    # Recursive sort_keys: the same canonical form `transcript.canonical_json` uses, so the
    # signature and the transcript's "expected vs actual" never disagree.
    if text is None:
        return None
    try:
        return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False)
    except ValueError:
        return text


def _ensure_udf(con: Connection) -> None:
    registered = con.execute(
        "SELECT count(*) FROM duckdb_functions() WHERE function_name = ?", [CANON_UDF]
    ).fetchall()[0][0]
    if not registered:
        con.create_function(CANON_UDF, _canonical_json, [VARCHAR], VARCHAR,
                            null_handling="special", side_effects=False)


def signature_parts_sql(con: Connection, where: str,
                        failures_only: bool = True) -> str:
    """The CTEs (`WITH ... sig AS (...)`) that compute every signature level from the raw
    tables for the trajectories matching `where` (failures only unless told). The
    importer runs it once per new trajectory (`derive_missing`); pages read the result."""
    _ensure_udf(con)
    # A store opened read-only is not migrated: older files have no expected requestor.
    has_req = con.execute(
        "SELECT count(*) FROM information_schema.columns WHERE table_name = 'expected_actions' "
        "AND column_name = 'requestor'").fetchone()[0]
    exp_side = ("CASE WHEN e.requestor = 'user' THEN 'user' ELSE 'assistant' END"
                if has_req else "'assistant'")
    return f"""
        WITH f AS MATERIALIZED (
            SELECT t.id, t.dataset_id, t.task_id, t.termination, t.trial, t.agent_model,
                   t.domain, t.reward
            FROM trajectories t WHERE {"NOT t.success AND " if failures_only else ""}{where}
        ),
        first_err AS MATERIALIZED (
            SELECT c.trajectory_id,
                   arg_min(c.name, c.message_idx * 1000 + c.call_idx) AS tool,
                   arg_min(c.error, c.message_idx * 1000 + c.call_idx) AS err
            FROM tool_calls c JOIN f ON f.id = c.trajectory_id
            WHERE c.error IS NOT NULL GROUP BY c.trajectory_id
        ),
        exp0 AS MATERIALIZED (
            SELECT f.id AS trajectory_id, e.idx, e.name, {exp_side} AS side,
                   coalesce(json(e.arguments)::VARCHAR, '{{}}') AS args
            FROM f JOIN expected_actions e
              ON e.dataset_id = f.dataset_id AND e.task_id = f.task_id
        ),
        calls0 AS MATERIALIZED (
            SELECT DISTINCT c.trajectory_id, c.name,
                   CASE WHEN c.requestor = 'user' THEN 'user' ELSE 'assistant' END AS side,
                   coalesce(json(c.arguments)::VARCHAR, '{{}}') AS args
            FROM tool_calls c
            WHERE c.trajectory_id IN (SELECT trajectory_id FROM exp0)
              AND c.name IN (SELECT name FROM exp0)
        ),
        canon AS MATERIALIZED (
            SELECT args, {CANON_UDF}(args) AS canon
            FROM (SELECT args FROM exp0 UNION SELECT args FROM calls0)
        ),
        exp AS MATERIALIZED (
            SELECT x.trajectory_id, x.idx, x.name, x.side, k.canon
            FROM exp0 x JOIN canon k ON k.args = x.args
        ),
        calls AS MATERIALIZED (
            SELECT c.trajectory_id, c.name, c.side, k.canon
            FROM calls0 c JOIN canon k ON k.args = c.args
        ),
        exp_status AS MATERIALIZED (
            SELECT x.trajectory_id, x.idx, x.name, x.side,
                   coalesce(bool_or(c.canon = x.canon), false) AS exact,
                   count(c.name) > 0 AS named
            FROM exp x LEFT JOIN calls c
              ON c.trajectory_id = x.trajectory_id AND c.name = x.name AND c.side = x.side
            GROUP BY x.trajectory_id, x.idx, x.name, x.side
        ),
        dev AS MATERIALIZED (
            SELECT trajectory_id,
                   arg_min(CASE WHEN named THEN 'wrong args' ELSE 'missing' END
                           || CASE WHEN side = 'user' THEN ' (user)' ELSE '' END
                           || ': ' || name,
                           idx) FILTER (WHERE NOT exact) AS deviation
            FROM exp_status GROUP BY trajectory_id
        ),
        sig AS MATERIALIZED (
            SELECT f.*,
                   coalesce(f.termination, '(none)') AS sig_termination,
                   coalesce(e.tool, '{NO_ERROR}') AS sig_error_tool,
                   CASE WHEN e.trajectory_id IS NULL THEN '{NO_ERROR}'
                        ELSE coalesce({error_kind_sql("e.err")}, '(empty error)') END
                       AS sig_error_kind,
                   CASE WHEN d.trajectory_id IS NULL THEN '{NO_EXPECTED}'
                        ELSE coalesce(d.deviation, '{ALL_MADE}') END AS sig_deviation
            FROM f
            LEFT JOIN first_err e ON e.trajectory_id = f.id
            LEFT JOIN dev d ON d.trajectory_id = f.id
        )
    """
