"""The `capabilities` table's SQL: the catalog rows, the built-in menu's seeding, status.

Design decisions
- A capability is a row (name, description, applies_when, source, status, examples);
  labels and edits are keyed by its name, so there is no rename here.
- The built-in menu (`trace_lib.capabilities.BUILTIN`) is seeded where missing and never
  overwrites a person's edits. Seeding tolerates a concurrent seeder (two page renders,
  two sessions): see `ensure_builtin`.
- Rules about names, allowed statuses and what a missing row means for a person are the
  caller's (`diagnose.capabilities`); this module reads and writes rows.
"""

from __future__ import annotations

import json
import time
from typing import Any

import duckdb

from trace_lib.capabilities import BUILTIN
from trace_lib.data_model import Capability
from trace_lib.store.connection import Connection, StoreError


def ensure_builtin(con: Connection) -> int:
    """Insert the built-in menu where missing (never overwrites a user's edits).

    Every page render and label run calls this, and two connections of one process (two
    reruns, two sessions) can insert the same rows at once: DuckDB commits one and fails
    the other with a duplicate key (ON CONFLICT does not see a concurrent transaction's
    rows, and until the other transaction commits its rows are not visible either). So
    read first (nothing to write once the menu is in), and after a conflict wait briefly
    and recheck until the rows are there. Call it outside an explicit transaction."""
    names = [b.name for b in BUILTIN]

    def present() -> int:
        return con.execute("SELECT count(*) FROM capabilities WHERE name IN (SELECT unnest(?))",
                           [names]).fetchone()[0]

    before = present()
    for attempt in range(6):
        if present() == len(names):
            return 0
        try:
            con.executemany(
                "INSERT INTO capabilities (name, description, applies_when, source, status) "
                "VALUES (?, ?, ?, 'builtin', 'accepted') ON CONFLICT (name) DO NOTHING",
                [[b.name, b.description, b.applies_when] for b in BUILTIN])
            return present() - before
        except (duckdb.ConstraintException, duckdb.TransactionException):
            # The other writer may not have committed yet: wait for its rows, then recheck.
            time.sleep(0.05 * 2 ** attempt)
    if present() != len(names):
        raise StoreError("the built-in capabilities could not be written: another "
                         "session kept conflicting; retry")
    return 0


def capabilities_on(con: Connection, status: str | None = None) -> list[Capability]:
    """The catalog on an open connection (builtins first, then by name)."""
    sql = ("SELECT name, description, applies_when, source, status, examples FROM capabilities"
           + (" WHERE status = ?" if status else "") + " ORDER BY source = 'builtin' DESC, name")
    rows = con.execute(sql, [status] if status else []).fetchall()
    return [Capability(name=r[0], description=r[1], applies_when=r[2], source=r[3], status=r[4],
                       examples=json.loads(r[5]) if r[5] else []) for r in rows]


def capability_names(con: Connection, include_rejected: bool = False) -> list[str]:
    """Names in the catalog, sorted (without the rejected ones unless asked)."""
    sql = "SELECT name FROM capabilities" + ("" if include_rejected else
                                             " WHERE status != 'rejected'")
    return [r[0] for r in con.execute(sql + " ORDER BY name").fetchall()]


def exists(con: Connection, name: str) -> bool:
    return con.execute("SELECT 1 FROM capabilities WHERE name = ?", [name]).fetchone() is not None


def status_counts(con: Connection) -> dict[str, int]:
    """Capabilities per status as the catalog lists them: `ensure_builtin` writes the
    built-in menu (accepted) on its first use, so a built-in not written yet counts as
    accepted. Reads only, so a read-only connection (Home's) gives the Labels page's
    numbers before that page was ever opened."""
    names = [b.name for b in BUILTIN]
    try:
        counts = dict(con.execute(
            "SELECT status, count(*) FROM capabilities GROUP BY status").fetchall())
        written = con.execute("SELECT count(*) FROM capabilities WHERE name IN "
                              "(SELECT unnest(?))", [names]).fetchone()[0]
    except duckdb.CatalogException:  # a foreign or old file without the table
        counts, written = {}, 0
    counts["accepted"] = counts.get("accepted", 0) + len(names) - written
    return {k: int(v) for k, v in counts.items()}


def status_of(con: Connection, name: str) -> str | None:
    """The capability's status, None when the catalog has no such row."""
    row = con.execute("SELECT status FROM capabilities WHERE name = ?", [name]).fetchone()
    return None if row is None else row[0]


def description_and_examples(con: Connection, name: str) -> tuple[str | None, list[Any]] | None:
    """(description, example trajectory ids) of a capability, None without its row."""
    row = con.execute("SELECT description, examples FROM capabilities WHERE name = ?",
                      [name]).fetchone()
    if not row:
        return None
    examples = json.loads(row[1]) if isinstance(row[1], str) else (row[1] or [])
    return row[0], examples


def insert(con: Connection, name: str, description: str, *, applies_when: str | None,
           source: str, status: str, examples: list[str]) -> None:
    con.execute(
        "INSERT INTO capabilities (name, description, applies_when, source, status, examples) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        [name, description, applies_when, source, status, json.dumps(examples)])


def set_status(con: Connection, name: str, status: str) -> None:
    con.execute("UPDATE capabilities SET status = ?, updated_at = current_timestamp "
                "WHERE name = ?", [status, name])


def set_description(con: Connection, name: str, description: str) -> None:
    con.execute("UPDATE capabilities SET description = ?, updated_at = current_timestamp "
                "WHERE name = ?", [description, name])


def set_applies_when(con: Connection, name: str, applies_when: str) -> None:
    con.execute("UPDATE capabilities SET applies_when = ?, updated_at = current_timestamp "
                "WHERE name = ?", [applies_when, name])
