"""The environment tables' SQL: `environments` (status, reports, generated code) and
`env_generation_attempts` (every attempt of the generation agent).

Design decisions
- Row id = environment name (names are unique: generated ones carry their number). A row
  is replaced whole (delete, insert) inside the caller's transaction, so a report merge
  and a status change land together.
- `report` is one JSON object with a key per producer ("validation", "calibration",
  "review"); rows come back with it parsed ({} when empty). What a status means, which
  moves are allowed and the built-ins without a row are `envs.catalog`'s rules: this
  module takes and returns plain values, never an `EnvSpec`.
"""

from __future__ import annotations

import json
from typing import Any

from trace_lib.store.connection import Connection, equals_filter

COLUMNS = ("id", "name", "capability", "domain", "version", "source", "code", "code_sha256",
           "status", "report")
_COLUMNS = ", ".join(COLUMNS)
_ATTEMPT_COLUMNS = ("generation_id, attempt, env_name, capability, domain, generator, model, "
                    "code, code_sha256, status, report, created_at")


def _rows(cur: Any) -> list[dict[str, Any]]:
    cols = [d[0] for d in cur.description]
    out = []
    for values in cur.fetchall():
        row = dict(zip(cols, values, strict=True))
        if isinstance(row.get("report"), str):
            row["report"] = json.loads(row["report"])
        row["report"] = row.get("report") or {}
        out.append(row)
    return out


def row_named(con: Connection, name: str) -> dict[str, Any] | None:
    """The environment's row, None when it has none."""
    rows = _rows(con.execute(f"SELECT {_COLUMNS} FROM environments WHERE name = ?", [name]))
    return rows[0] if rows else None


def rows(con: Connection) -> list[dict[str, Any]]:
    """Every environment row, by name."""
    return _rows(con.execute(f"SELECT {_COLUMNS} FROM environments ORDER BY name"))


def replace_row(con: Connection, row: dict[str, Any]) -> None:
    """Insert the row with `COLUMNS` (replacing the row of that id); run it in a transaction."""
    con.execute("DELETE FROM environments WHERE id = ?", [row["id"]])
    values = [row.get(c) for c in COLUMNS]
    values[COLUMNS.index("report")] = json.dumps(row.get("report") or {}, default=str)
    con.execute(f"INSERT INTO environments ({_COLUMNS}) VALUES "
                f"({', '.join('?' for _ in COLUMNS)})", values)


def insert_attempt(con: Connection, *, generation_id: str, attempt: int, env_name: str,
                   capability: str, domain: str, generator: str, model: str | None,
                   code: str | None, code_sha256: str | None, status: str,
                   report: dict[str, Any]) -> None:
    con.execute(
        "INSERT INTO env_generation_attempts (generation_id, attempt, env_name, capability, "
        "domain, generator, model, code, code_sha256, status, report) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [generation_id, attempt, env_name, capability, domain, generator, model, code,
         code_sha256, status, json.dumps(report, default=str)])


def attempts(con: Connection, env_name: str | None = None,
             generation_id: str | None = None) -> list[dict[str, Any]]:
    """Generation attempts, oldest first, of one environment and/or one generation."""
    where, params = equals_filter(env_name=env_name, generation_id=generation_id)
    return _rows(con.execute(f"SELECT {_ATTEMPT_COLUMNS} FROM env_generation_attempts{where} "
                             "ORDER BY created_at, generation_id, attempt", params))


def names_with_prefix(con: Connection, prefix: str) -> list[str]:
    """Environment names, stored or attempted, that start with `prefix`."""
    return [r[0] for r in con.execute(
        "SELECT name FROM environments WHERE name LIKE ? UNION "
        "SELECT env_name FROM env_generation_attempts WHERE env_name LIKE ?",
        [prefix + "%", prefix + "%"]).fetchall()]
