"""The Trajectories page's stored whole-store view: the `explore_stored` table and the
fingerprint of what it depends on.

Design decisions
- What is stored is what the page's first visit shows before any filter is touched: the
  filter widgets' options and every overview frame of the unfiltered store (issue 35,
  part 2). `explore.overview_stored` decides what to store and when; this module only
  reads and writes it, one row per frame, its bytes opaque here (Parquet: the frames come
  back with their dtypes, equal to the computed ones).
- A row is keyed by its inputs (`key`, a JSON text the caller builds) and carries the
  fingerprint of the trajectories it was computed for (`version`). `fingerprint` hashes
  every column the view shows: the trajectories' own columns, every tool call's (name,
  error) and the datasets' names, so an import, a deleted dataset, a renamed one and a
  plain SQL write are all noticed, the way `materialise` notices label writes. It is one
  scan of two tables (0.04-0.1 s at 1M trajectories on the loaded bench box, ~10x at 10M:
  still a tenth of what it spares). Labels, edits and the search index do not enter: the
  view shows none of them.
- `read` answers only for the fingerprint it is asked about; `write` is one transaction
  that drops every row of another version and keeps at most `KEEP` keys of the current
  one. A read-only connection, or a store migrated before this table, stores nothing and
  reads nothing (None): storing is a cache fill, never a reason for a reader to fail.
"""

from __future__ import annotations

import hashlib

from trace_lib.store import cache_fill
from trace_lib.store.connection import Connection

TABLE = "explore_stored"
KEEP = 4  # keys of the current version kept (today one: the unfiltered view)


def _table_exists(con: Connection) -> bool:
    return bool(con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'main' "
        "AND table_name = ?", [TABLE]).fetchall()[0][0])


def fingerprint(con: Connection) -> str:
    """A short hash that changes whenever anything the unfiltered view shows may change."""
    row = con.execute("""
        SELECT (SELECT count(*) || ':' || coalesce(bit_xor(hash(
                    id, dataset_id, source_id, task_id, trial, agent_model, domain, reward,
                    success, outcome, termination, n_messages, n_tool_calls, n_tool_errors)),
                    0) FROM trajectories),
               (SELECT count(*) || ':' || coalesce(bit_xor(hash(
                    trajectory_id, message_idx, call_idx, name, error)), 0) FROM tool_calls),
               (SELECT coalesce(string_agg(id || '=' || coalesce(name, ''), ',' ORDER BY id),
                    '') FROM datasets)""").fetchall()[0]
    return hashlib.sha256(repr(tuple(row)).encode()).hexdigest()[:32]


def read(con: Connection, key: str, version: str) -> dict[str, bytes] | None:
    """The frames stored for `key` at `version` (name -> bytes), else None."""
    if not _table_exists(con):
        return None
    rows = con.execute(f"SELECT frame, data FROM {TABLE} WHERE key = ? AND version = ?",
                       [key, version]).fetchall()
    return {name: bytes(data) for name, data in rows} or None


def write(con: Connection, key: str, version: str, frames: dict[str, bytes],
          compute_s: float) -> bool:
    """Store `frames` for (`key`, `version`), replacing the key's rows and dropping rows of
    other versions; False when the connection is read-only or another connection's write
    won the race (its rows are the same frames)."""
    if not _table_exists(con):
        return False

    def rows() -> None:
        con.execute(f"DELETE FROM {TABLE} WHERE version <> ? OR key = ?", [version, key])
        con.execute(f"""DELETE FROM {TABLE} WHERE key IN (
                            SELECT DISTINCT key FROM {TABLE} ORDER BY key
                            OFFSET ?)""", [KEEP - 1])
        for name, data in frames.items():
            con.execute(f"INSERT INTO {TABLE} (key, version, frame, data, compute_s) "
                        "VALUES (?, ?, ?, ?, ?)", [key, version, name, data, compute_s])

    return cache_fill.fill(con, rows)
