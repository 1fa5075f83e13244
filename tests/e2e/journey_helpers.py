"""Helpers for the whole-journey and reliability browser tests (fixtures live in conftest.py).

Design decisions
- Set-up a new user would do from a shell goes through the real CLI in a subprocess
  (`python -m trace_lib demo build ...`), so the journey exercises what `make demo` runs.
- Screenshots are the test's artifacts: one PNG per page visit under
  `artifacts/journey/`, kept whatever the outcome, so a failing CI run shows the page the
  walk stopped on.
- `wide_tiny_model` builds the project's own random-init tiny Llama with a longer position
  range: the registry's `tiny` has 4096 positions, and a built-in airline environment's
  first prompt is ~7.9k tiny-tokenizer tokens (the domain policy is long), so the tiny model
  cannot roll out on it. Everything else (builder, tokenizer, seed) is `TinyLlama`'s.
- Label-grid cells are edited the way a person does it (click the canvas, arrows, type):
  Streamlit's data editor is a canvas, so there is no DOM cell to target.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO_ROOT / "artifacts"
GRID_ID_COLUMNS = 4  # trajectory_id, task_id, domain, success come before the capabilities
GRID_HEADER_PX = 35
GRID_ROW_PX = 35


def run_cli(*args: str, db: Path, timeout_s: float = 300) -> subprocess.CompletedProcess:
    """`python -m trace_lib ARGS --db DB` as a user types it; fail loudly with its output."""
    proc = subprocess.run(
        [sys.executable, "-m", "trace_lib", *args, "--db", str(db)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    if proc.returncode != 0:
        raise AssertionError(f"trace_lib {' '.join(args)} exited {proc.returncode}:\n"
                             f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return proc


def shot_dir(name: str) -> Path:
    out = ARTIFACTS / name
    out.mkdir(parents=True, exist_ok=True)
    return out


def screenshot(page: Any, folder: Path, name: str) -> Path:
    path = folder / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def wide_tiny_model(dest: Path, positions: int = 16384) -> Path:
    """The project's tiny Llama (same builder and seed) with `positions` positions."""
    from trace_lib.runtime.base_models import TinyLlama

    if not (dest / "config.json").exists():
        dest.mkdir(parents=True, exist_ok=True)
        TinyLlama(max_position_embeddings=positions).build(dest)
    return dest


def goto(page: Any, url: str, wait_for_app: Any) -> None:
    """Open a page and wait until its script has drawn its title and finished running
    (on a loaded machine the first run can start later than `wait_for_app`'s grace)."""
    page.goto(url)
    page.wait_for_selector('[data-testid="stMain"] h1', timeout=90_000)
    wait_for_app(page)


def fill_number(page: Any, label: str, value: Any, wait_for_app: Any | None = None) -> None:
    """Type into a labelled number/text input and commit it (Tab), as a person would."""
    box = page.get_by_label(label, exact=True)
    box.fill(str(value))
    box.press("Tab")
    if wait_for_app is not None:
        wait_for_app(page)


def choose_option(page: Any, box: Any, option: Any, *, timeout_s: float = 180) -> None:
    """Open the select or multiselect `box` (a locator) and click its option `option` (a
    name matched exactly, or a compiled pattern).

    The list can close between the click that opens it and the click on the option: a
    script or fragment rerun that lands in between re-renders the widget (seen once in a
    CI run under load, the option never appeared in 60 s). So wait a short while for the
    option; when it is not listed, close whatever is open and open the list again, until
    `timeout_s`. The option is clicked only once it is listed, so it is never chosen twice.
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    listed = page.get_by_role("option", name=option, exact=isinstance(option, str))
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if not listed.first.is_visible():
                box.click(timeout=30_000)
            listed.first.wait_for(state="visible", timeout=10_000)
            listed.first.click(timeout=10_000)
            return
        except PlaywrightTimeout:
            if time.monotonic() > deadline:
                raise
            page.keyboard.press("Escape")


def pick_option(page: Any, selectbox_label: str, option: str, wait_for_app: Any) -> None:
    """Open the selectbox whose label is `selectbox_label` and choose `option`."""
    choose_option(page, page.get_by_test_id("stSelectbox").filter(
        has_text=selectbox_label).first, option)
    wait_for_app(page)


def edit_grid_cell(page: Any, grid: Any, row: int, col: int, value: str,
                   on_submit: Any = None) -> None:
    """Type `value` into the data editor's cell (row, col), 0-based over all columns;
    `on_submit()`, when given, is called just before the Enter that commits the value
    (the moment the page sends the edit: what a test that times the save starts from).

    Waits on the grid's own editor state, not on fixed pauses: the cell's overlay editor
    (a combobox in Streamlit's #portal) must be open before typing, the typed option must
    be listed before Enter picks it, and the overlay must close (the value committed)
    before the next key. On a loaded machine the editor can take seconds to open, and
    keystrokes typed before it did were lost."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    overlay = page.locator("#portal .gdg-clip-region")
    editor = overlay.locator("input[role='combobox']")
    target = grid.get_by_test_id(f"glide-cell-{col}-{row}")
    for attempt in range(4):
        # A rerun can remount the grid between the click and Enter (the click then
        # selected nothing): open the editor again until it is open.
        # The grid can be mid-remount (detached for a moment, no box): wait for it.
        grid.wait_for(state="visible", timeout=60_000)
        box = grid.bounding_box()
        if box is None:
            if attempt == 3:
                raise AssertionError("the label grid never stayed on the page")
            continue
        page.mouse.click(box["x"] + 40, box["y"] + GRID_HEADER_PX + GRID_ROW_PX * row + 17)
        for _ in range(col):
            page.keyboard.press("ArrowRight")
        try:
            # The grid's accessible shadow table marks the selected cell (<td
            # data-testid="glide-cell-COL-ROW" aria-selected="true">): Enter only once the
            # target is the selected one. Under load an arrow key was lost and a
            # reliability run edited the column to the left.
            # 20 s each: a 2-core box running a benchmark beside the suite took >10 s
            # four times in a row (session 13); an idle CI machine takes well under 1 s.
            target.wait_for(state="attached", timeout=20_000)
            page.wait_for_function("el => el.getAttribute('aria-selected') === 'true'",
                                   arg=target.element_handle(timeout=20_000), timeout=20_000)
            page.keyboard.press("Enter")
            editor.wait_for(state="visible", timeout=20_000)
            break
        except PlaywrightTimeout:
            if attempt == 3:
                raise
            page.keyboard.press("Escape")
    page.keyboard.type(value)
    # An option's text is the value, or the value after the Labels grid's colour glyph
    # ("🔴 lacking"): match the whole value as the last word, so "na" never matches another.
    option = re.compile(rf"^(\S+ )?{re.escape(value)}$")
    page.locator("#portal").get_by_role("option", name=option).wait_for(timeout=60_000)
    if on_submit is not None:
        on_submit()
    page.keyboard.press("Enter")
    overlay.wait_for(state="detached", timeout=60_000)
    page.keyboard.press("Escape")


def table_fingerprint(db: Path) -> dict[str, tuple[int, str]]:
    """(row count, order-independent content hash) of every base table in the store."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        tables = [r[0] for r in con.execute(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = 'main' AND table_type = 'BASE TABLE' ORDER BY 1").fetchall()]
        out = {}
        for t in tables:
            n, h = con.execute(
                f'SELECT count(*), coalesce(sum(hash(t::VARCHAR)), 0)::VARCHAR FROM "{t}" t'
            ).fetchone()
            out[t] = (int(n), str(h))
        return out
    finally:
        con.close()


def wait_until(predicate: Any, timeout_s: float, what: str, every_s: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(every_s)
