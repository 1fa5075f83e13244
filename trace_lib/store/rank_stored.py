"""The Rankings view's stored threshold-free parts: `rank_stability`,
`rank_stability_counts`, `rank_clusters` and `rank_cover`.

Design decisions
- What is stored is what no slider of the Rankings page moves: per resample and
  capability the six counts (lf pf nf lp pp np) Cov and Delta come from, what `auto`
  resolved to (runs or bootstrap, and why), the failure clusters (a JSON list of at
  most 20 signatures) and, for what the page computes from its kept set, the failed
  trajectories' cover signatures (bit sets of lacking and labelled capabilities with
  counts: a few thousand rows of JSON) and every capability's export examples. `diagnose.stability` and `diagnose.rank_precompute` decide what to
  store and when; this module only reads and writes it.
- A row is keyed by its inputs (`key`, a JSON text the caller builds) and carries the
  store version it was computed for (`version`). `read` answers only for the version it is
  asked about, so a result computed before a label edit, an undo, a new run or a
  capability change is never served after it. `write` drops every row of another version
  (they can never be read again) and keeps at most `KEEP` entries of the current one (a
  person trying scopes and B values leaves one small entry each: 2,800 count rows at
  B=200 x 14 capabilities).
- The counts are integers in the table (BIGINT) and come back as float64 arrays, the
  dtype the computed counts have, so figures from a stored entry equal computed ones to
  the bit.
- A write is one transaction. Two app sessions that compute the same entry at once
  conflict in DuckDB; the loser's write is dropped (`False`): the winner's rows are the
  same numbers. A read-only connection writes nothing (`False`): storing is a cache fill,
  never a reason for a reader to fail.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from trace_lib.store import cache_fill
from trace_lib.store.connection import Connection

SLOTS = ("lf", "pf", "nf", "lp", "pp", "np")
KEEP = 16  # entries of the current version kept (the oldest go first)


@dataclass
class StoredStability:
    method: str  # what was used: runs | bootstrap
    reason: str
    b: int | None
    seed: int | None
    caps: list[str]
    counts: np.ndarray | None  # (B, C, 6) float64; None for the runs method
    compute_s: float


def has(con: Connection, key: str, version: str) -> bool:
    """Whether an entry for `key` computed at `version` is stored."""
    return bool(con.execute("SELECT count(*) FROM rank_stability WHERE key = ? AND "
                            "version = ?", [key, version]).fetchall()[0][0])


def read(con: Connection, key: str, version: str) -> StoredStability | None:
    """The entry for `key` computed at `version`, else None."""
    head = con.execute("SELECT method, reason, b, seed, capabilities, compute_s "
                       "FROM rank_stability WHERE key = ? AND version = ?",
                       [key, version]).fetchall()
    if not head:
        return None
    method, reason, b, seed, caps, compute_s = head[0]
    caps = list(caps)
    counts = None
    if method == "bootstrap":
        rows = con.execute(f"""
            SELECT resample, list_position(?::VARCHAR[], capability) - 1 AS ci,
                   {", ".join(SLOTS)}
            FROM rank_stability_counts WHERE key = ?""", [caps, key]).fetchnumpy()
        counts = np.zeros((int(b), len(caps), len(SLOTS)), dtype=np.float64)
        bi = np.asarray(rows["resample"], dtype=np.int64)
        ci = np.asarray(rows["ci"], dtype=np.int64)
        if len(bi) != int(b) * len(caps):
            return None  # not whole (never written so; treated as absent)
        for s, name in enumerate(SLOTS):
            counts[bi, ci, s] = np.asarray(rows[name], dtype=np.float64)
    return StoredStability(method, reason, None if b is None else int(b),
                           None if seed is None else int(seed), caps, counts,
                           float(compute_s))


def write(con: Connection, key: str, version: str, entry: StoredStability) -> bool:
    """Store `entry` for (`key`, `version`), replacing the key's row and dropping rows of
    other versions; False when another connection's write won the race (or the connection
    is read-only)."""
    return cache_fill.fill(con, lambda: _write(con, key, version, entry))


def _write(con: Connection, key: str, version: str, entry: StoredStability) -> None:
    con.execute("DELETE FROM rank_stability WHERE version <> ? OR key = ?", [version, key])
    con.execute("""DELETE FROM rank_stability WHERE key IN (
                       SELECT key FROM rank_stability ORDER BY computed_at DESC, key
                       OFFSET ?)""", [KEEP - 1])
    con.execute("DELETE FROM rank_stability_counts WHERE key NOT IN "
                "(SELECT key FROM rank_stability) OR key = ?", [key])
    con.execute("INSERT INTO rank_stability (key, version, method, reason, b, seed, "
                "capabilities, compute_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [key, version, entry.method, entry.reason, entry.b, entry.seed,
                 entry.caps, entry.compute_s])
    if entry.counts is not None:
        b, c, _ = entry.counts.shape
        flat = entry.counts.reshape(b * c, len(SLOTS))
        ints = np.rint(flat).astype(np.int64)
        con.execute(f"""
            INSERT INTO rank_stability_counts
            SELECT ?, unnest(?::INTEGER[]), unnest(?::VARCHAR[]),
                   {", ".join("unnest(?::BIGINT[])" for _ in SLOTS)}""",
                    [key, np.repeat(np.arange(b), c).tolist(), entry.caps * b,
                     *(ints[:, s].tolist() for s in range(len(SLOTS)))])


def has_clusters(con: Connection, key: str, version: str) -> bool:
    """Whether failure clusters for `key` computed at `version` are stored."""
    return bool(con.execute("SELECT count(*) FROM rank_clusters WHERE key = ? AND "
                            "version = ?", [key, version]).fetchall()[0][0])


def read_clusters(con: Connection, key: str, version: str) -> list[dict[str, Any]] | None:
    """The failure clusters stored for `key` at `version`, else None."""
    got = con.execute("SELECT clusters FROM rank_clusters WHERE key = ? AND version = ?",
                      [key, version]).fetchall()
    return json.loads(got[0][0]) if got else None


def write_clusters(con: Connection, key: str, version: str, clusters: list[dict[str, Any]],
                   compute_s: float) -> bool:
    """Store the failure clusters for (`key`, `version`), as `write` does the counts."""
    return _write_row(con, "rank_clusters", key, version,
                      {"clusters": json.dumps(clusters), "compute_s": compute_s})


def has_cover(con: Connection, key: str, version: str) -> bool:
    """Whether cover signatures and examples for `key` computed at `version` are stored."""
    return bool(con.execute("SELECT count(*) FROM rank_cover WHERE key = ? AND "
                            "version = ?", [key, version]).fetchall()[0][0])


def read_cover(con: Connection, key: str, version: str
               ) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(cover signatures, examples per capability) stored for `key` at `version` (the JSON
    the writer was given), else None."""
    got = con.execute("SELECT signatures, examples FROM rank_cover WHERE key = ? AND "
                      "version = ?", [key, version]).fetchall()
    return (json.loads(got[0][0]), json.loads(got[0][1])) if got else None


def write_cover(con: Connection, key: str, version: str, signatures: dict[str, Any],
                examples: dict[str, Any], compute_s: float) -> bool:
    """Store the cover signatures and examples for (`key`, `version`), as `write` does."""
    return _write_row(con, "rank_cover", key, version,
                      {"signatures": json.dumps(signatures), "examples": json.dumps(examples),
                       "compute_s": compute_s})


def _write_row(con: Connection, table: str, key: str, version: str,
               values: dict[str, Any]) -> bool:
    # One row per key in `table` (rank_clusters, rank_cover): the key's row replaced, rows
    # of other versions dropped, at most KEEP kept; one transaction, a lost race dropped.
    def rows() -> None:
        con.execute(f"DELETE FROM {table} WHERE version <> ? OR key = ?", [version, key])
        con.execute(f"""DELETE FROM {table} WHERE key IN (
                            SELECT key FROM {table} ORDER BY computed_at DESC, key
                            OFFSET ?)""", [KEEP - 1])
        con.execute(f"INSERT INTO {table} (key, version, {', '.join(values)}) "
                    f"VALUES (?, ?, {', '.join('?' for _ in values)})",
                    [key, version, *values.values()])

    return cache_fill.fill(con, rows)


def entries(con: Connection) -> list[tuple[str, str, str]]:
    """(key, version, method) of every stored entry (tests, `store check`-like reads)."""
    return [tuple(r) for r in con.execute(
        "SELECT key, version, method FROM rank_stability ORDER BY computed_at, key"
    ).fetchall()]
