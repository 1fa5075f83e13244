"""What identifies a row of the store's unkeyed tables, and finding rows that repeat it.

Design decisions
- The tables written in bulk (trajectories, messages, tool calls, labels) have no key
  (migrations LABELS_UNKEYED and BULK_TABLES_UNKEYED): DuckDB held a transaction's new
  keys in memory (a 10M import ran out) and the key's index was most of a label table.
  Each still has an identity, written down once here (`ROW_KEYS`), kept by its writer
  (`ingest.writer` for trajectories and their rows, `store.labels.insert_labels` for
  labels) and checked by `store check`, which repairs a repeat by keeping the first
  written row (the lowest rowid) of each identity.
- One query per table finds repeats (a GROUP BY over the identity); the same query runs
  on a write's own rows before they are written (`source`), so a refusal and a check
  word a repeat the same way.
"""

from __future__ import annotations

from trace_lib.store.connection import Connection

# table -> the columns that identify one of its rows, and how `store check` names it.
ROW_KEYS: dict[str, tuple[str, ...]] = {
    "trajectories": ("id",),
    "messages": ("trajectory_id", "idx"),
    "tool_calls": ("trajectory_id", "message_idx", "call_idx"),
    "labels": ("run_id", "trajectory_id", "capability"),
}
# How a repeat is worded: the identity's names in the message.
_NAMES: dict[str, tuple[str, ...]] = {
    "trajectories": ("trajectory",),
    "messages": ("trajectory", "message"),
    "tool_calls": ("trajectory", "message", "call"),
    "labels": ("run", "trajectory", "capability"),
}
_NOUNS: dict[str, str] = {
    "trajectories": "trajectory ids",
    "messages": "(trajectory, message) keys",
    "tool_calls": "(trajectory, message, call) keys",
    "labels": "(run, trajectory, capability) pairs",
}


def repeated(con: Connection, table: str, source: str | None = None) -> tuple[int, str]:
    """How many identities of `table` have more than one row in `source` (the table
    itself, or a write's rows registered under a name), and the first three, worded."""
    key = ", ".join(ROW_KEYS[table])
    rows = con.execute(f"""
        SELECT {key}, n, count(*) OVER () FROM (
            SELECT {key}, count(*) AS n FROM {source or table}
            GROUP BY ALL HAVING count(*) > 1)
        ORDER BY ALL LIMIT 3""").fetchall()
    names = _NAMES[table]
    shown = "; ".join(
        ", ".join(f"{name} {value}" for name, value in zip(names, r, strict=False))
        + f": {r[len(names)]} rows" for r in rows)
    return (rows[0][-1] if rows else 0), shown


def identity_words(table: str) -> str:
    """A repeat's noun in messages: 'trajectory ids', '(run, trajectory, capability) pairs'."""
    return _NOUNS[table]


def keep_first(con: Connection, table: str) -> int:
    """Delete every row of `table` but the first written (lowest rowid) of its identity;
    returns how many went."""
    key = ", ".join(ROW_KEYS[table])
    return int(con.execute(f"""
        DELETE FROM {table} WHERE rowid IN (
            SELECT rowid FROM (
                SELECT rowid, row_number() OVER (PARTITION BY {key} ORDER BY rowid) AS k
                FROM {table}) WHERE k > 1)""").fetchall()[0][0])
