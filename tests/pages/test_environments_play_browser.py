"""Environment play in a real browser: a failed episode's reward shows "failed" in red with
no arrow (it used to show a green "↑ not passed")."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.e2e
def test_failed_episode_has_no_green_arrow(streamlit_server, browser_page, wait_for_app,
                                           db_path: Path) -> None:
    from playwright.sync_api import expect

    page = browser_page
    page.goto(streamlit_server(db_path).url + "/Environments")
    expect(page.get_by_role("heading", name="Environments")).to_be_visible(timeout=120_000)
    wait_for_app(page)
    page.get_by_role("tab", name="Play").click()
    play = page.get_by_role("tabpanel", name="Play")
    box = play.get_by_label("Action (JSON)")
    box.fill('{"content": "I cannot help with that."}')  # ends the episode, unsolved
    box.press("Control+Enter")
    wait_for_app(page)
    play.get_by_role("button", name="Send").click()
    reward = page.get_by_test_id("stMetric").filter(has_text="Reward")
    expect(reward).to_contain_text("failed", timeout=60_000)
    expect(reward.get_by_test_id("stMetricDelta")).to_be_visible()
    # No arrow icon at all, and the word is not green.
    expect(reward.locator('[data-testid^="stMetricDeltaIcon"]')).to_have_count(0)
    color = reward.get_by_test_id("stMetricDelta").evaluate("e => getComputedStyle(e).color")
    r, g, _b = (int(x) for x in color[color.index("(") + 1:color.index(")")].split(",")[:3])
    assert r > g, color  # red, not green
