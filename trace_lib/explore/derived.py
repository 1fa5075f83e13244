"""The import hook and the reindex of derived columns and the full-text index.

Design decisions
- The `trajectory_derived` table, its column definitions and `derive_missing` are the
  store's (`store.derived`); this module ties them to explore's full-text index, which
  lives beside the database file (`store.search`).
- Rows are computed when a trajectory is imported, inside the import's transaction
  (`on_import`): an aborted import leaves no derived row, as it leaves no trajectory. The
  full-text index is written by the same hook (`search.pending_index`), committed after
  DuckDB's commit.
- `rebuild` (`explore reindex`) backfills a store written before the derived table
  existed and rebuilds the index: readers fall back to the raw tables until then
  (`store.derived.ready`), so answers stay right, only slower.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from trace_lib import store
from trace_lib.store import derived as store_derived


@contextlib.contextmanager
def on_import(con: store.Connection | None, db: str | Path) -> Iterator[None]:
    """Wrap an import's commit: derive the new trajectories' rows and write their search
    documents while the import's transaction is open; the search index commits only if
    the body (DuckDB's COMMIT) succeeds. `con` None (nothing was written) does nothing."""
    from trace_lib.store import search

    if con is None:
        yield
        return
    store_derived.derive_missing(con)
    with search.pending_index(con, db):
        yield


def rebuild(con: store.Connection, db: str | Path) -> dict[str, int]:
    """Backfill derived rows and rebuild the search index (`explore reindex`)."""
    from trace_lib.store import search

    with store.transaction(con):
        n_derived = store_derived.derive_missing(con)
    return {"derived": n_derived, "indexed": search.rebuild(con, db)}
