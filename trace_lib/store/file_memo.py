"""Values computed from a store, kept per state of the store's files (issue 35).

Design decisions
- What a page asks for several times per action, and again after a server restart, is
  computed from the whole store but changes only when the store does: the trajectories'
  fingerprints (the explore views', `explore.overview_stored.version`; the materialised
  labels', `diagnose.materialise`). The first kept its own bounded dictionary keyed by the
  store file's state, the second none (six hashes of every trajectory per Rankings slider
  move); both use this one (`FileMemo`), so "when is a kept value still right" has one
  answer. A text search's hits (`store.search.hits`) are keyed by the same state but
  stay in their own process cache: Arrow arrays of up to millions of ids, no side file.
- The key is the state of the store's files on disk (`search.file_version`: size and
  modification time of the store, its WAL, the search index and its WAL) and the
  caller's own key. A commit grows the WAL or rewrites the file, so any writer (another
  process, plain SQL) makes a new state; an in-memory store has no file: nothing is kept.
- Inside an explicit transaction the connection's own writes are not on disk yet, so the
  state says nothing about what it sees: `committed_only` memos compute every time there
  (two reads of `current_transaction_id()` tell: outside one, each statement is its own).
- `persist=True` also keeps the values (small JSON: strings and numbers) in a side file,
  `<store>.memo.json`, so the first visit after a server start does not hash every
  trajectory again (the explore fingerprint: 0.126 s CPU in a fresh process at 1M, linear
  in the store). The side file is a
  cache: written atomically (a temporary file renamed over it), never required (an
  unreadable or unwritable one is ignored), and a state it names that no longer matches
  the files is simply never asked for.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

import duckdb

from trace_lib.store.search import file_version, store_file

T = TypeVar("T")
MEMO_SUFFIX = ".memo.json"
_PERSISTED_PER_NAME = 8  # states kept in the side file per memo
_FILE_LOCK = threading.Lock()


def memo_path(db: str | Path) -> Path:
    p = Path(db)
    return p.with_name(p.name + MEMO_SUFFIX)


def file_state(con: duckdb.DuckDBPyConnection, *, committed_only: bool = False
               ) -> tuple | None:
    """The store's files' state (path, sizes and times), or None where it identifies
    nothing: an in-memory store, and with `committed_only` a connection inside an
    explicit transaction."""
    path = store_file(con)
    if path is None:
        return None
    if committed_only:
        ids = [con.execute("SELECT current_transaction_id()").fetchall()[0][0]
               for _ in range(2)]
        if ids[0] == ids[1]:
            return None
    return (str(path), *file_version(path))


class FileMemo(Generic[T]):
    """`get(con, key, compute)`: `compute()` once per (file state, key), the `size` most
    recent kept in this process; with `persist`, also in the store's side file under
    `name` (values must be JSON: strings, numbers)."""

    def __init__(self, name: str, size: int, *, persist: bool = False,
                 committed_only: bool = False) -> None:
        self.name, self.size = name, size
        self.persist, self.committed_only = persist, committed_only
        self._items: OrderedDict[tuple, T] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, con: duckdb.DuckDBPyConnection, key: tuple, compute: Callable[[], T]) -> T:
        state = file_state(con, committed_only=self.committed_only)
        if state is None:
            return compute()
        full = (*state, *key)
        with self._lock:
            if full in self._items:
                self._items.move_to_end(full)
                return self._items[full]
        found = _read_persisted(state[0], self.name, full) if self.persist else None
        value = found[0] if found is not None else compute()
        with self._lock:
            self._items[full] = value
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        if self.persist and found is None:
            _write_persisted(state[0], self.name, full, value)
        return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


def _entries(path: Path, name: str) -> tuple[dict, list[list]]:
    """The side file's document and its well-formed `[state, value]` entries for `name`;
    anything unreadable or of another shape reads as nothing kept."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}, []
    if not isinstance(data, dict):
        return {}, []
    got = data.get(name)
    return data, [e for e in got if isinstance(e, list) and len(e) == 2
                  and isinstance(e[0], list)] if isinstance(got, list) else []


def _read_persisted(db: str, name: str, full: tuple) -> tuple[Any] | None:
    for state, value in _entries(memo_path(db), name)[1]:
        if tuple(state) == full:
            return (value,)
    return None


def _write_persisted(db: str, name: str, full: tuple, value: Any) -> None:
    path = memo_path(db)
    with _FILE_LOCK, contextlib.suppress(OSError, TypeError, ValueError):
        data, entries = _entries(path, name)
        kept = [e for e in entries if tuple(e[0]) != full]
        data[name] = (kept + [[list(full), value]])[-_PERSISTED_PER_NAME:]
        fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(data, fh)
            os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide it from the store's readers
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
