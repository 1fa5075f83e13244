"""Data use cases: import trajectory files, store statistics, the demo data set, overview.

Design decisions
- Import is one use case for both front-end shapes: paths on disk (CLI, notebook) and an
  uploaded file's bytes (the Trajectories page, as an `Upload`). Both run the same ingest
  pipeline (same parser, same all-or-nothing rule); extra ingest options pass through
  unchanged, so a new importer flag needs no change here.
- `pipeline_counts` is the Home page's table and `explore overview`'s output; it returns
  None when there is no database yet (an empty state, not an error). Capabilities and
  environments are counted as their pages list them (a built-in capability or
  environment not written yet is an accepted capability, a draft environment), so Home
  never says 0 beside a page that lists them.
- Deleting a dataset finds what to remove generically: every base table with a
  `trajectory_id` column (rows of the dataset's trajectories) or a `dataset_id` column,
  read from the catalog at delete time, so a table a later migration adds is covered
  without touching this function. Everything goes in ONE transaction: a failure (a
  constraint, a lock) rolls back and leaves the store as it was. Label edits are people's
  work: they are written to an audit file (beside the database, under `audit/`) before
  the commit, and the file is removed again if the transaction fails. `backup=PATH` takes a
  whole-store backup first (`workbench.store_admin.backup_store`, restored with `store
  restore PATH`), once the dataset is known to exist, so a wrong name costs no copy.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trace_lib import store
from trace_lib.demo import DEMO_DIR, DEMO_FILE  # noqa: F401  (where the demo data set lives)
from trace_lib.errors import UserInputError
from trace_lib.store import capabilities as store_capabilities
from trace_lib.store import labels as store_labels
from trace_lib.store import trajectories as store_trajectories

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
    from trace_lib.workbench.explore import store_overview

    uploads = [s for s in sources if isinstance(s, Upload)]
    if uploads:
        if len(sources) != 1:
            raise UserInputError("import: give paths, or one uploaded file at a time")
        report = ingest_bytes(uploads[0].name, uploads[0].content, db=db, fmt=fmt,
                              skip_invalid=skip_invalid, **options)
    else:
        report = ingest_paths(list(sources), db=db, fmt=fmt, skip_invalid=skip_invalid,
                              success_file=success_file, progress=progress, **options)
    # The Trajectories page's unfiltered view, stored for its next first visit (issue 35).
    store_overview(db)
    return report


# What an upload may be (the file kinds the importers read); anything else is refused with
# a sentence that says why, rather than by the upload widget's small print.
UPLOAD_SUFFIXES = (".json", ".jsonl", ".traj", ".eval", ".gz")


def upload_refusal(name: str) -> str | None:
    """Why an uploaded file of this name is not imported (a whole sentence), or None."""
    suffix = Path(name).suffix.lower()
    if suffix in UPLOAD_SUFFIXES:
        return None
    kind = f"a {suffix} file" if suffix else "a file without an extension"
    return (f"File {name} was not imported: {kind} is not a trajectory file. Upload "
            f"{', '.join(UPLOAD_SUFFIXES[:-1])} or {UPLOAD_SUFFIXES[-1]} (gzip of those) "
            "files.")


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
        counts = queries.pipeline_counts(con)
        # Capabilities count as the Labels page lists them: the built-in menu is written
        # on that page's first visit, so before it Home said "accepted 0" beside a page
        # listing fourteen accepted capabilities.
        by_cap_status = store_capabilities.status_counts(con)
    rows = counts.item.str.startswith("capabilities ")
    counts.loc[rows, "n"] = [by_cap_status.get(item.removeprefix("capabilities "), 0)
                             for item in counts.loc[rows, "item"]]
    if db_exists(db):
        # Environments count as the Environments page lists them: a built-in without a
        # review row is a draft there, so it is one here too (else Home says "draft 0"
        # beside a page of drafts).
        from collections import Counter

        from trace_lib.workbench import environments

        by_status = Counter(e["status"] for e in environments.list_environments(db))
        rows = counts.stage == "environments"
        counts.loc[rows, "n"] = [by_status.get(item, 0) for item in counts.loc[rows, "item"]]
    return counts


def next_step(counts) -> tuple[str, str]:
    """What to do next, from the pipeline counts: (a sentence, the page file to open)."""
    n = {} if counts is None else dict(zip(counts["item"], counts["n"], strict=True))
    if not n.get("trajectories"):
        return ("Import trajectories: upload result files on the Trajectories page, or run "
                "`make demo` for the demo data.", "pages/1_Trajectories.py")
    if not n.get("label runs"):
        return ("Label capabilities: run a labeler over the failures on the Labels page.",
                "pages/2_Labels.py")
    if not n.get("capabilities accepted"):
        return ("Rank capabilities: see which ones failures lack and accept them on the "
                "Rankings page.", "pages/3_Rankings.py")
    if not n.get("approved"):
        return ("Review environments: validate one for an accepted capability and approve "
                "it on the Environments page.", "pages/4_Environments.py")
    if not n.get("adapters"):
        return ("Train an adapter: launch a GRPO job on an approved environment on the "
                "Training page.", "pages/5_Training.py")
    if not n.get("composed models"):
        return ("Compose adapters: build a composed model and train its gates on the "
                "Routing page.", "pages/6_Routing.py")
    return ("Route prompts through the composed model and read which expert each token "
            "used on the Routing page.", "pages/6_Routing.py")


# ------------------------------------------------------------------------ datasets


def list_datasets(db: Db = None) -> list[dict[str, Any]]:
    """Imported datasets with their trajectory counts, newest first (`datasets list`);
    [] without a database."""
    if not db_exists(db):
        return []
    with store.connect(db, read_only=True) as con:
        return store_trajectories.list_datasets(con)


def _find_dataset(con, name: str) -> tuple[str, str]:
    """The (id, name) a person means by NAME: an exact id, else a unique name."""
    rows = store_trajectories.find_datasets(con, name)
    if not rows:
        known = store_trajectories.dataset_names(con)
        raise UserInputError(f"no dataset named {name!r}; the datasets are: "
                             f"{', '.join(known) or 'none yet'}.")
    if len(rows) > 1:
        raise UserInputError(f"{len(rows)} datasets are named {name!r}; give one of their "
                             f"ids instead: {', '.join(r[0] for r in rows)}.")
    return rows[0][0], rows[0][1]


def audit_dir(db: Db = None) -> Path:
    """Where deleted people's work (label edits) is kept: `audit/` beside the database."""
    return db_path(db).parent / "audit"


def delete_dataset(name: str, db: Db = None, *, backup: str | Path | None = None
                   ) -> dict[str, Any]:
    """Remove dataset NAME (a name or an id) with its trajectories and every row that
    refers to them, in one transaction (`datasets delete NAME --yes`, Home's Delete).
    With `backup`, a backup of the whole store is written to that new folder first.
    Returns the rows removed per table, the audit file of the label edits removed and
    the backup folder."""
    if not db_exists(db):
        raise store.StoreError(f"{db_path(db)}: no database here yet, so there is no "
                               "dataset to delete.")
    kept = None
    if backup is not None:
        from trace_lib.workbench import store_admin

        with store.connect(db, read_only=True) as con:
            _find_dataset(con, name)  # a wrong name is refused before any copy is made
        kept = store_admin.backup_store(db, backup)["backup"]
    removed: dict[str, int] = {}
    audit: Path | None = None
    with store.connect(db) as con:
        dataset_id, dataset_name = _find_dataset(con, name)
        try:
            with store.transaction(con):
                edit_rows = store_labels.dataset_label_edits(con, dataset_id)
                removed = store_trajectories.delete_dataset_rows(con, dataset_id)
                if edit_rows:  # written before the commit; removed again on rollback
                    audit = _write_audit(db, dataset_id, dataset_name, edit_rows)
        except store.DatabaseError as exc:
            if audit is not None:
                audit.unlink(missing_ok=True)
            raise store.StoreError(
                f"Could not delete dataset {dataset_name!r}: {exc}. Nothing was removed."
            ) from exc
        except BaseException:
            if audit is not None:
                audit.unlink(missing_ok=True)
            raise
    from trace_lib.workbench.explore import store_overview

    store_overview(db)  # the Trajectories page's unfiltered view, without the dataset
    return {"id": dataset_id, "name": dataset_name,
            "removed": {k: int(v) for k, v in removed.items() if v},
            "audit_file": str(audit) if audit else None, "backup": kept}


def _write_audit(db: Db, dataset_id: str, dataset_name: str,
                 edits: list[dict[str, Any]]) -> Path:
    folder = audit_dir(db)
    folder.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    path = folder / f"deleted-dataset-{dataset_id}-{stamp}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"dataset_id": dataset_id, "dataset_name": dataset_name,
                               "deleted_at": stamp, "label_edits": edits},
                              indent=2, default=str))
    tmp.replace(path)
    return path
