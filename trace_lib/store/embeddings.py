"""The `embeddings` table's SQL: one vector per (trajectory, model), keyed by its text's hash.

Design decisions
- A vector is stored with the sha256 of the text it embeds, so "which vectors are
  missing or stale" is a comparison of hashes: against `trajectory_derived.text_sha256`
  in SQL when every trajectory has its derived row, else against hashes the caller
  computed (`explore.embeddings`).
- Writes replace a (trajectory, model) row; nothing else writes the table (deleting a
  dataset removes its rows through `store.trajectories.delete_dataset_rows`).
- Scopes arrive as a SQL condition over `trajectories t` with its parameters (what
  `explore.queries.filter_sql` builds).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from trace_lib.store import derived
from trace_lib.store.connection import Connection


def text_hashes(con: Connection, model: str) -> dict[str, str]:
    """trajectory_id -> the text hash of its stored vector for `model`."""
    return dict(con.execute(
        "SELECT trajectory_id, text_sha256 FROM embeddings WHERE model = ?", [model]
    ).fetchall())


def upsert_vectors(con: Connection, rows: list[tuple[str, str, str, list[float]]]) -> None:
    """Insert or replace (trajectory_id, model, text_sha256, vector) rows."""
    con.executemany("INSERT OR REPLACE INTO embeddings VALUES (?, ?, ?, ?)", rows)


def count_stale(con: Connection, model: str, where: str, params: list[Any]) -> int:
    """How many trajectories matching `where` have no vector for `model` of their current
    text (needs every trajectory's derived row: `derived.ready`)."""
    return int(con.execute(f"""
        SELECT count(*) FROM trajectories t
        JOIN {derived.TABLE} d ON d.trajectory_id = t.id
        LEFT JOIN embeddings e ON e.trajectory_id = t.id AND e.model = ?
        WHERE {where} AND e.text_sha256 IS DISTINCT FROM d.text_sha256
    """, [model, *params]).fetchone()[0])


def vectors(con: Connection, model: str, where: str, params: list[Any]) -> pd.DataFrame:
    """The stored vectors of the trajectories matching `where`, by id: trajectory_id,
    task_id, trial, domain, agent_model, outcome, termination, vector."""
    return con.execute(f"""
        SELECT t.id AS trajectory_id, t.task_id, t.trial, t.domain, t.agent_model,
               CASE WHEN t.success THEN 'success' WHEN NOT t.success THEN 'failure'
                    ELSE 'unknown' END AS outcome,
               t.termination, e.vector
        FROM trajectories t JOIN embeddings e ON e.trajectory_id = t.id AND e.model = ?
        WHERE {where} ORDER BY t.id
    """, [model, *params]).df()
