"""Writing a result the pages read back (`rank_stored`, `explore_stored`): a cache fill.

Design decisions
- A stored first-visit result is a cache of what the store's data already says: losing a
  write loses nothing but time. So a fill on a read-only connection is skipped, and a
  fill that lost a write race to another connection (DuckDB's optimistic concurrency:
  `TransactionException`) is rolled back and reported False; the other writer stored the
  same result for the same inputs and version.
- Anything else (a bug, a full disk) rolls back and raises: the store stays as it was.
- One transaction per fill, so a reader sees a key's old rows or its new ones, never half.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import duckdb

from trace_lib.store.connection import Connection


def read_only(con: Connection) -> bool:
    return con.execute("SELECT current_setting('access_mode')").fetchall()[0][0] == "read_only"


def fill(con: Connection, write: Callable[[], None]) -> bool:
    """Run `write` (its statements) in one transaction; False when the connection is
    read-only or another connection's write won the race, True when stored."""
    if read_only(con):
        return False
    con.execute("BEGIN TRANSACTION")
    try:
        write()
        con.execute("COMMIT")
        return True
    except duckdb.TransactionException:
        with contextlib.suppress(duckdb.Error):
            con.execute("ROLLBACK")
        return False
    except BaseException:
        con.execute("ROLLBACK")
        raise
