"""Kappa formulas against textbook examples, bootstrap stability, sensitivity checked by
really applying the flip, and the review queue's sources of disagreement."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from synthetic import make_store

from trace_lib import store
from trace_lib.diagnose import agreement as ag
from trace_lib.diagnose.labels import edit_label

# ----------------------------------------------------------------------------- kappa

# Fleiss (1971) as reprinted on Wikipedia: 10 subjects, 14 raters, 5 categories;
# P-bar = 0.378, P_e = 0.2128, kappa = 0.210.
FLEISS_WIKI = [[0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0],
               [2, 2, 8, 1, 1], [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2],
               [6, 5, 2, 1, 0], [0, 2, 2, 3, 7]]


def test_fleiss_textbook_and_hand_examples() -> None:
    assert ag.fleiss_kappa(FLEISS_WIKI) == pytest.approx(0.20993, abs=5e-5)
    # By hand: two raters always agree, categories split evenly: P-bar 1, P_e 0.5 -> 1.
    assert ag.fleiss_kappa([[2, 0], [0, 2]]) == pytest.approx(1.0)
    # Always disagree: P-bar 0, P_e 0.5 -> (0 - 0.5) / 0.5 = -1.
    assert ag.fleiss_kappa([[1, 1], [1, 1]]) == pytest.approx(-1.0)
    # Three raters, 4 subjects: P_i = 1, 1/3, 1/3, 1 -> P-bar 2/3; p = (6/12, 6/12) -> 0.5.
    assert ag.fleiss_kappa([[3, 0], [2, 1], [1, 2], [0, 3]]) == pytest.approx(1 / 3)
    assert ag.fleiss_kappa([[3, 0], [3, 0]]) is None  # one category only: 0/0
    with pytest.raises(ValueError):
        ag.fleiss_kappa([[2, 0], [1, 0]])  # unequal raters per subject


def _expand(table: list[list[int]], cats: tuple[str, ...]) -> tuple[list[str], list[str]]:
    a, b = [], []
    for i, row in enumerate(table):
        for j, n in enumerate(row):
            a += [cats[i]] * n
            b += [cats[j]] * n
    return a, b


def test_cohen_textbook_examples() -> None:
    yes_no = ("yes", "no")
    # Wikipedia: 50 proposals, 20 yes/yes, 5 yes/no, 10 no/yes, 15 no/no:
    # p_o = 0.7, p_e = 0.5 * 0.6 + 0.5 * 0.4 = 0.5 -> kappa 0.4.
    a, b = _expand([[20, 5], [10, 15]], yes_no)
    assert ag.cohen_kappa(a, b, yes_no) == pytest.approx(0.4)
    # 45/15/25/15 of 100: p_o = 0.6, p_e = 0.6 * 0.7 + 0.4 * 0.3 = 0.54 -> 0.06 / 0.46.
    a, b = _expand([[45, 15], [25, 15]], yes_no)
    assert ag.cohen_kappa(a, b, yes_no) == pytest.approx(0.06 / 0.46)
    assert ag.cohen_kappa(["na", "na"], ["na", "na"]) is None  # chance agreement 1
    assert ag.cohen_kappa(["lacking"], ["present"]) == pytest.approx(0.0)
    with pytest.raises(ValueError):
        ag.cohen_kappa(["na"], ["na", "na"])


def test_cohen_matches_sklearn_when_installed() -> None:
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(3)
    for _ in range(20):
        a = rng.choice(ag.VALUES, size=40)
        b = np.where(rng.random(40) < 0.6, a, rng.choice(ag.VALUES, size=40))
        assert ag.cohen_kappa(a, b) == pytest.approx(metrics.cohen_kappa_score(a, b))


# ------------------------------------------------------------------------ stores

def _outcomes(n_fail: int, n_pass: int) -> dict[str, bool]:
    return {**{f"f{i:02d}": False for i in range(n_fail)},
            **{f"p{i:02d}": True for i in range(n_pass)}}


def _one_run_store(db: Path) -> None:
    """20 failed, 20 passed. clear: lacking in every failure, present in every pass.
    edge: lacking in 7 failures and 3 passes (Cov 0.35, Delta 0.20: on the threshold)."""
    caps = {"tool_calling_precision": ["lacking"] * 20 + ["present"] * 20,
            "precondition_verification": (["lacking"] * 7 + ["present"] * 13
                                          + ["lacking"] * 3 + ["present"] * 17)}
    make_store(db, _outcomes(20, 20), {"h": caps})
    with store.connect(db) as con:
        con.execute("UPDATE label_runs SET labeler = 'heuristic'")


# ---------------------------------------------------------------- agreement, queue

def _two_labelers_store(db: Path) -> None:
    h = ["lacking"] * 6 + ["present"] * 2 + ["present"] * 6 + ["lacking"] * 2
    llm = ["lacking"] * 4 + ["present"] * 4 + ["present"] * 6 + ["na"] * 2
    make_store(db, _outcomes(8, 8), {"h1": {"tool_calling_precision": h},
                                      "h2": {"tool_calling_precision": h},
                                      "o1": {"tool_calling_precision": llm}})
    with store.connect(db) as con:
        con.execute("UPDATE label_runs SET labeler = 'heuristic' WHERE id LIKE 'h%'")
        con.execute("UPDATE label_runs SET labeler = 'openai' WHERE id = 'o1'")


def test_agreement_report_fleiss_and_cohen(db_path: Path) -> None:
    _two_labelers_store(db_path)
    cap = "tool_calling_precision"
    # People: ana decides 3 pairs, bo disagrees with ana on one of them.
    edit_label(db_path, "f00", cap, "lacking", editor="ana")
    edit_label(db_path, "f05", cap, "present", editor="ana")
    edit_label(db_path, "p06", cap, "present", editor="ana")
    edit_label(db_path, "p06", cap, "lacking", editor="bo")
    with store.connect(db_path) as con:
        rep = ag.agreement_con(con)
    fl = {r.capability: r for r in rep.fleiss}[cap]
    # Hand: 16 subjects x 3 runs; the same count matrix through the formula.
    h = ["lacking"] * 6 + ["present"] * 8 + ["lacking"] * 2
    o = ["lacking"] * 4 + ["present"] * 10 + ["na"] * 2
    counts = [[2 * (x == v) + (y == v) for v in ag.VALUES] for x, y in zip(h, o, strict=True)]
    assert fl.n_runs == 3 and fl.n_trajectories == 16
    assert fl.kappa == pytest.approx(ag.fleiss_kappa(counts))
    cohen = {(c.rater_a, c.rater_b): c for c in rep.cohen}
    # People's decision = the latest live edit: f00 lacking, f05 present, p06 lacking (bo).
    hp = cohen[("heuristic", "people")]
    assert hp.n == 3 and hp.kind == "labeler vs people"
    assert hp.kappa == pytest.approx(ag.cohen_kappa(["lacking", "lacking", "lacking"],
                                                    ["lacking", "present", "lacking"]))
    assert cohen[("heuristic", "openai")].kappa == pytest.approx(ag.cohen_kappa(h, o))
    ab = cohen[("ana", "bo")]
    assert ab.kind == "person vs person" and ab.n == 1 and ab.observed == 0.0


def test_review_queue_sources_and_orders(db_path: Path) -> None:
    _two_labelers_store(db_path)
    cap = "tool_calling_precision"
    edit_label(db_path, "f05", cap, "present", editor="ana")  # decided, no conflict
    edit_label(db_path, "p06", cap, "present", editor="ana")
    edit_label(db_path, "p06", cap, "lacking", editor="bo")  # people disagree
    with store.connect(db_path) as con:
        q = ag.review_queue_con(con, limit=100)
        qs = ag.review_queue_con(con, limit=100, order="sensitivity")
        with pytest.raises(ag.UserInputError, match="order"):
            ag.review_queue_con(con, order="random")
    pairs = {(r.trajectory_id, r.capability): r for r in q.itertuples()}
    assert ("f05", cap) not in pairs  # a person decided it and nobody disagrees
    people = pairs[("p06", cap)]
    assert "people" in people.source and people.editors == "ana=present, bo=lacking"
    lab = pairs[("f04", cap)]  # heuristic lacking (2 runs) vs openai present
    assert "labelers" in lab.source and "runs" in lab.source
    assert lab.labelers == "heuristic=lacking, openai=present"
    assert lab.disagreement == pytest.approx(0.5)
    assert list(q["disagreement"]) == sorted(q["disagreement"], reverse=True)
    assert q.attrs["stability"]["method"] == "runs"
    assert list(qs["flips_keep"]) == sorted(qs["flips_keep"], reverse=True)


def test_scope_restricts_queue_agreement_and_bootstrap(db_path: Path) -> None:
    from trace_lib.scope import Scope

    _two_labelers_store(db_path)
    with store.connect(db_path) as con:
        con.execute("INSERT INTO datasets (id, name, format, content_sha256) "
                    "VALUES ('d2', 'other', 'test', 'y')")
        con.execute("UPDATE trajectories SET dataset_id = 'd2' WHERE id IN "
                    "('f04', 'f05', 'f06', 'f07', 'p04', 'p05', 'p06', 'p07')")
        scope = Scope(datasets=("other",))
        q = ag.review_queue_con(con, limit=100, scope=scope)
        rep = ag.agreement_con(con, scope=scope)
        sr = ag.stable_ranking(con, st=ag.StabilityConfig(method="bootstrap", b=20),
                               scope=scope)
        with pytest.raises(ag.UserInputError, match="unknown dataset"):
            ag.review_queue_con(con, scope=Scope(datasets=("nope",)))
    assert not q.empty and set(q["trajectory_id"]) <= {
        "f04", "f05", "f06", "f07", "p04", "p05", "p06", "p07"}
    assert {r.capability: r for r in rep.fleiss}["tool_calling_precision"].n_trajectories == 8
    row = {r.capability: r for r in sr.ranking.rows}["tool_calling_precision"]
    assert all(f.lf + f.pf + f.nf == 4 and f.lp + f.pp + f.np == 4 for f in row.runs)
    assert "scope: dataset other" in (sr.ranking.note or "") or sr.ranking.scope == scope


def test_cli_verbs(db_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from trace_lib.cli import main

    _one_run_store(db_path)
    db = ["--db", str(db_path)]

    def run(argv: list[str]):
        assert main([*argv, *db]) == 0
        return json.loads(capsys.readouterr().out)

    rep = run(["agreement", "--json"])
    assert rep["runs"] == ["h"] and rep["fleiss"][0]["why"] == "needs at least two label runs"
    q = run(["review-queue", "--json", "--bootstrap", "50", "--order", "sensitivity"])
    assert q["stability"]["method"] == "bootstrap" and q["stability"]["b"] == 50
    assert q["queue"] and q["queue"][0]["capability"] == "precondition_verification"
    ranked = run(["rank", "--json", "--stability", "auto", "--bootstrap", "50"])
    assert "stability from 50 bootstrap resamples, not independent label runs" in (
        ranked[0]["note"])
    assert ranked[0]["runs"][0]["run"] == "boot-001"
    plain = run(["rank", "--json"])  # default: the label runs, as before
    assert plain[0]["runs"][0]["run"] == "h"
    assert main(["review-queue", "--bootstrap", "3", *db]) == 1  # a clear error, no traceback
    assert "expected 10..5000" in capsys.readouterr().err
