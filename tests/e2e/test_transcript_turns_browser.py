"""Transcripts that open where the reading starts and show what each turn cost (issue 34),
in a real headless Chromium.

- The Labels page's transcript opens at the message its evidence points at, in its own
  scroll box (measured: the evidence sits at the box's top, the page did not jump), the
  system prompt folded above it.
- A tau2 import shows each turn's tokens, cost and latency in the message's header, and
  their sum above the transcript, inside the message box (element boxes measured).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from journey_helpers import goto, pick_option, run_cli  # noqa: E402

pytestmark = pytest.mark.e2e
TAU2 = "tau2-bench/results/feature-gym/gpt-4.1_airline_default_gpt-4.1_1trials.json"


def _deepest_evidence(db: Path) -> tuple[str, str, int]:
    """(trajectory, capability, first evidence message) whose evidence starts furthest in."""
    from trace_lib import store
    from trace_lib.diagnose import labels as lb

    with store.connect(db, read_only=True) as con:
        pairs = con.execute("SELECT DISTINCT trajectory_id, capability FROM labels "
                            "WHERE value = 'lacking' AND evidence IS NOT NULL").fetchall()
    best = None
    for tid, cap in pairs:
        at = lb.evidence_by_message(lb.evidence(db, tid, cap))
        if at and (best is None or min(at) > best[2]):
            best = (tid, cap, min(at))
    assert best is not None, "no lacking label with message evidence"
    return best


def test_labels_transcript_opens_at_the_evidence(streamlit_server, browser_page, wait_for_app,
                                                 db_path: Path, tmp_path: Path,
                                                 artifacts_dir: Path) -> None:
    from playwright.sync_api import expect

    run_cli("demo", "build", "--n", "48", "--out", str(tmp_path / "demo"), db=db_path)
    run_cli("label", "--labeler", "heuristic", db=db_path)
    tid, cap, first = _deepest_evidence(db_path)
    server = streamlit_server(db_path)
    page = browser_page
    goto(page, server.url + "/Labels", wait_for_app)
    pick_option(page, "Transcript", tid, wait_for_app)
    pick_option(page, "Evidence for", cap, wait_for_app)
    box = page.locator(".trace-scroll").first
    expect(box.locator(f'.trace-transcript[data-trajectory="{tid}"]')).to_be_attached()
    evidence = box.locator(".trace-evidence").first
    expect(evidence).to_be_attached()
    prompt = box.locator("details.system-prompt")
    expect(prompt).not_to_have_attribute("open", "")
    page.wait_for_function(
        "el => el.scrollTop > 0 || el.scrollHeight <= el.clientHeight",
        arg=box.element_handle(), timeout=30_000)
    box.screenshot(path=str(artifacts_dir / "labels_transcript_at_evidence.png"))
    geo = box.evaluate("""b => {
        const e = b.querySelector('.trace-evidence').getBoundingClientRect();
        const r = b.getBoundingClientRect();
        return {top: r.top, bottom: r.bottom, evTop: e.top, scrollTop: b.scrollTop,
                maxScroll: b.scrollHeight - b.clientHeight, windowY: window.scrollY};
    }""")
    # The note above the evidence message is where the box opens (or the box is scrolled
    # as far as it goes), and it is inside the box's visible part.
    assert geo["top"] - 1 <= geo["evTop"] <= geo["bottom"] - 20, geo
    assert geo["evTop"] - geo["top"] <= 60 or geo["scrollTop"] >= geo["maxScroll"] - 1, geo
    if first > 2:
        assert geo["scrollTop"] > 0, geo  # the turns before the evidence are above


def test_tau2_turns_show_tokens_cost_and_latency(streamlit_server, browser_page, wait_for_app,
                                                 db_path: Path, shared_data: Path,
                                                 artifacts_dir: Path) -> None:
    from playwright.sync_api import expect

    from trace_lib.ingest import ingest_paths

    ingest_paths([str(shared_data / TAU2)], db=db_path)
    server = streamlit_server(db_path)
    page = browser_page
    goto(page, server.url + "/Trajectories", wait_for_app)
    transcript = page.locator(".trace-transcript").first
    expect(transcript).to_be_visible(timeout=90_000)
    total = transcript.locator(".trace-usage-total")
    expect(total).to_contain_text("measured messages")
    expect(total).to_contain_text("tokens")
    usage = transcript.locator(".msg.role-assistant .trace-usage")
    expect(usage.first).to_contain_text("tokens")  # the canned greeting has none at all
    expect(usage.first).to_contain_text("$")
    assert usage.count() >= 2
    usage.first.scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts_dir / "transcript_turn_usage.png"))
    # each usage note stays inside its message box, on the header line
    boxes = usage.evaluate_all("""els => els.map(u => {
        const m = u.closest('.msg').getBoundingClientRect(), r = u.getBoundingClientRect();
        return [r.left - m.left, m.right - r.right, r.height];
    })""")
    for left, right, height in boxes:
        assert left >= 0 and right >= 0 and height < 40, boxes
