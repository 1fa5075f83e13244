"""Real browser: the Rankings page with a dataset scope shows only that dataset's ranking
(issue 17 scope), and Fisher p reads as a number (3.2e-07 / "< 1e-300"), not "000000000"."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from journey_helpers import choose_option  # noqa: E402


@pytest.mark.e2e
def test_rankings_dataset_scope_and_readable_fisher_p(streamlit_server, browser_page,
                                                      wait_for_app, db_path: Path,
                                                      tmp_path: Path) -> None:
    from playwright.sync_api import expect

    from trace_lib import store
    from trace_lib.demo import build_demo
    from trace_lib.diagnose.labeling import run_labeling
    from trace_lib.workbench import diagnose as wb

    build_demo(tmp_path / "demo", n=36, seed=0, db=db_path)
    with store.connect(db_path) as con:  # a second dataset: 16 trajectories moved into it
        con.execute("INSERT INTO datasets (id, name, format, content_sha256) "
                    "VALUES ('d-theirs', 'theirs', 'test', 'zz')")
        con.execute("UPDATE trajectories SET dataset_id = 'd-theirs' WHERE id IN "
                    "(SELECT id FROM trajectories ORDER BY id LIMIT 16)")
    run_labeling(db_path, "heuristic", run_prefix="h")
    cfg, stab = wb.RankConfig(), wb.StabilityConfig()
    whole = wb.rankings(db_path, cfg, details=False, stability=stab).ranking
    scoped = wb.rankings(db_path, cfg, details=False, stability=stab,
                         scope=wb.Scope(datasets=["theirs"])).ranking
    assert {r.capability: r.pooled for r in whole.rows} != {
        r.capability: r.pooled for r in scoped.rows}

    server = streamlit_server(db_path)
    page = browser_page
    page.goto(server.url + "/Rankings")
    wait_for_app(page)
    main = page.get_by_test_id("stMain")
    expect(main.get_by_text("Scope: all trajectories", exact=True)).to_be_visible(
        timeout=120_000)

    # Choose the dataset in the sidebar's scope picker.
    picker = page.get_by_test_id("stSidebar").get_by_test_id("stMultiSelect").filter(
        has_text="Datasets")
    choose_option(page, picker.get_by_role("combobox"), "theirs")
    page.keyboard.press("Escape")
    wait_for_app(page)
    expect(main.get_by_text("Scope: dataset theirs", exact=True)).to_be_visible(
        timeout=120_000)
    kept = [r for r in scoped.rows if r.selected]
    expect(main.get_by_test_id("stMetric")).to_contain_text(
        f"{len(kept)} of {len(scoped.rows)}", timeout=60_000)

    # What the table shows, as the grid's own "Download as CSV" gives it (the grid is a
    # canvas): the scoped pooled counts and a readable Fisher p for every capability.
    grid = main.locator(".st-key-rank_table_box").get_by_test_id("stDataFrame")
    expect(grid).to_be_visible(timeout=60_000)
    # Chromium offers the File System Access picker, which the grid's CSV button prefers
    # and a headless browser cannot answer; without it the grid falls back to a download.
    page.evaluate("() => { delete window.showSaveFilePicker; }")
    grid.hover()
    with page.expect_download() as dl:
        grid.get_by_role("button", name="Download as CSV").click()
    saved = tmp_path / "shown.csv"
    dl.value.save_as(saved)
    import csv

    with open(saved, newline="", encoding="utf-8-sig") as fh:
        shown = {r["capability"]: r for r in csv.DictReader(fh)}
    assert set(shown) == {r.capability for r in scoped.rows}
    for r in scoped.rows:
        row = shown[r.capability]
        assert row["LF/PF/NF"] == f"{r.pooled['lf']}/{r.pooled['pf']}/{r.pooled['nf']}"
        assert row["LP/PP/NP"] == f"{r.pooled['lp']}/{r.pooled['pp']}/{r.pooled['np']}"
        if r.fisher_p is None:
            assert row["Fisher p"] == "—"  # the caption's marker for undefined
        else:
            assert re.fullmatch(r"\d\.\d{3}|\d\.\de-\d\d|< 1e-300", row["Fisher p"]), row
            assert row["Fisher p"] == wb.format_p(r.fisher_p)
    assert any(shown[r.capability]["LF/PF/NF"] != f"{r.pooled['lf']}/{r.pooled['pf']}/"
               f"{r.pooled['nf']}" for r in whole.rows if r.capability in shown)
