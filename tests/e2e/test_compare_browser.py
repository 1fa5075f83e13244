"""Compare page in a real browser: a tau2 run against an evaluation made here; the demo's
scripted agents against each other; a job's status that moves without a click.

A real app server and headless Chromium. The first test's runs are a tau2-bench results
file built here (one tool argument carries an HTML payload) and an evaluation against the
reference-policy HTTP server; the second's is the demo generator's first tasks with its
three scripted agents; the third's is a job run directory whose process is a real
`sleep` and whose status.json the test ends. The tests wait on what the app exposes: the
metric values, the aligned table's `data-task` attribute, the chart's tick labels, the
pickers' shown values, and they never see a red error.
"""

from __future__ import annotations

import re
import subprocess
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
    # newest dataset is B (ours), the tau2 import is A: both at 3 of 4; beside each, the
    # do-nothing floor: unknown for the imported log (scored by tau2, not here), 1 of 4
    # for ours (airline's first four tasks hold one refusal)
    values = page.locator('[data-testid="stMetricValue"]')
    values.nth(3).wait_for(timeout=90_000)  # the second run's floor: the page is drawn
    assert values.count() == 4
    assert [values.nth(i).inner_text() for i in range(4)] == [
        "75.0%", "unknown", "75.0%", "25.0%"]
    assert page.get_by_text("Floor unknown: no verifier", exact=False).count() == 1
    assert page.get_by_text("1/4 tasks pass by doing nothing", exact=False).count() == 1
    assert page.get_by_text("tau2_run.json (tau2)", exact=False).count() >= 1
    assert page.locator('[data-testid="stException"]').count() == 0
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
    choose_option(page, box, re.compile(rf"^{other} \(flipped\)"))
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


# ------------------------------------------------------------- the demo's agents


def _selectbox(page, label: str):
    return page.locator('[data-testid="stSelectbox"]').filter(
        has=page.get_by_text(label, exact=True))


def test_the_demos_scripted_agents_compare_in_chromium(tmp_path, monkeypatch, streamlit_server,
                                                       browser_page, wait_for_app):
    """Issue 34: one dataset, three agents. The page opens on careful against hasty (not
    on a red error), shows each pass rate beside its floor, and the agent picker moves a
    side to sloppy."""
    from trace_lib.demo import build_demo
    from trace_lib.evaluate.tasks import do_nothing_verdicts

    db = tmp_path / "trace.duckdb"
    monkeypatch.setenv("TRACE_RUNS_DIR", str(tmp_path / "runs"))
    build_demo(tmp_path / "demo", n=24, db=db)  # 4 tasks x 3 agents x 2 trials
    idle = sum(do_nothing_verdicts(load_task_set("airline", 4)).values())
    floor = f"{idle / 4:.1%}"
    page = browser_page
    server = streamlit_server(db)
    page.goto(server.url + "/Compare")
    page.wait_for_selector('[data-testid="stMain"] h1', timeout=90_000)
    values = page.locator('[data-testid="stMetricValue"]')
    values.nth(3).wait_for(timeout=120_000)  # the verifier runs once per task first
    wait_for_app(page)
    assert page.locator('[data-testid="stAlertContentError"]').count() == 0
    assert page.locator('[data-testid="stException"]').count() == 0
    a_agent = page.get_by_role("combobox", name="Agent model A", exact=True)
    b_agent = page.get_by_role("combobox", name="Agent model B", exact=True)
    assert a_agent.input_value() == "scripted-careful"
    assert b_agent.input_value() == "scripted-hasty"
    shown = [values.nth(i).inner_text() for i in range(4)]
    assert shown[1] == shown[3] == floor and shown[0].endswith("%")
    choose_option(page, _selectbox(page, "Agent model B"), "scripted-sloppy")
    wait_for_app(page)
    expect_b = page.get_by_text("dataset airline_demo.jsonl @ scripted-sloppy", exact=False)
    expect_b.first.wait_for()
    assert values.nth(3).inner_text() == floor
    assert page.locator('[data-testid="stAlertContentError"]').count() == 0
    # flipped or not, a task that passes by doing nothing says so in the task picker
    task = page.get_by_role("combobox", name="Task", exact=True)
    task.scroll_into_view_if_needed()
    options = page.get_by_role("option")
    for _ in range(5):  # a rerun landing between the click and the list closes it
        task.click()
        try:
            options.first.wait_for(timeout=10_000)
            break
        except Exception:  # noqa: BLE001 - playwright's timeout: open it again
            page.keyboard.press("Escape")
    texts = [options.nth(i).inner_text() for i in range(options.count())]
    page.keyboard.press("Escape")
    assert len(texts) == 4, texts
    assert sum("(passes by doing nothing)" in t for t in texts) == idle > 0
    out = Path(__file__).resolve().parents[2] / "artifacts" / "compare"
    out.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(out / "compare_agents.png"), full_page=True)


# ------------------------------------------------------------- job status, live


def test_a_job_status_moves_without_a_click(tmp_path, monkeypatch, streamlit_server,
                                            browser_page, wait_for_app):
    """Issue 34: "Latest evaluation: queued" stayed for minutes after the job had
    succeeded, and Home counted it as running. Both views now follow the job: its
    status.json says succeeded, and each shows it within seconds, with no interaction."""
    from trace_lib import jobs, store
    from trace_lib.jobs.run_dir import write_json_atomic
    from trace_lib.workbench import jobs as wb_jobs

    db = tmp_path / "trace.duckdb"
    monkeypatch.setenv("TRACE_RUNS_DIR", str(tmp_path / "runs"))
    with store.connect(db):
        pass
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        spec = jobs.JobSpec(kind=jobs.EVALUATE,
                            config={"model": "tiny", "tasks": 1, "label": "fake"})
        spec.path.mkdir(parents=True)
        write_json_atomic(spec.path / "spec.json", spec.to_dict())
        jobs.update_status(spec.path, state="running", backend="local", kind=jobs.EVALUATE,
                           pid=sleeper.pid)
        wb_jobs.record_job(db, spec)  # the store's row says "queued", as at submission
        page = browser_page
        server = streamlit_server(db)
        page.goto(server.url + "/Compare")
        page.wait_for_selector('[data-testid="stMain"] h1', timeout=90_000)
        wait_for_app(page)
        page.get_by_role("tab", name="Evaluate a policy").click()
        latest = page.locator('[data-testid="stMetric"]').filter(
            has=page.get_by_text("Latest evaluation", exact=True))
        latest.get_by_text("running", exact=True).wait_for(timeout=60_000)
        home = browser_page.context.new_page()
        home.goto(server.url)
        running = home.locator('[data-testid="stMetric"]').filter(
            has=home.get_by_text("jobs running", exact=True))
        running.locator('[data-testid="stMetricValue"]').get_by_text(
            "1", exact=True).wait_for(timeout=90_000)
        jobs.update_status(spec.path, state="succeeded", exit_code=0)  # the job ended
        # no click, no reload: both pages move on their own
        latest.get_by_text("succeeded", exact=True).wait_for(timeout=30_000)
        running.locator('[data-testid="stMetricValue"]').get_by_text(
            "0", exact=True).wait_for(timeout=30_000)
        assert page.locator('[data-testid="stException"]').count() == 0
        assert home.locator('[data-testid="stException"]').count() == 0
    finally:
        sleeper.kill()
        sleeper.wait()
