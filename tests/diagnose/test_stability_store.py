"""The stored threshold-free part of a stability ranking (issue 35): stored when a label run
finishes, read instead of computed while the labels stay as they are, never served for
other labels, and equal to the computation to the bit."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from synthetic import make_store
from test_agreement import _one_run_store, _outcomes

from trace_lib import store
from trace_lib.diagnose import materialise, rank_precompute
from trace_lib.diagnose import stability as ag
from trace_lib.diagnose.labeling import run_labeling
from trace_lib.diagnose.labels import edit_label, undo_edit
from trace_lib.diagnose.ranking import RankConfig
from trace_lib.scope import Scope
from trace_lib.store import rank_stored
from trace_lib.workbench import diagnose as wb

CFGS = (RankConfig(), RankConfig(rho=0.3, delta=0.1, k=3), RankConfig(rho=0.0, delta=-1.0))


@pytest.fixture
def draws(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the resample draws (with or without the multiplicities); each test starts as
    a fresh process would (nothing kept in memory), so only the store can spare a draw."""
    calls: list[int] = []

    def counting(real):
        def draw(*args, **kwargs):
            calls.append(1)
            return real(*args, **kwargs)
        return draw

    monkeypatch.setattr(ag, "draw_resamples", counting(ag.draw_resamples))
    monkeypatch.setattr(ag, "draw_counts", counting(ag.draw_counts))
    monkeypatch.setattr(ag, "_BOOT_CACHE", materialise.StoreMemo(size=2))
    return calls


def _store_default(con) -> str:
    """What a label run's finish does (here for runs written by SQL); the stability's part."""
    return rank_precompute.store_default(con)["stability"]


def _forget(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh process: the in-memory resamples gone, the store as it is."""
    monkeypatch.setattr(ag, "_BOOT_CACHE", materialise.StoreMemo(size=2))


def _computed(db: Path, tmp: Path, cfg: RankConfig, st: ag.StabilityConfig,
              scope: Scope | None = None) -> ag.StableRanking:
    """The ranking computed from scratch: a copy of the store without stored entries and a
    fresh memo."""
    copy = tmp / f"fresh-{len(list(tmp.glob('fresh-*')))}.duckdb"
    shutil.copy(db, copy)
    with store.connect(copy) as con:
        con.execute("DELETE FROM rank_stability")
        con.execute("DELETE FROM rank_stability_counts")
        saved = ag._BOOT_CACHE
        ag._BOOT_CACHE = materialise.StoreMemo(size=2)
        try:
            sr = ag.stable_ranking(con, cfg, st, scope=scope)
        finally:
            ag._BOOT_CACHE = saved
    assert sr.source == "computed"
    return sr


def _same(a: ag.StableRanking, b: ag.StableRanking) -> None:
    """Bit-for-bit: every figure of every row and run, the selected set, the note."""
    assert a.ranking.rows == b.ranking.rows  # dataclass equality: floats compared exactly
    assert [r.capability for r in a.ranking.selected] == [
        r.capability for r in b.ranking.selected]
    assert (a.ranking.k_effective, a.ranking.n_runs, a.ranking.note) == (
        b.ranking.k_effective, b.ranking.n_runs, b.ranking.note)
    assert a.info == b.info


def test_stored_bootstrap_equals_computed_and_is_what_a_ranking_reads(
        db_path: Path, tmp_path: Path, draws: list[int], monkeypatch) -> None:
    _one_run_store(db_path)
    with store.connect(db_path) as con:
        assert _store_default(con) == "computed" and len(draws) == 1
        assert [m for _, _, m in rank_stored.entries(con)] == ["bootstrap"]
    _forget(monkeypatch)
    with store.connect(db_path) as con:
        stored = [ag.stable_ranking(con, cfg) for cfg in CFGS]
    assert len(draws) == 1  # three rankings at three thresholds: no draw
    assert {s.source for s in stored} == {"stored"}
    assert stored[0].info.method == "bootstrap" and "1 label run" in stored[0].info.reason
    for cfg, got in zip(CFGS, stored, strict=True):
        _same(got, _computed(db_path, tmp_path, cfg, ag.StabilityConfig()))
    # The counts themselves: as drawn, float64, exactly.
    fresh = _computed(db_path, tmp_path, RankConfig(), ag.StabilityConfig()).boot
    assert stored[0].boot.caps == fresh.caps and stored[0].boot.counts.dtype == fresh.counts.dtype
    assert (stored[0].boot.counts == fresh.counts).all()


def test_the_use_case_the_verb_and_a_notebook_read_it(db_path: Path, draws: list[int],
                                                     monkeypatch) -> None:
    """`workbench.diagnose.rankings` with the page's defaults (what `rank` and the notebook
    call) reads the stored entry; the page's state says nothing is pending."""
    _one_run_store(db_path)
    with store.connect(db_path) as con:
        _store_default(con)
    _forget(monkeypatch)
    st = wb.StabilityConfig()
    state = wb.rankings_state(db_path, None, st, wb.Scope())
    assert not state.pending and state.version == wb.version(db_path)
    # The page passes every run by name and an empty scope picker: the same entry.
    view = wb.rankings(db_path, wb.RankConfig(runs=wb.run_ids(db_path)), stability=st,
                       scope=wb.Scope(datasets=[], agent_models=[], domains=[]))
    assert view.stability_source == "stored" and len(draws) == 1
    assert "tool_calling_precision" in view.kept


def test_a_label_run_finishing_stores_the_default_view(demo_db: Path, tmp_path: Path,
                                                      draws: list[int], monkeypatch) -> None:
    run_labeling(demo_db, "heuristic", run_prefix="h")
    assert len(draws) == 1  # drawn at the run's finish
    _forget(monkeypatch)
    view = wb.rankings(demo_db, wb.RankConfig(), stability=wb.StabilityConfig())
    assert view.stability_source == "stored" and len(draws) == 1
    with store.connect(demo_db) as con:
        again = ag.stable_ranking(con, RankConfig(), ag.StabilityConfig())
    _same(again, _computed(demo_db, tmp_path, RankConfig(), ag.StabilityConfig()))
    # A second run: a new version, stored again at its finish; auto now compares the runs
    # (two identical heuristic runs: still the bootstrap).
    n = len(draws)
    run_labeling(demo_db, "heuristic", run_prefix="h2")
    assert len(draws) == n + 1
    _forget(monkeypatch)
    with store.connect(demo_db) as con:
        sr = ag.stable_ranking(con, RankConfig(), ag.StabilityConfig())
        versions = {v for _, v, _ in rank_stored.entries(con)}
        assert versions == {materialise.version_hash(con)}  # the old version's entry is gone
    assert sr.source == "stored" and "identical" in sr.info.reason and len(sr.run_ids) == 2
    _same(sr, _computed(demo_db, tmp_path, RankConfig(), ag.StabilityConfig()))


@pytest.mark.parametrize("change", ["edit", "undo", "new run", "capability"])
def test_a_change_of_labels_is_never_served_the_old_entry(
        db_path: Path, tmp_path: Path, draws: list[int], monkeypatch, change: str) -> None:
    _one_run_store(db_path)
    cap = "precondition_verification"
    eid = None
    if change == "undo":  # an edit stored over, then undone
        eid = edit_label(db_path, "f00", cap, "present", editor="t")
    with store.connect(db_path) as con:
        _store_default(con)
        before = ag.stable_ranking(con, RankConfig(), ag.StabilityConfig())
    assert before.source == "stored"
    n = len(draws)
    if change == "edit":
        edit_label(db_path, "f00", cap, "present", editor="t")
    elif change == "undo":
        undo_edit(db_path, editor="t", edit_id=eid)
    elif change == "new run":  # a finished run written by SQL (as an import might)
        with store.connect(db_path) as con:
            con.execute("INSERT INTO label_runs (id, labeler) VALUES ('h2', 'test')")
            con.execute("INSERT INTO labels (run_id, trajectory_id, capability, value) "
                        "SELECT 'h2', trajectory_id, capability, value FROM labels "
                        "WHERE run_id = 'h'")
    else:
        wb.set_status(db_path, cap, "rejected")
    _forget(monkeypatch)
    assert wb.rankings_state(db_path, None, wb.StabilityConfig()).pending
    with store.connect(db_path) as con:
        after = ag.stable_ranking(con, RankConfig(), ag.StabilityConfig())
        assert {v for _, v, _ in rank_stored.entries(con)} == {materialise.version_hash(con)}
    assert after.source == "computed" and len(draws) == n + 1
    _same(after, _computed(db_path, tmp_path, RankConfig(), ag.StabilityConfig()))
    if change in ("edit", "undo"):  # the edit moved the counts (the undo moved them back)
        moved = {r.capability: r for r in after.ranking.rows}[cap].runs
        assert moved != {r.capability: r for r in before.ranking.rows}[cap].runs
    if change == "capability":
        assert not {r.capability: r for r in after.ranking.rows}[cap].selected
    with store.connect(db_path) as con:  # the ranking stored what it computed
        assert not ag.stability_pending(con, None, ag.StabilityConfig(), Scope())


def test_runs_stability_and_auto_resolved_to_runs(db_path: Path, tmp_path: Path,
                                                  draws: list[int], monkeypatch) -> None:
    """Runs that differ: `auto` resolves to runs; the entry stores that resolution (no
    counts: the per-run counts are `label_run_counts`) and the figures equal the computed."""
    same = ["lacking"] * 4 + ["present"] * 4
    flipped = ["present"] + ["lacking"] * 3 + ["present"] * 4
    make_store(db_path, _outcomes(4, 4), {"r1": {"tool_calling_precision": same},
                                          "r2": {"tool_calling_precision": flipped}})
    with store.connect(db_path) as con:
        assert _store_default(con) == "computed"
    _forget(monkeypatch)
    with store.connect(db_path) as con:
        auto = ag.stable_ranking(con, RankConfig(), ag.StabilityConfig())
        chosen = ag.stable_ranking(con, RankConfig(), ag.StabilityConfig(method="runs"))
    assert (auto.source, chosen.source) == ("stored", "chosen")
    assert auto.info.method == "runs" and auto.boot is None and "differ" in auto.info.reason
    _same(auto, _computed(db_path, tmp_path, RankConfig(), ag.StabilityConfig()))
    assert not draws
    with store.connect(db_path) as con:
        fresh = ag.stable_ranking(con, RankConfig(), ag.StabilityConfig(method="runs"))
        con.execute("DELETE FROM rank_stability")
        auto = ag.stable_ranking(con, RankConfig(), ag.StabilityConfig())
    assert auto.source == "computed"
    assert [r.runs for r in auto.ranking.rows] == [r.runs for r in fresh.ranking.rows]


def test_other_inputs_compute_then_store_their_own_entry(db_path: Path, tmp_path: Path,
                                                        draws: list[int], monkeypatch) -> None:
    """A scope, another B or seed, a subset of runs: computed as before (equal to a fresh
    computation), stored under their own key; the default entry stays."""
    _one_run_store(db_path)
    with store.connect(db_path) as con:  # a second dataset holding 10 trajectories
        con.execute("INSERT INTO datasets (id, name, format, content_sha256) "
                    "VALUES ('d2', 'other', 'test', 'y')")
        con.execute("UPDATE trajectories SET dataset_id = 'd2' WHERE id IN "
                    "('f00', 'f01', 'f02', 'f03', 'f04', 'p00', 'p01', 'p02', 'p03', 'p04')")
        _store_default(con)
    cases = [(RankConfig(), ag.StabilityConfig(), Scope(datasets=["other"])),
             (RankConfig(), ag.StabilityConfig(b=50, seed=3), None),
             (RankConfig(runs=["h"]), ag.StabilityConfig(method="bootstrap", b=30), None)]
    for cfg, st, scope in cases:
        _forget(monkeypatch)
        n = len(draws)
        with store.connect(db_path) as con:
            first = ag.stable_ranking(con, cfg, st, scope=scope)
        _forget(monkeypatch)
        with store.connect(db_path) as con:
            again = ag.stable_ranking(con, cfg, st, scope=scope)
        assert (first.source, again.source) == ("computed", "stored") and len(draws) == n + 1
        _same(again, first)
        _same(again, _computed(db_path, tmp_path, cfg, st, scope))
    with store.connect(db_path) as con:
        scoped = {r.capability: r for r in ag.stable_ranking(
            con, RankConfig(), ag.StabilityConfig(), scope=Scope(datasets=["other"])
        ).ranking.rows}
        assert all(f.lf + f.pf + f.nf == 5 for f in scoped["tool_calling_precision"].runs)
        assert len(rank_stored.entries(con)) == 4  # the default and three others
        _forget(monkeypatch)
        assert ag.stable_ranking(con).source == "stored"


def test_sensitivity_from_stored_counts_draws_the_same_resamples(
        db_path: Path, tmp_path: Path, draws: list[int], monkeypatch) -> None:
    """The review queue needs the multiplicities, which are not stored: a ranking read
    from the store draws them (the same seed: the same counts) and the sensitivity equals
    the one of a ranking computed in process."""
    _one_run_store(db_path)
    cfg, st = RankConfig(), ag.StabilityConfig(b=40, seed=4)
    with store.connect(db_path) as con:
        computed = ag.stable_ranking(con, cfg, st)
        want = ag.sensitivity(con, computed, cfg)
    _forget(monkeypatch)
    with store.connect(db_path) as con:
        sr = ag.stable_ranking(con, cfg, st)
        assert sr.source == "stored" and not isinstance(sr.boot, ag.Resamples)
        got = ag.sensitivity(con, sr, cfg)
    assert isinstance(sr.boot, ag.Resamples) and (sr.boot.counts == computed.boot.counts).all()
    assert got.equals(want)


def test_prepare_reports_progress_and_stores(db_path: Path, draws: list[int]) -> None:
    """What the page calls when `rankings_state` says something is pending: every part
    computed with progress from 0 to 1, then nothing pending."""
    _one_run_store(db_path)
    seen: list[tuple[float, str]] = []
    st = wb.StabilityConfig(b=20)
    assert wb.rankings_state(db_path, None, st).pending
    assert wb.prepare_rankings(db_path, None, st, progress=lambda f, t: seen.append((f, t))
                               ) == {"stability": "computed", "clusters": "computed",
                                     "cover": "computed"}
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and fractions[0] == 0.0 and fractions[-1] == 1.0
    assert any("resamples" in t for _, t in seen)
    assert not wb.rankings_state(db_path, None, st).pending
    # Both in the store (and nothing kept in this process's memory).
    assert wb.prepare_rankings(db_path, None, st) == {"stability": "stored",
                                                      "clusters": "stored",
                                                      "cover": "stored"}
    # The plain run ranking (no stability) has only the clusters to wait for.
    assert not wb.rankings_state(db_path, None, None).pending
