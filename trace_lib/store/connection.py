"""Opening the DuckDB store: where the file is, the lock retry, migration on open.

Design decisions
- One file holds every decision and every imported record. One writer at a time
  (DuckDB's rule), so connections are short-lived: open, do the work, close. A file
  locked by another process is retried with exponential backoff, then fails with
  `StoreLockedError` naming the file and the holder that DuckDB reports; a wait says
  so once on stderr (the file, the holder, how long it may wait). Background jobs
  never call `connect`; they write into their run directory and the app records results
  when a job ends.
- A writable open migrates the file (`migrations`); a file newer than this code is
  refused rather than half-read (`NewerSchemaError`, naming the file, its schema version
  and this trace_lib's), by a read-only open too: it never writes, so it never migrates,
  but it checks the version before any caller reads.
- A damaged file (overwritten, truncated, a block whose checksum fails) is reported as
  `DamagedStoreError`, which says what to do (restore a backup, or move the file aside and
  re-import), never as DuckDB's bare IO error. `damage_error` recognises DuckDB's messages
  for these; `store check` reads every table in full, because DuckDB reads blocks lazily and
  a truncation past the catalog opens fine and fails only on the first read of a lost block.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb

from trace_lib.errors import disk_full_error, writing
from trace_lib.store import migrations

# What a store function takes: callers outside `store/` name the type without importing
# DuckDB, and catch `DatabaseError` for a statement the database refused.
Connection = duckdb.DuckDBPyConnection
DatabaseError = duckdb.Error
OutOfMemoryError = duckdb.OutOfMemoryException

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DB = REPO_ROOT / "data" / "trace.duckdb"
ENV_DB = "TRACE_DB"
# The most memory DuckDB may use per store connection ("4GB", "2.5GiB", "25%"); unset:
# DuckDB's own default, 80% of the machine. A 10M-trajectory store's label finish took
# 19 GB that way and the OOM killer took a training job beside it (bench/README,
# session 24); under a limit DuckDB spills to disk instead.
ENV_MEMORY = "TRACE_DB_MEMORY"
_MEMORY = re.compile(r"\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB|%)", re.IGNORECASE)


class StoreError(RuntimeError):
    """A store operation failed in a way the user can act on."""


class StoreLockedError(StoreError):
    """Another process holds the DuckDB file's write lock."""


class DamagedStoreError(StoreError):
    """The store file is not a readable DuckDB database (overwritten, truncated, corrupt)."""


class NewerSchemaError(StoreError):
    """The store was written by a newer trace_lib (its schema version is ahead of ours)."""


# DuckDB's words for a file that is not (or no longer) a whole database, and what they mean.
_DAMAGE = (
    ("not a valid duckdb database file", "it is not a DuckDB database (overwritten or emptied)"),
    ("could not read enough bytes", "it ends before its data does (truncated)"),
    ("corrupt database file", "a block's checksum does not match (overwritten in part)"),
    ("checksum", "a block's checksum does not match (overwritten in part)"),
)


def damage_error(path: str | Path, exc: BaseException) -> DamagedStoreError | None:
    """A `DamagedStoreError` that says what DuckDB's `exc` means for the file at `path`
    and what to do, or None when `exc` is not about a damaged file."""
    if not isinstance(exc, duckdb.Error):
        return None
    text = str(exc).lower()
    for needle, meaning in _DAMAGE:
        if needle in text:
            return DamagedStoreError(
                f"{path}: the store file is damaged: {meaning}. DuckDB said: "
                f"{str(exc).splitlines()[0]}. Nothing was changed. What to do: restore your "
                f"last backup with `python -m trace_lib store restore BACKUP --db {path}` "
                f"(the damaged file is kept beside it), or move the file aside and import "
                f"your trajectories again; `python -m trace_lib store check --db {path}` "
                f"reports what is readable.")
    return None


def newer_schema_error(path: str | Path, version: int) -> NewerSchemaError:
    from importlib import metadata

    try:
        ours = f"this trace_lib (trace-workbench {metadata.version('trace-workbench')})"
    except metadata.PackageNotFoundError:
        ours = "this trace_lib"
    return NewerSchemaError(
        f"{path}: the store has schema version {version}, newer than {ours}, which reads "
        f"schema version {migrations.SCHEMA_VERSION} at most; a newer trace_lib wrote it. "
        f"It was not opened and nothing was changed. What to do: open it with the newer "
        f"trace_lib that wrote it (upgrade this checkout), or point --db / TRACE_DB at "
        f"another store.")


def equals_filter(**columns: Any) -> tuple[str, list[Any]]:
    """(" WHERE a = ? AND b = ?", params) for the columns given a value (None and "" mean
    "any"), or ("", []): the optional filters a listing takes."""
    given = {k: v for k, v in columns.items() if v not in (None, "")}
    if not given:
        return "", []
    return " WHERE " + " AND ".join(f"{k} = ?" for k in given), list(given.values())


def default_db_path() -> Path:
    """`TRACE_DB` if set, else `data/trace.duckdb` in the repository."""
    env = os.environ.get(ENV_DB)
    return Path(env).expanduser() if env else DEFAULT_DB


def resolve_db_path(db: str | Path | None = None) -> Path:
    return Path(db).expanduser() if db else default_db_path()


def _migrate(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    current = migrations.current_version(con)
    if current > migrations.SCHEMA_VERSION:
        raise newer_schema_error(path, current)
    migrations.apply_from(con, current)


def _check_version(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """A read-only open's check: refuse a store newer than this code before anyone reads."""
    has_table = con.execute("SELECT count(*) FROM information_schema.tables WHERE "
                            "table_schema = 'main' AND table_name = 'schema_version'"
                            ).fetchall()[0][0]
    if has_table:
        current = migrations.schema_version(con)
        if current > migrations.SCHEMA_VERSION:
            raise newer_schema_error(path, current)


# "different configuration": in one process (the app serving two browser sessions), DuckDB
# refuses a read-write connection while a read-only one is open, and the reverse. Both are
# short-lived, so this is waited out like another process's lock (issue 33: a session's
# label edit was lost when its page failed to open the store this way).
_LOCK_PATTERNS = ("could not set lock", "conflicting lock",
                  "with a different configuration than existing connections")


# A lock held for less than this is waited out silently (a reader's short connection).
BUSY_NOTE_S = 0.5


def _is_lock_error(exc: Exception) -> bool:
    text = str(exc).lower()
    return any(p in text for p in _LOCK_PATTERNS)


def _lock_holder(exc: Exception) -> str:
    if "different configuration" in str(exc):
        return "another connection of this process (one read-only, one read-write)"
    match = re.search(r"held in (.+?)(?:\n|$)", str(exc))
    return match.group(1).strip() if match else "another process"


def open_connection(
    db: str | Path | None = None,
    *,
    read_only: bool = False,
    timeout_s: float = 10.0,
    migrate: bool = True,
) -> duckdb.DuckDBPyConnection:
    """Open the store, migrating it if needed; retry while another process holds the lock.

    Prefer `connect()` (a context manager that closes); this is for callers that manage
    the lifetime themselves. `migrate=False` takes the write lock without migrating or
    checking the version (`store backup` copies whatever the file is).
    """
    path = resolve_db_path(db)
    if read_only and not path.exists():
        raise StoreError(f"{path}: no database here yet (import trajectories or run `demo build`)")
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    said = False
    while True:
        try:
            con = duckdb.connect(str(path), read_only=read_only)
            break
        except duckdb.Error as exc:
            if not _is_lock_error(exc):
                raise (disk_full_error(exc, _store_words(path), path)
                       or damage_error(path, exc) or StoreError(
                    f"{path}: cannot open the DuckDB file: {exc}. If the file is damaged, "
                    f"restore a backup (`python -m trace_lib store restore BACKUP --db "
                    f"{path}`); if it is not a store, point --db / TRACE_DB elsewhere.")
                ) from exc
            if time.monotonic() >= deadline:
                raise StoreLockedError(
                    f"{path}: the database is locked by {_lock_holder(exc)}; "
                    f"gave up after {timeout_s:.0f}s. Close the other writer "
                    f"(a notebook, a CLI command or another app) and retry."
                ) from exc
            if not said and time.monotonic() - (deadline - timeout_s) >= BUSY_NOTE_S:
                # a wait that a person notices says what it waits for, once (issue 33)
                said = True
                print(f"{path}: the store is busy ({_lock_holder(exc)}); waiting up to "
                      f"{timeout_s:.0f}s", file=sys.stderr, flush=True)
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 1.0)
    try:
        _limit_memory(con)
        if read_only:
            _check_version(con, path)
        elif migrate:
            _migrate(con, path)
    except duckdb.Error as exc:
        con.close()
        raise (disk_full_error(exc, _store_words(path), path) or damage_error(path, exc)
               or exc) from exc
    except Exception:
        con.close()
        raise
    return con


def _limit_memory(con: duckdb.DuckDBPyConnection) -> None:
    """`TRACE_DB_MEMORY`, if set, as the connection's DuckDB memory limit."""
    limit = os.environ.get(ENV_MEMORY, "").strip()
    if not limit:
        return
    if not _MEMORY.fullmatch(limit):
        raise StoreError(f"{ENV_MEMORY}={limit!r}: expected an amount of memory such as "
                         f"4GB, 2.5GiB or 25%")
    con.execute(f"SET memory_limit = '{limit}'")


def _store_words(path: Path) -> str:
    return f"the store {path}"


@contextlib.contextmanager
def connect(
    db: str | Path | None = None,
    *,
    read_only: bool = False,
    timeout_s: float = 10.0,
) -> Iterator[duckdb.DuckDBPyConnection]:
    """A short-lived connection to the store, closed on exit. A write refused for want
    of space (DuckDB's WAL or checkpoint, inside the block or at close) is a
    `DiskFullError` naming the store; DuckDB rolls the open transaction back."""
    con = open_connection(db, read_only=read_only, timeout_s=timeout_s)
    path = resolve_db_path(db)
    with writing(_store_words(path), path):
        try:
            yield con
        finally:
            con.close()


@contextlib.contextmanager
def transaction(con: duckdb.DuckDBPyConnection) -> Iterator[duckdb.DuckDBPyConnection]:
    """All or nothing: commit on success, roll back on any exception."""
    con.execute("BEGIN TRANSACTION")
    try:
        yield con
    except BaseException:
        con.execute("ROLLBACK")
        raise
    else:
        con.execute("COMMIT")


class LazyWriteTransaction:
    """One write transaction over the store, opened on first use (`connect`) with a
    bounded memory limit: the transaction's uncommitted rows spill to disk beyond it. A
    caller that fails before its first write never opens (or creates) the file; `abort`
    rolls back and removes the file if this transaction created it (the bulk import)."""

    def __init__(self, db: str | Path | None, memory_bytes: int):
        self.db = db
        self.memory_bytes = memory_bytes
        self.path = resolve_db_path(db)
        self.existed = self.path.exists()
        self.con: Connection | None = None

    def connect(self) -> Connection:
        if self.con is None:
            self.con = open_connection(self.db)
            self.con.execute(f"SET memory_limit = '{max(self.memory_bytes >> 20, 64)}MiB'")
            self.con.execute("BEGIN TRANSACTION")
        return self.con

    committed = False

    def commit(self, *, close: bool = True) -> None:
        """COMMIT; `close=False` keeps the connection (closing checkpoints, which takes
        time a caller may not want between this commit and its own, see `close`)."""
        if self.con is not None:
            with writing(_store_words(self.path), self.path):
                self.con.execute("COMMIT")
                self.committed = True
                if close:
                    self.close()

    def close(self) -> None:
        if self.con is not None:
            con, self.con = self.con, None
            con.close()

    def abort(self) -> None:
        if self.committed:  # nothing to undo, and the file holds committed rows
            self.close()
            return
        if self.con is not None:
            with contextlib.suppress(duckdb.Error):
                self.con.execute("ROLLBACK")
            self.con.close()
            self.con = None
        if not self.existed:
            for p in (self.path, self.path.with_name(self.path.name + ".wal")):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
