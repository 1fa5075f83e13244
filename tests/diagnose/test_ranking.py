"""Ranking: hand-computed counts, undefined ratios, K-of-N, edits re-rank, export, cover."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from synthetic import make_store

from trace_lib import store
from trace_lib.diagnose import labels as lb
from trace_lib.diagnose.ranking import (
    RankConfig,
    effective_k,
    export_selected,
    failure_clusters,
    greedy_cover,
    rank,
    ranking_json,
    wilson,
)
from trace_lib.errors import UserInputError

# 4 failed (f1..f4), 4 passed (p1..p4)
OUTCOMES = {"f1": False, "f2": False, "f3": False, "f4": False,
            "p1": True, "p2": True, "p3": True, "p4": True}
L, P, N = "lacking", "present", "na"


def _by_cap(rows):
    return {r.capability: r for r in rows}


def test_counts_and_formulas_by_hand(db_path: Path) -> None:
    make_store(db_path, OUTCOMES, {"r1": {
        # failed: L L P N -> LF=2 PF=1 NF=1; passed: L P P P -> LP=1 PP=3
        "precondition_verification": [L, L, P, N, L, P, P, P],
        # never lacking when passing, never present when passing -> ER+ undefined
        "tone_empathy": [L, N, N, N, N, N, N, N],
    }})
    r = _by_cap(rank(db_path).rows)
    pv = r["precondition_verification"].runs[0]
    assert (pv.lf, pv.pf, pv.nf, pv.lp, pv.pp, pv.np) == (2, 1, 1, 1, 3, 0)
    assert pv.cov == pytest.approx(2 / 4)
    assert pv.er_minus == pytest.approx(2 / 3)
    assert pv.er_plus == pytest.approx(1 / 4)
    assert pv.delta == pytest.approx(2 / 3 - 1 / 4)
    te = r["tone_empathy"]
    assert te.runs[0].er_plus is None and te.runs[0].delta is None  # undefined, not 0
    assert te.mean_delta is None and not te.selected and te.n_runs_defined == 0
    assert te.fisher_p is None


def test_k_of_n_selection_and_scaling(db_path: Path) -> None:
    good = [L, L, L, P, P, P, P, P]  # cov .75, delta .75
    weak = [L, P, P, P, L, P, P, P]  # cov .25, delta .0
    runs = {f"r{i}": {"structured_data_reasoning": good if i < 7 else weak,
                      "tool_calling_precision": weak} for i in range(10)}
    make_store(db_path, OUTCOMES, runs)
    ranking = rank(db_path)
    assert ranking.k_effective == 8 and ranking.note is None
    by = _by_cap(ranking.rows)
    sdr = by["structured_data_reasoning"]
    assert (sdr.n_runs_passed, sdr.n_runs_total) == (7, 10) and not sdr.selected  # 7 < 8
    assert by["structured_data_reasoning"].std_delta > 0
    assert _by_cap(rank(db_path, RankConfig(k=7)).rows)["structured_data_reasoning"].selected
    # Three runs only: K scales to ceil(8 * 3 / 10) = 3, and the note says so.
    three = rank(db_path, RankConfig(runs=["r0", "r1", "r2"]))
    assert three.k_effective == 3 and "scaled" in three.note
    assert _by_cap(three.rows)["structured_data_reasoning"].selected
    assert effective_k(8, 1) == (1, effective_k(8, 1)[1])
    with pytest.raises(UserInputError, match="unknown label run"):
        rank(db_path, RankConfig(runs=["nope"]))


def test_edit_reranks_at_once_and_undo_restores(db_path: Path) -> None:
    make_store(db_path, OUTCOMES, {"r1": {"multi_step_task_completion":
                                          [L, P, P, P, P, P, P, P]}})
    before = _by_cap(rank(db_path, RankConfig(delta=0.2)).rows)["multi_step_task_completion"]
    assert before.mean_cov == pytest.approx(0.25) and before.selected
    eid = lb.edit_label(db_path, "f1", "multi_step_task_completion", "present", editor="ann",
                        note="evidence was wrong")
    after = _by_cap(rank(db_path).rows)["multi_step_task_completion"]
    assert after.mean_cov == 0 and not after.selected
    lb.undo_edit(db_path, editor="ann", edit_id=eid)
    again = _by_cap(rank(db_path).rows)["multi_step_task_completion"]
    assert again.mean_cov == pytest.approx(0.25) and again.selected
    hist = lb.edit_history(db_path)
    assert list(hist["editor"]) == ["ann", "ann"] and bool(hist["undone"].iloc[1])
    with pytest.raises(UserInputError, match="already undone"):
        lb.undo_edit(db_path, editor="ann", edit_id=eid)


def test_rejected_capability_is_never_selected(db_path: Path) -> None:
    from trace_lib.diagnose.capability_curation import set_status

    make_store(db_path, OUTCOMES, {"r1": {"upselling": [L, L, L, L, P, P, P, P]}})
    assert _by_cap(rank(db_path).rows)["upselling"].selected
    set_status(db_path, "upselling", "rejected")
    row = _by_cap(rank(db_path).rows)["upselling"]
    assert not row.selected and row.mean_delta == 1.0


def test_wilson_and_fisher() -> None:
    lo, hi = wilson(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-3) and hi == pytest.approx(0.7634, abs=1e-3)
    assert wilson(0, 0) is None


def test_json_export_cover_and_clusters(db_path: Path, tmp_path: Path) -> None:
    make_store(db_path, OUTCOMES, {"r1": {
        "structured_data_reasoning": [L, L, P, P, P, P, P, P],
        "precondition_verification": [P, L, L, P, P, P, P, P],
    }})
    doc = ranking_json(rank(db_path))
    assert {"capability", "mean_cov", "std_cov", "mean_delta", "std_delta", "n_runs_passed",
            "n_runs_total", "selected", "fisher_p", "runs"} <= set(doc[0])
    assert {"run", "cov", "delta", "er_minus", "er_plus", "lf", "pf", "nf", "lp", "pp",
            "np"} == set(doc[0]["runs"][0])
    out = tmp_path / "selected_capabilities.json"
    written = export_selected(db_path, out)
    on_disk = json.loads(out.read_text())
    assert on_disk == written and {d["skill"] for d in on_disk} == {
        "structured_data_reasoning", "precondition_verification"}
    assert set(on_disk[0]) == {"skill", "description", "mean_cov", "std_cov", "mean_delta",
                               "std_delta", "n_runs_passed", "n_runs_total",
                               "example_failed_cases", "example_failed_trajectories",
                               "status"}
    # Examples are qualified: dataset name + task + trial, and the trajectory id.
    sdr = next(d for d in on_disk if d["skill"] == "structured_data_reasoning")
    assert sdr["example_failed_cases"] == ["syn/task task0/trial ?", "syn/task task1/trial ?"]
    assert [e["trajectory_id"] for e in sdr["example_failed_trajectories"]] == ["f1", "f2"]
    assert sdr["example_failed_trajectories"][0] == {
        "dataset": "syn", "task_id": "task0", "trial": None, "trajectory_id": "f1"}
    with store.connect(db_path) as con:
        curve = greedy_cover(con, [d["skill"] for d in on_disk])
        clusters = failure_clusters(con)
    assert curve[-1]["covered"] == 3 and curve[-1]["n_failed"] == 4 and curve[0]["new"] == 2
    assert curve[-1]["n_unlabelled"] == 0
    sigs = {c["signature"]: c["n"] for c in clusters}
    assert sigs["precondition_verification + structured_data_reasoning"] == 1
    assert sigs["(none lacking)"] == 1 and "(not labelled)" not in sigs


def test_cover_and_clusters_count_unlabelled_failures_apart(db_path: Path) -> None:
    """A failed trajectory no run labelled is neither explained nor "(none lacking)"
    (issue 34): f4 has no label at all, f3 only a label the labeler failed on."""
    make_store(db_path, OUTCOMES, {"r1": {
        "structured_data_reasoning": [L, L, None, None, P, P, P, P],
    }})
    with store.connect(db_path) as con:
        con.execute("INSERT INTO labels (run_id, trajectory_id, capability, value, error) "
                    "VALUES ('r1', 'f3', 'structured_data_reasoning', NULL, 'timeout')")
        curve = greedy_cover(con, ["structured_data_reasoning"])
        clusters = {c["signature"]: c["n"] for c in failure_clusters(con)}
    assert curve[-1]["covered"] == 2 and curve[-1]["n_failed"] == 2
    assert curve[-1]["n_unlabelled"] == 2 and curve[-1]["fraction"] == 1.0
    assert clusters == {"structured_data_reasoning": 2, "(not labelled)": 2}


def test_incremental_counts_equal_the_direct_sql(db_path: Path) -> None:
    import random

    from trace_lib.diagnose.ranking import rank_con

    rng = random.Random(0)
    outcomes = {f"t{i}": rng.random() < 0.5 for i in range(40)}
    runs = {f"r{r}": {c: [rng.choice([L, P, N, None]) for _ in outcomes]
                      for c in ("tool_calling_precision", "upselling")} for r in range(4)}
    make_store(db_path, outcomes, runs)

    def figures(ranking):
        return {r.capability: (r.pooled, [(f.run, f.lf, f.pf, f.nf, f.lp, f.pp, f.np)
                                          for f in r.runs]) for r in ranking.rows}

    with store.connect(db_path) as con:
        assert figures(rank_con(con)) == figures(rank_con(con, incremental=False))
        for i in range(12):  # edits, including re-edits of one pair and an unlabeled value
            tid = f"t{rng.randrange(40)}" if i % 4 else "t0"
            con.execute("INSERT INTO label_edits (trajectory_id, capability, old, new, editor) "
                        "VALUES (?, ?, NULL, ?, 'e')",
                        [tid, rng.choice(["tool_calling_precision", "upselling"]),
                         rng.choice([L, P, N])])
            cfg = RankConfig(runs=["r0", "r2"]) if i % 3 == 0 else None
            assert figures(rank_con(con, cfg)) == figures(rank_con(con, cfg, incremental=False))
