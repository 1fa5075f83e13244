"""Materialised labels: majority and effective labels, and the ranking's counts, as tables.

Design decisions
- The views `majority_labels`, `effective_labels` and `effective_run_labels` (trace_lib/store)
  stay the definition; the tables here hold the same answers so that the ranking, the
  Labels grid, the review queue and the exports read them in milliseconds at 100k
  trajectories x 10 runs (14M label rows) instead of re-aggregating every label:
    label_pairs          per (trajectory, capability): votes of finished runs (nl/np/nn,
                         n_rows incl. failed pairs), their majority, the latest live edit,
                         and the effective value (edit, else majority)
    label_run_counts     per (run, capability, dataset, agent model, domain, outcome,
                         effective value): the per-run counts Cov / Delta come from
    label_pooled_counts  the same over pooled effective labels (Fisher, Wilson)
  The scope keys (dataset, agent model, domain) are columns of the counts, so a scoped
  ranking is a filtered sum, not a recomputation.
- Kept up to date by `sync`, the one entry point, called by every writer right after it
  writes (a label run finishing, an edit, an undo, an import) and by every reader before
  it reads. It compares the store with what the tables were built from
  (`label_materialised`: finished runs with their row counts, the trajectory count, the
  edit watermark) and does the least work that makes them equal again:
    a new finished run   -> its votes are added to `label_pairs` (one join of the run's
                            labels with the pairs), its counts appended
    new edits (or undos) -> only the touched pairs are patched, and the counts get a delta:
                            minus each touched pair's old contribution (per run: the old
                            edit, else the run's own label), plus its new one. This is the
                            re-rank cache's patching idea (ranking.py before issue 15),
                            moved from process memory into the store, so every process and
                            every page sees it, and it survives a restart.
    anything else        -> a full rebuild from the definition (a run deleted or no longer
                            finished, labels of a finished run changed, trajectories
                            removed, edits rewritten). Plain SQL writes are therefore
                            noticed too; a test checks tables == definition after runs,
                            edits and undos.
- Only finished runs count (the `counted_labels` rule): labels a running run writes do not
  touch the tables until the run finishes.
- Each sync is one transaction: a reader never sees half a patch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import duckdb

from trace_lib.store import file_memo
from trace_lib.store.search import store_file

T = TypeVar("T")

KEYS = "dataset_id, agent_model, domain"
RUN_COUNT_COLS = f"run_id, capability, {KEYS}, success, value"
POOLED_COLS = f"capability, {KEYS}, success, value"
MAJORITY = ("CASE WHEN nl + np + nn = 0 THEN NULL WHEN nl >= np AND nl >= nn THEN 'lacking' "
            "WHEN np >= nn THEN 'present' ELSE 'na' END")
FINISHED = "coalesce(status, 'finished') = 'finished'"


@dataclass(frozen=True)
class Fingerprint:
    finished: tuple[str, ...]
    n_labels: int
    n_trajectories: int
    edit_max: int
    edit_count: int


# The trajectories' part of the fingerprint, kept per state of the store's files
# (`store.file_memo`, in the process and the store's side file): one page action asks for
# the store's version several times (the sync before each read, the memo keys), and that
# part is a hash over every trajectory (0.044 s at 1M, six times per Rankings slider move).
# Never kept inside an explicit transaction (a writer's rows are not on disk until it
# commits). The other parts are counts and maxima of small tables or row-group metadata.
_TRAJECTORY_HASHES: file_memo.FileMemo[int] = file_memo.FileMemo(
    "labels_trajectory_hash", 16, persist=True, committed_only=True)


def _trajectories_hash(con: duckdb.DuckDBPyConnection) -> int:
    # (id, dataset, agent model, domain, outcome) of every trajectory, not a count: the
    # counts are keyed by those columns, so a trajectory moved to another dataset (or a
    # dataset deleted) must be noticed too. Kept in the state's `n_trajectories` column.
    # The count joins the key: a coarse file clock cannot hide a delete.
    n = con.execute("SELECT count(*) FROM trajectories").fetchall()[0][0]
    return _TRAJECTORY_HASHES.get(con, (n,), lambda: int(con.execute(
        "SELECT coalesce((bit_xor(hash(id, dataset_id, agent_model, domain, success)) >> 2)"
        "::BIGINT, 0) FROM trajectories").fetchall()[0][0]))


def _fingerprint(con: duckdb.DuckDBPyConnection) -> Fingerprint:
    finished = tuple(r[0] for r in con.execute(
        f"SELECT id FROM label_runs WHERE {FINISHED} ORDER BY id").fetchall())
    n_labels, emax, ecount = con.execute(
        "SELECT (SELECT count(*) FROM labels), (SELECT coalesce(max(id), 0) FROM label_edits), "
        "(SELECT count(*) FROM label_edits)").fetchall()[0]
    return Fingerprint(finished, int(n_labels), _trajectories_hash(con), int(emax),
                       int(ecount))


def _stored(con: duckdb.DuckDBPyConnection) -> tuple[dict[str, int], Fingerprint] | None:
    row = con.execute("SELECT runs, n_labels, n_trajectories, edit_max, edit_count "
                      "FROM label_materialised").fetchone()
    if row is None:
        return None
    runs = json.loads(row[0]) if isinstance(row[0], str) else dict(row[0])
    return runs, Fingerprint(tuple(sorted(runs)), int(row[1]), int(row[2]), int(row[3]),
                             int(row[4]))


def _run_rows(con: duckdb.DuckDBPyConnection, runs: list[str]) -> dict[str, int]:
    if not runs:
        return {}
    got = dict(con.execute("SELECT run_id, count(*) FROM labels WHERE list_contains(?, run_id) "
                           "GROUP BY run_id", [runs]).fetchall())
    return {r: int(got.get(r, 0)) for r in runs}


def _write_state(con: duckdb.DuckDBPyConnection, runs: dict[str, int], fp: Fingerprint) -> None:
    con.execute("DELETE FROM label_materialised")
    con.execute("INSERT INTO label_materialised VALUES (?, ?, ?, ?, ?)",
                [json.dumps(runs, sort_keys=True), fp.n_labels, fp.n_trajectories,
                 fp.edit_max, fp.edit_count])


# --------------------------------------------------------------------------- rebuild

def _rebuild(con: duckdb.DuckDBPyConnection) -> None:
    """Everything from the definition (what a test compares the incremental path with)."""
    con.execute("DELETE FROM label_pairs")
    con.execute(f"""
        INSERT INTO label_pairs
        WITH v AS (
            SELECT trajectory_id, capability, count(*) AS n_rows,
                   count(*) FILTER (WHERE value = 'lacking') AS nl,
                   count(*) FILTER (WHERE value = 'present') AS np,
                   count(*) FILTER (WHERE value = 'na') AS nn
            FROM counted_labels GROUP BY ALL
        ), j AS (
            SELECT coalesce(v.trajectory_id, e.trajectory_id) AS trajectory_id,
                   coalesce(v.capability, e.capability) AS capability,
                   coalesce(v.n_rows, 0) AS n_rows, coalesce(v.nl, 0) AS nl,
                   coalesce(v.np, 0) AS np, coalesce(v.nn, 0) AS nn,
                   e.value AS edit_value, e.edit_id, e.editor, e.edited_at
            FROM v FULL OUTER JOIN latest_label_edits e
              ON e.trajectory_id = v.trajectory_id AND e.capability = v.capability
        )
        SELECT trajectory_id, capability, n_rows, nl, np, nn, {MAJORITY}, edit_value, edit_id,
               editor, edited_at, coalesce(edit_value, {MAJORITY})
        FROM j ORDER BY trajectory_id, capability""")
    con.execute("DELETE FROM label_run_counts")
    _insert_run_counts(con, "counted_labels")
    _rebuild_pooled(con)


def _insert_run_counts(con: duckdb.DuckDBPyConnection, source: str,
                       params: list[Any] | None = None) -> None:
    """Append per-run counts of `source` labels (edits applied from `label_pairs`)."""
    con.execute(f"""
        INSERT INTO label_run_counts
        SELECT l.run_id, l.capability, t.dataset_id, t.agent_model, t.domain, t.success,
               coalesce(p.edit_value, l.value) AS value, count(*)
        FROM {source} l
        JOIN trajectories t ON t.id = l.trajectory_id
        LEFT JOIN (SELECT trajectory_id, capability, edit_value FROM label_pairs
                   WHERE edit_value IS NOT NULL) p
          ON p.trajectory_id = l.trajectory_id AND p.capability = l.capability
        WHERE t.success IS NOT NULL AND coalesce(p.edit_value, l.value) IS NOT NULL
        GROUP BY ALL""", params or [])


def _rebuild_pooled(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("DELETE FROM label_pooled_counts")
    con.execute("""
        INSERT INTO label_pooled_counts
        SELECT p.capability, t.dataset_id, t.agent_model, t.domain, t.success, p.value, count(*)
        FROM label_pairs p JOIN trajectories t ON t.id = p.trajectory_id
        WHERE t.success IS NOT NULL AND p.n_rows > 0 AND p.value IS NOT NULL
        GROUP BY ALL""")


# -------------------------------------------------------------------- incremental

def _add_runs(con: duckdb.DuckDBPyConnection, runs: list[str]) -> None:
    """Add newly finished runs: their votes into `label_pairs`, their counts appended."""
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _mat_pairs AS
        WITH v AS (
            SELECT trajectory_id, capability, count(*) AS n_rows,
                   count(*) FILTER (WHERE value = 'lacking') AS nl,
                   count(*) FILTER (WHERE value = 'present') AS np,
                   count(*) FILTER (WHERE value = 'na') AS nn
            FROM labels WHERE list_contains(?, run_id) GROUP BY ALL
        ), j AS (
            SELECT coalesce(p.trajectory_id, v.trajectory_id) AS trajectory_id,
                   coalesce(p.capability, v.capability) AS capability,
                   coalesce(p.n_rows, 0) + coalesce(v.n_rows, 0) AS n_rows,
                   coalesce(p.nl, 0) + coalesce(v.nl, 0) AS nl,
                   coalesce(p.np, 0) + coalesce(v.np, 0) AS np,
                   coalesce(p.nn, 0) + coalesce(v.nn, 0) AS nn,
                   p.edit_value, p.edit_id, p.editor, p.edited_at
            FROM label_pairs p FULL OUTER JOIN v
              ON p.trajectory_id = v.trajectory_id AND p.capability = v.capability
        )
        SELECT trajectory_id, capability, n_rows, nl, np, nn, {MAJORITY} AS majority,
               edit_value, edit_id, editor, edited_at,
               coalesce(edit_value, {MAJORITY}) AS value
        FROM j""", [runs])
    con.execute("DELETE FROM label_pairs")
    # Sorted by trajectory: a page's pairs (the grid's first trajectories by id, one
    # trajectory's labels) are then a few row groups that zone maps find, not a scan of
    # every pair (140M at 10M x 14).
    con.execute("INSERT INTO label_pairs SELECT * FROM _mat_pairs "
                "ORDER BY trajectory_id, capability")
    con.execute("DROP TABLE _mat_pairs")
    _insert_run_counts(con, "(SELECT * FROM labels WHERE list_contains(?, run_id))", [runs])
    _rebuild_pooled(con)


def _merge_delta(con: duckdb.DuckDBPyConnection, table: str, cols: str, delta: str) -> None:
    """table := table + delta (rows summed by key; zero rows dropped). Count tables are
    small (runs x capabilities x scope keys x 6), so rewriting them is cheap."""
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _mat_merged AS
        SELECT {cols}, sum(n)::BIGINT AS n
        FROM (SELECT {cols}, n FROM {table} UNION ALL SELECT {cols}, n FROM {delta})
        GROUP BY ALL HAVING sum(n) <> 0""")
    con.execute(f"DELETE FROM {table}")
    con.execute(f"INSERT INTO {table} SELECT {cols}, n FROM _mat_merged")
    con.execute("DROP TABLE _mat_merged")


def _patch_edits(con: duckdb.DuckDBPyConnection, after_edit_id: int) -> None:
    """Patch the pairs touched by edits (and undos) with id > `after_edit_id`."""
    con.execute("""CREATE OR REPLACE TEMP TABLE _mat_touched AS
                   SELECT DISTINCT trajectory_id, capability FROM label_edits WHERE id > ?""",
                [after_edit_id])
    con.execute("""CREATE OR REPLACE TEMP TABLE _mat_new AS
                   SELECT x.trajectory_id, x.capability, e.value, e.edit_id, e.editor,
                          e.edited_at
                   FROM _mat_touched x LEFT JOIN latest_label_edits e
                     ON e.trajectory_id = x.trajectory_id AND e.capability = x.capability""")
    con.execute("""CREATE OR REPLACE TEMP TABLE _mat_old AS
                   SELECT p.* FROM label_pairs p SEMI JOIN _mat_touched x
                     ON p.trajectory_id = x.trajectory_id AND p.capability = x.capability""")
    # Per run: each counted label of a touched pair moves from (old edit, else its own
    # value) to (new edit, else its own value).
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _mat_run_delta AS
        WITH l AS (
            SELECT c.run_id, c.trajectory_id, c.capability, c.value, t.dataset_id,
                   t.agent_model, t.domain, t.success, o.edit_value AS old_edit,
                   n.value AS new_edit
            FROM counted_labels c
            SEMI JOIN _mat_touched x
              ON c.trajectory_id = x.trajectory_id AND c.capability = x.capability
            JOIN trajectories t ON t.id = c.trajectory_id
            LEFT JOIN _mat_old o
              ON o.trajectory_id = c.trajectory_id AND o.capability = c.capability
            LEFT JOIN _mat_new n
              ON n.trajectory_id = c.trajectory_id AND n.capability = c.capability
            WHERE t.success IS NOT NULL
        )
        SELECT {RUN_COUNT_COLS}, sum(n) AS n FROM (
            SELECT run_id, capability, {KEYS}, success, coalesce(old_edit, value) AS value,
                   -1 AS n FROM l
            UNION ALL
            SELECT run_id, capability, {KEYS}, success, coalesce(new_edit, value) AS value,
                   1 AS n FROM l
        ) WHERE value IS NOT NULL GROUP BY ALL""")
    con.execute("""
        UPDATE label_pairs SET edit_value = n.value, edit_id = n.edit_id, editor = n.editor,
               edited_at = n.edited_at, value = coalesce(n.value, label_pairs.majority)
        FROM _mat_new n
        WHERE label_pairs.trajectory_id = n.trajectory_id
          AND label_pairs.capability = n.capability""")
    con.execute("""
        INSERT INTO label_pairs
        SELECT n.trajectory_id, n.capability, 0, 0, 0, 0, NULL, n.value, n.edit_id, n.editor,
               n.edited_at, n.value
        FROM _mat_new n ANTI JOIN _mat_old o
          ON o.trajectory_id = n.trajectory_id AND o.capability = n.capability
        WHERE n.value IS NOT NULL""")
    # A pair that has neither labels nor a live edit any more (an undone edit on a pair no
    # run labeled) is not a pair: the definition has no row for it.
    con.execute("""DELETE FROM label_pairs WHERE n_rows = 0 AND edit_value IS NULL""")
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _mat_pool_delta AS
        SELECT {POOLED_COLS}, sum(n) AS n FROM (
            SELECT o.capability, t.dataset_id, t.agent_model, t.domain, t.success, o.value,
                   -1 AS n
            FROM _mat_old o JOIN trajectories t ON t.id = o.trajectory_id
            WHERE o.n_rows > 0 AND o.value IS NOT NULL AND t.success IS NOT NULL
            UNION ALL
            SELECT p.capability, t.dataset_id, t.agent_model, t.domain, t.success, p.value, 1
            FROM label_pairs p
            SEMI JOIN _mat_touched x
              ON p.trajectory_id = x.trajectory_id AND p.capability = x.capability
            JOIN trajectories t ON t.id = p.trajectory_id
            WHERE p.n_rows > 0 AND p.value IS NOT NULL AND t.success IS NOT NULL
        ) GROUP BY ALL""")
    _merge_delta(con, "label_run_counts", RUN_COUNT_COLS, "_mat_run_delta")
    _merge_delta(con, "label_pooled_counts", POOLED_COLS, "_mat_pool_delta")
    for t in ("_mat_touched", "_mat_new", "_mat_old", "_mat_run_delta", "_mat_pool_delta"):
        con.execute(f"DROP TABLE {t}")


# ----------------------------------------------------------------------------- sync

@dataclass
class SyncReport:
    action: str  # 'fresh' | 'rebuilt' | 'updated'
    added_runs: list[str]
    patched_edits: int


_SYNC_ATTEMPTS = 5


def sync(con: duckdb.DuckDBPyConnection, *, force_rebuild: bool = False) -> SyncReport:
    """Bring the materialised tables up to date with labels, runs and edits (one
    transaction). Cheap when nothing changed: four counts and the run list."""
    for attempt in range(_SYNC_ATTEMPTS):
        fp = _fingerprint(con)
        stored = _stored(con)
        if not force_rebuild and stored is not None and stored[1] == fp:
            return SyncReport("fresh", [], 0)
        con.execute("BEGIN TRANSACTION")
        try:
            report = _sync_locked(con, fp, stored, force_rebuild)
            con.execute("COMMIT")
            return report
        except duckdb.TransactionException:
            # Two connections of the app (two browser sessions) synced the same change at
            # once: DuckDB lets one commit and aborts the other. Re-read: the other one's
            # work is usually all there is to do.
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
            if attempt == _SYNC_ATTEMPTS - 1:
                raise
            time.sleep(0.05 * (attempt + 1))
        except BaseException:
            con.execute("ROLLBACK")
            raise
    raise AssertionError("unreachable")


def _sync_locked(con: duckdb.DuckDBPyConnection, fp: Fingerprint,
                 stored: tuple[dict[str, int], Fingerprint] | None,
                 force_rebuild: bool) -> SyncReport:
    def rebuild() -> SyncReport:
        _rebuild(con)
        _write_state(con, _run_rows(con, list(fp.finished)), fp)
        return SyncReport("rebuilt", list(fp.finished), 0)

    if force_rebuild or stored is None:
        return rebuild()
    runs, old = stored
    if fp.n_trajectories != old.n_trajectories or set(runs) - set(fp.finished):
        return rebuild()
    new_runs = [r for r in fp.finished if r not in runs]
    rows = _run_rows(con, sorted(set(runs) | set(new_runs))) if (
        fp.n_labels != old.n_labels or new_runs) else dict(runs)
    if any(rows[r] != n for r, n in runs.items()):
        return rebuild()  # labels of a counted run changed under us
    if fp.edit_count < old.edit_count or fp.edit_max < old.edit_max:
        return rebuild()
    if fp.edit_max > old.edit_max:
        kept = con.execute("SELECT count(*) FROM label_edits WHERE id <= ?",
                           [old.edit_max]).fetchone()[0]
        if kept != old.edit_count:
            return rebuild()
    if new_runs:
        _add_runs(con, new_runs)
    n_edits = 0
    if fp.edit_max > old.edit_max:
        n_edits = fp.edit_count - old.edit_count
        _patch_edits(con, old.edit_max)
    _write_state(con, rows, fp)
    return SyncReport("updated", new_runs, n_edits)


def counts_every_finished_run(con: duckdb.DuckDBPyConnection, run_ids: list[str]) -> bool:
    """Whether `run_ids` are all the finished runs: then the tables here answer for them."""
    finished = {r[0] for r in con.execute(
        f"SELECT id FROM label_runs WHERE {FINISHED}").fetchall()}
    return set(run_ids) == finished


def version(con: duckdb.DuckDBPyConnection) -> tuple[Any, ...]:
    """A key that changes whenever anything the diagnose pages show may change: the
    materialised state (after `sync`) and the capability catalog."""
    sync(con)
    state = con.execute("SELECT runs, n_labels, n_trajectories, edit_max, edit_count "
                        "FROM label_materialised").fetchone()
    caps = con.execute("SELECT count(*), max(updated_at), string_agg(name || ':' || status, ',' "
                       "ORDER BY name) FROM capabilities").fetchone()
    runs = con.execute("SELECT count(*), string_agg(id || ':' || coalesce(status, ''), ',' "
                       "ORDER BY id) FROM label_runs").fetchone()
    return (tuple(str(x) for x in state or ()), tuple(str(x) for x in caps),
            tuple(str(x) for x in runs))


def version_hash(con: duckdb.DuckDBPyConnection, v: tuple[Any, ...] | None = None) -> str:
    """`version` (or `v`, if the caller has just read it) as a short hash: what a stored
    result computed from the labels is keyed on (`store.rank_stored`)."""
    return hashlib.sha256(repr(version(con) if v is None else v).encode()).hexdigest()[:32]


class StoreMemo:
    """Results kept per (store file, `version`, key), the `size` most recent: what does not
    depend on a page's thresholds (bootstrap resamples with their multiplicities) is
    computed once per store version and process, and a Rankings slider move reuses it.
    An in-memory store has no file to key on: nothing is kept. (What a first visit needs
    is stored in the store itself: `rank_precompute`.)"""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[tuple, Any] = OrderedDict()
        self._lock = threading.Lock()

    def _full(self, con: duckdb.DuckDBPyConnection, key: tuple) -> tuple | None:
        path = store_file(con)
        return (str(path), version(con), *key) if path else None

    def peek(self, con: duckdb.DuckDBPyConnection, key: tuple) -> Any | None:
        """What is kept for `key` at the store's version, without computing (None)."""
        full = self._full(con, key)
        with self._lock:
            return None if full is None else self._items.get(full)

    def get(self, con: duckdb.DuckDBPyConnection, key: tuple, compute: Callable[[], T]) -> T:
        full = self._full(con, key)
        if full is None:
            return compute()
        with self._lock:
            if full in self._items:
                self._items.move_to_end(full)
                return self._items[full]
        out = compute()
        with self._lock:
            self._items[full] = out
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return out


# ------------------------------------------------- for the tests and `store check`

def definition_snapshot(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """The tables' content as the definition (the views) computes it, normalised."""
    pairs = con.execute("""
        WITH v AS (
            SELECT trajectory_id, capability, count(*) AS n_rows,
                   count(*) FILTER (WHERE value = 'lacking') AS nl,
                   count(*) FILTER (WHERE value = 'present') AS np,
                   count(*) FILTER (WHERE value = 'na') AS nn
            FROM counted_labels GROUP BY ALL
        )
        SELECT e.trajectory_id, e.capability, coalesce(v.n_rows, 0), coalesce(v.nl, 0),
               coalesce(v.np, 0), coalesce(v.nn, 0), m.value, e.value, e.origin
        FROM effective_labels e
        LEFT JOIN v ON v.trajectory_id = e.trajectory_id AND v.capability = e.capability
        LEFT JOIN majority_labels m
          ON m.trajectory_id = e.trajectory_id AND m.capability = e.capability""").fetchall()
    per_run = con.execute(f"""
        SELECT l.run_id, l.capability, t.dataset_id, t.agent_model, t.domain, t.success,
               l.value, count(*)
        FROM effective_run_labels l JOIN trajectories t ON t.id = l.trajectory_id
        WHERE t.success IS NOT NULL AND l.value IS NOT NULL
          AND l.run_id IN (SELECT id FROM label_runs WHERE {FINISHED})
        GROUP BY ALL""").fetchall()
    return {"pairs": sorted(pairs, key=repr), "run_counts": sorted(per_run, key=repr)}


def built_state(con: duckdb.DuckDBPyConnection) -> str:
    """"fresh" (the tables claim to answer for the store as it is now), "stale" (a write
    since; the next `sync` catches up) or "unbuilt" (never synced). Reads only."""
    stored = _stored(con)
    if stored is None:
        return "unbuilt"
    return "fresh" if stored[1] == _fingerprint(con) else "stale"


def materialised_snapshot(con: duckdb.DuckDBPyConnection, *, sync_first: bool = True
                          ) -> dict[str, Any]:
    """The tables' content in `definition_snapshot`'s shape (after `sync`, unless
    `sync_first` is False: `store check` compares what is stored, read-only)."""
    if sync_first:
        sync(con)
    pairs = con.execute("""
        SELECT trajectory_id, capability, n_rows, nl, np, nn, majority, value,
               CASE WHEN edit_value IS NOT NULL THEN 'edit' ELSE 'majority' END
        FROM label_pairs WHERE value IS NOT NULL""").fetchall()
    per_run = con.execute(f"SELECT {RUN_COUNT_COLS}, n FROM label_run_counts").fetchall()
    return {"pairs": sorted(pairs, key=repr), "run_counts": sorted(per_run, key=repr)}
