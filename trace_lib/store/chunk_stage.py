"""A set of trajectories with their messages and tool calls, staged once in chunks, so SQL
written over the store's tables can run a chunk at a time in linear time.

Design decisions
- What an import's commit computes for its new trajectories (`derived` rows, `search`
  documents) is SQL over `trajectories`, `messages` and `tool_calls`, a chunk of 50k
  trajectories at a time so that memory is a chunk's texts. Picking a chunk by its ids
  in the whole tables made every chunk read the whole messages table: O(new x stored),
  200 chunks x 35M messages for a 10M import (bench/README, session 24).
- Here the set's rows are copied once into temp tables with their chunk number and
  sorted by it (one join and one sort; DuckDB spills both past its memory limit), so a
  chunk's query reads its own row groups (zone maps on the sorted column) and the whole
  pass is linear in the set.
- A chunk is read under the tables' own names: each of `Stage.prefixes()` is a WITH clause whose
  CTEs `trajectories`, `messages` and `tool_calls` shadow the tables, and callers run
  `{prefix} SELECT * FROM ({their SQL})`. The SQL definitions (`derived`, `search`) stay
  the one definition and run unchanged on a chunk or on the whole store.
- A trajectory's chunk is a hash of its id, so no window over the set is sorted; chunks
  vary in size by a few hundred rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from trace_lib.store.connection import Connection

CHUNK = 50_000  # trajectories per chunk (their texts are what a chunk's query holds)
# table -> its column naming the trajectory
TABLES: dict[str, str] = {"trajectories": "id", "messages": "trajectory_id",
                          "tool_calls": "trajectory_id"}


@dataclass(frozen=True)
class Stage:
    n: int  # trajectories staged
    n_chunks: int

    def prefixes(self) -> Iterator[str]:
        """Per chunk, the WITH clause that makes the three tables read that chunk only
        (none when nothing was staged)."""
        for k in range(self.n_chunks if self.n else 0):
            yield "WITH " + ", ".join(
                f"{t} AS (SELECT * EXCLUDE (chunk) FROM _stage_{t} WHERE chunk = {k})"
                for t in TABLES) + " "


@contextlib.contextmanager
def staged(con: Connection, ids_sql: str, chunk: int | None = None) -> Iterator[Stage]:
    """Stage the trajectories whose ids `ids_sql` selects (one column, `id`), `chunk`
    (default `CHUNK`) to a chunk; the temp tables are dropped on exit."""
    chunk = chunk or CHUNK
    try:
        # `ids_sql` is an anti-join over the store (what has no row yet): run it once.
        # Each id's hash once here, not once per message and call row of the join below.
        con.execute(f"CREATE OR REPLACE TEMP TABLE _stage_ids AS "
                    f"SELECT id, hash(id) AS h FROM ({ids_sql})")
        n = int(con.execute("SELECT count(*) FROM _stage_ids").fetchall()[0][0])
        n_chunks = max(1, -(-n // chunk))
        for table, column in TABLES.items():
            if n == 0:  # the same empty shape, without reading the table
                con.execute(f"CREATE OR REPLACE TEMP TABLE _stage_{table} AS "
                            f"SELECT 0::UBIGINT AS chunk, * FROM {table} LIMIT 0")
                continue
            con.execute(f"CREATE OR REPLACE TEMP TABLE _stage_{table} AS "
                        f"SELECT s.h % {n_chunks} AS chunk, x.* FROM {table} x "
                        f"JOIN _stage_ids s ON s.id = x.{column} ORDER BY chunk")
        yield Stage(n, n_chunks)
    finally:
        for table in ("ids", *TABLES):
            con.execute(f"DROP TABLE IF EXISTS _stage_{table}")
