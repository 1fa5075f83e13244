"""Bootstrap stability (seeded, stratified, K of B) and the keep rule's sensitivity,
checked by really applying the predicted flip and re-ranking."""

from __future__ import annotations

from pathlib import Path

import pytest
from synthetic import make_store
from test_agreement import _one_run_store, _outcomes

from trace_lib import store
from trace_lib.diagnose import materialise, resamples
from trace_lib.diagnose import stability as ag
from trace_lib.diagnose.labels import edit_label, undo_edit
from trace_lib.diagnose.ranking import RankConfig
from trace_lib.errors import UserInputError


def test_bootstrap_used_for_one_run_seeded_and_stratified(db_path: Path) -> None:
    _one_run_store(db_path)
    with store.connect(db_path) as con:
        sr = ag.stable_ranking(con, RankConfig(), ag.StabilityConfig(b=100, seed=1))
        again = ag.stable_ranking(con, RankConfig(), ag.StabilityConfig(b=100, seed=1))
        other = ag.stable_ranking(con, RankConfig(), ag.StabilityConfig(b=100, seed=2))
        runs = ag.stable_ranking(con, RankConfig(), ag.StabilityConfig(method="runs"))
    assert sr.info.method == "bootstrap" and "1 label run" in sr.info.reason
    assert "stability from 100 bootstrap resamples, not independent label runs" in (
        sr.ranking.note or "")
    assert sr.ranking.k_effective == 80 and sr.ranking.n_runs == 100
    rows = {r.capability: r for r in sr.ranking.rows}
    clear, edge = rows["tool_calling_precision"], rows["precondition_verification"]
    assert clear.selected and clear.n_runs_passed == 100 and clear.std_delta == 0.0
    assert 0 < edge.n_runs_passed < 100 and edge.std_delta > 0  # a real spread
    assert len(edge.runs) == 100 and edge.runs[0].run == "boot-001"
    # Stratified: every resample keeps 20 failures and 20 passes.
    assert all(f.lf + f.pf + f.nf == 20 and f.lp + f.pp + f.np == 20 for f in edge.runs)
    assert [f.delta for f in edge.runs] == [
        f.delta for f in {r.capability: r for r in again.ranking.rows}[edge.capability].runs]
    assert [f.delta for f in edge.runs] != [
        f.delta for f in {r.capability: r for r in other.ranking.rows}[edge.capability].runs]
    # Pooled figures (Fisher, intervals) are the run ranking's.
    assert edge.pooled == {r.capability: r for r in runs.ranking.rows}[edge.capability].pooled
    assert runs.info.method == "runs" and runs.ranking.n_runs == 1


def test_auto_uses_runs_when_they_differ_and_bootstrap_when_identical(db_path: Path) -> None:
    same = ["lacking"] * 4 + ["present"] * 4
    flipped = ["present"] + ["lacking"] * 3 + ["present"] * 4
    make_store(db_path, _outcomes(4, 4), {"r1": {"tool_calling_precision": same},
                                          "r2": {"tool_calling_precision": same}})
    with store.connect(db_path) as con:
        info = ag.stable_ranking(con).info
        assert info.method == "bootstrap" and "identical" in info.reason
        con.execute("INSERT INTO label_runs (id, labeler) VALUES ('r3', 'test')")
        for i, v in enumerate(flipped):
            tid = f"f{i:02d}" if i < 4 else f"p{i - 4:02d}"
            con.execute("INSERT INTO labels (run_id, trajectory_id, capability, value) "
                        "VALUES ('r3', ?, 'tool_calling_precision', ?)", [tid, v])
        sr = ag.stable_ranking(con)
    assert sr.info.method == "runs" and sr.ranking.n_runs == 3
    with pytest.raises(UserInputError, match="expected one of"):
        with store.connect(db_path) as con:
            ag.stable_ranking(con, st=ag.StabilityConfig(method="magic"))


# ---------------------------------------------------------------------- sensitivity

def _kept(db: Path, cap: str, cfg: RankConfig, st: ag.StabilityConfig) -> bool:
    with store.connect(db) as con:
        return {r.capability: r for r in ag.stable_ranking(con, cfg, st).ranking.rows
                }[cap].selected


def _on_the_edge(db: Path, st: ag.StabilityConfig, cap: str
                 ) -> tuple[ag.StableRanking, RankConfig, object]:
    """The one-run store ranked with K put at `cap`'s pass count, so that it sits on the
    keep boundary and single flips can cross it: (ranking, config, sensitivity)."""
    _one_run_store(db)
    cfg = RankConfig()
    with store.connect(db) as con:
        first = ag.stable_ranking(con, cfg, st)
        cfg.k = max(1, {r.capability: r for r in first.ranking.rows}[cap].n_runs_passed)
        sr = ag.stable_ranking(con, cfg, st)
        return sr, cfg, ag.sensitivity(con, sr, cfg)


@pytest.mark.parametrize("method", ["bootstrap", "runs"])
def test_sensitivity_predicts_what_an_edit_does(db_path: Path, method: str) -> None:
    # B = 10 makes K of 10 exactly K of B.
    st = ag.StabilityConfig(method=method, b=10, seed=0)
    cap = "precondition_verification"
    sr, cfg, sens = _on_the_edge(db_path, st, cap)
    mine = sens[sens["capability"] == cap]
    assert len(mine) == 40 and mine["sensitivity"].between(0, 1).all()
    flips = mine[mine["flips_keep"]]
    assert not flips.empty
    stays = mine[~mine["flips_keep"]]
    before = _kept(db_path, cap, cfg, st)
    # Really apply a predicted flip, and a non-flip, and re-rank.
    pred = flips.iloc[0]
    eid = edit_label(db_path, pred["trajectory_id"], cap, pred["flip_to"], editor="t")
    assert _kept(db_path, cap, cfg, st) != before
    undo_edit(db_path, editor="t", edit_id=eid)
    assert _kept(db_path, cap, cfg, st) == before
    if not stays.empty:
        row = stays.iloc[0]
        other = row["flip_to"] if isinstance(row["flip_to"], str) else next(
            v for v in ag.VALUES if v != row["value"])
        edit_label(db_path, row["trajectory_id"], cap, other, editor="t")
        assert _kept(db_path, cap, cfg, st) == before
    # The clear capability is not moved by any single flip.
    clear = sens[sens["capability"] == "tool_calling_precision"]
    assert not clear["flips_keep"].any()


def _recount_sensitivity(sr: ag.StableRanking, cfg: RankConfig, cap: str) -> list[float]:
    """The bootstrap sensitivity of each labeled pair of `cap` by brute force: every
    resample recounted with the pair moved to each other value (the definition the
    lookup table in `_sensitivity_boot` must reproduce)."""
    import numpy as np

    boot = sr.boot
    j = boot.caps.index(cap)
    row = {r.capability: r for r in sr.ranking.rows}[cap]
    out = []
    for t in np.flatnonzero(boot.codes[:, j] >= 0):
        old, s = int(boot.codes[t, j]), int(boot.success[t])
        best = 0.0
        for v in range(3):
            if v == old:
                continue
            c = boot.counts[:, j, :].copy()
            c[:, 3 * s + old] -= boot.w[:, t]
            c[:, 3 * s + v] += boot.w[:, t]
            passes = int(ag._figures(c, cfg.rho, cfg.delta)["passed"].sum())
            best = max(best, abs(passes - row.n_runs_passed) / boot.w.shape[0])
        out.append(best)
    return out


def test_bootstrap_sensitivity_equals_a_recount_of_every_resample(db_path: Path) -> None:
    cap = "precondition_verification"
    sr, cfg, sens = _on_the_edge(db_path, ag.StabilityConfig(method="bootstrap", b=60, seed=3),
                                 cap)
    mine = sens[sens["capability"] == cap]
    expected = _recount_sensitivity(sr, cfg, cap)
    assert any(x > 0 for x in expected)  # the edge capability: some flips move passes
    # Where no flip changes keep, the largest move is the sensitivity; where one does, the
    # chosen flip's move is at most the largest.
    for got, want, flips in zip(mine["sensitivity"], expected, mine["flips_keep"],
                                strict=True):
        assert got == pytest.approx(want) if not flips else 0 < got <= want + 1e-12


def test_bootstrap_resamples_are_reused_across_thresholds_and_redrawn_after_an_edit(
        db_path: Path) -> None:
    """A slider move (rho, delta, K) reuses the resamples; an edit changes the pooled
    labels, so the next ranking draws them again and counts the edit."""
    _one_run_store(db_path)
    st = ag.StabilityConfig(method="bootstrap", b=40, seed=5)
    cap = "precondition_verification"
    with store.connect(db_path) as con:
        first = ag.stable_ranking(con, RankConfig(), st)
        moved = ag.stable_ranking(con, RankConfig(rho=0.3, delta=0.1, k=3), st)
        assert moved.boot is first.boot  # the same arrays: nothing recomputed
        j = first.boot.caps.index(cap)
        t = next(i for i in range(len(first.boot.tids)) if first.boot.codes[i, j] == 0)
        tid, s = first.boot.tids[t], int(first.boot.success[t])
    edit_label(db_path, tid, cap, "present", editor="t")
    with store.connect(db_path) as con:
        after = ag.stable_ranking(con, RankConfig(), st)
    assert after.boot is not first.boot
    moved_by = first.boot.w[:, t].astype(float)  # same seed, same strata: same draws
    assert (after.boot.counts[:, j, 3 * s] == first.boot.counts[:, j, 3 * s] - moved_by).all()
    assert (after.boot.counts[:, j, 3 * s + 1]
            == first.boot.counts[:, j, 3 * s + 1] + moved_by).all()


def test_review_queue_after_a_cached_ranking_on_the_same_connection(db_path: Path) -> None:
    """The notebook's order: rank (resamples cached), then the review queue on one
    connection; the queue's frame registration must not trip over an earlier result."""
    _one_run_store(db_path)
    st = ag.StabilityConfig(b=30, seed=2)
    with store.connect(db_path) as con:
        ranked = ag.stable_ranking(con, RankConfig(), st)
        from trace_lib.diagnose.agreement import review_queue_con

        queue = review_queue_con(con, RankConfig(), st, limit=5)
        assert ag.stable_ranking(con, RankConfig(), st).boot is ranked.boot
    assert queue.attrs["stability"]["method"] == "bootstrap" and len(queue) <= 5


def test_bootstrap_from_the_materialised_pairs_equals_the_definition(db_path: Path,
                                                                     monkeypatch) -> None:
    """Every finished run counted: the resamples read `label_pairs` (the materialised
    effective value) instead of grouping every label; the pairs, codes and counts must be
    those of the definition over `effective_run_labels`, with ties, failed labels (NULL),
    an unknown outcome, an edit, an undone edit, an edit of a never-labeled pair and a run
    still going."""
    import random

    rng = random.Random(7)
    outcomes = {**_outcomes(15, 15), "u00": None}
    values = ["lacking", "present", "na", None]
    caps = ("tool_calling_precision", "precondition_verification")
    make_store(db_path, outcomes, {run: {c: [rng.choice(values) for _ in outcomes]
                                         for c in caps} for run in ("r1", "r2", "r3")})
    with store.connect(db_path) as con:
        con.execute("INSERT INTO label_runs (id, labeler, status) "
                    "VALUES ('r4', 'test', 'running')")
        con.execute("INSERT INTO labels (run_id, trajectory_id, capability, value) "
                    "VALUES ('r4', 'f00', 'tool_calling_precision', 'na')")
    edit_label(db_path, "f01", caps[0], "lacking", editor="t")
    undo_edit(db_path, editor="t", edit_id=edit_label(db_path, "p01", caps[1], "na",
                                                      editor="t"))
    edit_label(db_path, "p02", "structured_data_reasoning", "present", editor="t")
    st = ag.StabilityConfig(method="bootstrap", b=30, seed=11)
    with store.connect(db_path) as con:
        runs = ag.counted_run_ids(con, None)
        assert sorted(runs) == ["r1", "r2", "r3"]
        assert materialise.counts_every_finished_run(con, runs)
        sc, sp = ag.Scope().where(con, "t")
        fast = resamples.draw_resamples(con, runs, st.b, st.seed, sc, sp)
        monkeypatch.setattr(materialise, "counts_every_finished_run", lambda con, ids: False)
        slow = resamples.draw_resamples(con, runs, st.b, st.seed, sc, sp)
    assert list(fast.tids) == list(slow.tids) and fast.caps == slow.caps
    assert (fast.codes == slow.codes).all() and (fast.success == slow.success).all()
    assert (fast.counts == slow.counts).all()
