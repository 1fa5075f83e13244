"""Compare page (AppTest): two runs side by side, and an evaluation launched from the page.

Runs are real evaluations against the reference-policy HTTP server (known outcome per
task); the launched evaluation is a real background job rolling the tiny model out.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from trace_lib import jobs
from trace_lib.evaluate.tasks import load_task_set
from trace_lib.workbench import evaluation
from trace_lib.workbench import jobs as wb_jobs

sys.path.insert(0, str(Path(__file__).parents[1] / "evaluate"))
from reference_policy import ReferencePolicyServer, tasks_with_writes  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PAGE = str(REPO / "pages" / "7_Compare.py")


@pytest.fixture
def two_runs(env):
    ts = load_task_set("airline", 4)
    w = tasks_with_writes(ts)
    out = []
    for label, fail in (("policy-a", {w[0]}), ("policy-b <i>x</i>", {w[1]})):
        with ReferencePolicyServer(ts, fail) as srv:
            out.append(evaluation.evaluate(env, {
                "server_url": srv.url, "served_model": srv.model, "tasks": 4,
                "label": label}))
    return out, w


def test_empty_store_says_what_to_do(env):
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    assert not at.exception
    assert any("No database" in i.value for i in at.info)
    assert any("Comparing needs runs" in i.value for i in at.info)


def test_two_runs_side_by_side(env, two_runs):
    (a, b), w = two_runs
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    assert not at.exception
    # it opens on the pair: the newest run as B, the one before it (same tasks) as A
    assert at.selectbox(key="cmp_a").value == a["dataset_id"]
    assert at.selectbox(key="cmp_b").value == b["dataset_id"]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Pass rate A"] == "75.0%" and metrics["Pass rate B"] == "75.0%"
    # beside each pass rate, the floor the evaluation recorded: the same tasks, by doing
    # nothing (airline's first four tasks hold one refusal)
    assert a["floor"]["passes"] == 1
    assert metrics["Do-nothing floor A"] == metrics["Do-nothing floor B"] == "25.0%"
    assert any("1/4 tasks pass by doing nothing" in c.value for c in at.caption)
    assert any("3/4 passed" in c.value for c in at.caption)
    tasks = at.dataframe[0].value
    assert list(tasks.flipped[:2]) != ["", ""] and set(tasks.flipped[2:]) == {""}
    assert set(tasks.task_id[:2]) == {w[0], w[1]}
    idle = dict(zip(tasks.task_id, tasks["doing nothing"], strict=True))
    assert [t for t, v in idle.items() if v == "passes"] == a["floor"]["task_ids"]
    assert set(idle.values()) == {"passes", ""}
    # no labels on either side: a sentence instead of an empty chart
    assert any("neither run has labels" in i.value for i in at.info)
    assert not at.get("plotly_chart")
    # the selected task defaults to the first flipped one; the alignment is escaped HTML
    assert at.selectbox(key="cmp_task").value == tasks.task_id[0]
    html = " ".join(h.proto.body for h in at.get("html"))
    assert "trace-compare" in html and "expected actions" in html
    # plain words, and the two transcripts side by side with one shared system prompt
    assert "only A" not in html and "only B" not in html
    assert re.search(r"missed by B|extra in B|both made it", html)
    [side] = [h.proto.body for h in at.get("html") if "trace-side-by-side" in h.proto.body]
    pair = evaluation.task_pair(env, a["dataset_id"], b["dataset_id"], tasks.task_id[0])
    prompts = {evaluation.transcript_render.system_prompt(t) for t in (pair.a, pair.b)}
    assert side.count('class="trace-transcript"') == 2
    assert side.count("system-prompt") == (1 if len(prompts) == 1 else 2)
    assert len(prompts) == 1 and "the same in both" in side  # both runs: one policy
    assert "policy-b" not in html or "<i>x</i>" not in html
    assert any("exact McNemar" in m.value for m in at.markdown)


@pytest.fixture
def small_demo(env, tmp_path):
    """The demo generator's first 4 tasks x 3 scripted agents x 2 trials, imported."""
    from trace_lib.demo import build_demo

    build_demo(tmp_path / "demo", n=24, db=env)
    return evaluation.datasets(env)[0]["id"]


def test_the_demo_opens_on_two_of_its_agents(env, small_demo):
    """One dataset, three scripted agents: the page opens on careful vs hasty, with the
    floor the verifier gives on an empty episode, and the pickers narrow each side."""
    from trace_lib.evaluate.tasks import do_nothing_verdicts

    at = AppTest.from_file(PAGE, default_timeout=120).run()
    assert not at.exception and not at.error and not at.warning
    assert at.selectbox(key="cmp_a").value == at.selectbox(key="cmp_b").value == small_demo
    assert at.selectbox(key="cmp_a_agent").value == "scripted-careful"
    assert at.selectbox(key="cmp_b_agent").value == "scripted-hasty"
    assert at.selectbox(key="cmp_a_agent").options[1:] == [
        "scripted-careful", "scripted-hasty", "scripted-sloppy"]
    verdicts = do_nothing_verdicts(load_task_set("airline", 4))
    floor = f"{sum(verdicts.values()) / 4:.1%}"
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Do-nothing floor A"] == metrics["Do-nothing floor B"] == floor
    tasks = at.dataframe[0].value
    assert {t: v == "passes" for t, v in zip(tasks.task_id, tasks["doing nothing"],
                                             strict=True)} == verdicts
    # sloppy instead of hasty: another pair of the same dataset
    at.selectbox(key="cmp_b_agent").set_value("scripted-sloppy").run()
    assert not at.exception and not at.warning
    assert any("sloppy" in c.value for c in at.caption)  # escaped markdown: scripted\\-sloppy
    # the same agent on both sides is explained, not a red error
    at.selectbox(key="cmp_b_agent").set_value("scripted-careful").run()
    assert not at.exception and not at.error
    assert any("the same run" in w.value for w in at.warning)
    # the whole dataset against one agent of it
    at.selectbox(key="cmp_a_agent").set_value("").run()
    assert not at.exception and not at.warning
    assert {m.label: m.value for m in at.metric}["Pass rate A"].endswith("%")


def test_opens_on_an_empty_choice_when_no_two_runs_share_a_task(env, tmp_path):
    from trace_lib.workbench.data import import_files

    def rec(task_id):
        return json.dumps({"id": task_id, "task_id": task_id, "agent_model": "m",
                           "success": True, "messages": [
                               {"role": "user", "content": "hi"},
                               {"role": "assistant", "content": "ok"}]}) + "\n"

    for name, task in (("a.jsonl", "t1"), ("b.jsonl", "t2")):
        (tmp_path / name).write_text(rec(task))
    import_files([tmp_path / "a.jsonl", tmp_path / "b.jsonl"], db=env)
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    assert not at.exception and not at.error and not at.warning
    assert at.selectbox(key="cmp_a").value is None and at.selectbox(key="cmp_b").value is None
    assert any("No two runs here share a task" in i.value for i in at.info)
    # two runs chosen by hand that cannot pair: a sentence, not a traceback
    ids = [d["id"] for d in evaluation.datasets(env)]
    at.selectbox(key="cmp_a").set_value(ids[0])
    at.selectbox(key="cmp_b").set_value(ids[1]).run()
    assert not at.exception and not at.error
    assert any("no task id in common" in w.value for w in at.warning)


def _launch_smallest(at: AppTest) -> None:
    """One task, one turn of 8 tokens on tiny at 16k context, launched from the form."""
    at.number_input(key="eval_tasks").set_value(1)
    at.radio(key="eval_tools").set_value("capability")
    at.number_input(key="eval_turns").set_value(1)
    at.number_input(key="eval_max_tokens").set_value(8)
    at.number_input(key="eval_ctx").set_value(16384)
    at.button(key="eval_launch").click().run()


def test_launch_an_evaluation_and_see_it_as_a_dataset(env, two_runs):
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    _launch_smallest(at)
    assert not at.exception
    job_id = at.session_state["eval_job"]
    assert jobs.wait(job_id, timeout_s=600).state == "succeeded"
    at.run()
    assert not at.exception
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Latest evaluation"] == "succeeded"
    names = [d["name"] for d in evaluation.datasets(env)]
    assert len(names) == 3 and any(n.startswith("tiny__airline__") for n in names)


def test_launch_the_per_request_composition_from_the_page(env, tmp_path):
    """The router kind: an empty folder says what to give; a real export is evaluated as a
    background job (the local server loads its adapters) and lands as a dataset."""
    from routed_export import make_routed_export

    export = make_routed_export(tmp_path)
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    at.radio(key="eval_kind").set_value("composed, per request (as vLLM serves it)").run()
    assert any("moe-merge --per-request --out" in i.value for i in at.info)
    assert "eval_launch" not in [b.key for b in at.button]  # nothing to launch yet
    at.text_input(key="eval_router").set_value(str(export)).run()
    _launch_smallest(at)
    assert not at.exception
    assert jobs.wait(at.session_state["eval_job"], timeout_s=600).state == "succeeded"
    wb_jobs.sync(env)
    names = [d["name"] for d in evaluation.datasets(env)]
    assert any(n.startswith("tiny+router-export__airline__") for n in names), names
