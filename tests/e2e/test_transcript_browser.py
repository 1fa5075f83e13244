"""The transcript viewer in a real browser: folded system prompt, keyboard navigation,
search hits, any two trials compared (and a task run once saying so).

A real `streamlit run` and headless Chromium on tau-bench's airline file plus one hostile
single-trial trajectory. The test waits on what the page exposes: the transcript's
`data-trajectory` attribute, the expander's label, the marks' ids.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from trace_lib import store
from trace_lib.explore import queries

sys.path.insert(0, str(Path(__file__).parent))
from journey_helpers import choose_option  # noqa: E402

pytestmark = pytest.mark.e2e
SCRIPT = "<script>window.__xss=1</script>"
IMG = '<img src=x onerror="window.__xss=2">'
HOSTILE = {
    "id": "xss-1", "task_id": "xss-task", "domain": "airline", "agent_model": "evil-model",
    "reward": 0.0,
    "messages": [
        {"role": "system", "content": f"policy {SCRIPT}"},
        {"role": "user", "content": f"{SCRIPT} I need help {IMG}"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {
                "name": "get_user_details", "arguments": json.dumps({"user_id": IMG})}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "get_user_details",
         "content": json.dumps({"user": IMG, "reservations": list(range(20))})},
        {"role": "assistant", "content": f"Sorry. {SCRIPT}"},
    ],
}


@pytest.fixture
def viewer(streamlit_server, browser_page, wait_for_app, db_path: Path, shared_data: Path):
    from trace_lib.ingest import ingest_bytes, ingest_paths

    ingest_paths([str(shared_data / "tau-bench/historical_trajectories/gpt-4o-airline.json")],
                 db=db_path)
    ingest_bytes("hostile.jsonl", (json.dumps(HOSTILE) + "\n").encode(), db=db_path)
    server = streamlit_server(db_path)
    return server, browser_page, db_path


def _open(page, url: str, wait_for_app, query: str = "") -> None:
    page.goto(url + "/Trajectories" + query)
    wait_for_app(page)
    page.locator(".trace-transcript").first.wait_for(timeout=90_000)


def _shown(page, tid: str):
    """The viewer's own transcript (the first on the page) once it shows `tid`."""
    t = page.locator(f'.trace-transcript[data-trajectory="{tid}"]').first
    t.wait_for(timeout=90_000)
    return t


def test_system_prompt_folded_and_keys_move(viewer, wait_for_app, artifacts_dir: Path):
    from playwright.sync_api import expect

    server, page, db = viewer
    with store.connect(db, read_only=True) as con:
        listing = queries.list_trajectories(con, None, limit=500)
        tid = con.execute("SELECT m.trajectory_id FROM messages m JOIN trajectories t "
                          "ON t.id = m.trajectory_id WHERE m.role = 'system' AND "
                          "t.task_id <> 'xss-task' ORDER BY 1 LIMIT 1").fetchone()[0]
    ids, outcomes = listing.id.tolist(), listing.outcome.tolist()
    _open(page, server.url, wait_for_app, f"?trajectory={tid}")
    viewer_t = _shown(page, tid)
    prompt = viewer_t.locator("details.system-prompt")
    expect(prompt).to_have_count(1)
    expect(prompt).not_to_have_attribute("open", "")
    expect(prompt.locator("summary")).to_contain_text("system prompt")
    body = prompt.locator("div")
    expect(body).to_be_hidden()  # several screens of policy, folded
    first_user = viewer_t.locator(".msg.role-user").first
    expect(first_user).to_be_visible()
    prompt.locator("summary").click()
    expect(body).to_be_visible()
    page.screenshot(path=str(artifacts_dir / "transcript_viewer.png"), full_page=True)

    # J: the next trajectory in the list; K: back; N: the next failure
    pos = ids.index(tid)
    page.get_by_test_id("stMain").locator("h1").first.click()  # focus off any input
    page.keyboard.press("j")
    _shown(page, ids[pos + 1])
    page.keyboard.press("k")
    _shown(page, ids[pos])
    page.keyboard.press("n")
    _shown(page, next(i for k, i in enumerate(ids) if k > pos and outcomes[k] == "failure"))


def test_search_hits_marked_and_jumped_to(viewer, wait_for_app):
    from playwright.sync_api import expect

    server, page, _ = viewer
    _open(page, server.url, wait_for_app)
    sidebar = page.get_by_test_id("stSidebar")
    box = sidebar.get_by_role("textbox", name="Text contains")
    box.fill("reservation")
    box.press("Enter")
    wait_for_app(page)
    hit = page.locator(".trace-transcript").first.locator("mark.trace-hit").first
    hit.wait_for(timeout=90_000)
    expect(hit).to_have_attribute("id", "trace-hit-0")
    expect(hit).to_be_in_viewport(timeout=30_000)  # the page jumped to it
    assert hit.inner_text().lower() == "reservation"


def test_any_two_trials_and_a_task_run_once(viewer, wait_for_app, artifacts_dir: Path):
    from playwright.sync_api import expect

    server, page, db = viewer
    with store.connect(db, read_only=True) as con:
        failed_id = con.execute(
            "SELECT any_value(id) FILTER (WHERE NOT success) FROM trajectories "
            "GROUP BY dataset_id, task_id HAVING bool_or(success) AND count(*) FILTER "
            "(WHERE NOT success) >= 2 ORDER BY 1 LIMIT 1").fetchone()[0]
        trials = con.execute(
            "SELECT t.id, t.trial, t.success FROM trajectories t JOIN trajectories me "
            "ON me.id = ? AND t.task_id = me.task_id AND t.dataset_id = me.dataset_id "
            "ORDER BY t.trial, t.id", [failed_id]).fetchall()
        xss = con.execute("SELECT id FROM trajectories WHERE task_id = 'xss-task'"
                          ).fetchone()[0]
    other_failed = next(t for t in trials if t[0] != failed_id and not t[2])

    _open(page, server.url, wait_for_app, f"?trajectory={failed_id}")
    _shown(page, failed_id)
    page.get_by_text("Compare with another trial", exact=False).click()
    table = page.locator("table.trace-alignment").filter(has_text=f"({failed_id})")
    table.wait_for(timeout=90_000)
    expect(table).to_contain_text("passed trial")  # a contrasting trial first
    side = page.locator(".trace-side-by-side")
    expect(side.locator(".trace-transcript")).to_have_count(2)
    # the shared system prompt is shown once, above both columns
    expect(side.locator("details.system-prompt")).to_have_count(1)
    # choose another failed trial of the task
    box = page.get_by_test_id("stSelectbox").filter(
        has=page.get_by_text("Compare with", exact=True))
    expect(box).to_have_count(1)
    choose_option(page, box, f"trial {other_failed[1]} · failed · {other_failed[0]}")
    wait_for_app(page)
    page.locator("table.trace-alignment").filter(has_text=f"({other_failed[0]})").wait_for(
        timeout=90_000)
    expect(side.locator(f'.trace-transcript[data-trajectory="{other_failed[0]}"]')
           ).to_have_count(1)

    # a task run once: said in words, and any id can still be typed
    _open(page, server.url, wait_for_app, f"?trajectory={xss}")
    _shown(page, xss)
    page.get_by_text("this task has only this one trial", exact=False).click()
    expect(page.get_by_text("has only this one trial in hostile.jsonl", exact=False)
           ).to_be_visible()
    field = page.get_by_label("…or any trajectory id")
    field.fill(failed_id)
    field.press("Enter")
    wait_for_app(page)
    pair = page.locator(".trace-side-by-side")
    pair.locator(f'.trace-transcript[data-trajectory="{failed_id}"]').wait_for(timeout=90_000)
    expect(pair).to_contain_text(SCRIPT)
    assert page.locator(".trace-side-by-side script, .trace-side-by-side img").count() == 0
    assert page.evaluate("() => window.__xss") is None
    page.screenshot(path=str(artifacts_dir / "transcript_compare.png"), full_page=True)
