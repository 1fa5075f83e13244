"""Errors a user can act on: they carry a message that says what was wrong and where.

Design decisions
- A config read from a file, a form, a notebook's dict or a job spec is checked for unknown
  fields in one place (`check_fields`, `config_from_dict`), so every front end words the
  mistake the same way: where it was, the unknown fields and the ones expected.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class UserInputError(ValueError):
    """Bad input from a user or a file. The message names the file, record, field and
    what was expected, so the CLI and the app can show it as it is."""


def check_fields(data: Any, known: Iterable[str], where: str, *,
                 accepted: Iterable[str] = ()) -> None:
    """Raise a UserInputError unless `data` is an object whose keys are all `known` (or
    `accepted`: an old name still read, not offered); `where` names the file or field."""
    if not isinstance(data, dict):
        raise UserInputError(f"{where}: expected an object, got {type(data).__name__}")
    known = sorted(known)
    extra = sorted(set(data) - set(known) - set(accepted))
    if extra:
        raise UserInputError(f"{where}: unknown fields {extra}; expected {known}")


def config_from_dict(cls: type[T], data: Any, where: str) -> T:
    """The dataclass `cls` built from `data`, whose keys must be its fields."""
    check_fields(data, (f.name for f in dataclasses.fields(cls)), where)  # type: ignore[arg-type]
    return cls(**data)


# ----------------------------------------------------------------------- full disks
# Issue 33 ("nothing lost under faults"): a write that fails because its device is full
# must end in one message that names what could not be written, never a traceback from
# whichever layer happened to write first (DuckDB, SQLite, torch.save, a JSON file).

class DiskFullError(RuntimeError):
    """A file could not be written because its device is full (or the quota is spent).
    The message names the file or the store, says what was kept, and what to do."""


# What each writer says when its device is full: the OS (ENOSPC, EDQUOT), DuckDB (the
# OS's words inside its IO error), SQLite ("database or disk is full"; a failed
# WAL/journal open is only "disk I/O error", told apart by `_device_full`).
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_FULL_WORDS = ("no space left on device", "disk quota exceeded", "database or disk is full",
               "not enough space on the disk")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]


def _device_full(path: str | Path | None) -> bool:
    """Whether the device holding `path` has (next to) no free space left."""
    if path is None:
        return False
    folder = Path(path)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return shutil.disk_usage(folder).free < 64 * 1024
    except OSError:
        return False


def is_disk_full(exc: BaseException, path: str | Path | None = None) -> bool:
    """Whether `exc` (or what caused it) is a write refused for want of space; `path`,
    where given, lets an "I/O error" count when its device is in fact full."""
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno in _FULL_ERRNOS:
            return True
        text = str(e).lower()
        if any(w in text for w in _FULL_WORDS):
            return True
        if "disk i/o error" in text and _device_full(path):
            return True
    return False


def disk_full_error(exc: BaseException, what: str | Path,
                    path: str | Path | None = None) -> DiskFullError | None:
    """The `DiskFullError` for `exc` while writing `what` (a file, or words naming it),
    or None when `exc` is not about a full device."""
    if isinstance(exc, DiskFullError):
        return exc
    where = path if path is not None else (what if isinstance(what, Path) else None)
    if not is_disk_full(exc, where):
        return None
    filename = next((e.filename for e in _chain(exc)
                     if isinstance(e, OSError) and e.filename), None)
    also = f" ({filename})" if filename and str(filename) not in str(what) else ""
    return DiskFullError(
        f"could not write {what}{also}: no space left on the device. Nothing half-written "
        f"was kept: what was there before is unchanged. Free some space (or point the "
        f"store / TRACE_RUNS_DIR at a larger disk) and run it again; a run resumes from "
        f"what it finished.")


@contextlib.contextmanager
def writing(what: str | Path, path: str | Path | None = None) -> Iterator[None]:
    """Turn a full device met inside the block into a `DiskFullError` naming `what`."""
    try:
        yield
    except Exception as exc:
        err = disk_full_error(exc, what, path)
        if err is None or err is exc:
            raise
        raise err from exc


def write_text_atomic(path: str | Path, text: str) -> None:
    """`path` holds `text` in full or keeps what it held: a temp file beside it, fsynced,
    then `os.replace`; the temp file goes when the write fails (a full disk)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with writing(path), tmp.open("w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
