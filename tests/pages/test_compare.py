"""Compare page (AppTest): two runs side by side, and an evaluation launched from the page.

Runs are real evaluations against the reference-policy HTTP server (known outcome per
task); the launched evaluation is a real background job rolling the tiny model out.
"""

from __future__ import annotations

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
def env(tmp_path, monkeypatch) -> Path:
    db = tmp_path / "trace.duckdb"
    monkeypatch.setenv("TRACE_DB", str(db))
    monkeypatch.setenv(jobs.RUNS_ENV, str(tmp_path / "runs"))
    return db


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
    assert any("two datasets" in i.value for i in at.info)


def test_two_runs_side_by_side(env, two_runs):
    (a, b), w = two_runs
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    assert not at.exception
    at.selectbox(key="cmp_a").set_value(a["dataset_id"])
    at.selectbox(key="cmp_b").set_value(b["dataset_id"]).run()
    assert not at.exception
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Pass rate A"] == "75.0%" and metrics["Pass rate B"] == "75.0%"
    assert any("3/4 passed" in c.value for c in at.caption)
    tasks = at.dataframe[0].value
    assert list(tasks.flipped[:2]) != ["", ""] and set(tasks.flipped[2:]) == {""}
    assert set(tasks.task_id[:2]) == {w[0], w[1]}
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
