"""What the Rankings view computes from its kept set (issue 35, part 2): the greedy cover
from the stored cover signatures equals the definition (Python sets over the effective
labels) for any kept set and scope; the export examples equal `failed_examples`; both are
stored at a label run's finish, read by every kept set, never for other labels."""

from __future__ import annotations

from pathlib import Path

import pytest
from synthetic import make_store
from test_agreement import _one_run_store, _outcomes

from trace_lib import store
from trace_lib.diagnose import materialise, rank_precompute, ranking
from trace_lib.diagnose.labeling import run_labeling
from trace_lib.diagnose.labels import edit_label, undo_edit
from trace_lib.scope import Scope
from trace_lib.workbench import diagnose as wb

CFGS = (wb.RankConfig(), wb.RankConfig(rho=0.3, delta=0.1, k=3),
        wb.RankConfig(rho=0.0, delta=-1.0, k=1), wb.RankConfig(rho=1.0, delta=1.0))


def _definition(con, kept: list[str], scope: Scope | None = None) -> list[dict]:
    """The greedy cover as it was first written: Python sets of trajectory ids."""
    if not kept:
        return []
    sc, sp = (scope or Scope()).where(con, "t")
    failed = {r[0] for r in con.execute(
        f"SELECT t.id FROM trajectories t WHERE t.success = false AND {sc}", sp).fetchall()}
    pairs = con.execute("SELECT trajectory_id, capability, value FROM label_pairs "
                        "WHERE value IS NOT NULL AND list_contains(?::VARCHAR[], capability)",
                        [kept]).fetchall()
    labelled = {t for t, _, _ in pairs if t in failed}
    members = {c: {t for t, cc, v in pairs if cc == c and v == "lacking" and t in failed}
               for c in kept}
    covered: set[str] = set()
    curve = []
    while members:
        gains = {c: len(m - covered) for c, m in members.items()}
        cap = max(gains, key=lambda c: (gains[c], c))
        covered |= members.pop(cap)
        curve.append({"step": len(curve) + 1, "capability": cap, "new": gains[cap],
                      "covered": len(covered), "n_failed": len(labelled),
                      "n_unlabelled": len(failed) - len(labelled),
                      "fraction": len(covered) / len(labelled) if labelled else None})
    return curve


def _document(con, cfg: wb.RankConfig, view: wb.RankingsView) -> list[dict]:
    """The export document computed from the labels (no stored examples)."""
    return ranking.selected_document(con, cfg, ranking=view.ranking)


@pytest.fixture
def computes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Counts the reads of labels for the cover and the examples."""
    calls: list[str] = []
    for name in ("cover_signatures", "failed_examples"):
        real = getattr(rank_precompute, name)
        monkeypatch.setattr(rank_precompute, name,
                            lambda *a, _r=real, _n=name, **k: calls.append(_n) or _r(*a, **k))
    return calls


def test_the_cover_from_signatures_is_the_definitions(demo_db: Path) -> None:
    run_labeling(demo_db, "heuristic", run_prefix="h")
    with store.connect(demo_db) as con:
        caps = sorted(r[0] for r in con.execute(
            "SELECT DISTINCT capability FROM label_pairs").fetchall())
        sigs = ranking.cover_signatures(con, caps)
        assert int(sigs.n.sum()) == ranking.n_failed(con)
        again = ranking.CoverSignatures.from_json(sigs.to_json())
        for kept in (caps, caps[:3], caps[2:9:2], [caps[-1]], []):
            want = _definition(con, kept)
            assert ranking.greedy_cover(con, kept) == want
            assert ranking.cover_from_signatures(again, kept) == want
        assert _definition(con, caps)[-1]["covered"] > 0  # something to cover
        scope = Scope(agent_models=["scripted-sloppy"])
        scoped = ranking.cover_signatures(con, caps, scope=scope)
        for kept in (caps, caps[1:4]):
            assert (ranking.cover_from_signatures(scoped, kept)
                    == _definition(con, kept, scope) == ranking.greedy_cover(con, kept,
                                                                            scope=scope))


def test_more_than_64_capabilities_fit(db_path: Path) -> None:
    caps = [f"cap{i:03d}" for i in range(70)]
    outcomes = _outcomes(9, 3)
    make_store(db_path, outcomes, {"h": {}})
    with store.connect(db_path) as con:
        # f{i} lacks cap{7i..7i+6}; cap063..cap069 are shared by f08 and a pass; f00
        # is labelled for nothing (unlabelled).
        for i, tid in enumerate(outcomes):
            lacking = caps[7 * i:7 * i + 7] + (caps[63:] if i in (8, 10) else [])
            con.execute("INSERT INTO labels (run_id, trajectory_id, capability, value) "
                        "SELECT 'h', ?, c, CASE WHEN list_contains(?::VARCHAR[], c) "
                        "THEN 'lacking' ELSE 'present' END FROM unnest(?::VARCHAR[]) AS u(c)",
                        [tid, lacking, [] if i == 0 else caps])
        sigs = ranking.cover_signatures(con, caps)
        assert sigs.lacking.shape[1] == 2
        back = ranking.CoverSignatures.from_json(sigs.to_json())
        for kept in (caps, caps[60:], [caps[64], caps[69], caps[3]], caps[:64]):
            want = _definition(con, kept)
            assert ranking.cover_from_signatures(back, kept) == want
            assert ranking.greedy_cover(con, kept) == want
        assert _definition(con, caps)[-1]["n_unlabelled"] == 1


def test_a_label_run_stores_what_every_kept_set_reads(demo_db: Path,
                                                       computes: list[str]) -> None:
    run_labeling(demo_db, "heuristic", run_prefix="h")
    assert computes == ["cover_signatures", "failed_examples"]  # at the run's finish
    del computes[:]
    kept_sets = set()
    for cfg in CFGS:
        view = wb.rankings(demo_db, cfg, stability=wb.StabilityConfig())
        assert view.kept_source == "stored", cfg
        kept_sets.add(tuple(view.kept))
        with store.connect(demo_db) as con:
            assert view.cover == _definition(con, view.kept)
            assert view.document == _document(con, cfg, view)
    assert not computes and len(kept_sets) >= 3  # several kept sets, one stored entry
    assert () in kept_sets  # nothing kept: no cover, an empty document
    with store.connect(demo_db) as con:
        assert con.execute("SELECT count(*) FROM rank_cover").fetchall()[0][0] == 1


def test_another_scope_computes_and_stores_its_own(demo_db: Path,
                                                   computes: list[str]) -> None:
    run_labeling(demo_db, "heuristic", run_prefix="h")
    del computes[:]
    scope = Scope(agent_models=["scripted-hasty"])  # 8 of the 17 failures
    cfg = wb.RankConfig(rho=0.0, delta=-1.0, k=1)
    first = wb.rankings(demo_db, cfg, stability=wb.StabilityConfig(), scope=scope)
    second = wb.rankings(demo_db, wb.RankConfig(), stability=wb.StabilityConfig(),
                         scope=scope)
    assert (first.kept_source, second.kept_source) == ("computed", "stored")
    assert computes == ["cover_signatures", "failed_examples"]
    with store.connect(demo_db) as con:
        for cfg_, view in ((cfg, first), (wb.RankConfig(), second)):
            assert view.cover == _definition(con, view.kept, scope)
            assert view.document == _document(con, cfg_, view)
        assert first.cover[-1]["n_failed"] + first.cover[-1]["n_unlabelled"] == \
            ranking.n_failed(con, scope) < ranking.n_failed(con)


@pytest.mark.parametrize("change", ["edit", "undo", "new run", "capability"])
def test_a_change_of_labels_is_never_served_the_old_entry(
        db_path: Path, computes: list[str], change: str) -> None:
    _one_run_store(db_path)
    cap = "precondition_verification"
    cfg = wb.RankConfig(rho=0.0, delta=-1.0, k=1)  # both capabilities kept
    eid = None
    if change == "undo":  # an edit stored over, then undone
        eid = edit_label(db_path, "f00", cap, "present", editor="t")
    with store.connect(db_path) as con:
        assert rank_precompute.store_default(con)["cover"] == "computed"
    before = wb.rankings(db_path, cfg, stability=wb.StabilityConfig())
    assert before.kept_source == "stored" and len(before.kept) == 2
    del computes[:]
    if change == "edit":
        edit_label(db_path, "f00", "tool_calling_precision", "present", editor="t")
    elif change == "undo":
        undo_edit(db_path, editor="t", edit_id=eid)
    elif change == "new run":  # two finished runs written by SQL: the majority moves
        with store.connect(db_path) as con:
            for run in ("h2", "h3"):
                con.execute("INSERT INTO label_runs (id, labeler) VALUES (?, 'test')", [run])
                con.execute("INSERT INTO labels (run_id, trajectory_id, capability, value) "
                            "SELECT ?, trajectory_id, capability, 'present' FROM labels "
                            "WHERE run_id = 'h'", [run])
    else:
        wb.set_status(db_path, cap, "rejected")
    assert wb.rankings_state(db_path, None, wb.StabilityConfig()).pending
    after = wb.rankings(db_path, cfg, stability=wb.StabilityConfig())
    assert after.kept_source == "computed" and computes == ["cover_signatures",
                                                            "failed_examples"]
    with store.connect(db_path) as con:
        assert after.cover == _definition(con, after.kept)
        assert after.document == _document(con, cfg, after)
        assert {r[0] for r in con.execute("SELECT version FROM rank_cover").fetchall()} == {
            materialise.version_hash(con)}  # the old version's row is gone
    if change == "capability":
        assert after.kept == ["tool_calling_precision"]
    else:
        assert (after.cover, after.document) != (before.cover, before.document)
    assert wb.rankings(db_path, cfg, stability=wb.StabilityConfig()).kept_source == "stored"
