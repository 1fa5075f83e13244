"""Labels grid in a real browser (streamlit run + headless Chromium): the grid spans the main
column, its editable label cells are coloured (🟢 present, 🔴 lacking, ⚪ na), and a cell
edited through the coloured options saves exactly the plain value (issue 17).

Design decisions
- Streamlit's data editor draws on a canvas, so colour is read from pixels: in each row's
  band of a screenshot, the red and green glyph blobs left to right must be the row's
  lacking/present labels in column order (na draws a white glyph, which is not counted).
  This checks the colours and the value-to-colour mapping together.
- The viewport is wide enough that every capability column of the default filter is on
  screen, so no glyph is scrolled away.
- Every wait is on state: the grid's accessible table, the pixels, the store's edit rows.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from journey_helpers import (  # noqa: E402
    GRID_HEADER_PX,
    GRID_ID_COLUMNS,
    GRID_ROW_PX,
    edit_grid_cell,
    wait_until,
)

ROWS_CHECKED = 8  # rows 0..7 are on screen in the grid's default 400 px height


def _colour(rgb: tuple[int, int, int]) -> str | None:
    """'red' / 'green' for a saturated glyph pixel, None for anything else (text, lines)."""
    r, g, b = rgb
    if r > 150 and r > 1.8 * g and r > 1.8 * b:
        return "red"
    if g > 110 and g > 1.3 * r and g > 1.3 * b:
        return "green"
    return None


def glyph_rows(page, grid, n_rows: int) -> list[list[str]]:
    """Per grid row, the colours of its glyph blobs from left to right."""
    from PIL import Image

    box = grid.bounding_box()
    shot = Image.open(io.BytesIO(page.screenshot(clip=box))).convert("RGB")
    out = []
    for row in range(n_rows):
        mid = GRID_HEADER_PX + GRID_ROW_PX * row + GRID_ROW_PX // 2
        blobs: list[str] = []
        last_x = -10
        for x in range(shot.width):
            hits = {_colour(shot.getpixel((x, y))) for y in range(mid - 5, mid + 6)} - {None}
            if not hits:
                continue
            if x - last_x > 3:  # a gap: a new glyph starts
                blobs.append(hits.pop())
            last_x = x
        out.append(blobs)
    return out


def expected_rows(grid_df, n_rows: int) -> list[list[str]]:
    caps = list(grid_df.columns[GRID_ID_COLUMNS:])
    colour = {"lacking": "red", "present": "green"}
    return [[colour[v] for v in (grid_df.iloc[i][c] for c in caps) if v in colour]
            for i in range(n_rows)]


@pytest.mark.e2e
def test_grid_spans_main_column_and_colours_labels(streamlit_server, browser, wait_for_app,
                                                   db_path: Path, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    from trace_lib import store
    from trace_lib.demo import build_demo
    from trace_lib.diagnose import capability_curation as capmod
    from trace_lib.diagnose import labels as lb
    from trace_lib.diagnose.labeling import run_labeling

    build_demo(tmp_path / "demo", n=24, seed=0, db=db_path)
    run_labeling(db_path, "heuristic", run_prefix="h")
    all_caps = [c.name for c in capmod.list_capabilities(db_path) if c.status != "rejected"]
    shown = [c for c in capmod.CORE if c in all_caps] or all_caps
    before = lb.label_grid(db_path, lb.LabelFilter(capabilities=shown))
    want = expected_rows(before, ROWS_CHECKED)
    flat = [c for row in want for c in row]
    assert "red" in flat and "green" in flat  # the sample can tell the colours apart

    server = streamlit_server(db_path)
    ctx = browser.new_context(viewport={"width": 1800, "height": 1100})
    try:
        page = ctx.new_page()
        page.set_default_timeout(60_000)
        page.goto(server.url + "/Labels")
        page.wait_for_selector('[data-testid="stMain"] h1', timeout=90_000)
        wait_for_app(page)
        grid = page.get_by_test_id("stDataFrame").first
        expect(grid).to_be_visible()
        # the grid has its rows once its accessible table lists the first trajectory
        expect(grid.locator("table td").first).to_have_text(before.iloc[0]["trajectory_id"],
                                                            timeout=90_000)

        # ---- width: the grid spans the main column's content box.
        content = page.evaluate("""() => {
            const el = document.querySelector('[data-testid="stMainBlockContainer"]');
            const s = getComputedStyle(el);
            return el.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight);
        }""")
        width = grid.bounding_box()["width"]
        assert width >= 0.97 * content, (width, content)

        # ---- colour: the glyph blobs of each row are its lacking/present labels in order.
        got = wait_until(lambda: (g := glyph_rows(page, grid, ROWS_CHECKED)) == want and g,
                         90, "the grid's glyph colours to be drawn")
        assert got == want

        # ---- a coloured option saves the plain value, and the cell turns its colour.
        cap = before.columns[GRID_ID_COLUMNS]
        current = before.iloc[0][cap]
        new = "present" if current == "lacking" else "lacking"
        edit_grid_cell(page, grid, row=0, col=GRID_ID_COLUMNS, value=new)
        wait_for_app(page)

        def edits() -> list:
            with store.connect(db_path, read_only=True) as con:
                return con.execute("SELECT trajectory_id, capability, old, new "
                                   "FROM label_edits").fetchall()

        saved = wait_until(edits, 90, "the grid edit in label_edits")
        assert saved == [(before.iloc[0]["trajectory_id"], cap, current, new)]
        after = lb.label_grid(db_path, lb.LabelFilter(capabilities=shown))
        assert set(after[shown].stack().unique()) <= {"present", "lacking", "na"}
        want_after = expected_rows(after, 1)
        wait_until(lambda: glyph_rows(page, page.get_by_test_id("stDataFrame").first, 1)
                   == want_after, 90, "the edited cell's new colour")
    finally:
        ctx.close()
