"""Real browser: imported trajectories -> label -> edit a label in the grid -> the ranking
moves -> export selected_capabilities.json, all in the app."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from journey_helpers import GRID_ID_COLUMNS, edit_grid_cell, wait_until  # noqa: E402


@pytest.mark.e2e
def test_label_edit_rank_export(streamlit_server, browser_page, wait_for_app, db_path: Path,
                                tmp_path: Path) -> None:
    from playwright.sync_api import expect

    from trace_lib import store
    from trace_lib.demo import build_demo
    from trace_lib.diagnose.ranking import rank

    build_demo(tmp_path / "demo", n=24, seed=0, db=db_path)
    server = streamlit_server(db_path)
    page = browser_page

    # 1. Label from the app (offline heuristic labeler, the default).
    page.goto(server.url + "/Labels")
    wait_for_app(page)
    page.get_by_test_id("stSidebar").get_by_role("button", name="Label all trajectories").click()
    wait_for_app(page)
    expect(page.get_by_test_id("stAlert").filter(has_text="0 failed")).to_be_visible(
        timeout=120_000)
    before = {r.capability: r for r in rank(db_path).rows}

    # 2. Edit one cell of the grid: first row, first capability column (after 4 id columns),
    #    to a value it does not have yet.
    from trace_lib.diagnose import labels as lb
    from trace_lib.diagnose.capability_curation import CORE

    first = lb.label_grid(db_path, lb.LabelFilter(capabilities=list(CORE))).iloc[0]
    target = "na" if first[CORE[0]] != "na" else "present"
    grid = page.get_by_test_id("stDataFrame").first
    expect(grid).to_be_visible(timeout=60_000)
    # the shared helper waits on the cell editor's own state (no fixed pauses)
    edit_grid_cell(page, grid, row=0, col=GRID_ID_COLUMNS, value=target)
    wait_for_app(page)

    def label_edits() -> list:
        with store.connect(db_path, read_only=True) as con:
            return con.execute("SELECT trajectory_id, capability, new, note FROM label_edits"
                               ).fetchall()

    edits = wait_until(label_edits, 90, "the grid edit in label_edits")
    assert len(edits) == 1, edits
    tid, cap, new, note = edits[0]
    assert (tid, cap, new, note) == (first["trajectory_id"], CORE[0], target, "grid edit")
    after = {r.capability: r for r in rank(db_path).rows}
    assert after[cap].pooled != before[cap].pooled  # the ranking moved at once

    # 3. Rankings page: kept set shown, export offered.
    page.goto(server.url + "/Rankings")
    wait_for_app(page)
    expect(page.get_by_test_id("stMetric").first).to_contain_text("of 14", timeout=60_000)
    expect(page.get_by_role("button", name="Export selected_capabilities.json")).to_be_enabled(
        timeout=60_000)
    with page.expect_download() as dl:
        page.get_by_role("button", name="Export selected_capabilities.json").click()
    saved = tmp_path / "selected_capabilities.json"
    dl.value.save_as(saved)
    doc = json.loads(saved.read_text())
    # The page ranks K-of-N with its default stability (auto: bootstrap resamples for one
    # deterministic run); the export is the document of what the page shows as kept.
    from trace_lib.workbench import diagnose as wb

    shown = wb.rankings(db_path, wb.RankConfig(), details=False,
                        stability=wb.StabilityConfig()).document
    assert {d["skill"] for d in doc} == {d["skill"] for d in shown}
    assert {d["skill"] for d in doc} <= {r.capability for r in rank(db_path).selected}
