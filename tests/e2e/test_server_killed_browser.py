"""The app server SIGKILLed while a person edits labels (issue 33, "nothing lost under
faults"): afterwards the store opens, and no label edit the page acknowledged is missing.

Design decisions
- Everything is real: the server `make demo` runs (`python -m trace_lib app`) on a fresh
  DuckDB file holding the 24-trajectory demo and a heuristic label run, Debian's Chromium
  typing into the Labels grid cell by cell, SIGKILL (no handler, no cleanup: what the OOM
  killer does) to the server's whole process group, and the store read back through the
  library after each kill, the server dead.
- The acknowledgement is the page's own save status above the grid, "✅ saved 1 edit(s):
  #ID TRAJECTORY · CAPABILITY → VALUE, HH:MM:SS", set only once `edit_labels` returned
  (committed). It names the edit's id, so the check is exact: that id, that pair, that
  value, in the store. (The page's toast alone read "saved 1 edit(s)" for every save, and
  a second save's toast, arriving while the first still showed, changed nothing on the
  screen: this test found every second save unacknowledged, so the page now keeps a
  status that names each save.) The page records every text the status shows the moment
  it changes; it is read once the server is dead, so nothing a restarted server sends is
  taken for an acknowledgement.
- Kill points are seeded (SEED; replay by running the test again): before each of the 10
  kills the page saves 0-1 more edits, each awaited on its confirmation, then one more edit is
  typed and a timer started at its submitting Enter kills the server a seeded fraction of
  this run's median save time (Enter to confirmation) later, one fraction from each tenth of
  0-1.5. A fraction of the measured save time, not a fixed delay: on a loaded 2-core box a
  save takes seconds, on an idle one a fraction of one, and a fixed delay would land every
  kill before (or after) the write on one of them. The save is a script run that reaches
  `edit_labels` (the commit), then a rerun that shows the confirmation: small fractions
  kill before the commit, middle ones between the two, those above 1 mostly after both.
  Three runs on the loaded box: 2-3 kills per run before the commit, 2-4 between, the
  rest after; 11-14 of 18 edits confirmed, none missing.
  (Timed from the end of the typing instead, 1 of 30 kills in three runs came before the
  commit: the browser sends the edit well before the cell's editor has closed.)
- The server restarts on the same port and the same store, and the page is reloaded, as a
  person would after "Connection error". The open page may reconnect to the new server on
  its own first (Streamlit's client does): that is part of what must not duplicate an edit.
- Each pair (trajectory, capability) is edited once, to the value it does not have, so an
  edit stored twice, an edit of a value nobody typed, or a pair whose effective label is
  not its stored edit is a fault the store readback sees directly.
- Bounded: 18 edits (seed 33's plan) and 11 server starts, about 2 minutes on the shared
  2-core box.
"""

from __future__ import annotations

import os
import random
import re
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from journey_helpers import (  # noqa: E402
    GRID_ID_COLUMNS,
    edit_grid_cell,
    goto,
    run_cli,
    screenshot,
    shot_dir,
)

SEED = 33  # issue 33: the plan below (edits between kills, kill moments) is drawn from it
N_KILLS = 10
ROWS = 8  # grid rows drawn without scrolling (the editor is 400 px tall)
# Capability columns used: the first three, whole on screen at 1500 px. A fourth only
# partly shown scrolls the grid sideways when selected, and the next click at the grid's
# left edge (edit_grid_cell) then lands one column to the right.
CAP_COLUMNS = 3
MAX_FRACTION = 1.5  # the latest kill, in median save times after the submission
# The save status's text for one saved edit: "✅ saved 1 edit(s): #ID TRAJECTORY · CAP →
# VALUE, HH:MM:SS" (trace_lib.diagnose.labels.describe_grid_save).
SAVED_ONE = re.compile(r"^✅ saved 1 edit\(s\): #(\d+) (\S+) · (\S+) → (\S+), ")
# Every text the save status shows, recorded the moment it changes (a slow poll on a loaded
# machine could miss one that the next save replaced).
SAVE_RECORDER = """
window.__saves = [];
new MutationObserver(() => {
  const box = document.querySelector('.st-key-grid_save_status');
  const text = box ? (box.textContent || '').trim() : '';
  if (text && text !== window.__saves[window.__saves.length - 1]) window.__saves.push(text);
}).observe(document, {subtree: true, childList: true, characterData: true});
"""

Edit = tuple[str, str, str]  # (trajectory_id, capability, new value)
Ack = tuple[int, Edit]  # (edit id, edit) as the save status named it


def _acks(page) -> list[Ack]:
    """The edits this page load acknowledged, in order, each with its edit id."""
    found = (SAVED_ONE.match(s) for s in _saves(page))
    return [(int(m[1]), (m[2], m[3], m[4])) for m in found if m]


def _saves(page) -> list[str]:
    return page.evaluate("() => window.__saves")


def _stored(db: Path) -> list[tuple[int, Edit]]:
    from trace_lib import store

    with store.connect(db, read_only=True) as con:
        return [(i, (t, c, v)) for i, t, c, v in con.execute(
            "SELECT id, trajectory_id, capability, new FROM label_edits ORDER BY id"
        ).fetchall()]


def _check_store(db: Path, typed: list[Edit], acked: list[Ack], where: str) -> list[Edit]:
    """The store after a kill (server dead): it opens for writing, `store check` passes,
    every acknowledged edit is there once under the id the page named, nothing but typed
    edits is, and each stored edit is the pair's effective label in the grid the page
    reads. Returns the stored edits."""
    from trace_lib import store
    from trace_lib.diagnose import labels as lb
    from trace_lib.workbench.store_admin import check_store

    with store.connect(db):  # a read-write open: replays (or drops) what the kill left
        pass
    report = check_store(db)
    assert report.ok, f"{where}: store check: {[p.message for p in report.problems]}"
    rows = _stored(db)
    stored = [e for _, e in rows]
    pairs = [(t, c) for t, c, _ in stored]
    assert len(pairs) == len(set(pairs)), f"{where}: an edit stored twice: {rows}"
    missing = [a for a in acked if a not in rows]
    assert not missing, f"{where}: acknowledged but not in the store: {missing}"
    assert set(stored) <= set(typed), f"{where}: stored, never typed: {set(stored) - set(typed)}"
    grid = lb.label_grid(db, lb.LabelFilter(capabilities=sorted({c for _, c, _ in stored})
                                            or None)).set_index("trajectory_id")
    wrong = [(t, c, v, grid.loc[t, c]) for t, c, v in stored if grid.loc[t, c] != v]
    assert not wrong, f"{where}: stored edit is not the effective label: {wrong}"
    return stored


def _plan() -> list[tuple[int, float]]:
    """Per kill: how many edits to save (acknowledged) first, and when to kill after the
    next edit's submission, as a fraction of the median save time. One fraction from each
    tenth of 0-1.5, in seeded order: ten independent draws can all miss the short span
    before the commit (seed 33's did: none below 0.4)."""
    rng = random.Random(SEED)
    fractions = [round((k + rng.random()) * MAX_FRACTION / N_KILLS, 3) for k in range(N_KILLS)]
    rng.shuffle(fractions)
    return [(rng.randint(0, 1), f) for f in fractions]


@pytest.mark.e2e
def test_server_killed_at_ten_points_loses_no_acknowledged_label_edit(
        streamlit_server, browser, wait_for_app, db_path: Path, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    from trace_lib.diagnose import capability_curation as capmod
    from trace_lib.diagnose import labels as lb

    started = time.monotonic()
    run_cli("demo", "build", "--n", "24", "--out", str(tmp_path / "demo"), db=db_path)
    run_cli("label", "--labeler", "heuristic", db=db_path)
    all_caps = [c.name for c in capmod.list_capabilities(db_path) if c.status != "rejected"]
    shown = [c for c in capmod.CORE if c in all_caps] or all_caps
    grid = lb.label_grid(db_path, lb.LabelFilter(capabilities=shown))
    cells = [(r, GRID_ID_COLUMNS + k) for r in range(min(ROWS, len(grid)))
             for k in range(CAP_COLUMNS)]
    random.Random(SEED).shuffle(cells)  # edits spread over rows and columns
    plan = _plan()
    # each cell is edited once: the first save, the plan's saves and kills, the last save
    assert len(cells) >= 2 + sum(n for n, _ in plan) + N_KILLS, (len(cells), plan)
    todo = iter(cells)
    shots = shot_dir("server_killed")

    server = streamlit_server(db_path, own_group=True)
    port = int(server.url.rsplit(":", 1)[1])  # every restart serves the open page's port
    ctx = browser.new_context(viewport={"width": 1500, "height": 1000})
    ctx.add_init_script(SAVE_RECORDER)
    page = ctx.new_page()
    page.set_default_timeout(60_000)
    goto(page, server.url + "/Labels", wait_for_app)

    typed: list[Edit] = []
    acked: list[Ack] = []
    save_s: list[float] = []
    outcomes: list[str] = []

    def counts() -> str:
        return (f"seed {SEED}; {len(outcomes)} of {N_KILLS} kills done ({outcomes}); "
                f"{len(typed)} edits typed, {len(acked)} acknowledged")

    def type_next(on_submit: Callable[[], None] | None = None) -> tuple[Edit, float]:
        """Type the next edit; returns it and when it was submitted (its last Enter)."""
        row, col = next(todo)
        cap = grid.columns[col]
        edit = (grid.iloc[row]["trajectory_id"], cap,
                "present" if grid.iloc[row][cap] == "lacking" else "lacking")
        submitted: list[float] = []

        def submit() -> None:
            submitted.append(time.monotonic())
            if on_submit is not None:
                on_submit()

        try:
            edit_grid_cell(page, page.get_by_test_id("stDataFrame").first, row=row, col=col,
                           value=edit[2], on_submit=submit)
        except Exception as exc:
            screenshot(page, shots, f"untyped_{len(typed)}")
            raise AssertionError(f"{counts()}: could not type the edit {edit} "
                                 f"(cell {row}, {col}): {exc}") from exc
        typed.append(edit)
        return edit, submitted[0]

    def acknowledged(edit: Edit, before: int) -> bool:
        """Whether the page acknowledged `edit` since it had `before` acknowledgements;
        one it did is added to `acked` (after checking it names what was typed)."""
        new = _acks(page)[before:]
        assert len(new) <= 1 and all(e == edit for _, e in new), (
            f"{counts()}: the page acknowledged {new} for the one edit {edit}")
        acked.extend(new)
        return bool(new)

    def save_one() -> None:
        """One edit, awaited on the page's acknowledgement."""
        before = len(_acks(page))
        edit, at = type_next()
        try:
            page.wait_for_function(
                "([re, n]) => window.__saves.filter(s => new RegExp(re).test(s)).length > n",
                arg=[SAVED_ONE.pattern, before], timeout=120_000)
        except Exception:
            screenshot(page, shots, f"unsaved_{len(typed)}")
            raise AssertionError(f"{counts()}: the edit {edit} was typed but never "
                                 f"acknowledged; the status read {_saves(page)}") from None
        save_s.append(time.monotonic() - at)
        assert acknowledged(edit, before)
        wait_for_app(page)  # the save's rerun is done: the next edit starts on a quiet page

    save_one()  # the first save: the page works, and a first save time to scale kills by
    for i, (n_before, fraction) in enumerate(plan):
        for _ in range(n_before):
            save_one()
        before = len(_acks(page))
        delay = fraction * statistics.median(save_s)
        # A timer started at the submitting Enter: the kill lands `delay` after it even
        # while the browser is still busy closing the cell's editor. The whole process
        # group: the server and anything it spawned.
        killer = threading.Timer(delay, os.killpg, (server.proc.pid, signal.SIGKILL))
        edit, _ = type_next(killer.start)
        killer.join()
        server.proc.wait(timeout=30)
        # Read once the server is dead, so every acknowledgement counted came from it; after
        # a moment for the browser to draw a status that reached it before the kill
        # (counted, it makes the check stricter, never looser).
        page.wait_for_timeout(500)
        was_acked = acknowledged(edit, before)
        where = f"kill {i} ({delay:.2f} s after the edit {edit} was submitted; {counts()})"
        stored = _check_store(db_path, typed, acked, where)
        outcomes.append(f"{delay:.2f} s: " + ("acknowledged" if was_acked else
                                               "stored, unacknowledged" if edit in stored
                                               else "not stored"))

        server = streamlit_server(db_path, port=port, own_group=True)
        goto(page, server.url + "/Labels", wait_for_app)  # the reload after the restart
        assert page.get_by_test_id("stException").count() == 0, where
        expect(page.get_by_test_id("stDataFrame").first).to_be_visible()

    save_one()  # after ten kills the page still saves
    screenshot(page, shots, "labels_after_kills")
    ctx.close()
    server.stop()
    stored = _check_store(db_path, typed, acked, f"the end ({counts()})")
    assert server.tracebacks() == [], f"{counts()}: {server.tracebacks()}"  # every server's log
    assert len(outcomes) == N_KILLS, counts()
    print(f"server killed {N_KILLS} times during label edits: {len(typed)} typed, "
          f"{len(acked)} acknowledged, {len(stored)} stored, 0 acknowledged missing; "
          f"kills: {outcomes}; save s median {statistics.median(save_s):.2f} "
          f"max {max(save_s):.2f}; {time.monotonic() - started:.0f} s in all")
