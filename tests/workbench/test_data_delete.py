"""Deleting a dataset (`datasets delete`, Home's Delete): everything that refers to its
trajectories goes, in one transaction; the other dataset stays; label edits are kept in an
audit file; a failure half-way leaves the store exactly as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trace_lib import store
from trace_lib.cli import main
from trace_lib.errors import UserInputError
from trace_lib.store import trajectories as store_trajectories
from trace_lib.workbench import data


def _records(tag: str, n: int) -> list[dict]:
    return [{
        "id": f"{tag}{i}", "task_id": f"t{i % 2}", "trial": i, "agent_model": f"model-{tag}",
        "domain": "shop", "reward": float(i % 2),
        "expected_actions": [{"name": "lookup", "arguments": {"order_id": f"{tag}{i % 2}"}}],
        "messages": [
            {"role": "user", "content": f"where is order {tag}{i}?"},
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": "c1", "type": "function",
                "function": {"name": "lookup", "arguments": json.dumps({"order_id": tag})}}]},
            {"role": "tool", "tool_call_id": "c1", "content": '{"status": "shipped"}'},
            {"role": "assistant", "content": "It has shipped."},
        ]} for i in range(n)]


@pytest.fixture
def two_datasets(tmp_path: Path, db_path: Path) -> Path:
    """Two imported datasets (mine: 4 trajectories, theirs: 3) with embeddings, labels from a
    finished run and two label edits on each."""
    for tag, n in (("mine", 4), ("theirs", 3)):
        path = tmp_path / f"{tag}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in _records(tag, n)))
        data.import_files([path], db=db_path)
    with store.connect(db_path) as con:
        con.execute("INSERT INTO label_runs (id, labeler) VALUES ('run1', 'heuristic')")
        ids = [r[0] for r in con.execute("SELECT id FROM trajectories").fetchall()]
        for tid in ids:
            con.execute("INSERT INTO embeddings VALUES (?, 'm', 'sha', [0.1, 0.2])", [tid])
            con.execute("INSERT INTO labels (run_id, trajectory_id, capability, value) "
                        "VALUES ('run1', ?, 'cap', 'lacking')", [tid])
            con.execute("INSERT INTO label_edits (trajectory_id, capability, old, new, editor) "
                        "VALUES (?, 'cap', 'lacking', 'present', 'ann')", [tid])
    return db_path


def _counts(db: Path) -> dict[str, int]:
    with store.connect(db, read_only=True) as con:
        return store.table_counts(con)


def test_list_shows_both_with_counts(two_datasets: Path) -> None:
    rows = {r["name"]: r for r in data.list_datasets(two_datasets)}
    assert {n: r["trajectories"] for n, r in rows.items()} == {"mine.jsonl": 4, "theirs.jsonl": 3}


def test_delete_removes_every_dependent_row_and_keeps_the_edits(two_datasets: Path) -> None:
    before = _counts(two_datasets)
    done = data.delete_dataset("mine.jsonl", db=two_datasets)
    after = _counts(two_datasets)
    expected = {"embeddings": 4, "expected_actions": 2, "label_edits": 4, "labels": 4,
                "messages": 16, "tool_calls": 4, "trajectories": 4, "datasets": 1}
    # Tables other stages derive per trajectory (materialised labels, derived columns) are
    # removed too; the exact set grows with migrations, so these are a subset.
    assert {k: done["removed"].get(k) for k in expected} == expected
    for table, n in done["removed"].items():
        assert after[table] == before[table] - n, table
    with store.connect(two_datasets, read_only=True) as con:
        assert con.execute("SELECT DISTINCT agent_model FROM trajectories").fetchall() == [
            ("model-theirs",)]
        # Nothing anywhere still points at a trajectory or a dataset that is gone.
        for table, column in store_trajectories.dependent_tables(con):
            parent = "trajectories" if column == "trajectory_id" else "datasets"
            orphans = con.execute(f'SELECT count(*) FROM "{table}" WHERE {column} NOT IN '
                                  f"(SELECT id FROM {parent})").fetchone()[0]
            assert orphans == 0, table
    audit = json.loads(Path(done["audit_file"]).read_text())
    assert Path(done["audit_file"]).parent == two_datasets.parent / "audit"
    assert audit["dataset_name"] == "mine.jsonl" and len(audit["label_edits"]) == 4
    assert {e["new"] for e in audit["label_edits"]} == {"present"}


def test_a_table_added_later_is_covered(two_datasets: Path) -> None:
    with store.connect(two_datasets) as con:  # what a later migration might add
        con.execute("CREATE TABLE review_notes (trajectory_id VARCHAR, note VARCHAR)")
        con.execute("INSERT INTO review_notes SELECT id, 'look' FROM trajectories")
    done = data.delete_dataset("mine.jsonl", db=two_datasets)
    assert done["removed"]["review_notes"] == 4
    assert _counts(two_datasets)["review_notes"] == 3


def test_a_failure_half_way_leaves_the_store_unchanged(two_datasets: Path) -> None:
    # A row that references the dataset through a foreign key under another column name:
    # DuckDB refuses to delete that dataset, after its trajectories, messages, labels...
    # were deleted in the same transaction. All of it must roll back, and no audit file
    # may stay behind. (The dataset, not a trajectory: trajectories have no key to
    # reference since schema 15.)
    with store.connect(two_datasets) as con:
        con.execute("CREATE TABLE pins (pinned VARCHAR REFERENCES datasets (id))")
        con.execute("INSERT INTO pins SELECT DISTINCT dataset_id FROM trajectories "
                    "WHERE agent_model = 'model-mine'")
    before = _counts(two_datasets)
    with pytest.raises(store.StoreError, match="Nothing was removed"):
        data.delete_dataset("mine.jsonl", db=two_datasets)
    assert _counts(two_datasets) == before
    assert not any((two_datasets.parent / "audit").glob("*"))


def test_unknown_name_is_a_clear_error(two_datasets: Path) -> None:
    with pytest.raises(UserInputError, match="no dataset named 'nope'.*mine.jsonl"):
        data.delete_dataset("nope", db=two_datasets)


def test_cli_refuses_without_yes_then_deletes(two_datasets: Path, capsys) -> None:
    assert main(["datasets", "delete", "mine.jsonl", "--db", str(two_datasets)]) == 1
    assert "add --yes" in capsys.readouterr().err
    assert _counts(two_datasets)["trajectories"] == 7
    assert main(["datasets", "list", "--json", "--db", str(two_datasets)]) == 0
    listed = json.loads(capsys.readouterr().out)
    mine = next(r for r in listed if r["name"] == "mine.jsonl")
    assert main(["datasets", "delete", mine["id"], "--yes", "--json",
                 "--db", str(two_datasets)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["removed"]["trajectories"] == 4
    assert main(["datasets", "list", "--db", str(two_datasets)]) == 0
    text = capsys.readouterr().out
    assert "theirs.jsonl" in text and "mine.jsonl" not in text
