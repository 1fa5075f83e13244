"""Text search in a real browser: the index's hits listed, marked in the transcript, and
trajectory markup around a hit shown as text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SCRIPT = "<script>window.__xss=1</script>"
HOSTILE = {
    "id": "search-1", "task_id": "search-task", "domain": "airline", "agent_model": "m",
    "reward": 0.0,
    "messages": [
        {"role": "user", "content": f"{SCRIPT} please refund zebra-7731 today"},
        {"role": "assistant", "content": "Sorry, <b>zebra</b> is unknown."},
    ],
}


@pytest.mark.e2e
def test_text_search_marks_hits_and_escapes(streamlit_server, browser_page, wait_for_app,
                                            db_path: Path, shared_data: Path,
                                            artifacts_dir: Path):
    from playwright.sync_api import expect

    from trace_lib.ingest import ingest_bytes, ingest_paths

    ingest_paths([str(shared_data / "tau-bench/historical_trajectories/gpt-4o-airline.json")],
                 db=db_path)
    ingest_bytes("hostile.jsonl", (json.dumps(HOSTILE) + "\n").encode(), db=db_path)
    server = streamlit_server(db_path)
    page = browser_page
    page.goto(server.url + "/Trajectories")
    wait_for_app(page)
    sidebar = page.get_by_test_id("stSidebar")
    box = sidebar.get_by_role("textbox", name="Text contains")
    trajectories = page.get_by_test_id("stMetric").nth(0).get_by_test_id("stMetricValue")
    try:
        box.fill("ZEBRA")
        box.press("Enter")
        wait_for_app(page)
        expect(trajectories).to_have_text("1", timeout=120_000)
        transcript = page.locator(".trace-transcript").first
        marks = transcript.locator("mark.trace-hit")
        expect(marks.first).to_have_text("zebra", ignore_case=True, timeout=120_000)
        assert marks.count() >= 2  # in both messages
        text = transcript.inner_text()
        assert SCRIPT in text and "<b>zebra</b>" in text  # shown as typed, around hits
        assert transcript.locator("script, b").count() == 0
        assert page.evaluate("() => window.__xss") is None

        # a fragment inside a word: nothing by words, found as an exact substring
        box.fill("ebra-77")
        box.press("Enter")
        wait_for_app(page)
        expect(page.get_by_text("No trajectories match the filter.")).to_be_visible(
            timeout=120_000)
        sidebar.get_by_test_id("stCheckbox").filter(has_text="Exact substring").locator(
            "label").click()
        wait_for_app(page)
        expect(page.get_by_text("No trajectories match the filter.")).to_have_count(
            0, timeout=120_000)
        expect(trajectories).to_have_text("1", timeout=120_000)
        expect(page.locator(".trace-transcript").first).to_contain_text("zebra-7731")
    finally:
        page.screenshot(path=str(artifacts_dir / "trajectories_search.png"), full_page=True)
