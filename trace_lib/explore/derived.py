"""Derived columns: what the Trajectories page would otherwise recompute on every rerun.

Design decisions
- One row per trajectory in `trajectory_derived` (store migration `_EXPLORE_DERIVED`):
  the distinct kinds of its tool errors (`error_kinds`, what the error-kind filter and its
  widget's counts read), its failure-signature levels (`error_tool`, `error_kind`,
  `deviation`: `clusters.signature_parts_sql` is the definition) and the sha256 of its
  embedding text (`text_sha256`, `embeddings.trajectory_texts` is the definition), so
  "which vectors are missing" is one SQL join instead of 400k texts rebuilt in Python.
- Everything here depends only on what an import writes at once (a trajectory's messages
  and calls, its dataset's expected actions), so rows are computed once, when the
  trajectory is imported, inside the import's transaction (`on_import`): an aborted
  import leaves no derived row, as it leaves no trajectory. Rows are only inserted, never
  updated; deleting a dataset deletes its rows with the trajectories (`workbench.data`
  finds the table by its `trajectory_id` column).
- `derive_missing` computes the rows of every trajectory that has none: the same call
  fills a new import, backfills a store written before this table existed (at its next
  import, or with `explore reindex`), and repairs rows written with plain SQL (fixtures,
  bench replication).
- Readers use the rows only when every trajectory has one (`ready`); otherwise they fall
  back to computing from the raw tables, so a store opened read-only before its backfill
  still answers correctly, only slower.
- The full-text index is written by the same hook (`search.pending_index`), committed
  after DuckDB's commit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import duckdb

TABLE = "trajectory_derived"
_NEW = "_derive_new"
_NEW_CHUNK = "_derive_chunk"
_CHUNK = 50_000


def table_exists(con: duckdb.DuckDBPyConnection) -> bool:
    return bool(con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'main' "
        "AND table_name = ?", [TABLE]).fetchall()[0][0])


# `SET VARIABLE trace_computed_paths = true` on a connection makes its readers take the
# computed paths (raw tables, the text scan as a subquery): bench/explore.py's named peer.
PEER_VARIABLE = "trace_computed_paths"


def computed_paths(con: duckdb.DuckDBPyConnection) -> bool:
    """True when the connection asks for the computed (pre-derived, pre-index) paths."""
    return bool(con.execute(f"SELECT coalesce(getvariable('{PEER_VARIABLE}'), false)"
                            ).fetchall()[0][0])


def ready(con: duckdb.DuckDBPyConnection) -> bool:
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


def derive_missing(con: duckdb.DuckDBPyConnection) -> int:
    """Insert the derived row of every trajectory without one; returns how many.

    Needs a writable, migrated connection. Runs inside the caller's transaction if any.
    """
    con.execute(f"CREATE OR REPLACE TEMP TABLE {_NEW} AS SELECT id FROM trajectories "
                f"WHERE id NOT IN (SELECT trajectory_id FROM {TABLE})")
    try:
        n = int(con.execute(f"SELECT count(*) FROM {_NEW}").fetchall()[0][0])
        # A chunk at a time: the embedding texts of a 1M import at once are ~800 MiB.
        for start in range(0, n, _CHUNK):
            con.execute(f"CREATE OR REPLACE TEMP TABLE {_NEW_CHUNK} AS SELECT id FROM {_NEW} "
                        f"ORDER BY id LIMIT {_CHUNK} OFFSET {start}")
            _derive_chunk(con, f"t.id IN (SELECT id FROM {_NEW_CHUNK})")
        return n
    finally:
        con.execute(f"DROP TABLE IF EXISTS {_NEW}")
        con.execute(f"DROP TABLE IF EXISTS {_NEW_CHUNK}")


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

    The text is `embeddings.compose_text` over `embeddings.trajectory_texts_sql`'s parts
    (the definition; `tests/explore/test_derived.py` checks both agree on hard strings:
    code points, not bytes, are cut; `strip()`'s whitespace set; code-point sort order).
    Computing it here instead of fetching every trajectory's parts into Python to join
    and hash them: 0.4 s of CPU instead of 1.0 s per 100k trajectories at import
    (bench/ingest.py's file, measured side by side).
    """
    from trace_lib.explore.embeddings import TEXT_CHARS, text_parts_sql

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


def _derive_chunk(con: duckdb.DuckDBPyConnection, scope: str) -> None:
    from trace_lib.explore.clusters import signature_parts_sql
    from trace_lib.explore.queries import error_kind_sql

    # A temp table, not con.register of an Arrow table: a registered table stays
    # referenced until the transaction commits, so every chunk would be held to the end.
    con.execute(f"CREATE TEMP TABLE _derive_texts AS {_text_sha256_sql(scope)}")
    sql = f"""
        INSERT INTO {TABLE} (trajectory_id, error_kinds, error_tool, error_kind,
                             deviation, text_sha256)
        {signature_parts_sql(con, scope, failures_only=False)},
        kinds AS (
            SELECT c.trajectory_id,
                   -- sorted: DISTINCT alone gives the kinds in any order, run to run
                   list(DISTINCT {error_kind_sql("c.error")}
                        ORDER BY {error_kind_sql("c.error")}) FILTER (
                       WHERE {error_kind_sql("c.error")} IS NOT NULL) AS kinds
            FROM tool_calls c JOIN trajectories t ON t.id = c.trajectory_id
            WHERE c.error IS NOT NULL AND {scope}
            GROUP BY 1
        )
        SELECT s.id, coalesce(k.kinds, []::VARCHAR[]), s.sig_error_tool,
               s.sig_error_kind, s.sig_deviation, x.text_sha256
        FROM sig s
        LEFT JOIN kinds k ON k.trajectory_id = s.id
        LEFT JOIN _derive_texts x ON x.trajectory_id = s.id
    """
    try:
        con.execute(sql)
    finally:
        con.execute("DROP TABLE IF EXISTS _derive_texts")


@contextlib.contextmanager
def on_import(con: duckdb.DuckDBPyConnection | None, db: str | Path) -> Iterator[None]:
    """Wrap an import's commit: derive the new trajectories' rows and write their search
    documents while the import's transaction is open; the search index commits only if
    the body (DuckDB's COMMIT) succeeds. `con` None (nothing was written) does nothing."""
    from trace_lib.explore import search

    if con is None:
        yield
        return
    derive_missing(con)
    with search.pending_index(con, db):
        yield


def rebuild(con: duckdb.DuckDBPyConnection, db: str | Path) -> dict[str, int]:
    """Backfill derived rows and rebuild the search index (`explore reindex`)."""
    from trace_lib.explore import search

    con.execute("BEGIN TRANSACTION")
    try:
        n_derived = derive_missing(con)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return {"derived": n_derived, "indexed": search.rebuild(con, db)}
