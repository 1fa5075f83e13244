"""Real browser (Debian's Chromium through playwright) on `streamlit run`: with one run of
the deterministic heuristic labeler the review queue used to say "No disagreements"
forever. Now it fills from the ranking's sensitivity, a person's decision lands as an
edit, and the Agreement section shows Cohen's kappa of the labeler against people."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from journey_helpers import choose_option  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def _harness():
    """The e2e harness (real `streamlit run` on a free port), reused rather than copied."""
    spec = importlib.util.spec_from_file_location("e2e_harness", REPO / "tests/e2e/conftest.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[spec.name] = mod  # its dataclasses resolve their module through this
    spec.loader.exec_module(mod)
    return mod


def _settled(page, timeout_ms: int = 120_000) -> None:
    """Streamlit finished the script run (its running indicator is gone)."""
    page.wait_for_selector('[data-testid="stApp"]', timeout=timeout_ms)
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')",
        timeout=timeout_ms)


@pytest.mark.e2e
def test_queue_fills_with_heuristic_labels_and_kappa_shows(tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    from trace_lib import store
    from trace_lib.demo import build_demo
    from trace_lib.diagnose.agreement import cohen_kappa
    from trace_lib.diagnose.labeling import run_labeling
    from trace_lib.workbench import diagnose as wb

    h = _harness()
    if not h.CHROMIUM.exists():
        pytest.fail(f"{h.CHROMIUM} is missing: install Debian's chromium (make chromium)")
    db = tmp_path / "demo.duckdb"
    build_demo(tmp_path / "files", n=60, seed=0, db=db)
    run_labeling(db, "heuristic", run_prefix="h")  # one deterministic run, no disagreement
    queue = wb.review_queue_ranked(db, None, wb.StabilityConfig(), limit=100)
    assert not queue.empty  # the library's side of what the page must show
    first = queue.iloc[0]
    decision = next(v for v in wb.LABEL_VALUES if v != first["value"])

    server = h.start_streamlit(db, log_dir=tmp_path)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(h.CHROMIUM), headless=True,
                                         args=h.CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            page.set_default_timeout(120_000)
            page.goto(server.url + "/Labels")
            _settled(page)
            name = page.get_by_label("Your name (recorded with every edit)")
            name.fill("ana")
            name.press("Enter")
            _settled(page)
            page.get_by_role("tab", name="Review queue").click()

            # 1. The queue fills, and says where its stability comes from.
            caption = page.get_by_text(re.compile(r"\d+ pairs to review"))
            expect(caption).to_be_visible(timeout=120_000)
            expect(caption).to_contain_text(f"{len(queue)} pairs to review")
            expect(caption).to_contain_text("bootstrap resamples, not independent label runs")
            expect(page.get_by_text("No disagreements")).to_have_count(0)

            # 2. Kappa before any human decision: nothing to compare with yet.
            metric = page.get_by_test_id("stMetric").filter(has_text="heuristic vs people")
            expect(metric).to_contain_text("n/a", timeout=120_000)

            # 3. A person decides the first pair against the labeler.
            choose_option(page, page.get_by_test_id("stSelectbox").filter(
                has_text="Decision"), decision)
            page.get_by_role("button", name="Save decision").click()

            # 4. Cohen's kappa of the heuristic against people shows once the decision is
            #    saved: one pair, labeler and person disagree -> p_o = 0, p_e = 0, kappa 0.
            expected = cohen_kappa([first["value"]], [decision])
            assert expected == 0.0
            expect(metric).to_contain_text(f"{expected:.2f}", timeout=120_000)
            with store.connect(db) as con:
                edits = con.execute("SELECT trajectory_id, capability, new, editor "
                                    "FROM label_edits").fetchall()
            assert edits == [(first["trajectory_id"], first["capability"], decision, "ana")]
            report = wb.agreement(db)
            row = next(c for c in report.cohen if (c.rater_a, c.rater_b) ==
                       ("heuristic", "people"))
            assert row.n == 1 and row.kappa == expected
            # The decided pair left the queue; the queue still holds the others.
            expect(page.get_by_text(re.compile(r"\d+ pairs to review"))).to_be_visible()
            browser.close()
    finally:
        server.stop()
