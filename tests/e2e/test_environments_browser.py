"""Real browser: a person inspects an environment, plays an instance by hand, validates
and approves it on the Environments page (streamlit run + headless Chromium)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from journey_helpers import choose_option  # noqa: E402


@pytest.mark.e2e
def test_inspect_play_validate_approve(streamlit_server, browser_page, wait_for_app,
                                       db_path: Path) -> None:
    from playwright.sync_api import expect

    from trace_lib.envs import is_approved

    name = "retail/structured_data_reasoning"
    server = streamlit_server(db_path)
    page = browser_page
    page.goto(server.url + "/Environments")
    wait_for_app(page)

    # choose the environment
    choose_option(page, page.get_by_test_id("stSelectbox").filter(has_text="Environment"),
                  name)
    wait_for_app(page)
    expect(page.get_by_text("capability structured_data_reasoning · domain retail")
           ).to_be_visible()

    # inspect: the instance and its ground truth
    page.get_by_role("tab", name="Instance").click()
    panel = page.get_by_role("tabpanel", name="Instance")
    expect(panel.get_by_text("Hi, my email is")).to_be_visible()
    panel.get_by_text("Show ground truth").click()
    wait_for_app(page)
    expect(page.get_by_role("tabpanel", name="Instance").get_by_text("reference_actions")
           ).to_be_visible()

    # play by hand: a tool call typed in, then the reference finishes the episode
    page.get_by_role("tab", name="Play").click()
    play = page.get_by_role("tabpanel", name="Play")
    box = play.get_by_label("Action (JSON)")
    box.fill('{"name": "list_all_product_types", "arguments": {}}')
    box.press("Control+Enter")
    wait_for_app(page)
    page.get_by_role("button", name="Send").click()
    wait_for_app(page)
    expect(page.get_by_role("tabpanel", name="Play").get_by_text(
        '[1] {"name": "list_all_product_types"')).to_be_visible()
    def step_line(k: int):  # the k-th step of the episode shown in the Play tab
        return page.get_by_role("tabpanel", name="Play").get_by_text(re.compile(rf"^\[{k}\] "))

    page.get_by_role("button", name="Restart").click()
    expect(step_line(1)).to_have_count(0, timeout=90_000)  # the episode starts over
    wait_for_app(page)
    # Each reference step is waited for by its own line (a click during a rerun that has
    # not started yet would otherwise be lost on a loaded machine), until the episode ends.
    reward = page.get_by_test_id("stMetric").filter(has_text="Reward")
    for k in range(1, 13):
        page.get_by_role("button", name="Reference step").click()
        expect(step_line(k)).to_have_count(1, timeout=90_000)
        wait_for_app(page)
        if reward.count():  # drawn in the same run as the step that ended the episode
            break
    expect(page.get_by_test_id("stMetric").filter(has_text="Reward")).to_contain_text("1.000",
                                                                              timeout=60_000)

    # validate, then approve
    page.get_by_role("tab", name="Validation").click()
    seeds = page.get_by_role("tabpanel", name="Validation").get_by_label("Seeds")
    seeds.fill("6")
    seeds.press("Enter")
    wait_for_app(page)
    page.get_by_role("tabpanel", name="Validation").get_by_role("button", name="Validate",
                                                                exact=True).click()
    wait_for_app(page)
    expect(page.get_by_test_id("stMetric").filter(has_text="Validation")
           ).to_contain_text("validated", timeout=180_000)  # 6 seeds x 3 policies, shared box
    page.get_by_role("tab", name="Review").click()
    page.get_by_role("tabpanel", name="Review").get_by_role("button", name="Approve").click()
    wait_for_app(page)
    assert is_approved(name, db=db_path)
