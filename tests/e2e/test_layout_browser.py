"""Layout, measured in a real headless Chromium (issue 34): element boxes, not screenshots.

- Expected-vs-actual: a tool name wraps only between its parts ("get_reservation_" /
  "details"), never inside one (was "get_reservation_de" / "tails").
- Environments' Play tab: a tool's result stays inside the page (was one line running
  off it), wrapped, indented when it is JSON.
- The Routing legend: each chip is one box on one line (a chip broken over two lines read
  as two), none wider than the sidebar.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from journey_helpers import choose_option, goto  # noqa: E402

pytestmark = pytest.mark.e2e
AIRLINE = "tau-bench/historical_trajectories/gpt-4o-airline.json"

# For each tool name in the alignment table: its text and, for every line after the first,
# the characters either side of the line break (read from per-character boxes).
NAME_BREAKS_JS = """table => [...table.querySelectorAll('code.tool-name')].map(code => {
  const chars = [];
  const walk = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
  for (let node = walk.nextNode(); node; node = walk.nextNode()) {
    for (let i = 0; i < node.length; i++) {
      const r = document.createRange();
      r.setStart(node, i); r.setEnd(node, i + 1);
      const box = r.getClientRects()[0];
      if (box) chars.push([node.data[i], box.top]);
    }
  }
  const breaks = [];
  for (let i = 1; i < chars.length; i++) {
    if (chars[i][1] > chars[i - 1][1] + 2) breaks.push(chars[i - 1][0] + chars[i][0]);
  }
  return [code.textContent, breaks, code.scrollWidth - code.clientWidth];
})"""


@pytest.fixture
def airline_db(db_path: Path, shared_data: Path) -> Path:
    from trace_lib.ingest import ingest_paths

    ingest_paths([str(shared_data / AIRLINE)], db=db_path)
    return db_path


def test_expected_action_names_wrap_between_their_parts(streamlit_server, browser,
                                                        wait_for_app, airline_db: Path,
                                                        artifacts_dir: Path) -> None:
    from playwright.sync_api import expect

    from trace_lib import store

    with store.connect(airline_db, read_only=True) as con:  # long names, many calls
        tid = con.execute(
            "SELECT t.id FROM trajectories t JOIN expected_actions e ON e.task_id = t.task_id "
            "AND e.dataset_id = t.dataset_id WHERE e.name LIKE '%\\_%\\_%' ESCAPE '\\' "
            "GROUP BY t.id ORDER BY count(*) DESC, t.id LIMIT 1").fetchone()[0]
    server = streamlit_server(airline_db)
    ctx = browser.new_context(viewport={"width": 1100, "height": 1000})
    page = ctx.new_page()
    page.set_default_timeout(60_000)
    try:
        goto(page, f"{server.url}/Trajectories?trajectory={tid}", wait_for_app)
        table = page.locator("table.trace-alignment").first
        expect(table.locator("code.tool-name").first).to_be_visible(timeout=90_000)
        names = table.evaluate(NAME_BREAKS_JS)
        table.screenshot(path=str(artifacts_dir / "alignment_names.png"))
    finally:
        ctx.close()
    wrapped = [(text, breaks) for text, breaks, _ in names if breaks]
    assert wrapped, f"no name wrapped at this width: {names[:5]}"
    for text, breaks in wrapped:  # every line break falls after a joint of the name
        assert all(pair[0] in "_." for pair in breaks), (text, breaks)
    assert all(overflow <= 1 for _, _, overflow in names), names


def test_environment_tool_results_stay_inside_the_page(streamlit_server, browser_page,
                                                       wait_for_app, db_path: Path,
                                                       artifacts_dir: Path) -> None:
    from playwright.sync_api import expect

    server = streamlit_server(db_path)
    page = browser_page
    goto(page, server.url + "/Environments", wait_for_app)
    choose_option(page, page.get_by_test_id("stSelectbox").filter(has_text="Environment"),
                  "retail/structured_data_reasoning")
    wait_for_app(page)
    page.get_by_role("tab", name="Play").click()
    play = page.get_by_role("tabpanel", name="Play")
    for k in (1, 2):  # the reference policy's first look-ups return long JSON
        play.get_by_role("button", name="Reference step").click()
        wait_for_app(page)
        expect(play.get_by_text(f"[{k}] {{")).to_be_visible()
    blocks = play.get_by_test_id("stCode")
    expect(blocks.nth(1)).to_be_visible()
    page.wait_for_timeout(300)
    geo = play.evaluate("""panel => {
        const main = document.querySelector('[data-testid="stMain"]').getBoundingClientRect();
        return [...panel.querySelectorAll('[data-testid="stCode"]')].map(b => {
            const pre = b.querySelector('pre'), r = b.getBoundingClientRect();
            return {text: pre.textContent.slice(0, 40), right: r.right, mainRight: main.right,
                    hidden: pre.scrollWidth - pre.clientWidth, lines: pre.textContent.split('\\n').length};
        });
    }""")
    play.screenshot(path=str(artifacts_dir / "environments_play_results.png"))
    assert len(geo) >= 2
    for g in geo:
        assert g["right"] <= g["mainRight"] + 1 and g["hidden"] <= 1, g
    assert any(g["lines"] > 1 and g["text"].lstrip().startswith(("{", "[")) for g in geo), geo


def test_routing_legend_chips_do_not_break(streamlit_server, browser_page, wait_for_app,
                                           db_path: Path, artifacts_dir: Path) -> None:
    from playwright.sync_api import expect

    server = streamlit_server(db_path, app="tests/e2e/routing_legend_app.py")
    page = browser_page
    page.goto(server.url)
    wait_for_app(page)
    legend = page.locator(".trace-legend").first
    expect(legend).to_contain_text("1: precondition_verification")
    chips = legend.evaluate("""l => {
        const box = l.getBoundingClientRect();
        return [...l.querySelectorAll('.trace-chip')].map(c => ({
            text: c.textContent, boxes: c.getClientRects().length,
            inside: c.getBoundingClientRect().right <= box.right + 1,
            cut: c.scrollWidth > c.clientWidth + 1, title: c.title}));
    }""")
    legend.screenshot(path=str(artifacts_dir / "routing_legend.png"))
    assert len(chips) == 6
    for chip in chips:
        assert chip["boxes"] == 1 and chip["inside"], chip
        assert chip["title"] == chip["text"]  # the full name on hover, cut or not
    assert chips[-1]["cut"] and not any(c["cut"] for c in chips[:-1]), chips
