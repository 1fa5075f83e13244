"""Training page layout, measured in a real browser (issue 34): the State of a job that
learned nothing reads whole ("succeeded — no learning signal", was cut to "succeeded —
…"), the metrics chart's panel titles sit on no axis label or title, and the adapters
table shows the pass rates before and after training without scrolling sideways.

The job's run directory is written the way a job writes it (test_training_browser's
helpers); the adapter row the way the job sync records one (`store.jobs.insert_adapter`).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "_training_browser", Path(__file__).with_name("test_training_browser.py"))
_tb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_tb)
runs = _tb.runs  # the fixture: an approved toy environment, TRACE_RUNS_DIR under tmp

# Any element inside the metric's value whose text does not fit its box (CSS ellipsis).
CUT_JS = """el => [...el.querySelectorAll('*')].concat([el]).filter(
    e => e.scrollWidth > e.clientWidth + 1).map(e => e.textContent)"""
# Subplot titles (layout annotations) against every axis title, tick label and legend text.
OVERLAP_JS = """plot => {
  const R = e => e.getBoundingClientRect();
  const titles = [...plot.querySelectorAll('g.annotation text')].map(e => [e.textContent, R(e)]);
  const axes = [...plot.querySelectorAll(
      '[class*="title"] text, .xtick text, .ytick text, .legend text')].map(
      e => [e.textContent, R(e)]);
  const hit = (a, b) => a.left < b.right - 1 && b.left < a.right - 1
                        && a.top < b.bottom - 1 && b.top < a.bottom - 1;
  const out = [];
  for (const [t, a] of titles) for (const [u, b] of axes) if (hit(a, b)) out.push([t, u]);
  return {titles: titles.length, axes: axes.length, overlaps: out};
}"""


@pytest.mark.e2e
@pytest.mark.parametrize("width", [1500, 1100])
def test_state_chart_and_adapter_table_fit(runs, streamlit_server, browser, wait_for_app,
                                           db_path: Path, width: int,
                                           artifacts_dir: Path) -> None:
    from playwright.sync_api import expect

    from trace_lib import store
    from trace_lib.store import jobs as job_rows

    rows = [_tb._row(1, True), _tb._row(2, True)]
    for r in rows:
        r.update(tokens_per_s=120.0, rollouts_per_s=2.0, reward_std=0.1)
    quiet = _tb._job("succeeded", rows, steps=2)
    with store.connect(db_path) as con:
        job_rows.insert_adapter(
            con, job_id=quiet.id, capability="toy_target_letter", environment=_tb.TOY_ENV,
            path=str(runs / quiet.id / "adapter" / ("deeply/nested/" * 6)), base_model="tiny",
            metrics={"final_reward": 0.5, "steps": 2, "eval_before": {"pass_rate": 0.25},
                     "eval_after": {"pass_rate": 0.5}})
    ctx = browser.new_context(viewport={"width": width, "height": 1000})
    page = ctx.new_page()
    page.set_default_timeout(60_000)
    try:
        _tb._open(streamlit_server(db_path), page, wait_for_app)
        _tb._watch(page, quiet.id)
        state = _tb._metric(page, "State")
        expect(state).to_contain_text("succeeded — no learning signal", timeout=60_000)
        value = state.get_by_test_id("stMetricValue")
        assert value.evaluate(CUT_JS) == [], "the State is cut"

        plot = page.locator(".js-plotly-plot").first
        expect(plot.locator("g.annotation text").first).to_be_visible(timeout=60_000)
        page.wait_for_timeout(500)  # plotly lays out again after automargin
        measured = plot.evaluate(OVERLAP_JS)
        assert measured["titles"] == 4 and measured["axes"] > 8, measured
        assert measured["overlaps"] == [], measured

        table = page.get_by_test_id("stDataFrame").filter(
            has=page.locator("th", has_text="pass rate after"))
        table.scroll_into_view_if_needed()
        # the grid lists only the columns it draws in view: both rates are among them
        shown = table.evaluate("t => [...t.querySelectorAll('th')].map(h => h.textContent)")
        assert "pass rate before" in shown and "pass rate after" in shown, shown
        page.screenshot(path=str(artifacts_dir / f"training_layout_{width}.png"),
                        full_page=True)
    finally:
        ctx.close()
