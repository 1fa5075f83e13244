"""One real-browser journey: landing page -> Trajectories -> failures -> a hostile transcript.

Markup inside trajectory text must show as text and never run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SCRIPT = "<script>window.__xss=1</script>"
IMG = '<img src=x onerror="window.__xss=2">'
HOSTILE = {
    "id": "xss-1", "task_id": "xss-task", "domain": "airline", "agent_model": "evil-model",
    "reward": 0.0,
    "expected_actions": [{"name": "get_user_details", "arguments": {"user_id": SCRIPT}}],
    "messages": [
        {"role": "system", "content": "policy"},
        {"role": "user", "content": f"{SCRIPT} I need help {IMG}"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {
                "name": "get_user_details", "arguments": json.dumps({"user_id": IMG})}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "get_user_details",
         "content": f"Error: user {IMG} not found"},
        {"role": "assistant", "content": f"Sorry. {SCRIPT}"},
    ],
}


@pytest.mark.e2e
def test_hostile_transcript_is_shown_as_text(streamlit_server, browser_page, wait_for_app,
                                             db_path: Path, shared_data: Path,
                                             artifacts_dir: Path):
    from playwright.sync_api import expect

    from trace_lib import store
    from trace_lib.ingest import ingest_bytes, ingest_paths

    ingest_paths([str(shared_data / "tau-bench/historical_trajectories/gpt-4o-airline.json")],
                 db=db_path)
    ingest_bytes("hostile.jsonl", (json.dumps(HOSTILE) + "\n").encode(), db=db_path)
    with store.connect(db_path, read_only=True) as con:
        tid = con.execute("SELECT id FROM trajectories WHERE task_id = 'xss-task'").fetchone()[0]

    server = streamlit_server(db_path)
    page = browser_page
    page.goto(server.url)
    wait_for_app(page)
    page.get_by_role("link", name="Trajectories →", exact=True).click()
    page.wait_for_url("**/Trajectories")
    wait_for_app(page)

    sidebar = page.get_by_test_id("stSidebar")
    sidebar.get_by_test_id("stRadio").first.get_by_text("failures", exact=True).click()
    wait_for_app(page)
    # retried until the rerun lands: 116 tau-bench failures + the hostile one
    expect(page.get_by_test_id("stMetric").nth(2)).to_contain_text("117", timeout=60_000)

    picker = page.get_by_test_id("stSelectbox").filter(has_text="Trajectory").last
    picker.click()
    page.keyboard.type(tid)
    page.keyboard.press("Enter")
    wait_for_app(page)

    try:
        transcript = page.locator(".trace-transcript").first
        expect(transcript).to_contain_text("I need help", timeout=60_000)
        text = transcript.inner_text()
        assert SCRIPT in text and IMG in text  # shown, as typed
        assert transcript.locator("script, img").count() == 0
        alignment = page.locator(".trace-alignment").first
        # same rerun, may lag; the status in plain words
        expect(alignment).to_contain_text("right tool, other arguments", timeout=60_000)
        aligned = alignment.inner_text()
        assert SCRIPT in aligned and IMG in aligned
        assert page.locator(".trace-alignment script, .trace-alignment img").count() == 0
        assert page.evaluate("() => window.__xss") is None  # nothing ran
    finally:
        page.screenshot(path=str(artifacts_dir / "trajectories_xss.png"), full_page=True)
