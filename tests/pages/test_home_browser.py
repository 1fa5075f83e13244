"""Home in a real browser (streamlit run + headless Chromium): the sidebar starts with
"Home", link texts are whole, the counts agree with the Environments page, it says what to
do next, and a dataset can be deleted after a confirmation."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from trace_lib import store
from trace_lib.workbench import data, environments


def _import(tmp_path: Path, db: Path, tag: str, n: int) -> None:
    path = tmp_path / f"{tag}.jsonl"
    path.write_text("".join(json.dumps({
        "id": f"{tag}{i}", "task_id": f"t{i}", "trial": 0, "agent_model": tag, "reward": 0.0,
        "messages": [{"role": "user", "content": f"hello {tag} {i}"},
                     {"role": "assistant", "content": "done"}]}) + "\n" for i in range(n)))
    data.import_files([path], db=db)


@pytest.mark.e2e
def test_home_navigation_counts_next_step(streamlit_server, browser_page, wait_for_app,
                                          tmp_path: Path, db_path: Path) -> None:
    from playwright.sync_api import expect

    _import(tmp_path, db_path, "mine", 3)
    page = browser_page
    page.goto(streamlit_server(db_path).url)
    # The first run imports everything: wait for the page's own heading, then for idle.
    expect(page.get_by_role("heading", name="TRACE Workbench")).to_be_visible(timeout=120_000)
    wait_for_app(page)
    nav = page.get_by_test_id("stSidebarNav").get_by_role("link")
    expect(nav.nth(0)).to_contain_text("Home")
    expect(nav.filter(has_text="app")).to_have_count(0)
    # Counts agree with the Environments page: built-ins without a review are drafts there.
    drafts = sum(e["status"] == "draft" for e in environments.list_environments(db_path))
    assert drafts > 0
    draft = page.get_by_test_id("stMetric").filter(has_text=re.compile(r"^\s*draft"))
    expect(draft).to_have_text(re.compile(rf"^\s*draft\s*{drafts}\s*$"))
    expect(page.get_by_text("Next: Label capabilities")).to_be_visible()
    # No link text is cut off (ellipsis): each label fits in its box.
    links = page.get_by_test_id("stPageLink")
    assert links.count() >= 7
    cut = page.evaluate("""() => [...document.querySelectorAll('[data-testid="stPageLink"] p')]
        .filter(p => p.scrollWidth > p.clientWidth + 1).map(p => p.textContent)""")
    assert cut == []


@pytest.mark.e2e
def test_delete_a_dataset_after_confirming(streamlit_server, browser_page, wait_for_app,
                                           tmp_path: Path, db_path: Path) -> None:
    from playwright.sync_api import expect

    _import(tmp_path, db_path, "mine", 3)
    _import(tmp_path, db_path, "theirs", 2)
    mine = next(r for r in data.list_datasets(db_path) if r["name"] == "mine.jsonl")
    page = browser_page
    page.goto(streamlit_server(db_path).url)
    expect(page.get_by_role("heading", name="TRACE Workbench")).to_be_visible(timeout=120_000)
    wait_for_app(page)
    page.locator(f".st-key-dataset_{mine['id']}").get_by_role("button", name="Delete…").click()
    wait_for_app(page)
    confirm = page.locator(".st-key-delete_confirm")
    expect(confirm).to_contain_text("Delete dataset mine.jsonl with its 3 trajectories")
    with store.connect(db_path, read_only=True) as con:  # nothing happens before "Yes"
        assert con.execute("SELECT count(*) FROM trajectories").fetchone()[0] == 5
    confirm.get_by_role("button", name="Yes, delete").click()
    expect(page.get_by_text("Deleted dataset mine.jsonl and its 3 trajectories")
           ).to_be_visible(timeout=90_000)
    assert [r["name"] for r in data.list_datasets(db_path)] == ["theirs.jsonl"]
    expect(page.locator(".st-key-delete_confirm")).to_have_count(0)
