"""Store administration use cases: check, repair, back up, restore, and the check on open.

Design decisions
- `check_store` is `python -m trace_lib store check`: the schema version, every table read
  in full (damage DuckDB only finds when it reads a block), each dataset's rows against
  what its import recorded, the materialised labels against their definition (the views),
  and the search index against the messages (`store.integrity`). It opens the store
  read-only and writes nothing, unless `repair`: then the search index is rebuilt and the
  materialised labels are rebuilt from the definition where they differ, and the store is
  checked again. What a repair cannot mend (a damaged file, lost rows) is left to a backup.
- Materialised labels are compared only when they claim to be up to date (their watermark
  equals the store's): tables behind a recent write are stale by design and caught up by
  the next read (`materialise.sync`), which is not a fault.
- `open_check` is what the app runs when it opens a store (and again whenever the files
  change): a damaged file or a newer schema raises `StoreError` with what to do (the page
  shows it instead of a traceback); a missing, unreadable or stale search index is rebuilt
  on the spot and the notice says so. A store busy with another writer skips the rebuild
  and says it will be done later (searches meanwhile scan).
- `backup_store` / `restore_store` / `compact_store` are `store.backup` (a file copy under the store's lock;
  see that module for why not EXPORT DATABASE). `delete_dataset(..., backup=PATH)` in
  `workbench.data` takes one of these before it deletes.
- `explain_error` turns a DuckDB error raised mid-query by a damaged file into the same
  `DamagedStoreError` message the open gives (the CLI prints it, exit 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_lib import store
from trace_lib.store import backup as store_backup
from trace_lib.store import derived, integrity, migrations, row_identity, search

Db = str | Path | None


@dataclass
class StoreReport:
    """What `store check` found: every finding, and what a repair did."""

    path: Path
    findings: list[integrity.Finding] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.findings)

    @property
    def problems(self) -> list[integrity.Finding]:
        return [f for f in self.findings if not f.ok]

    def to_json(self) -> dict[str, Any]:
        return {"store": str(self.path), "ok": self.ok, "repaired": self.repaired,
                "findings": [f.to_json() for f in self.findings]}


def _labels(con: Any) -> integrity.Finding:
    from trace_lib.diagnose import materialise

    if store.MIGRATIONS.index(migrations.MATERIALISED_LABELS) >= store.schema_version(con):
        return integrity.Finding("labels", True, "no materialised labels in this schema "
                                 "version (created by the first write, which migrates it)")
    state = materialise.built_state(con)
    if state == "unbuilt":
        return integrity.Finding("labels", True, "materialised labels not built yet (built "
                                 "by the first read that needs them)")
    if state == "stale":
        return integrity.Finding("labels", True, "materialised labels are behind the latest "
                                 "write (caught up by the next read)")
    built = materialise.materialised_snapshot(con, sync_first=False)
    want = materialise.definition_snapshot(con)
    if built == want:
        return integrity.Finding("labels", True, f"materialised labels match their "
                                 f"definition ({len(want['pairs'])} labelled pairs, "
                                 f"{len(want['run_counts'])} per-run counts)")
    diff = [f"{k}: {len(set(built[k]) ^ set(want[k]))} rows differ" for k in want
            if built[k] != want[k]]
    return integrity.Finding("labels", False, "materialised labels differ from their "
                             "definition (the label views): " + "; ".join(diff),
                             f"`{integrity.REPAIR}` rebuilds them from the definition")


def _check(path: Path, sample: int) -> StoreReport:
    report = StoreReport(path)
    with store.connect(path, read_only=True) as con:
        report.findings.append(integrity.schema(con))
        found, _ = integrity.read_tables(con, path)
        report.findings += found
        if not all(f.ok for f in found):
            return report  # a damaged table: the checks below would only repeat it
        report.findings += integrity.dataset_counts(con)
        report.findings += integrity.row_identities(con)
        report.findings.append(_labels(con))
        report.findings += integrity.search_index(con, sample)
    return report


def check_store(db: Db = None, *, repair: bool = False, sample: int = 50) -> StoreReport:
    """Verify the store (`store check`); with `repair`, rebuild what can be rebuilt (the
    search index, the materialised labels) and check again."""
    path = store.resolve_db_path(db)
    if not path.exists():
        raise store.StoreError(f"{path}: no database here yet (import trajectories or run "
                               "`python -m trace_lib demo build`); nothing to check.")
    report = _check(path, sample)
    if not repair or report.ok:
        return report
    repaired: list[str] = []
    areas = {f.check for f in report.problems}
    if areas & {"search index", "labels", "label rows", "trajectory rows"}:
        from trace_lib.diagnose import materialise

        with store.connect(path) as con:
            if "trajectory rows" in areas:
                with store.transaction(con):
                    n = {t: row_identity.keep_first(con, t)
                         for t in ("trajectories", "messages", "tool_calls")}
                repaired.append("repeated rows deleted (the first of each kept): "
                                + ", ".join(f"{k} {v}" for k, v in n.items()))
                areas |= {"labels", "search index"}  # both counted the repeats
            if "label rows" in areas:
                with store.transaction(con):
                    n = row_identity.keep_first(con, "labels")
                repaired.append(f"{n} repeated label rows deleted (the first of each pair "
                                "kept)")
                areas.add("labels")  # the materialised labels counted the repeats
            if "search index" in areas:
                aside = integrity.set_aside_unreadable_index(path)
                if aside is not None:
                    repaired.append(f"unreadable search index set aside as {aside}")
                n = derived.rebuild(con, path)["indexed"]  # what `explore reindex` runs
                repaired.append(f"search index rebuilt ({n} documents)")
            if "labels" in areas:
                materialise.sync(con, force_rebuild=True)
                repaired.append("materialised labels rebuilt from their definition")
    report = _check(path, sample)
    report.repaired = repaired
    return report


def open_check(db: Db = None) -> list[str]:
    """What the app runs on opening the store: raises `StoreError` (damaged, newer schema)
    with what to do; rebuilds a missing or stale search index. Returns notices to show."""
    path = store.resolve_db_path(db)
    if not path.exists():
        return []
    with store.connect(path, read_only=True) as con:
        state = search.index_state(con)
    if state.fresh or state.n_trajectories == 0:
        return []
    what = ("missing" if state.path is None else
            f"behind the store ({state.n_unindexed} of {state.n_trajectories} trajectories "
            "unindexed)")
    try:
        with store.connect(path, timeout_s=2.0) as con:
            integrity.set_aside_unreadable_index(path)
            n = derived.rebuild(con, path)["indexed"]
    except store.StoreLockedError:
        return [f"The search index of {path} is {what}; another process is writing the "
                "store, so it will be rebuilt on the next visit (text searches scan "
                "meanwhile)."]
    return [f"The search index of {path} was {what}; it was rebuilt from the messages "
            f"({n} trajectories)."]


def explain_error(exc: BaseException, db: Db = None) -> store.StoreError | None:
    """The `DamagedStoreError` for a DuckDB error a damaged store file raised mid-query,
    else None (the error is something else)."""
    return store.damage_error(store.resolve_db_path(db), exc)


def backup_store(db: Db, dest: str | Path) -> dict[str, Any]:
    """A consistent copy of the store and its search index in the new folder `dest`
    (`store backup PATH`)."""
    done = store_backup.backup(db, dest)
    return {"backup": str(done.path), "store": done.manifest["source"],
            "schema_version": done.manifest["schema_version"],
            "tables": done.manifest["tables"], "files": done.manifest["files"],
            "restore": f"python -m trace_lib store restore {done.path} --db "
                       f"{done.manifest['source']}"}


def compact_store(db: Db = None) -> dict[str, Any]:
    """Give back the space deletes left in the store file (`store compact`): a copy of the
    live rows swapped in under the store's lock (`store.backup.compact`)."""
    return store_backup.compact(db)


def restore_store(src: str | Path, db: Db = None) -> dict[str, Any]:
    """Replace the store with the backup folder `src` (`store restore PATH`); the store it
    replaces is kept beside it, renamed."""
    return store_backup.restore(src, db)
