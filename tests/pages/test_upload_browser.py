"""Uploading on the Trajectories page in a real browser: a failed file is counted as failed
(never "imported 1/1"), a refused file type says why in a visible sentence, and a JSON error
is a whole sentence with line and column."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.e2e
def test_failed_and_refused_files_say_so(streamlit_server, browser_page, wait_for_app,
                                         db_path: Path, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    bad = tmp_path / "bad.json"
    bad.write_text('{"a": "unterminated')
    pdf = tmp_path / "notes.pdf"
    pdf.write_bytes(b"%PDF-1.4 not a trajectory")
    page = browser_page
    page.goto(streamlit_server(db_path).url + "/Trajectories")
    uploader = page.get_by_test_id("stFileUploader")
    expect(uploader).to_be_visible(timeout=120_000)  # the sidebar's Upload, open: no db yet
    wait_for_app(page)
    uploader.locator('input[type="file"]').set_input_files([str(bad), str(pdf)])
    go = page.get_by_role("button", name="Import", exact=True)
    expect(go).to_be_enabled()
    go.click()
    expect(page.get_by_test_id("stAlert").filter(
        has_text="bad.json: truncated JSON (the file ends mid-document, so it is not valid "
                 "JSON) at line 1 column 7: unterminated string.")).to_be_visible()
    expect(page.get_by_test_id("stAlert").filter(
        has_text="File notes.pdf was not imported: a .pdf file is not a trajectory file."
    )).to_be_visible()
    bar = page.get_by_test_id("stProgress")
    expect(bar).to_contain_text("2/2 files: 0 imported, 2 failed")
    expect(page.get_by_text("imported 2/2")).to_have_count(0)
