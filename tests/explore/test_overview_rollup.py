"""The filters' rollup stored at import (issue 35): every aggregate frame it answers equals
the one computed over the trajectories, for filters of every field it serves and their
combinations, on the hand-built store (NULL outcomes, domains, tool errors), the demo
and the real tau-bench / tau2 files; a filter it cannot answer (text, tools, error kinds,
ids) is evaluated once and the same cells built over its trajectories, with the same
frames; a store changed since is computed."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import pandas as pd
import pytest

from trace_lib import store
from trace_lib.demo import build_demo
from trace_lib.explore import overview_rollup, overview_stored, queries
from trace_lib.explore.queries import TrajectoryFilter as F
from trace_lib.workbench import explore as wb

COMPUTED = {"summary": queries.outcome_summary, "by_domain": queries.success_by_domain_agent,
            "terminations": queries.termination_counts,
            "tool_calls": queries.tool_call_histogram, "tool_usage": queries.tool_usage,
            "error_kinds": queries.tool_error_kinds}


def _filters(con) -> list[F]:
    """One filter per served field and value, and pairs of them (the page's combinations)."""
    opts = queries.filter_options(con)
    values = {f: tuple(opts[opts.field == f].value) for f in
              ("dataset", "domain", "agent_model", "termination")}
    single = [F(datasets=(v,)) for v in values["dataset"]]
    single += [F(domains=(v,)) for v in values["domain"]]
    single += [F(agent_models=(v,)) for v in values["agent_model"]]
    single += [F(terminations=(v,)) for v in values["termination"]]
    single += [F(outcomes=(o,)) for o in queries.OUTCOMES]
    single += [F(outcomes=("success", "unknown")), F(tool_error=True), F(tool_error=False)]
    pairs = [F(**{**_fields(a), **_fields(b)}) for a, b in itertools.combinations(single, 2)
             if not set(_fields(a)) & set(_fields(b))]
    return single + pairs[::3] + [F(domains=("no such domain",))]


def _fields(flt: F) -> dict:
    return {k: v for k, v in vars(flt).items() if v != getattr(F(), k)}


def _assert_frames_equal(got: dict, con, flt: F) -> None:
    for name, computed in COMPUTED.items():
        try:
            pd.testing.assert_frame_equal(got[name], computed(con, flt))
        except AssertionError as e:
            raise AssertionError(f"{flt}: {name}: {e}") from None


def _assert_rollup_equals_computed(db: Path) -> int:
    with store.connect(db) as con:
        overview_rollup.store_default(con)
    checked = 0
    with store.connect(db, read_only=True) as con:
        version = overview_stored.version(con)
        for flt in _filters(con):
            got = overview_rollup.frames(con, flt, version)
            assert got is not None, flt
            _assert_frames_equal(got, con, flt)
            checked += 1
    return checked


def _unserved_filters(con) -> list[F]:
    """Filters the stored cells cannot answer: text in each mode, tools used, error kinds,
    task and trajectory ids, each alone and beside a served field, and one matching
    nothing."""
    opts = queries.filter_options(con)
    tools = tuple(opts[opts.field == "tool"].value)
    kinds = tuple(opts[opts.field == "error_kind"].value)
    ids = [r[0] for r in con.execute(
        "SELECT id FROM trajectories ORDER BY id LIMIT 3").fetchall()]
    tasks = [r[0] for r in con.execute(
        "SELECT DISTINCT task_id FROM trajectories WHERE task_id IS NOT NULL "
        "ORDER BY 1 LIMIT 2").fetchall()]
    out = [F(text=w, text_mode=m) for w in ("user", "reservation", "cancel flight")
           for m in ("words", "substring")]
    out += [F(text="policy", text_system=True), F(text="zzzz no such words")]
    out += [F(tools_used=(t,)) for t in tools[:4]] + [F(tools_used=tools[:2])]
    out += [F(error_kinds=(k,)) for k in kinds[:3]]
    out += [F(task_ids=tuple(tasks)), F(trajectory_ids=tuple(ids))]
    out += [F(outcomes=("failure",), text="user"), F(tool_error=True, tools_used=tools[:1]),
            F(domains=("no such domain",), text="user")]
    return out


def _assert_filtered_equals_computed(db: Path) -> int:
    checked = 0
    with store.connect(db, read_only=True) as con:
        for flt in _unserved_filters(con):
            got = overview_rollup.filtered_frames(con, flt)
            assert got is not None, flt
            _assert_frames_equal(got, con, flt)
            # the page's use case: the same frames, and the listing from the same table
            page = wb._overview(con, flt, 7)
            _assert_frames_equal(vars(page), con, flt)
            pd.testing.assert_frame_equal(page.listing,
                                          queries.list_trajectories(con, flt, limit=7))
            checked += 1
        # the temporary tables are gone: nothing of a filter stays on the connection
        assert not con.execute("SELECT table_name FROM duckdb_tables() "
                               "WHERE temporary").fetchall()
    return checked


def test_a_filter_it_cannot_serve_is_evaluated_once_with_the_same_frames(
        known_db: Path, tmp_path: Path) -> None:
    assert _assert_filtered_equals_computed(known_db) > 15
    db = tmp_path / "demo.duckdb"
    build_demo(tmp_path / "files", n=40, seed=3, db=db)
    assert _assert_filtered_equals_computed(db) > 15


def test_a_filter_it_cannot_serve_on_real_files(real_db: Path) -> None:
    assert _assert_filtered_equals_computed(real_db) > 15


@pytest.mark.parametrize("flt", [None, F(), F(text="   "), F(text_mode="substring")])
def test_no_filter_is_not_a_filtered_rollup(known_db: Path, flt: F | None) -> None:
    with store.connect(known_db, read_only=True) as con:
        assert overview_rollup.filtered_frames(con, flt) is None


def test_equal_to_computed_on_the_hand_built_store(known_db: Path) -> None:
    assert _assert_rollup_equals_computed(known_db) > 20


def test_equal_to_computed_on_the_demo(tmp_path: Path) -> None:
    db = tmp_path / "demo.duckdb"
    build_demo(tmp_path / "files", n=40, seed=3, db=db)
    assert _assert_rollup_equals_computed(db) > 20


def test_equal_to_computed_on_real_files(real_db: Path, tmp_path: Path) -> None:
    db = tmp_path / "real.duckdb"
    shutil.copy(real_db, db)  # the session's store is read-only to tests
    assert _assert_rollup_equals_computed(db) > 20


def test_task_ids_past_the_limit_are_counted_from_the_trajectories(
        known_db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(overview_rollup, "TASK_ROWS", 2)
    with store.connect(known_db) as con:
        assert "tasks" not in overview_rollup.compute(con)
    assert _assert_rollup_equals_computed(known_db) > 20


@pytest.mark.parametrize(("flt", "served"), [
    (None, False), (F(), False), (F(outcomes=("failure",)), True),
    (F(domains=("retail",), tool_error=True), True), (F(text="  "), False),
    (F(outcomes=("failure",), text="refund"), False),
    (F(outcomes=("failure",), text_mode="substring"), True),
    (F(tools_used=("book",)), False), (F(error_kinds=("x",)), False),
    (F(task_ids=("1",)), False), (F(trajectory_ids=("t_f1",)), False),
])
def test_which_filters_it_serves(flt: F | None, served: bool) -> None:
    assert overview_rollup.servable(flt) is served


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    db = tmp_path / "demo.duckdb"
    build_demo(tmp_path / "files", n=24, seed=0, db=db)  # the import stores the rollup
    return db


def test_the_page_reads_it_for_a_served_filter(
        demo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    flt = F(outcomes=("failure",))
    with store.connect(demo, read_only=True) as con:
        want = {name: fn(con, flt) for name, fn in COMPUTED.items()}
    calls: list[str] = []
    for name in ("outcome_summary", "success_by_domain_agent", "termination_counts",
                 "tool_call_histogram", "tool_usage", "tool_error_kinds"):
        real = getattr(queries, name)
        monkeypatch.setattr(queries, name,
                            lambda *a, _r=real, _n=name, **k: calls.append(_n) or _r(*a, **k))
    page = wb.trajectories_page(demo, flt)
    assert not calls  # no aggregate over the trajectories: the cells answered
    for name, frame in want.items():
        pd.testing.assert_frame_equal(getattr(page.overview, name), frame)
    assert len(page.overview.listing) == min(500, int(want["summary"].n_trajectories.iloc[0]))
    flt = F(tools_used=("get_user_details",))
    page = wb.trajectories_page(demo, flt)
    assert not calls  # a filter it does not serve: evaluated once, the same cells summed
    with store.connect(demo, read_only=True) as con:
        for name, fn in COMPUTED.items():
            pd.testing.assert_frame_equal(getattr(page.overview, name), fn(con, flt))


def test_a_store_changed_since_is_computed(demo: Path) -> None:
    flt = F(outcomes=("failure",))
    with store.connect(demo) as con:  # plain SQL: nothing stored the rollup again
        con.execute("UPDATE trajectories SET success = NOT success WHERE id IN "
                    "(SELECT min(id) FROM trajectories)")
    with store.connect(demo, read_only=True) as con:
        assert overview_rollup.frames(con, flt, overview_stored.version(con)) is None
        want = queries.outcome_summary(con, flt)
    pd.testing.assert_frame_equal(wb.trajectories_page(demo, flt).overview.summary, want)


def test_a_read_only_store_stores_nothing_and_fails_nothing(known_db: Path) -> None:
    with store.connect(known_db, read_only=True) as con:
        assert overview_rollup.store_default(con) == "unwritable"
        assert overview_rollup.frames(con, F(outcomes=("failure",)),
                                      overview_stored.version(con)) is None
