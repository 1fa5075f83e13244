"""The DuckDB store: one file holds every decision and every imported record.

Design decisions
- The schema lives here. `connection` opens the file (paths, lock retry, migration on
  open), `migrations` is the schema as forward migrations, and one module per table
  family owns that family's SQL: `trajectories` (datasets, trajectories, messages, tool
  calls, expected actions, tool schemas), `derived` (`trajectory_derived` and the SQL
  definitions of its columns), `labels` (label runs, labels, edits, the label views),
  `capabilities`, `environments` (environments, generation attempts), `embeddings`,
  `rank_stored` (the Rankings view's threshold-free parts, stored per labels' version),
  and `search` (the full-text side index beside the file); the job tables (jobs, adapters,
  moe_models, routing_traces) belong to `jobs`. Callers pass a connection and get plain Python or pandas values back.
  The store as a whole: `integrity` (what `store check` verifies) and `backup` (a copy of
  the file and its search index taken under the store's lock, and its restore).
- Analytical query modules outside `store/` (`explore.queries`, `explore.clusters`,
  `diagnose.ranking`, `diagnose.materialise` and the diagnose statistics) keep their SQL
  and read through the tables and views defined here; `trace_lib.trajectories` keeps its
  four reader queries (the label job must not import the store).
- This package re-exports the connection API (`from trace_lib.store import connect`),
  the one import every caller needs; a table family is imported by its module name.
"""

from __future__ import annotations

from trace_lib.store.connection import (
    DEFAULT_DB,
    ENV_DB,
    REPO_ROOT,
    Connection,
    DamagedStoreError,
    DatabaseError,
    LazyWriteTransaction,
    NewerSchemaError,
    OutOfMemoryError,
    StoreError,
    StoreLockedError,
    connect,
    damage_error,
    default_db_path,
    open_connection,
    resolve_db_path,
    transaction,
)
from trace_lib.store.migrations import MIGRATIONS, SCHEMA_VERSION, schema_version, table_counts

__all__ = [
    "Connection",
    "DamagedStoreError",
    "DatabaseError",
    "LazyWriteTransaction",
    "NewerSchemaError",
    "OutOfMemoryError",
    "DEFAULT_DB",
    "ENV_DB",
    "MIGRATIONS",
    "REPO_ROOT",
    "SCHEMA_VERSION",
    "StoreError",
    "StoreLockedError",
    "connect",
    "damage_error",
    "default_db_path",
    "open_connection",
    "resolve_db_path",
    "schema_version",
    "table_counts",
    "transaction",
]
