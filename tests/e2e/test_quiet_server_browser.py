"""A quiet server: the app as `make demo` serves it (file watcher on) logs no traceback
while a person opens the Semantic clusters tab and keeps working (issue 34).

Once that tab had loaded the encoder (sentence-transformers, so `transformers`), every
page action made Streamlit's file watcher look up `__path__` on `transformers`' lazy
modules, which imported them and logged ~100 `ModuleNotFoundError: torchvision`
tracebacks per action. The launcher keeps the watcher off third-party packages
(`app_server.watch_own_modules_only`); this walks the same steps in a real browser.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from journey_helpers import goto, run_cli, wait_until  # noqa: E402


@pytest.mark.e2e
def test_semantic_tab_then_page_actions_log_no_traceback(
        streamlit_server, browser_page, wait_for_app, db_path: Path, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    run_cli("demo", "build", "--n", "48", "--out", str(tmp_path / "demo"), db=db_path)
    server = streamlit_server(db_path, watch=True)
    page = browser_page
    goto(page, server.url + "/Trajectories", wait_for_app)
    page.get_by_role("tab", name="Semantic clusters", exact=True).click()
    wait_for_app(page)
    toggle = page.get_by_text("Failures only", exact=True)
    expect(toggle).to_be_visible()
    preparing = page.get_by_text("Preparing the encoder", exact=False)

    def encoder_loaded() -> bool:
        # The warm-up runs in the background; a page action redraws its progress bar.
        toggle.click()
        wait_for_app(page)
        return not preparing.count()

    wait_until(encoder_loaded, 300, "the encoder warm-up (sentence-transformers loaded)",
               every_s=2)
    # Page actions with transformers' modules loaded: each one ends a script run, after
    # which the watcher walks sys.modules.
    for _ in range(3):
        toggle.click()
        wait_for_app(page)
    page.get_by_role("tab", name="Charts", exact=True).click()
    wait_for_app(page)
    goto(page, server.url + "/Labels", wait_for_app)
    goto(page, server.url + "/Trajectories", wait_for_app)
    assert server.tracebacks() == []
    log = server.log.read_text(errors="replace")
    assert "torchvision" not in log and "Examining the path" not in log
