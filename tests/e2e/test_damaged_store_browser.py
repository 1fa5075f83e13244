"""The app opening a damaged store, in a real browser against the real server (issue 33):
a truncated file, a file overwritten in part (it opens; a page's query hits a lost block),
a store of a newer schema version, and a store without its search index. Each page shows
a message that says what happened and what to do, never a traceback (no exception box,
none in the server's log); the index is rebuilt and the page says so; a restored store
works again in the same running app."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from journey_helpers import goto, run_cli  # noqa: E402

INDEX = ".search.sqlite"


def _open(page, url: str, wait_for_app) -> None:
    page.goto(url)
    page.wait_for_selector('[data-testid="stMain"]', timeout=90_000)
    wait_for_app(page)


def _error_shown(page, *needles: str) -> str:
    from playwright.sync_api import expect

    alert = page.get_by_test_id("stAlert").filter(has_text=needles[0]).first
    expect(alert).to_be_visible()
    text = alert.inner_text()
    for needle in needles[1:]:
        assert needle in text, (needle, text)
    assert page.get_by_test_id("stException").count() == 0
    return text


@pytest.mark.e2e
def test_the_app_shows_what_to_do_for_each_damaged_store(
        streamlit_server, browser_page, wait_for_app, db_path: Path, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    run_cli("demo", "build", "--n", "24", "--out", str(tmp_path / "demo"), db=db_path)
    backup = tmp_path / "backup"
    run_cli("store", "backup", str(backup), db=db_path)
    server = streamlit_server(db_path)
    page = browser_page

    def restore() -> None:
        run_cli("store", "restore", str(backup), db=db_path)

    # 1. Truncated: the open fails; every page shows the message instead of itself.
    os.truncate(db_path, 5000)
    for path in ("/", "/Labels"):
        _open(page, server.url + path, wait_for_app)
        _error_shown(page, "the store file is damaged", "truncated", "store restore")

    # Restored: the same running app works again.
    restore()
    goto(page, server.url + "/Labels", wait_for_app)
    assert page.get_by_test_id("stAlert").filter(has_text="damaged").count() == 0

    # 2. Overwritten in part: the file opens (its catalog is intact); the page's first
    # read of a lost block ends the page with the same message.
    size = db_path.stat().st_size
    with open(db_path, "r+b") as fh:
        fh.seek(size // 10)
        fh.write(b"\0" * (size * 8 // 10))
    _open(page, server.url + "/", wait_for_app)
    _error_shown(page, "the store file is damaged", "checksum", "store restore")

    # 3. A newer schema: refused by file and version, every page.
    restore()
    from trace_lib import store

    with store.connect(db_path) as con:
        con.execute("INSERT INTO schema_version VALUES (?)", [store.SCHEMA_VERSION + 1])
    for path in ("/", "/Trajectories"):
        _open(page, server.url + path, wait_for_app)
        _error_shown(page, f"schema version {store.SCHEMA_VERSION + 1}",
                     f"schema version {store.SCHEMA_VERSION} at most", str(db_path))

    # 4. No search index: rebuilt when the app opens the store, and the page says so.
    restore()
    index = db_path.with_name(db_path.name + INDEX)
    for suffix in ("", "-wal", "-shm"):
        index.with_name(index.name + suffix).unlink(missing_ok=True)
    _open(page, server.url + "/Trajectories", wait_for_app)
    notice = page.get_by_test_id("stAlert").filter(has_text="search index").first
    expect(notice).to_contain_text("was missing; it was rebuilt from the messages "
                                   "(24 trajectories)")
    assert index.exists()
    expect(page.locator('[data-testid="stMain"] h1')).to_be_visible()
    run_cli("store", "check", db=db_path)  # the rebuilt index passes the check

    assert server.tracebacks() == []
    # Each of the three restores kept the store it replaced (none overwrote another).
    assert len([p for p in tmp_path.glob("*.before-restore-*") if "search" not in p.name]) == 3
    shutil.rmtree(backup)
