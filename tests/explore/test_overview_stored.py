"""The Trajectories page's unfiltered view stored at import (issue 35, part 2): equal to
the computation frame by frame, read instead of computed while the trajectories stay as
they are, never read for other trajectories (an import, a deleted dataset, plain SQL),
and computed then stored by the first visit of a store written otherwise."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from trace_lib import store
from trace_lib.demo import build_demo
from trace_lib.explore import overview_stored, queries
from trace_lib.store import explore_stored
from trace_lib.workbench import data
from trace_lib.workbench import explore as wb
from trace_lib.workbench.diagnose import edit_label, label


def _computed(db: Path, flt: wb.TrajectoryFilter | None = None) -> dict[str, pd.DataFrame]:
    with store.connect(db, read_only=True) as con:
        ov = wb._overview(con, flt, 500)
        return {"options": queries.filter_options(con),
                **{k: getattr(ov, k) for k in ("summary", "by_domain", "terminations",
                                               "tool_calls", "tool_usage", "error_kinds",
                                               "listing")}}


def _same(page: wb.TrajectoriesPage, options: pd.DataFrame, want: dict) -> None:
    pd.testing.assert_frame_equal(options, want["options"])
    for name, frame in want.items():
        if name != "options":
            pd.testing.assert_frame_equal(getattr(page.overview, name), frame)


def _visit(db: Path) -> tuple[wb.TrajectoriesPage, pd.DataFrame]:
    return wb.trajectories_page(db), wb.filter_options(db)


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    db = tmp_path / "demo.duckdb"
    build_demo(tmp_path / "files", n=24, seed=0, db=db)  # the import stores the view
    return db


@pytest.fixture
def no_queries(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Counts every whole-store query the unfiltered view is made of."""
    calls: list[str] = []
    for name in ("filter_options", "outcome_summary", "success_by_domain_agent",
                 "termination_counts", "tool_call_histogram", "tool_usage",
                 "tool_error_kinds", "list_trajectories"):
        real = getattr(queries, name)
        monkeypatch.setattr(queries, name,
                            lambda *a, _r=real, _n=name, **k: calls.append(_n) or _r(*a, **k))
    return calls


def test_an_import_stores_the_view_and_the_first_visit_reads_it(
        demo: Path, no_queries: list[str]) -> None:
    want = _computed(demo)
    del no_queries[:]
    page, options = _visit(demo)
    assert page.source == "stored" and not no_queries
    _same(page, options, want)
    assert int(page.overview.summary.n_trajectories.iloc[0]) == 24


def test_a_filter_is_computed(demo: Path) -> None:
    flt = wb.TrajectoryFilter(outcomes=("failure",))
    page = wb.trajectories_page(demo, flt)
    assert page.source == "filtered"
    want = _computed(demo, flt)
    for name, frame in want.items():
        if name != "options":
            pd.testing.assert_frame_equal(getattr(page.overview, name), frame)


def test_a_store_written_otherwise_computes_once_then_reads(known_db: Path) -> None:
    with store.connect(known_db, read_only=True) as con:
        assert overview_stored.read(con) is None
    first, options = _visit(known_db)
    again, options_again = _visit(known_db)
    assert (first.source, again.source) == ("computed", "stored")
    want = _computed(known_db)
    _same(first, options, want)
    _same(again, options_again, want)


def test_a_read_only_store_is_computed_and_fails_nothing(known_db: Path) -> None:
    with store.connect(known_db, read_only=True) as con:
        frames = overview_stored.compute(con)
        assert not overview_stored.store(con, frames, "v", 0.0)
        assert overview_stored.read(con) is None


@pytest.mark.parametrize("change", ["import", "delete", "outcome", "tool error", "rename"])
def test_a_change_of_trajectories_is_never_served_the_old_view(
        demo: Path, tmp_path: Path, change: str) -> None:
    before, _ = _visit(demo)
    assert before.source == "stored"
    if change == "import":  # the import use case stores the new view
        other = build_demo(tmp_path / "more", n=6, seed=7, import_into_store=False)
        data.import_files([other["file"]], db=demo)
    elif change == "delete":  # so does a dataset's deletion
        with store.connect(demo, read_only=True) as con:
            first = con.execute("SELECT id FROM datasets").fetchall()[0][0]
        data.import_files([build_demo(tmp_path / "more", n=6, seed=7,
                                      import_into_store=False)["file"]], db=demo)
        data.delete_dataset(first, demo)
    else:  # plain SQL: nothing stored the view again
        sql = {"outcome": "UPDATE trajectories SET success = NOT success WHERE id IN "
                          "(SELECT min(id) FROM trajectories)",
               "tool error": "UPDATE tool_calls SET error = 'Error: new' WHERE rowid = 0",
               "rename": "UPDATE datasets SET name = 'renamed'"}[change]
        with store.connect(demo) as con:
            con.execute(sql)
    after, options = _visit(demo)
    assert after.source == ("stored" if change in ("import", "delete") else "computed")
    want = _computed(demo)
    _same(after, options, want)
    assert any(not getattr(before.overview, k).equals(getattr(after.overview, k))
               for k in ("summary", "listing", "tool_usage", "by_domain"))
    assert _visit(demo)[0].source == "stored"
    with store.connect(demo, read_only=True) as con:  # one version left
        assert con.execute("SELECT count(DISTINCT version) FROM explore_stored"
                           ).fetchall()[0][0] == 1


def test_labels_do_not_move_the_view(demo: Path) -> None:
    with store.connect(demo, read_only=True) as con:
        v = explore_stored.fingerprint(con)
    label(demo, "heuristic")
    with store.connect(demo, read_only=True) as con:
        tid = con.execute("SELECT min(id) FROM trajectories").fetchall()[0][0]
    edit_label(demo, tid, "tool_calling_precision", "lacking", editor="t")
    with store.connect(demo, read_only=True) as con:
        assert explore_stored.fingerprint(con) == v
    assert wb.trajectories_page(demo).source == "stored"
