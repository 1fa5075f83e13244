"""Trajectories charts that act on a click, in a real headless Chromium.

- A click on a box of the failure-cluster treemap selects that cluster: the "Cluster"
  picker shows it and the members table lists it (Streamlit sends the box's `id`).
- A click on a point of the semantic map opens that trajectory's transcript in the
  "Trajectory" picker and scrolls the transcript into view.

The store is a real tau-bench file with its failures embedded by the real offline MiniLM
encoder before the app starts (the page's "Embed" button calls the same function).
"""

from __future__ import annotations

import html
from pathlib import Path

import pytest

AIRLINE = "tau-bench/historical_trajectories/gpt-4o-airline.json"


@pytest.fixture(scope="module")
def charts_db(tmp_path_factory, shared_data: Path) -> Path:
    from trace_lib.ingest import ingest_paths
    from trace_lib.workbench import explore

    db = tmp_path_factory.mktemp("charts") / "trace.duckdb"
    ingest_paths([str(shared_data / AIRLINE)], db=db)
    explore.embed(db, None, failures_only=True)
    return db


def _open_tab(page, name: str, wait_for_app) -> None:
    page.get_by_role("tab", name=name, exact=True).click()
    wait_for_app(page)


@pytest.mark.e2e
def test_treemap_click_selects_the_cluster(streamlit_server, browser_page, wait_for_app,
                                           charts_db: Path, artifacts_dir: Path):
    from playwright.sync_api import expect

    from trace_lib.workbench import explore

    sigs = explore.signature_counts(charts_db, None)
    assert len(sigs) >= 2
    # the second largest signature: the picker starts on the largest one
    target = sigs.iloc[1]
    levels = [str(target[c]) for c in explore.SIGNATURE_LEVELS]
    box_id = next(b for b, p in explore.trajectory_charts.treemap_box_paths(sigs).items()
                  if p == target.path)
    assert box_id.startswith("failures/" + html.escape(levels[0]))

    server = streamlit_server(charts_db)
    page = browser_page
    page.goto(server.url + "/Trajectories")
    wait_for_app(page)
    _open_tab(page, "Failure clusters", wait_for_app)
    cluster = page.get_by_role("combobox", name="Cluster", exact=True)
    shown = explore.path_label
    expect(cluster).to_have_value(f"{shown(sigs.iloc[0].path)}  ({sigs.iloc[0].n})",
                                    timeout=90_000)

    slices = page.locator("g.treemaplayer g.slice")
    expect(slices.first).to_be_attached(timeout=90_000)
    ids = slices.evaluate_all("els => els.map(e => e.__data__.data.data.id)")
    assert box_id in ids, (box_id, ids)
    try:
        slices.nth(ids.index(box_id)).locator("path.surface").click()
        wait_for_app(page)
        expect(cluster).to_have_value(f"{shown(target.path)}  ({target.n})",
                                        timeout=90_000)
        members = page.get_by_test_id("stDataFrame").filter(
            has=page.locator("[data-testid='stDataFrameResizable']")).first
        expect(members).to_be_visible()
    finally:
        page.screenshot(path=str(artifacts_dir / "trajectories_treemap_click.png"),
                        full_page=True)


@pytest.mark.e2e
def test_semantic_map_click_opens_the_transcript_in_view(
        streamlit_server, browser_page, wait_for_app, charts_db: Path, artifacts_dir: Path):
    from playwright.sync_api import expect

    from trace_lib import store

    with store.connect(charts_db, read_only=True) as con:
        failures = {r[0] for r in con.execute(
            "SELECT id FROM trajectories WHERE NOT success").fetchall()}

    server = streamlit_server(charts_db)
    page = browser_page
    page.goto(server.url + "/Trajectories")
    wait_for_app(page)
    picker = page.get_by_role("combobox", name="Trajectory", exact=True)
    expect(picker).to_be_visible(timeout=90_000)
    first_pick = picker.input_value()
    _open_tab(page, "Semantic clusters", wait_for_app)

    points = page.locator("g.scatterlayer path.point")
    expect(points.first).to_be_visible(timeout=120_000)
    heading = page.locator("#transcript")
    expect(heading).not_to_be_in_viewport()  # far below the map
    # a point in the middle of the list: not the one the picker starts on
    point = points.nth(points.count() // 2)
    point.scroll_into_view_if_needed()
    box = point.bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    hover = page.locator("g.hoverlayer g.hovertext")
    expect(hover.first).to_be_visible(timeout=30_000)  # Plotly has the point under the mouse
    clicked = next(i for i in failures if i in hover.first.text_content())
    try:
        page.mouse.click(x, y)
        wait_for_app(page)
        expect(picker).to_have_value(clicked, timeout=90_000)
        assert clicked != first_pick
        expect(heading).to_be_in_viewport(timeout=60_000)
        expect(page.locator(".trace-transcript").first).to_be_visible()
    finally:
        page.screenshot(path=str(artifacts_dir / "trajectories_map_click.png"))
