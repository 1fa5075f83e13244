"""Compare page in a real browser: a tau2 run against an evaluation made here.

A real `streamlit run` and headless Chromium; the two runs are a tau2-bench results file
built here (one tool argument carries an HTML payload) and an evaluation against the
reference-policy HTTP server. The test waits on what the app exposes: the metric values,
the aligned table's `data-task` attribute, the chart's tick labels.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from trace_lib import store
from trace_lib.diagnose.labels import edit_labels
from trace_lib.evaluate.tasks import load_task_set
from trace_lib.workbench import evaluation
from trace_lib.workbench.data import import_files

sys.path.insert(0, str(Path(__file__).parent))
from journey_helpers import choose_option  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[1] / "evaluate"))
from reference_policy import (  # noqa: E402
    ReferencePolicyServer,
    tasks_with_writes,
    tau2_results_file,
)

pytestmark = pytest.mark.e2e
PAYLOAD = '<img src=x onerror="window.__pwned=1">'


@pytest.fixture
def compare_store(tmp_path, monkeypatch):
    db = tmp_path / "trace.duckdb"
    monkeypatch.setenv("TRACE_RUNS_DIR", str(tmp_path / "runs"))
    ts = load_task_set("airline", 4)
    w = tasks_with_writes(ts)
    passed = {t.task_id for t in ts.tasks} - {w[0]}
    import_files([tau2_results_file(tmp_path / "tau2_run.json", ts, passed, PAYLOAD)], db=db)
    with ReferencePolicyServer(ts, {w[1]}) as srv:
        ours = evaluation.evaluate(db, {"server_url": srv.url, "served_model": srv.model,
                                        "tasks": 4, "label": "ours"})
    with store.connect(db, read_only=True) as con:
        ids = [r[0] for r in con.execute("SELECT id FROM trajectories ORDER BY id").fetchall()]
    edit_labels(db, [(t, "precondition_verification", "lacking" if i % 2 else "present")
                     for i, t in enumerate(ids)], editor="e2e")
    return db, ours, w


def test_compare_page_in_chromium(compare_store, streamlit_server, browser_page, wait_for_app):
    db, ours, w = compare_store
    page = browser_page
    server = streamlit_server(db)
    page.goto(server.url + "/Compare")
    page.wait_for_selector('[data-testid="stMain"] h1', timeout=90_000)
    wait_for_app(page)
    # newest dataset is B (ours), the tau2 import is A: both at 3 of 4
    values = page.locator('[data-testid="stMetricValue"]')
    values.nth(1).wait_for(timeout=90_000)  # the second run's pass rate: the page is drawn
    assert values.count() == 2
    assert [values.nth(i).inner_text() for i in range(2)] == ["75.0%", "75.0%"]
    assert page.get_by_text("tau2_run.json (tau2)", exact=False).count() >= 1
    # the first flipped task is shown, aligned, with the payload as text, never as markup
    pair = page.locator("div.trace-pair")
    pair.wait_for()
    shown = pair.get_attribute("data-task")
    assert shown in (w[0], w[1])
    assert page.evaluate("() => window.__pwned") is None
    if shown == w[1]:  # the task where the tau2 agent passed and made the payload call
        assert PAYLOAD in pair.inner_text()
    # choose the other flipped task
    other = w[0] if shown == w[1] else w[1]
    box = page.locator('[data-testid="stSelectbox"]').filter(
        has=page.get_by_text("Task", exact=True))
    assert box.count() == 1
    choose_option(page, box, f"{other} (flipped)")
    wait_for_app(page)
    page.locator(f'div.trace-pair[data-task="{other}"]').wait_for()
    assert page.locator("table.trace-compare tr").count() >= 2
    assert page.evaluate("() => window.__pwned") is None
    # both transcripts, and the capability chart
    page.get_by_text("Both transcripts", exact=True).click()
    page.locator(".trace-transcript").nth(1).wait_for()
    chart = page.locator('[data-testid="stPlotlyChart"]')
    chart.wait_for()
    chart.get_by_text("precondition_verification").wait_for()
    out = Path(__file__).resolve().parents[2] / "artifacts" / "compare"
    out.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(out / "compare.png"), full_page=True)  # the test's artifact
