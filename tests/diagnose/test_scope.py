"""Scope (datasets, agent models, domains) through label, rank, export and the review
queue, in the library and on the CLI (`--dataset NAME`, repeatable); qualified exports."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from trace_lib import store
from trace_lib.cli import main
from trace_lib.diagnose import label_csv
from trace_lib.diagnose import labels as lb
from trace_lib.diagnose.labeling import run_labeling
from trace_lib.diagnose.ranking import rank
from trace_lib.errors import UserInputError
from trace_lib.scope import Scope


def test_scope_is_hashable_normalised_and_described() -> None:
    s = Scope(datasets=["b", "a", "a"], agent_models=None, domains="airline")
    assert s == Scope(datasets=("a", "b"), domains=("airline",)) and hash(s)
    assert s.describe() == "dataset a, b; domain airline"
    assert Scope().is_empty() and Scope().describe() == "all trajectories"


@pytest.fixture
def two_datasets(demo_db: Path) -> Path:
    """The demo store plus a second dataset 'theirs': 12 of the demo trajectories moved."""
    with store.connect(demo_db) as con:
        con.execute("INSERT INTO datasets (id, name, format, content_sha256) "
                    "VALUES ('d-theirs', 'theirs', 'test', 'zz')")
        con.execute("UPDATE trajectories SET dataset_id = 'd-theirs', agent_model = 'their-agent' "
                    "WHERE id IN (SELECT id FROM trajectories ORDER BY id LIMIT 12)")
    return demo_db


def test_unknown_dataset_is_a_clear_error(two_datasets: Path) -> None:
    with pytest.raises(UserInputError, match="unknown dataset.*nope.*known: .*theirs"):
        rank(two_datasets, scope=Scope(datasets=["nope"]))


def test_label_rank_queue_and_export_in_scope(two_datasets: Path, tmp_path: Path) -> None:
    db = two_datasets
    theirs = Scope(datasets=["theirs"])
    [summary] = run_labeling(db, "heuristic", run_prefix="only-theirs", scope=theirs)
    assert summary.n_trajectories == 12
    with store.connect(db) as con:
        labeled = {r[0] for r in con.execute("SELECT DISTINCT t.dataset_id FROM labels l JOIN "
                                             "trajectories t ON t.id = l.trajectory_id").fetchall()}
        params = json.loads(con.execute("SELECT params FROM label_runs").fetchone()[0])
    assert labeled == {"d-theirs"} and len(params["trajectory_ids"]) == 12
    assert params["scope"]["datasets"] == ["theirs"]
    run_labeling(db, "heuristic", run_prefix="all")
    whole, scoped = rank(db), rank(db, scope=theirs)
    n_known = 12
    assert all(sum(r.pooled.values()) <= n_known for r in scoped.rows)
    assert any(sum(r.pooled.values()) > n_known for r in whole.rows)
    assert lb.review_queue(db, scope=Scope(agent_models=["nobody"])).empty
    path = tmp_path / "theirs.csv"
    n = label_csv.export_labels(db, path, scope=theirs)
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == n and {r["dataset"] for r in rows} == {"theirs"}
    assert all(r["task_id"] and r["trial"] for r in rows)  # qualified: task and trial


def test_cli_dataset_flag_ranks_that_dataset_only(two_datasets: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    db = ["--db", str(two_datasets)]
    assert main(["label", "--run", "h", "--json", *db]) == 0
    capsys.readouterr()
    assert main(["rank", "--dataset", "theirs", "--json", *db]) == 0
    scoped = json.loads(capsys.readouterr().out)
    expected = {r.capability: r.pooled for r in rank(two_datasets,
                                                     scope=Scope(datasets=["theirs"])).rows}
    assert {r["capability"]: r["pooled"] for r in scoped} == expected
    assert scoped[0]["scope"]["datasets"] == ["theirs"]
    assert main(["rank", "--json", *db]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert {r["capability"]: r["pooled"] for r in whole} != expected
    # Repeatable: both datasets = the whole store.
    with store.connect(two_datasets) as con:
        demo_name = con.execute("SELECT name FROM datasets WHERE name <> 'theirs'").fetchone()[0]
    both = json.loads(_out(capsys, ["rank", "--dataset", "theirs", "--dataset", demo_name,
                                    "--json", *db]))
    assert {r["capability"]: r["pooled"] for r in both} == {
        r["capability"]: r["pooled"] for r in whole}
    out = tmp_path / "sel.json"
    assert main(["rank", "--dataset", "theirs", "--export", str(out), "--json", *db]) == 0
    capsys.readouterr()
    for skill in json.loads(out.read_text()):
        for ex in skill["example_failed_trajectories"]:
            assert ex["dataset"] == "theirs" and ex["trajectory_id"] and ex["task_id"]
        assert all(c.startswith("theirs/task ") for c in skill["example_failed_cases"])


def _out(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 0
    return capsys.readouterr().out
