"""Backups of the store: a consistent copy of the DuckDB file and its search index, and back.

Design decisions
- A file copy taken under the store's own lock, not DuckDB's EXPORT/IMPORT DATABASE. The
  store is two files: the DuckDB database and its side search index
  (`<store>.search.sqlite`, `store.search`), a SQLite file that EXPORT DATABASE knows
  nothing of, so an export would come back without its index (every search a slow scan
  until a rebuild). A copy also brings back everything else exactly as it was: the
  label-edit sequence's position (new edits never reuse an id), the materialised label
  tables with their watermark, the schema version, the column types. An export re-creates
  those from SQL and CSV/Parquet and round-trips each only as well as the export's own
  rules do; a copy has no rules to get wrong, and its cost is one sequential read.
- Consistency. `backup` opens the store read-write without migrating (DuckDB's write lock
  is exclusive, so no other process reads or writes meanwhile: a running import makes it
  wait, then fail with the lock message), runs CHECKPOINT (a WAL left by a crashed writer
  is folded into the file, so the file alone is the whole store), and copies the file while
  it still holds the lock. Every writer of the search index holds the DuckDB write lock
  while it writes (the import's index commits inside it, `explore reindex` holds a
  connection), so the index is quiescent too; it is copied with SQLite's online backup API
  (a consistent snapshot even in WAL mode).
- A backup is a folder: `trace.duckdb` (the name of the store it came from),
  `<that>.search.sqlite` when the store had an index, and `manifest.json` (schema version,
  row counts of every table, size and SHA-256 of every file, when and from where). It is
  written under a temporary name and renamed when whole, so a failed backup leaves no
  folder that looks like one; an existing non-empty PATH is refused (never overwritten).
- `restore` verifies before it touches anything: the manifest's hashes, that the copy opens
  and holds the row counts the manifest lists, and that its schema is not newer than this
  code. It then copies the files beside the store under temporary names and swaps them in
  while holding the store file's lock (`fcntl.lockf`, the same POSIX lock DuckDB takes, so
  no DuckDB process can hold the store during the swap; a busy store is waited for, then
  refused with the lock message). The store it replaces, damaged or not, is not deleted:
  it is renamed `<store>.before-restore-<UTC time>` (with its WAL and index), and the
  result says where. A backup of an older schema is migrated by the first open, as any
  older store is.
- `compact` gives back the space deletes leave: DuckDB does not shrink its file after a
  DELETE (`datasets delete` of half a store left the file as large, measured in
  bench/README.md). It is a copy too, in the other direction: under the store's write lock
  (read-write connection, CHECKPOINT), `COPY FROM DATABASE` into a fresh file beside the
  store, which rewrites only live rows and keeps the whole catalog (tables, views,
  sequences at their current value, constraints). The copy is checked against the store
  before anything is replaced (schema version, row counts of every table, every
  sequence's value, the views); the connection is closed, the store file's lock taken
  (as `restore` does), and the copy swapped in only if the store did not change in
  between (size, modification time, no WAL): a writer that slipped in makes it refuse,
  never lose that write. The search index is not touched: it is keyed by trajectory ids,
  which a copy keeps.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import sqlite3
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb

from trace_lib.store import migrations, search
from trace_lib.store.connection import (
    StoreError,
    StoreLockedError,
    damage_error,
    newer_schema_error,
    open_connection,
    resolve_db_path,
)

MANIFEST = "manifest.json"
FORMAT = 1


@dataclass(frozen=True)
class BackupResult:
    path: Path
    manifest: dict[str, Any]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy_index(src: Path, dest: Path) -> None:
    """A consistent snapshot of the SQLite index (its WAL included)."""
    source = sqlite3.connect(f"file:{src}?mode=ro", uri=True, timeout=30.0)
    target = sqlite3.connect(str(dest))
    try:
        source.backup(target)
        target.execute("PRAGMA journal_mode=DELETE")  # one self-contained file
    finally:
        target.close()
        source.close()


def _counts(path: Path) -> tuple[int, dict[str, int]]:
    """(schema version, row counts per table) of a store file, opened read-only."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        return migrations.schema_version(con), migrations.table_counts(con)
    finally:
        con.close()


def _checkpoint(con: duckdb.DuckDBPyConnection, path: Path, before: str) -> None:
    """Fold the write-ahead log into the file before it is copied or rewritten."""
    try:
        con.execute("CHECKPOINT")
    except duckdb.Error as exc:
        raise (damage_error(path, exc) or StoreError(
            f"{path}: could not checkpoint the store before {before}: {exc}")) from exc


def backup(db: str | Path | None, dest: str | Path, *, timeout_s: float = 30.0
           ) -> BackupResult:
    """Copy the store `db` (and its search index) into the new folder `dest`."""
    path = resolve_db_path(db)
    dest = Path(dest).expanduser()
    if not path.exists():
        raise StoreError(f"{path}: no database here, so there is nothing to back up.")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise StoreError(f"{dest}: already exists and is not an empty folder; a backup is "
                         "written to a new folder (nothing is overwritten). Choose another "
                         "PATH.")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        con = open_connection(path, timeout_s=timeout_s, migrate=False)
        try:
            _checkpoint(con, path, "copying it")
            files: dict[str, dict[str, Any]] = {}
            shutil.copyfile(path, tmp / path.name)
            _fsync(tmp / path.name)
            index = search.index_path(path)
            if index.exists():
                _copy_index(index, tmp / index.name)
                _fsync(tmp / index.name)
        finally:
            con.close()
        try:
            version, counts = _counts(tmp / path.name)
        except duckdb.Error as exc:
            raise (damage_error(path, exc) or StoreError(
                f"{path}: the copy does not open: {exc}")) from exc
        for f in sorted(tmp.iterdir()):
            files[f.name] = {"bytes": f.stat().st_size, "sha256": _sha256(f)}
        manifest = {
            "format": FORMAT, "store": path.name, "source": str(path),
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "schema_version": version, "tables": counts, "files": files,
            "search_index": search.index_path(path).name if search.index_path(
                path).name in files else None,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
        _fsync(tmp / MANIFEST)
        if dest.exists():
            dest.rmdir()  # empty (checked above)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return BackupResult(dest, manifest)


def read_manifest(src: str | Path) -> dict[str, Any]:
    """The manifest of the backup folder `src`, its files verified against it."""
    src = Path(src).expanduser()
    mf = src / MANIFEST
    if not mf.is_file():
        raise StoreError(f"{src}: not a store backup (no {MANIFEST}); expected a folder "
                         "written by `python -m trace_lib store backup PATH`.")
    try:
        manifest = json.loads(mf.read_text())
        files = manifest["files"]
        store_name = manifest["store"]
        manifest["schema_version"], manifest["tables"]  # noqa: B018
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"{mf}: not a readable backup manifest ({exc}); the backup is "
                         "damaged. Use another backup.") from None
    if store_name not in files:
        raise StoreError(f"{mf}: lists no database file {store_name!r}; the backup is damaged.")
    for name, meta in files.items():
        f = src / name
        if not f.is_file():
            raise StoreError(f"{src}: the backup lacks {name}, which its manifest lists; the "
                             "backup is incomplete. Use another backup.")
        if f.stat().st_size != meta["bytes"] or _sha256(f) != meta["sha256"]:
            raise StoreError(f"{f}: does not match the SHA-256 its manifest recorded; the "
                             "backup was changed or damaged after it was written. Use "
                             "another backup.")
    return manifest


@contextlib.contextmanager
def _file_lock(path: Path, timeout_s: float):
    """Hold the POSIX lock DuckDB takes on `path` (exclusive): no DuckDB process can open
    the file meanwhile. Yields immediately when the file does not exist."""
    if not path.exists():
        yield
        return
    fd = os.open(path, os.O_RDWR)
    try:
        deadline = time.monotonic() + timeout_s
        delay = 0.05
        while True:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() >= deadline:
                    raise StoreLockedError(
                        f"{path}: the database is in use by another process; gave up after "
                        f"{timeout_s:.0f}s. Close the other writer or reader (the app, a "
                        "notebook, a CLI command) and restore again.") from None
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _side_files(path: Path) -> list[Path]:
    index = search.index_path(path)
    return [path.with_name(path.name + ".wal"), index,
            index.with_name(index.name + "-wal"), index.with_name(index.name + "-shm")]


def restore(src: str | Path, db: str | Path | None, *, timeout_s: float = 30.0
            ) -> dict[str, Any]:
    """Replace the store `db` with the backup folder `src`; the store replaced is kept."""
    src = Path(src).expanduser()
    path = resolve_db_path(db)
    manifest = read_manifest(src)
    if int(manifest["schema_version"]) > migrations.SCHEMA_VERSION:
        raise newer_schema_error(src / manifest["store"], int(manifest["schema_version"]))
    try:
        _, counts = _counts(src / manifest["store"])
    except duckdb.Error as exc:
        raise (damage_error(src / manifest["store"], exc) or StoreError(
            f"{src}: the backup's database does not open: {exc}")) from exc
    if counts != manifest["tables"]:
        raise StoreError(f"{src}: the backup's row counts differ from its manifest; the "
                         "backup is damaged. Use another backup.")
    path.parent.mkdir(parents=True, exist_ok=True)
    index_name = manifest.get("search_index")
    staged = {path: path.with_name(f".{path.name}.restoring-{os.getpid()}")}
    if index_name:
        staged[search.index_path(path)] = staged[path].with_name(
            staged[path].name + search.INDEX_SUFFIX)
    try:
        shutil.copyfile(src / manifest["store"], staged[path])
        if index_name:
            shutil.copyfile(src / index_name, staged[search.index_path(path)])
        for tmp in staged.values():
            _fsync(tmp)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        kept: Path | None = None
        with _file_lock(path, timeout_s):
            if path.exists():
                kept = path.with_name(f"{path.name}.before-restore-{stamp}")
                n = 1
                while any(kept.with_name(kept.name + f.name[len(path.name):]).exists()
                          for f in (path, *_side_files(path))):  # never replace a kept one
                    n += 1
                    kept = path.with_name(f"{path.name}.before-restore-{stamp}-{n}")
                for f in (path, *_side_files(path)):
                    if f.exists():
                        os.replace(f, kept.with_name(kept.name + f.name[len(path.name):]))
            for f in _side_files(path):  # nothing of the old store stays beside the new one
                f.unlink(missing_ok=True)
            for final, tmp in staged.items():
                os.replace(tmp, final)
    except BaseException:
        for tmp in staged.values():
            tmp.unlink(missing_ok=True)
        raise
    with _opened(path, timeout_s) as con:  # migrates a backup of an older schema
        version = migrations.schema_version(con)
        restored = migrations.table_counts(con)
    return {"store": str(path), "backup": str(src), "kept": str(kept) if kept else None,
            "schema_version": version, "backup_schema_version": manifest["schema_version"],
            "tables": restored, "search_index": bool(index_name)}


def _catalog(con: duckdb.DuckDBPyConnection, db: str) -> dict[str, Any]:
    """What a compacted copy must keep of database `db`: schema version, row counts of
    every table, sequence values, view names."""
    tables = [r[0] for r in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = ? ORDER BY 1",
        [db]).fetchall()]
    return {
        "tables": {t: con.execute(f'SELECT count(*) FROM "{db}".main."{t}"').fetchone()[0]
                   for t in tables},
        "sequences": con.execute(
            "SELECT sequence_name, last_value FROM duckdb_sequences() WHERE database_name = ? "
            "ORDER BY 1", [db]).fetchall(),
        "views": con.execute(
            "SELECT view_name FROM duckdb_views() WHERE database_name = ? AND NOT internal "
            "ORDER BY 1", [db]).fetchall(),
        "schema_version": con.execute(
            f'SELECT max(version) FROM "{db}".main.schema_version').fetchone()[0],
    }


def compact(db: str | Path | None, *, timeout_s: float = 30.0) -> dict[str, Any]:
    """Rewrite the store into a fresh file holding only its live rows and swap it in (see
    the module docstring). Returns the sizes before and after and the row counts."""
    path = resolve_db_path(db)
    if not path.exists():
        raise StoreError(f"{path}: no database here, so there is nothing to compact.")
    tmp = path.with_name(f".{path.name}.compacting-{os.getpid()}")
    tmp_wal = tmp.with_name(tmp.name + ".wal")
    before = path.stat().st_size
    try:
        for f in (tmp, tmp_wal):
            f.unlink(missing_ok=True)
        con = open_connection(path, timeout_s=timeout_s, migrate=False)
        try:
            _checkpoint(con, path, "compacting it")
            name = con.execute("SELECT current_database()").fetchone()[0]
            quoted = str(tmp).replace("'", "''")
            con.execute(f"ATTACH '{quoted}' AS _compact")
            con.execute(f'COPY FROM DATABASE "{name}" TO _compact')
            con.execute("CHECKPOINT _compact")
            kept, copied = _catalog(con, name), _catalog(con, "_compact")
            con.execute("DETACH _compact")
        finally:
            con.close()
        if kept != copied:
            raise StoreError(f"{path}: the compacted copy differs from the store ({kept} vs "
                             f"{copied}); nothing was replaced.")
        _fsync(tmp)
        seen = path.stat()
        with _file_lock(path, timeout_s):
            now = path.stat()
            if ((now.st_size, now.st_mtime_ns) != (seen.st_size, seen.st_mtime_ns)
                    or path.with_name(path.name + ".wal").exists()):
                raise StoreError(f"{path}: another process wrote to the store while it was "
                                 "being compacted; nothing was replaced. Run it again.")
            os.replace(tmp, path)
    except BaseException:
        for f in (tmp, tmp_wal):
            f.unlink(missing_ok=True)
        raise
    return {"store": str(path), "bytes_before": before, "bytes_after": path.stat().st_size,
            "tables": kept["tables"], "schema_version": kept["schema_version"]}


@contextlib.contextmanager
def _opened(path: Path, timeout_s: float):
    con = open_connection(path, timeout_s=timeout_s)
    try:
        yield con
    finally:
        con.close()
