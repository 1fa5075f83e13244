"""Labels: CSV export/import (ids and source ids, all-or-nothing), bulk edit, grid, queue."""

from __future__ import annotations

from pathlib import Path

import pytest
from synthetic import make_store

from trace_lib import store
from trace_lib.diagnose import label_csv
from trace_lib.diagnose import labels as lb
from trace_lib.errors import UserInputError

OUT = {"a": False, "b": False, "c": True}


def test_export_import_round_trip_with_source_ids(db_path: Path, tmp_path: Path) -> None:
    make_store(db_path, OUT, {"r1": {"tool_calling_precision": ["lacking", "present", "na"]}})
    csv_path = tmp_path / "labels.csv"
    assert label_csv.export_labels(db_path, csv_path) == 3
    assert csv_path.read_text().splitlines()[0] == \
        "trajectory_id,capability,value,dataset,task_id,trial"  # qualified: dataset, task, trial
    ext = tmp_path / "ext.csv"
    ext.write_text("trajectory_id,capability,value\nsrc-a,upselling,lacking\nb,upselling,NA\n")
    assert label_csv.import_labels(db_path, ext, "human-1") == 2
    with store.connect(db_path) as con:
        rows = con.execute("SELECT trajectory_id, value FROM labels WHERE run_id = 'human-1' "
                           "ORDER BY 1").fetchall()
    assert rows == [("a", "lacking"), ("b", "na")]
    with pytest.raises(UserInputError, match="already exists"):
        label_csv.import_labels(db_path, ext, "human-1")


def test_bad_import_names_lines_and_imports_nothing(db_path: Path, tmp_path: Path) -> None:
    make_store(db_path, OUT, {})
    bad = tmp_path / "bad.csv"
    bad.write_text("trajectory_id,capability,value\n"
                   "a,upselling,lacking\n"
                   "zzz,upselling,lacking\n"
                   "b,not_a_cap,present\n"
                   "c,upselling,maybe\n")
    with pytest.raises(UserInputError) as info:
        label_csv.import_labels(db_path, bad, "r-bad")
    msg = str(info.value)
    assert "bad.csv" in msg and "nothing imported" in msg
    assert "line 3: trajectory_id 'zzz'" in msg and "line 4: capability 'not_a_cap'" in msg
    assert "line 5: value 'maybe'" in msg
    with store.connect(db_path) as con:
        assert con.execute("SELECT count(*) FROM labels").fetchone()[0] == 0
        assert con.execute("SELECT count(*) FROM label_runs").fetchone()[0] == 0
    header = tmp_path / "header.csv"
    header.write_text("id,cap,value\nx,y,z\n")
    with pytest.raises(UserInputError, match="missing column"):
        label_csv.import_labels(db_path, header, "r2")


def test_grid_changes_bulk_edit_and_review_queue(db_path: Path) -> None:
    make_store(db_path, OUT, {
        "r1": {"tool_calling_precision": ["lacking", "present", "present"]},
        "r2": {"tool_calling_precision": ["present", "present", "present"]},
        "r3": {"tool_calling_precision": ["lacking", "present", "na"]},
    })
    grid = lb.label_grid(db_path, lb.LabelFilter(capabilities=["tool_calling_precision"]))
    assert list(grid["tool_calling_precision"]) == ["lacking", "present", "present"]
    edited = grid.copy()
    edited.loc[edited["trajectory_id"] == "b", "tool_calling_precision"] = "lacking"
    changes = lb.grid_changes(grid, edited)
    assert changes == [("b", "tool_calling_precision", "lacking")]
    queue = lb.review_queue(db_path)
    assert list(queue["trajectory_id"])[:2] == ["a", "c"]  # 2 of 3 agree: most disagreement
    ids = lb.bulk_edit(db_path, lb.LabelFilter(capabilities=["tool_calling_precision"],
                                               success=False), "na", editor="bob", note="bulk")
    assert len(ids) == 2
    grid2 = lb.label_grid(db_path, lb.LabelFilter(capabilities=["tool_calling_precision"]))
    assert list(grid2["tool_calling_precision"]) == ["na", "na", "present"]
    assert "a" not in set(lb.review_queue(db_path)["trajectory_id"])  # decided by a person
    with pytest.raises(UserInputError, match="expected one of"):
        lb.edit_label(db_path, "a", "tool_calling_precision", "bad", editor="x")
    with pytest.raises(UserInputError, match="unknown trajectory"):
        lb.edit_label(db_path, "nope", "tool_calling_precision", "na", editor="x")


def test_grid_save_from_a_stale_grid_records_nothing_twice(db_path: Path) -> None:
    """Two sessions (or one session's save still in flight when its page reloaded) type the
    same new value into grids read before either saved: the label changes once, one history
    row; a different value from the stale grid is still an edit, from the current label."""
    make_store(db_path, OUT, {"r1": {"tool_calling_precision": ["lacking", "present", "na"]}})
    cap = "tool_calling_precision"
    stale = lb.label_grid(db_path, lb.LabelFilter(capabilities=[cap]))
    edited = stale.copy()
    edited.loc[edited["trajectory_id"] == "a", cap] = "present"
    changes = lb.grid_changes(stale, edited)
    first = lb.edit_labels(db_path, changes, editor="ann", skip_unchanged=True)
    again = lb.edit_labels(db_path, changes, editor="bob", skip_unchanged=True)
    assert len(first) == 1 and again == []
    other = lb.edit_labels(db_path, [("a", cap, "na")], editor="bob", skip_unchanged=True)
    with store.connect(db_path) as con:
        rows = con.execute("SELECT old, new, editor FROM label_edits WHERE trajectory_id = 'a' "
                           "ORDER BY id").fetchall()
    assert len(other) == 1
    assert rows == [("lacking", "present", "ann"), ("present", "na", "bob")]
    # an explicit edit (CLI) records what it is given, even the value the label has
    assert len(lb.edit_labels(db_path, [("a", cap, "na")], editor="cli")) == 1


def test_grid_save_confirmation_names_each_saved_edit_by_id() -> None:
    """Two one-edit saves never read the same (the page's status and toast show this
    text, and a repeat of the same words looked like nothing new had been saved)."""
    from datetime import datetime

    at = datetime(2026, 12, 6, 16, 20, 5)
    one = lb.describe_grid_save([("t_1", "tool_use", "present")], [12], at)
    assert one == "saved 1 edit(s): #12 t_1 · tool_use → present, 16:20:05"
    assert lb.describe_grid_save([("t_1", "planning", "present")], [13], at) != one
    # a pair that already had its value: counted, and the stored one named by id only
    assert lb.describe_grid_save([("t_1", "a", "na"), ("t_2", "a", "na")], [14], at) == (
        "saved 1 edit(s): #14; 1 already had that value, 16:20:05")
    assert lb.describe_grid_save([("t_1", "a", "na")], [], at) == (
        "saved 0 edit(s); 1 already had that value, 16:20:05")
    many = lb.describe_grid_save([(f"t_{i}", "a", "na") for i in range(5)], list(range(5)), at)
    assert many.startswith("saved 5 edit(s): #0 t_0 · a → na; #1 ") and "; and 2 more, " in many


@pytest.mark.parametrize("labeled", [
    "t00 t01 t02 t03 t04 t05 t06 t07 t08 t09 t10 t11 t12 t13 t14 t15 t16 t17 t18 t19",
    "t17 t18 t19",  # none among the first 4 x limit by id: the page comes from every one
    "t01 t05 t09 t10 t16",  # the candidates hold some, not a full page
])
def test_the_grid_page_is_the_first_labeled_trajectories_by_id(db_path: Path,
                                                               labeled: str) -> None:
    # `grid_rows` looks for the page among the first 4 x limit trajectories by id first
    # (a 10M store: 21 s -> 0.6 s); the page must be what the whole search gives.
    done = set(labeled.split())
    tids = [f"t{i:02d}" for i in range(20)]
    make_store(db_path, dict.fromkeys(tids, False), {"r1": {"tool_calling_precision": [
        "lacking" if t in done else None for t in tids]}})
    grid = lb.label_grid(db_path, lb.LabelFilter(capabilities=["tool_calling_precision"],
                                                 limit=2))
    assert list(grid["trajectory_id"]) == sorted(done)[:2]
