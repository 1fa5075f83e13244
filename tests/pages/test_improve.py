"""Improve page (the self-trace loop): AppTest on a real store and a real loop state.

The loop under the page is real: `loop.run_loop` on `tiny` with the smallest settings runs
until it stops for the person's approval; the page then shows its stages, approves the
environment and offers Resume. Starting a loop with a budget too small for one step is an
error on the page and writes nothing."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

from trace_lib.workbench import environments, loop

REPO = Path(__file__).resolve().parents[2]
PAGE = str(REPO / "pages" / "8_Improve.py")


def _page() -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=120)
    at.run()
    assert not at.exception, at.exception
    return at


def test_no_loop_yet_says_how_to_start_one(env):
    at = _page()
    assert any("No loop yet" in i.value for i in at.info)
    assert [b.label for b in at.button] == ["Start the loop"]


def test_a_budget_too_small_is_an_error_and_writes_nothing(env, tmp_path):
    at = _page()
    at.multiselect(key="loop_caps").set_value(["tool_calling_precision"])
    at.number_input(key="loop_budget").set_value(0.000001)
    at.button[0].click().run()
    assert not at.exception, at.exception
    assert any("too small for one training step" in e.value for e in at.error)
    assert not env.exists() and not (tmp_path / "runs" / "loops").exists()


def test_a_loop_waiting_for_approval_is_approved_here(env):
    cfg = loop.LoopConfig(
        model="tiny", capabilities=["tool_calling_precision"], dev_tasks=2, test_tasks=2,
        validate_seeds=10, eval={"tools": "capability", "max_turns": 1, "max_tokens": 8})
    state = loop.run_loop(env, cfg, say=lambda line: None)
    assert state["state"] == "awaiting approval"
    at = _page()
    assert at.selectbox(key="loop_pick").value == state["id"]
    stages = at.dataframe[1].value
    assert list(stages["stage"]) == list(loop.STAGES)
    assert list(stages["state"][:3]) == ["done"] * 3
    assert any("awaiting approval" in i.value for i in at.info)
    labels = [b.label for b in at.button]
    assert "Approve airline/tool_calling_precision" in labels
    assert "Resume the loop" in labels
    next(b for b in at.button if b.label.startswith("Approve")).click().run()
    assert not at.exception, at.exception
    assert environments.status_of("airline/tool_calling_precision", db=env) == "approved"
