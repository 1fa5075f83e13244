"""Materialised labels equal a from-scratch recomputation (the views) after label runs,
edits, bulk edits, undo and plain-SQL writes; the incremental path is really taken; and
the ranking over the tables equals the direct SQL, whole-store and scoped."""

from __future__ import annotations

import json
import random
from pathlib import Path

import duckdb
import pytest
from synthetic import make_store

from trace_lib import store
from trace_lib.diagnose import label_csv, materialise
from trace_lib.diagnose import labels as lb
from trace_lib.diagnose.labeling import set_run_status
from trace_lib.diagnose.ranking import RankConfig, rank_con
from trace_lib.scope import Scope
from trace_lib.store import file_memo

CAPS = ("tool_calling_precision", "upselling", "precondition_verification")
VALUES = ("lacking", "present", "na", None)


def _figures(ranking):
    return {r.capability: (r.pooled, r.fisher_p, [(f.run, f.lf, f.pf, f.nf, f.lp, f.pp, f.np)
                                                  for f in r.runs]) for r in ranking.rows}


def _assert_equal_to_definition(con) -> None:
    assert materialise.materialised_snapshot(con) == materialise.definition_snapshot(con)
    for cfg in (None, RankConfig(runs=["r0", "r2"])):
        for scope in (None, Scope(datasets=("other",)), Scope(agent_models=("a1",))):
            assert _figures(rank_con(con, cfg, scope=scope)) == _figures(
                rank_con(con, cfg, scope=scope, incremental=False))


@pytest.fixture
def random_store(db_path: Path) -> Path:
    rng = random.Random(7)
    outcomes = {f"t{i}": rng.choice([True, False, False, None]) for i in range(60)}
    runs = {f"r{r}": {c: [rng.choice(VALUES) for _ in outcomes] for c in CAPS}
            for r in range(3)}
    make_store(db_path, outcomes, runs)
    with store.connect(db_path) as con:  # a second dataset and two agent models for scopes
        con.execute("INSERT INTO datasets (id, name, format, content_sha256) "
                    "VALUES ('d2', 'other', 'test', 'y')")
        con.execute("UPDATE trajectories SET dataset_id = 'd2' WHERE id IN "
                    "(SELECT id FROM trajectories WHERE id LIKE 't1%')")
        con.execute("UPDATE trajectories SET agent_model = CASE WHEN id < 't3' THEN 'a1' "
                    "ELSE 'a2' END")
    return db_path


def test_tables_equal_the_definition_after_runs_edits_and_undo(random_store: Path,
                                                               tmp_path: Path) -> None:
    db = random_store
    rng = random.Random(1)
    with store.connect(db) as con:
        assert materialise.sync(con).action == "rebuilt"  # first read builds them
        _assert_equal_to_definition(con)
    # Edits (one pair edited twice, a pair no run labeled), then a bulk edit.
    ids = lb.edit_labels(db, [("t0", CAPS[0], "present"), ("t0", CAPS[0], "na"),
                              ("t5", CAPS[1], "lacking")], editor="ann")
    with store.connect(db) as con:
        con.execute("DELETE FROM labels WHERE trajectory_id = 't7' AND capability = ?",
                    [CAPS[2]])  # plain SQL change of a counted run: noticed, rebuilt
        assert materialise.sync(con).action == "rebuilt"
    lb.edit_label(db, "t7", CAPS[2], "lacking", editor="bob")  # edit of an unlabeled pair
    with store.connect(db) as con:
        _assert_equal_to_definition(con)
    lb.bulk_edit(db, lb.LabelFilter(capabilities=[CAPS[1]], success=True), "present",
                 editor="ann")
    for _ in range(8):
        lb.edit_label(db, f"t{rng.randrange(60)}", rng.choice(CAPS),
                      rng.choice(VALUES[:3]), editor="e")
    with store.connect(db) as con:
        _assert_equal_to_definition(con)
    # Undo: falls back to the previous edit, then to the majority; and on the unlabeled pair
    # the row disappears.
    lb.undo_edit(db, editor="ann", edit_id=ids[1])
    lb.undo_edit(db, editor="bob", trajectory_id="t7", capability=CAPS[2])
    with store.connect(db) as con:
        _assert_equal_to_definition(con)
    lb.undo_edit(db, editor="ann", edit_id=ids[0])
    with store.connect(db) as con:
        _assert_equal_to_definition(con)

    # A run that is still running does not count; when it finishes it is added (not rebuilt).
    with store.connect(db) as con:
        con.execute("INSERT INTO label_runs (id, labeler, status) VALUES ('r3', 'x', 'running')")
        con.execute("""INSERT INTO labels (run_id, trajectory_id, capability, value)
                       SELECT 'r3', trajectory_id, capability,
                              CASE WHEN value = 'lacking' THEN 'present' ELSE 'lacking' END
                       FROM labels WHERE run_id = 'r0'""")
        assert materialise.sync(con).action == "updated"
        _assert_equal_to_definition(con)
    set_run_status(db, "r3", "finished")
    with store.connect(db) as con:
        rep = materialise.sync(con)
        assert rep.action == "fresh"  # set_run_status already added it
        state = con.execute("SELECT runs FROM label_materialised").fetchone()[0]
        assert '"r3"' in state
        _assert_equal_to_definition(con)
    # A run written with plain SQL (as fixtures do) and an import: both added incrementally.
    with store.connect(db) as con:
        con.execute("INSERT INTO label_runs (id, labeler) VALUES ('r4', 'test')")
        con.execute("""INSERT INTO labels (run_id, trajectory_id, capability, value)
                       SELECT 'r4', trajectory_id, capability, value FROM labels
                       WHERE run_id = 'r1'""")
        rep = materialise.sync(con)
        assert (rep.action, rep.added_runs) == ("updated", ["r4"])
        _assert_equal_to_definition(con)
    csv_path = tmp_path / "imp.csv"
    csv_path.write_text("trajectory_id,capability,value\nt1,upselling,lacking\n"
                        "t2,upselling,present\n")
    label_csv.import_labels(db, csv_path, "imported")
    with store.connect(db) as con:
        assert materialise.sync(con).action == "fresh"
        _assert_equal_to_definition(con)
    # After all that, an edit is a patch of the touched pair, not a rebuild.
    with store.connect(db) as con:
        con.execute("INSERT INTO label_edits (trajectory_id, capability, old, new, editor) "
                    "VALUES ('t3', 'upselling', NULL, 'na', 'sql')")
        rep = materialise.sync(con)
        assert (rep.action, rep.patched_edits) == ("updated", 1)
        _assert_equal_to_definition(con)


def test_a_failed_run_never_counts(random_store: Path) -> None:
    with store.connect(random_store) as con:
        before = materialise.materialised_snapshot(con)
        con.execute("INSERT INTO label_runs (id, labeler, status) VALUES ('bad', 'x', 'failed')")
        con.execute("""INSERT INTO labels (run_id, trajectory_id, capability, value)
                       SELECT 'bad', trajectory_id, capability, 'lacking' FROM labels
                       WHERE run_id = 'r0'""")
        assert materialise.materialised_snapshot(con) == before
        _assert_equal_to_definition(con)


def test_scope_restricts_the_ranking_to_its_trajectories(random_store: Path) -> None:
    with store.connect(random_store) as con:
        whole = rank_con(con)
        other = rank_con(con, scope=Scope(datasets=["other"]))
        n_other = con.execute("SELECT count(*) FROM trajectories WHERE dataset_id = 'd2' "
                              "AND success IS NOT NULL").fetchone()[0]
        # Every pooled count of the scoped ranking is over that dataset's trajectories only.
        for r in other.rows:
            assert sum(r.pooled.values()) <= n_other
        assert _figures(other) != _figures(whole)
        assert "scope: dataset other" in other.note
        # Deleting the other datasets' labels gives the same figures as the scope.
        con.execute("DELETE FROM labels WHERE trajectory_id NOT IN "
                    "(SELECT id FROM trajectories WHERE dataset_id = 'd2')")
        assert _figures(rank_con(con)) == _figures(other)


def test_a_trajectory_moved_between_datasets_is_noticed(random_store: Path) -> None:
    """The counts are keyed by dataset / agent / domain / outcome: changing those on a
    trajectory (plain SQL, a dataset deleted) rebuilds, so a scoped rank stays right."""
    with store.connect(random_store) as con:
        assert materialise.sync(con).action == "rebuilt"
        con.execute("UPDATE trajectories SET dataset_id = 'd2' WHERE id = 't2'")
        assert materialise.sync(con).action == "rebuilt"
        _assert_equal_to_definition(con)


def test_the_trajectories_hash_is_kept_per_file_state_and_never_inside_a_transaction(
        random_store: Path) -> None:
    """A page action asks for the version several times: the hash over every trajectory
    is computed once per state of the store's files (and kept beside the store for the
    next process). A commit (explicit or a plain statement's) changes that state; inside
    a transaction (rows not on disk yet) it is computed every time."""
    memo = materialise._TRAJECTORY_HASHES
    memo.clear()
    with store.connect(random_store) as con:
        assert materialise.sync(con).action == "rebuilt"
        first = materialise._fingerprint(con)
        full = (*file_memo.file_state(con), 60)
        assert memo._items[full] == first.n_trajectories  # the newest state: this one
        memo._items[full] = 12345  # what the next read must reuse
        assert materialise._fingerprint(con).n_trajectories == 12345
        memo._items[full] = first.n_trajectories
        con.execute("BEGIN TRANSACTION")  # a writer's transaction: on disk at its commit
        con.execute("UPDATE trajectories SET dataset_id = 'd2' WHERE id = 't2'")
        assert file_memo.file_state(con, committed_only=True) is None
        with pytest.raises(duckdb.TransactionException):
            materialise.sync(con)  # it noticed the change, and cannot nest its own BEGIN
        con.execute("ROLLBACK")
        assert file_memo.file_state(con, committed_only=True) == full[:-1]
        con.execute("BEGIN TRANSACTION")
        con.execute("UPDATE trajectories SET dataset_id = 'd2' WHERE id = 't2'")
        con.execute("COMMIT")
        assert materialise.sync(con).action == "rebuilt"
        _assert_equal_to_definition(con)
        assert materialise.sync(con).action == "fresh"
        con.execute("UPDATE trajectories SET success = NOT success WHERE id = 't3'")
        assert materialise.sync(con).action == "rebuilt"  # autocommit: a new file state
        _assert_equal_to_definition(con)
    # A writer's close checkpoints (a new file state); the next reader computes it once,
    # and a new process (the memo cleared) then reads it from the side file.
    with store.connect(random_store) as reader:
        assert materialise.sync(reader).action == "fresh"
        state = (*file_memo.file_state(reader), 60)
        now = materialise._fingerprint(reader).n_trajectories
    side = file_memo.memo_path(random_store)
    data = json.loads(side.read_text())
    assert [list(state), now] in data["labels_trajectory_hash"]
    for entry in data["labels_trajectory_hash"]:
        if tuple(entry[0]) == state:
            entry[1] = 777  # what only the side file can answer
    side.write_text(json.dumps(data))
    memo.clear()
    with store.connect(random_store) as other:
        assert (*file_memo.file_state(other), 60) == state  # a reader's close wrote nothing
        assert materialise._fingerprint(other).n_trajectories == 777
