"""`python -m trace_lib store check`: passes on a healthy store; on each kind of mismatch
(rows lost from a dataset, rows of no parent, a trajectory stored twice, a label pair with
two rows in one run,
materialised labels that differ from their definition, a search index that no longer
matches the messages) it exits 1 and names the
mismatch and what to do; `--repair` mends what can be rebuilt."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from trace_lib import store
from trace_lib.workbench import store_admin

sys.path.insert(0, str(Path(__file__).parent))
from store_faults import cli, ok  # noqa: E402


def _failed(db: Path) -> dict:
    proc = cli("store", "check", "--json", db=db)
    assert proc.returncode == 1, (proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    report = json.loads(proc.stdout)
    assert not report["ok"]
    return report


def _bad(report: dict, check: str) -> list[dict]:
    return [f for f in report["findings"] if f["check"] == check and not f["ok"]]


def test_a_healthy_store_passes_every_check(store_copy: Path) -> None:
    out = ok(cli("store", "check", db=store_copy)).stdout
    for area in ("schema", "tables", "datasets", "trajectory rows", "label rows", "labels",
                 "search index"):
        assert f"ok    {area}" in out, out
    assert "materialised labels match their definition" in out
    assert "24 sampled trajectories found by a word of their messages" in out
    assert "every check passed" in out


def test_rows_lost_from_a_dataset_are_named_with_the_dataset(store_copy: Path) -> None:
    with store.connect(store_copy) as con:
        tid, dataset = con.execute("SELECT id, dataset_id FROM trajectories ORDER BY id "
                                   "LIMIT 1").fetchall()[0]
        lost = con.execute("SELECT count(*) FROM messages WHERE trajectory_id = ?",
                           [tid]).fetchall()[0][0]
        con.execute("DELETE FROM messages WHERE trajectory_id = ? AND idx > 0", [tid])
        con.execute("INSERT INTO messages (trajectory_id, idx, role, content) "
                    "VALUES ('t_gone', 0, 'user', 'hello')")
    report = _failed(store_copy)
    bad = _bad(report, "datasets")
    assert any(dataset in f["message"] and "where its trajectories record" in f["message"]
               and "store restore" in f["fix"] for f in bad), bad
    assert any("1 messages rows of no trajectory" in f["message"] for f in bad), bad
    assert lost > 1


def test_materialised_labels_that_differ_from_their_definition_fail_then_repair(
        store_copy: Path) -> None:
    with store.connect(store_copy) as con:
        # Tamper with the table only, watermark untouched: the tables claim to be fresh.
        con.execute("UPDATE label_pairs SET value = CASE value WHEN 'lacking' THEN 'present' "
                    "ELSE 'lacking' END WHERE trajectory_id = (SELECT min(trajectory_id) "
                    "FROM label_pairs)")
    bad = _bad(_failed(store_copy), "labels")
    assert bad and "differ from their definition" in bad[0]["message"]
    assert "--repair" in bad[0]["fix"]
    repaired = ok(cli("store", "check", "--repair", db=store_copy)).stdout
    assert "materialised labels rebuilt from their definition" in repaired
    assert "every check passed" in repaired


def test_a_label_pair_written_twice_in_a_run_fails_then_repairs_keeping_the_first(
        store_copy: Path) -> None:
    # `labels` has no key (schema 14): a second row of a pair, written with plain SQL,
    # is what the writers never make and the check finds.
    with store.connect(store_copy) as con:
        run, tid, cap, value = con.execute(
            "SELECT run_id, trajectory_id, capability, value FROM labels "
            "ORDER BY ALL LIMIT 1").fetchall()[0]
        other = "present" if value == "lacking" else "lacking"
        con.execute("INSERT INTO labels (run_id, trajectory_id, capability, value) "
                    "VALUES (?, ?, ?, ?)", [run, tid, cap, other])
    bad = _bad(_failed(store_copy), "label rows")
    assert bad and "1 (run, trajectory, capability) pairs have more than one row" in \
        bad[0]["message"] and f"run {run}, trajectory {tid}, capability {cap}: 2 rows" in \
        bad[0]["message"], bad
    repaired = ok(cli("store", "check", "--repair", db=store_copy)).stdout
    assert "1 repeated label rows deleted (the first of each pair kept)" in repaired
    assert "every check passed" in repaired
    with store.connect(store_copy, read_only=True) as con:
        assert con.execute("SELECT value FROM labels WHERE run_id = ? AND trajectory_id = ? "
                           "AND capability = ?", [run, tid, cap]).fetchall() == [(value,)]


def test_a_trajectory_stored_twice_fails_then_repairs_keeping_the_first(
        store_copy: Path) -> None:
    # The bulk tables have no keys (schema 15): a trajectory's rows written a second time
    # with plain SQL are what the import never makes, and the check finds them.
    with store.connect(store_copy) as con:
        tid, n_messages = con.execute("SELECT id, n_messages FROM trajectories "
                                      "ORDER BY id LIMIT 1").fetchone()
        for table, key in (("trajectories", "id"), ("messages", "trajectory_id"),
                           ("tool_calls", "trajectory_id")):
            con.execute(f"INSERT INTO {table} SELECT * FROM {table} WHERE {key} = ?", [tid])
        before = store.table_counts(con)
    bad = _bad(_failed(store_copy), "trajectory rows")
    assert bad and f"1 trajectory ids have more than one row in trajectories (trajectory " \
        f"{tid}: 2 rows)" in bad[0]["message"], bad
    assert f"{n_messages} (trajectory, message) keys have more than one row in messages" in \
        bad[0]["message"]
    repaired = ok(cli("store", "check", "--repair", db=store_copy)).stdout
    assert "repeated rows deleted (the first of each kept): trajectories 1, messages " \
        f"{n_messages}" in repaired
    assert "every check passed" in repaired
    with store.connect(store_copy, read_only=True) as con:
        after = store.table_counts(con)
        assert after["trajectories"] == before["trajectories"] - 1
        assert after["messages"] == before["messages"] - n_messages


def test_labels_behind_a_recent_edit_are_stale_not_a_fault(store_copy: Path) -> None:
    from trace_lib.workbench import diagnose as wb

    grid = wb.label_grid(store_copy, wb.LabelFilter())
    tid = grid.iloc[0]["trajectory_id"]
    cap = [c for c in grid.columns if c in wb.CORE][0]
    with store.connect(store_copy) as con:  # an edit written without the use case's sync
        con.execute("INSERT INTO label_edits (trajectory_id, capability, old, new, editor) "
                    "VALUES (?, ?, NULL, 'na', 'plain-sql')", [tid, cap])
    report = store_admin.check_store(store_copy)
    labels = [f for f in report.findings if f.check == "labels"][0]
    assert labels.ok and "behind the latest write" in labels.message, labels


def test_a_search_index_that_lost_documents_fails_then_repairs(store_copy: Path) -> None:
    import sqlite3

    from trace_lib.store import search

    lite = sqlite3.connect(str(search.index_path(store_copy)))
    lite.execute("DELETE FROM docs WHERE rowid IN (SELECT rowid FROM docs LIMIT 3)")
    lite.commit()
    lite.close()
    bad = _bad(_failed(store_copy), "search index")
    assert bad and "3 of 24 trajectories have no document" in bad[0]["message"], bad


def test_a_search_index_whose_postings_do_not_match_the_messages_fails(store_copy: Path
                                                                       ) -> None:
    # Every document present, but a message's text changed after indexing (a write that
    # bypassed the importer): its words are not in the index.
    with store.connect(store_copy) as con:
        tid = con.execute("SELECT id FROM trajectories ORDER BY hash(id), id LIMIT 1"
                          ).fetchall()[0][0]
        con.execute("UPDATE messages SET content = 'Zyxwvutsrqponmlk' WHERE trajectory_id = ? "
                    "AND role = 'user'", [tid])
    bad = _bad(_failed(store_copy), "search index")
    assert bad and "not found by a word of their own messages" in bad[0]["message"], bad
    assert tid in bad[0]["message"]
    repaired = ok(cli("store", "check", "--repair", db=store_copy)).stdout
    assert "search index rebuilt" in repaired and "every check passed" in repaired


def test_check_on_no_store_is_a_clear_error(tmp_path: Path) -> None:
    proc = cli("store", "check", db=tmp_path / "nothing.duckdb")
    assert proc.returncode == 1 and "no database here yet" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "nothing.duckdb").exists()


def test_check_reads_an_older_schema_without_migrating_it(tmp_path: Path) -> None:
    import duckdb

    from trace_lib.store import migrations

    db = tmp_path / "old.duckdb"
    con = duckdb.connect(str(db))
    before_materialised = migrations.MIGRATIONS.index(migrations.MATERIALISED_LABELS)
    migrations.apply_from(con, migrations.current_version(con), target=before_materialised)
    con.close()
    out = ok(cli("store", "check", db=db)).stdout
    assert f"schema version {before_materialised}, older than" in out
    assert "no materialised labels in this schema version" in out
    with store.connect(db, read_only=True) as con:  # check wrote nothing: not migrated
        assert store.schema_version(con) == before_materialised


def test_a_dataset_checks_against_what_its_imports_reported(store_copy: Path,
                                                             pristine_store: Path) -> None:
    # A re-import of the same file with another agent model adds rows to the same dataset:
    # its report's count is added, and the check still holds.
    demo = pristine_store.parent / "demo" / "airline_demo.jsonl"
    ok(cli("ingest", str(demo), "--agent-model", "another-agent", db=store_copy))
    out = ok(cli("store", "check", db=store_copy)).stdout
    assert "48 trajectories as its imports reported" in out, out
    # A whole trajectory lost (its messages and calls with it): only the report sees it.
    with store.connect(store_copy) as con:
        tid = con.execute("SELECT id FROM trajectories ORDER BY id LIMIT 1").fetchall()[0][0]
        for table in ("tool_calls", "messages", "trajectory_derived", "labels"):
            con.execute(f"DELETE FROM {table} WHERE trajectory_id = ?", [tid])
        con.execute("DELETE FROM trajectories WHERE id = ?", [tid])
    bad = _bad(_failed(store_copy), "datasets")
    assert any("47 trajectories where its imports reported adding 48" in f["message"]
               for f in bad), bad
