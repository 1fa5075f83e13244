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
import pyarrow as pa

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


def _derive_chunk(con: duckdb.DuckDBPyConnection, scope: str) -> None:
    from trace_lib.explore.clusters import signature_parts_sql
    from trace_lib.explore.embeddings import trajectory_texts_sql
    from trace_lib.explore.queries import error_kind_sql

    texts = trajectory_texts_sql(con, scope, [])
    hashes = pa.table({
        "trajectory_id": pa.array(texts.trajectory_id.tolist(), pa.string()),
        "text_sha256": pa.array(texts.text_sha256.tolist(), pa.string()),
    })
    del texts
    # A temp table copied from the Arrow table, not con.register: a registered table stays
    # referenced until the transaction commits, so every chunk would be held to the end.
    con.from_arrow(hashes).create("_derive_texts")
    del hashes
    sql = f"""
        INSERT INTO {TABLE} (trajectory_id, error_kinds, error_tool, error_kind,
                             deviation, text_sha256)
        {signature_parts_sql(con, scope, failures_only=False)},
        kinds AS (
            SELECT c.trajectory_id,
                   list(DISTINCT {error_kind_sql("c.error")}) FILTER (
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
