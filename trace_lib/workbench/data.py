"""Data use cases: import trajectory files, store statistics, the demo data set, overview.

Design decisions
- Import is one use case for both front-end shapes: paths on disk (CLI, notebook) and an
  uploaded file's bytes (the Trajectories page, as an `Upload`). Both run the same ingest
  pipeline (same parser, same all-or-nothing rule); extra ingest options pass through
  unchanged, so a new importer flag needs no change here.
- `pipeline_counts` is the Home page's table and `explore overview`'s output; it returns
  None when there is no database yet (an empty state, not an error).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_lib import store
from trace_lib.errors import UserInputError

Db = str | Path | None


@dataclass(frozen=True)
class Upload:
    """A file a person uploaded: its name (for format detection and messages) and bytes."""

    name: str
    content: bytes


def import_files(sources: Sequence[str | Path | Upload], *, db: Db = None, fmt: str = "auto",
                 skip_invalid: bool = False, success_file: str | Path | None = None,
                 progress: bool = False, **options: Any):
    """Import trajectory files (all or nothing unless `skip_invalid`); returns the
    IngestReport. `sources` are paths on disk (`ingest`, a notebook) or one `Upload` (the
    Trajectories page): the same parser and the same rules either way."""
    from trace_lib.ingest import ingest_bytes, ingest_paths

    uploads = [s for s in sources if isinstance(s, Upload)]
    if uploads:
        if len(sources) != 1:
            raise UserInputError("import: give paths, or one uploaded file at a time")
        return ingest_bytes(uploads[0].name, uploads[0].content, db=db, fmt=fmt,
                            skip_invalid=skip_invalid, **options)
    return ingest_paths(list(sources), db=db, fmt=fmt, skip_invalid=skip_invalid,
                        success_file=success_file, progress=progress, **options)


def import_formats() -> list[str]:
    """The format names `--format` and the page accept (besides `auto`)."""
    from trace_lib.ingest import format_names

    return format_names()


def store_stats(db: Db = None) -> dict[str, Any]:
    """Store-wide counts (`stats`)."""
    from trace_lib.ingest import store_stats as _stats

    return _stats(db)


def build_demo(out: str | Path | None = None, **kwargs: Any) -> dict[str, Any]:
    """Generate the demo data set and import it (`demo build`); see `trace_lib.demo`."""
    from trace_lib.demo import DEMO_DIR
    from trace_lib.demo import build_demo as _build

    return _build(out if out is not None else DEMO_DIR, **kwargs)


def db_path(db: Db = None) -> Path:
    """The database file a front end works on (`--db`, else `TRACE_DB`, else the default)."""
    return store.resolve_db_path(db)


def db_exists(db: Db = None) -> bool:
    return store.resolve_db_path(db).exists()


def pipeline_counts(db: Db = None, missing_ok: bool = True):
    """Counts per pipeline stage (a DataFrame `stage, item, n`); without a database, None
    (or the store's "no database here yet" error when not `missing_ok`)."""
    from trace_lib.explore import queries

    if missing_ok and not db_exists(db):
        return None
    with store.connect(db, read_only=True) as con:
        return queries.pipeline_counts(con)
