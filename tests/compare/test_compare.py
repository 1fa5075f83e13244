"""Compare two runs: statistics, pairing by task, capability deltas, errors, across formats."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trace_lib import compare as cmp
from trace_lib.errors import UserInputError
from trace_lib.evaluate.tasks import load_task_set
from trace_lib.workbench import evaluation

sys.path.insert(0, str(Path(__file__).parents[1] / "evaluate"))
from reference_policy import (  # noqa: E402
    ReferencePolicyServer,
    tasks_with_writes,
    tau2_results_file,
)

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------ statistics


def test_wilson_matches_published_values():
    lo, hi = cmp.wilson(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)
    lo, hi = cmp.wilson(5, 10)
    assert (lo, hi) == (pytest.approx(0.2366, abs=1e-4), pytest.approx(0.7634, abs=1e-4))
    assert cmp.wilson(0, 0) == (None, None)


def test_exact_mcnemar():
    assert cmp.mcnemar_exact(0, 0) == 1.0
    assert cmp.mcnemar_exact(0, 5) == pytest.approx(2 / 32)
    assert cmp.mcnemar_exact(1, 9) == pytest.approx(2 * 11 / 1024)
    assert cmp.mcnemar_exact(9, 1) == cmp.mcnemar_exact(1, 9)
    assert cmp.mcnemar_exact(3, 3) == 1.0


def test_newcombe_difference_matches_newcombe_1998():
    # Newcombe (1998), example (a): 56/70 vs 48/80, difference 0.2000, 95% CI 0.0524-0.3339
    lo, hi = cmp.newcombe_diff(48, 80, 56, 70)
    assert lo == pytest.approx(0.0524, abs=1e-4) and hi == pytest.approx(0.3339, abs=1e-4)


# ----------------------------------------------------------------------------- runs


@pytest.fixture(autouse=True)
def _runs_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACE_RUNS_DIR", str(tmp_path / "runs"))


@pytest.fixture(scope="module")
def task_set():
    return load_task_set("airline", 6)


def _run(db, ts, fail, label):
    with ReferencePolicyServer(ts, fail) as srv:
        return evaluation.evaluate(db, {"server_url": srv.url, "served_model": srv.model,
                                        "tasks": len(ts.tasks), "label": label,
                                        "concurrency": 3})


@pytest.fixture
def two_runs(db_path, task_set):
    w = tasks_with_writes(task_set)
    a = _run(db_path, task_set, {w[0], w[1]}, "policy-a")
    b = _run(db_path, task_set, {w[1], w[2]}, "policy-b")
    return a, b, w


def test_pass_rates_pairing_and_flipped_tasks_first(db_path, two_runs):
    a, b, w = two_runs
    out = evaluation.compare(db_path, a["dataset"], b["dataset_id"])
    assert out["a"]["n"] == 6 and out["a"]["successes"] == 4
    assert out["b"]["successes"] == 4 and out["b"]["pass_rate"] == pytest.approx(4 / 6)
    assert out["a"]["ci95"] == [pytest.approx(x) for x in cmp.wilson(4, 6)]
    p = out["paired"]
    assert (p["tasks"], p["a_only"], p["b_only"], p["both"], p["neither"]) == (6, 1, 1, 3, 1)
    assert p["p_value"] == 1.0 and "half" in p["rule"]
    flips = [(t["task_id"], t["flip"]) for t in out["tasks"][:2]]
    assert sorted(flips) == sorted([(w[2], "a_only"), (w[0], "b_only")])
    assert all(t["flip"] is None for t in out["tasks"][2:])
    assert out["capabilities"] == []
    assert any("no effective labels" in n for n in out["notes"])
    assert out["a"]["provenance"]["policy"] == "policy-a"
    assert "policy-a" in cmp.provenance_line(out["a"])


def test_capability_deltas_from_effective_labels(db_path, two_runs):
    from trace_lib import store
    from trace_lib.diagnose.labels import edit_labels

    a, b, _ = two_runs
    with store.connect(db_path, read_only=True) as con:
        ids = {k: [r[0] for r in con.execute(
            "SELECT id FROM trajectories WHERE dataset_id = ? ORDER BY task_id",
            [d["dataset_id"]]).fetchall()] for k, d in (("a", a), ("b", b))}
    cap = "precondition_verification"
    # A: 4 of 6 lacking; B: 1 of 5 lacking (one na, left out)
    edits = [(t, cap, "lacking" if i < 4 else "present") for i, t in enumerate(ids["a"])]
    edits += [(t, cap, "lacking" if i == 0 else ("na" if i == 5 else "present"))
              for i, t in enumerate(ids["b"])]
    edit_labels(db_path, edits, editor="test")
    out = evaluation.compare(db_path, a["dataset_id"], b["dataset_id"])
    (row,) = [c for c in out["capabilities"] if c["capability"] == cap]
    assert row["a_lacking_rate"] == pytest.approx(4 / 6)
    assert row["b_lacking_rate"] == pytest.approx(1 / 5)
    assert row["delta"] == pytest.approx(1 / 5 - 4 / 6)
    assert row["ci95"] == [pytest.approx(x) for x in cmp.newcombe_diff(4, 6, 1, 5)]
    assert row["ci95"][0] < row["delta"] < row["ci95"][1]


def _jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _rec(task_id, trial, success, agent="hand"):
    return {"id": f"{agent}-{task_id}-{trial}", "task_id": task_id, "trial": trial,
            "agent_model": agent, "domain": "airline", "success": success,
            "messages": [{"role": "user", "content": "hi"},
                         {"role": "assistant", "content": "ok"}]}


def test_majority_over_trials_with_ties_not_passed(db_path, tmp_path):
    from trace_lib.workbench.data import import_files

    a = [_rec("t1", 0, True), _rec("t1", 1, True), _rec("t1", 2, False),  # 2/3: passed
         _rec("t2", 0, True), _rec("t2", 1, False)]  # 1/2 tie: not passed
    b = [_rec("t1", 0, False, "other"), _rec("t2", 0, True, "other")]
    import_files([_jsonl(tmp_path / "a.jsonl", a), _jsonl(tmp_path / "b.jsonl", b)], db=db_path)
    out = evaluation.compare(db_path, "a.jsonl", "b.jsonl")
    by = {t["task_id"]: t for t in out["tasks"]}
    assert by["t1"]["a_passed"] and by["t1"]["a_successes"] == 2 and by["t1"]["a_trials"] == 3
    assert not by["t2"]["a_passed"] and by["t2"]["b_passed"]
    assert out["paired"]["a_only"] == 1 and out["paired"]["b_only"] == 1
    assert out["a"]["n"] == 5 and out["a"]["successes"] == 3  # per trajectory, every trial


def test_bad_input_is_a_clear_error(db_path, tmp_path, two_runs):
    from trace_lib.workbench.data import import_files

    a, _, _ = two_runs
    with pytest.raises(UserInputError, match="the same dataset"):
        evaluation.compare(db_path, a["dataset"], a["dataset_id"])
    with pytest.raises(UserInputError, match="no dataset with this id or name"):
        evaluation.compare(db_path, a["dataset"], "nope.jsonl")
    import_files([_jsonl(tmp_path / "other.jsonl", [_rec("x1", 0, True)])], db=db_path)
    with pytest.raises(UserInputError, match="no task id in common"):
        evaluation.compare(db_path, a["dataset"], "other.jsonl")


def test_tau2_import_against_an_evaluation_made_here(db_path, tmp_path, task_set):
    from trace_lib.workbench.data import import_files

    w = tasks_with_writes(task_set)
    ours = _run(db_path, task_set, {w[0]}, "ours")
    theirs = set(t.task_id for t in task_set.tasks) - {w[1]}
    report = import_files([tau2_results_file(tmp_path / "tau2_run.json", task_set, theirs)],
                          db=db_path)
    assert list(report.formats.values()) == ["tau2"]
    out = evaluation.compare(db_path, "tau2_run.json", ours["dataset"])
    assert out["a"]["format"] == "tau2" and out["b"]["format"] == "openai_jsonl"
    assert out["paired"]["tasks"] == 6
    assert out["paired"]["a_only"] == 1 and out["paired"]["b_only"] == 1
    pair = evaluation.task_pair(db_path, "tau2_run.json", ours["dataset"], w[1])
    assert pair.expected and len(pair.rows) >= len(pair.expected)
    html = cmp.render_pair_html(pair, "tau2 <run>", "ours")
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "tau2 &lt;run&gt;" in html and "✓ expected" in html and "✗ not expected" in html


def _cli(*args, db):
    return subprocess.run([sys.executable, "-m", "trace_lib", *args, "--db", str(db)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


def test_cli_compare_json_shape_and_errors(db_path, two_runs):
    a, b, _ = two_runs
    proc = _cli("compare", a["dataset"], b["dataset"], "--json", db=db_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert set(out) >= {"a", "b", "paired", "capabilities", "tasks"}
    assert set(out["a"]) >= {"dataset", "n", "successes", "pass_rate", "ci95"}
    assert set(out["paired"]) >= {"tasks", "a_only", "b_only", "both", "neither", "p_value"}
    text = _cli("compare", a["dataset"], b["dataset"], db=db_path)
    assert "flipped" in text.stdout and "McNemar" in text.stdout
    for args, message in (((a["dataset"], a["dataset"]), "same dataset"),
                          ((a["dataset"], "missing"), "no dataset with this id or name")):
        proc = _cli("compare", *args, db=db_path)
        assert proc.returncode == 1 and message in proc.stderr
        assert "Traceback" not in proc.stderr


# ------------------------------------------------------------- sides: agent models


@pytest.fixture
def small_demo(db_path, tmp_path):
    """The demo generator's first 4 tasks x 3 scripted agents x 2 trials, imported."""
    from trace_lib.demo import build_demo

    build_demo(tmp_path / "demo", n=24, db=db_path)
    return "airline_demo.jsonl"


def test_agent_models_of_one_dataset_are_two_sides(db_path, small_demo):
    out = evaluation.compare(db_path, f"{small_demo}@scripted-careful",
                             evaluation.Side(small_demo, "scripted-sloppy"))
    assert out["a"]["agent_model"] == "scripted-careful"
    assert out["b"]["label"] == f"{small_demo} @ scripted-sloppy"
    assert out["a"]["n"] == out["b"]["n"] == 8  # 4 tasks x 2 trials, one agent each
    assert out["paired"]["tasks"] == 4
    assert "scripted-careful" in cmp.provenance_line(out["a"])
    # the one-task view reads only each side's agent
    pair = evaluation.task_pair(db_path, f"{small_demo}@scripted-careful",
                                f"{small_demo}@scripted-sloppy", out["tasks"][0]["task_id"])
    assert pair.a.trajectory["agent_model"] == "scripted-careful"
    assert pair.b.trajectory["agent_model"] == "scripted-sloppy"
    # the whole dataset against one of its agents is two different runs too
    whole = evaluation.compare(db_path, small_demo, f"{small_demo}@scripted-hasty")
    assert whole["a"]["n"] == 24 and whole["a"]["agent_model"] is None


def test_an_unknown_agent_model_lists_the_ones_present(db_path, small_demo):
    with pytest.raises(UserInputError) as err:
        evaluation.compare(db_path, f"{small_demo}@scripted-careful",
                           f"{small_demo}@gpt-5")
    text = str(err.value)
    assert "no trajectories of agent model 'gpt-5'" in text
    for agent in ("scripted-careful (8 trajectories)", "scripted-hasty", "scripted-sloppy"):
        assert agent in text
    with pytest.raises(UserInputError, match="same run"):
        evaluation.compare(db_path, f"{small_demo}@scripted-careful",
                           evaluation.Side(small_demo, "scripted-careful"))
    with pytest.raises(UserInputError, match="no dataset with this id or name"):
        evaluation.compare(db_path, "nope.jsonl@scripted-careful", small_demo)


def test_a_dataset_name_with_an_at_sign(db_path, tmp_path):
    from trace_lib.workbench.data import import_files

    import_files([_jsonl(tmp_path / "run@v2.jsonl", [_rec("t1", 0, True, "m@1"),
                                                     _rec("t1", 1, False, "m2")]),
                  _jsonl(tmp_path / "b.jsonl", [_rec("t1", 0, True)])], db=db_path)
    whole = evaluation.compare(db_path, "run@v2.jsonl", "b.jsonl")
    assert whole["a"]["dataset"] == "run@v2.jsonl" and whole["a"]["n"] == 2
    one = evaluation.compare(db_path, "run@v2.jsonl@m@1", "b.jsonl")
    assert one["a"]["agent_model"] == "m@1" and one["a"]["n"] == 1


# ------------------------------------------------------------------ do-nothing floor


def test_the_floor_runs_the_verifier_on_an_empty_episode(db_path, small_demo, monkeypatch):
    """The demo records carry no verdict: compare runs each task's verifier on an empty
    episode (counted here), and it agrees with the task set's own do-nothing verdicts."""
    from trace_lib.evaluate import floor, tasks

    monkeypatch.setattr(floor, "_MEMO", {})
    ran: list[str] = []
    real = tasks.passes_by_doing_nothing

    def counted(ts, task):
        ran.append(task.task_id)
        return real(ts, task)

    monkeypatch.setattr(tasks, "passes_by_doing_nothing", counted)
    out = evaluation.compare(db_path, f"{small_demo}@scripted-careful",
                             f"{small_demo}@scripted-hasty")
    expected = tasks.do_nothing_verdicts(load_task_set("airline", 4))
    assert sorted(ran[:4]) == sorted(expected)  # once per task, then memoised
    passing = sorted(t for t, ok in expected.items() if ok)
    assert passing, "the first demo tasks include a refusal"
    for key in ("a", "b"):
        fl = out["floor"][key]
        assert fl["status"] == "known" and fl["tasks"] == 4 and fl["unknown_tasks"] == 0
        assert fl["task_ids"] == passing and fl["pass_rate"] == len(passing) / 4
    assert out["floor"]["paired"]["passes"] == len(passing)
    assert {t["task_id"]: t["passes_by_doing_nothing"] for t in out["tasks"]} == expected
    assert "verifier" in out["floor"]["rule"]


def test_evaluations_use_their_recorded_verdicts(db_path, two_runs, monkeypatch):
    from trace_lib.evaluate import floor, tasks

    a, b, _ = two_runs
    monkeypatch.setattr(floor, "_MEMO", {})

    def never(*_):
        raise AssertionError("recorded verdicts are not recomputed")

    monkeypatch.setattr(tasks, "passes_by_doing_nothing", never)
    out = evaluation.compare(db_path, a["dataset"], b["dataset"])
    assert out["floor"]["a"]["status"] == "known"
    assert out["floor"]["a"]["passes"] == a["floor"]["passes"]
    assert out["floor"]["a"]["task_ids"] == a["floor"]["task_ids"]


def test_imported_logs_have_an_unknown_floor(db_path, tmp_path, task_set):
    """A tau2 run of the very same tasks was scored by tau2's evaluator, not here: its
    floor is unknown (and says why); the evaluation made here is known."""
    from trace_lib.workbench.data import import_files

    ours = _run(db_path, task_set, set(), "ours")
    import_files([tau2_results_file(tmp_path / "tau2_run.json", task_set,
                                    {t.task_id for t in task_set.tasks})], db=db_path)
    out = evaluation.compare(db_path, "tau2_run.json", ours["dataset"])
    fa, fb = out["floor"]["a"], out["floor"]["b"]
    assert fa["status"] == "unknown" and fa["pass_rate"] is None and fa["passes"] == 0
    assert "not scored by the workbench" in fa["why_unknown"]
    assert fb["status"] == "known" and fb["passes"] == ours["floor"]["passes"]
    assert any("floor of A" in n and "unknown" in n for n in out["notes"])
    # the task rows take the verdict from the side that has one
    assert all(t["passes_by_doing_nothing"] is not None for t in out["tasks"])


def test_capability_note_says_why_there_is_no_chart(db_path, two_runs):
    a, b, _ = two_runs
    out = evaluation.compare(db_path, a["dataset"], b["dataset"])
    assert out["capabilities"] == [] and "neither run has labels" in out["capability_note"]


# ------------------------------------------------------------------ where a page opens


def test_default_sides_pair_runs_that_share_tasks(db_path, tmp_path, small_demo):
    from trace_lib.workbench.data import import_files

    demo_id = evaluation.datasets(db_path)[0]["id"]
    # the demo alone: two of its agent models
    assert evaluation.compare_choices(db_path)["default"] == (
        evaluation.Side(demo_id, "scripted-careful"), evaluation.Side(demo_id, "scripted-hasty"))
    # a newer run on other tasks changes nothing; one on the demo's tasks pairs with it
    import_files([_jsonl(tmp_path / "other.jsonl", [_rec("x1", 0, True)])], db=db_path)
    assert evaluation.compare_choices(db_path)["default"][0].dataset == demo_id
    import_files([_jsonl(tmp_path / "same.jsonl", [_rec("airline_0_001", 0, True)])],
                 db=db_path)
    by_name = {d["name"]: d["id"] for d in evaluation.datasets(db_path)}
    assert evaluation.compare_choices(db_path)["default"] == (
        evaluation.Side(demo_id), evaluation.Side(by_name["same.jsonl"]))


def test_no_default_when_no_two_sides_share_a_task(db_path, tmp_path):
    from trace_lib.workbench.data import import_files

    assert evaluation.compare_choices(db_path) == {"datasets": [], "default": None}
    import_files([_jsonl(tmp_path / "a.jsonl", [_rec("t1", 0, True)]),
                  _jsonl(tmp_path / "b.jsonl", [_rec("t2", 0, True)])], db=db_path)
    choices = evaluation.compare_choices(db_path)
    assert len(choices["datasets"]) == 2 and choices["default"] is None


def test_cli_compare_by_agent_prints_the_floor(db_path, small_demo):
    proc = _cli("compare", f"{small_demo}@scripted-careful", f"{small_demo}@scripted-hasty",
                "--json", db=db_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert set(out["floor"]) == {"a", "b", "paired", "rule"}
    assert out["floor"]["a"]["status"] == "known"
    text = _cli("compare", f"{small_demo}@scripted-careful", f"{small_demo}@scripted-hasty",
                db=db_path).stdout
    assert "@ scripted-careful" in text and "do-nothing floor" in text
    bad = _cli("compare", f"{small_demo}@scripted-careful", f"{small_demo}@nobody",
               db=db_path)
    assert bad.returncode == 1 and "agent models in it: scripted-careful" in bad.stderr
    assert "Traceback" not in bad.stderr
