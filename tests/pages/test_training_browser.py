"""Training page in a real browser (streamlit run + headless Chromium): Launch moves the
"Watch job" selector to the new job; the jobs table and the live panel show the same step
count and both follow the run without a reload; a job that learned nothing is not a plain
"succeeded"; the eval-before phase shows its progress; the form warns before launch when
the environment's prompt does not fit the model's context.

Run directories of the jobs that are not launched here are written the way a job writes
them (spec.json, status.json, metrics.jsonl, log.txt)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from trace_lib import jobs
from trace_lib.envs.catalog import save_environment
from trace_lib.envs.registry import EnvSpec
from trace_lib.jobs.run_dir import write_json_atomic
from trace_lib.workbench import jobs as wb_jobs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from journey_helpers import choose_option  # noqa: E402

TOY_ENV = "trace_lib.train.smoke_envs:TargetLetterEnv"


@pytest.fixture
def runs(tmp_path: Path, monkeypatch, db_path: Path) -> Path:
    save_environment(EnvSpec(name=TOY_ENV, capability="toy_target_letter", domain="toy",
                             version=1, source="file", code="# toy env lives in tests"),
                     status="approved", db=db_path)
    monkeypatch.setenv(jobs.RUNS_ENV, str(tmp_path / "runs"))  # the server inherits it
    return tmp_path / "runs"


def _job(state: str, rows: list[dict], log: str = "", steps: int = 3,
         eval_seeds: int = 0) -> jobs.JobSpec:
    spec = jobs.JobSpec(kind=jobs.TRAIN_ADAPTER, config={
        "env": TOY_ENV, "model": "tiny", "steps": steps, "eval_seeds": eval_seeds})
    spec.path.mkdir(parents=True)
    write_json_atomic(spec.path / "spec.json", spec.to_dict())
    jobs.update_status(spec.path, state=state, backend="local", kind=jobs.TRAIN_ADAPTER)
    _append(spec, rows)
    (spec.path / "log.txt").write_text(log)
    return spec


def _append(spec: jobs.JobSpec, rows: list[dict]) -> None:
    with (spec.path / "metrics.jsonl").open("a") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)


def _row(step: int, no_signal: bool) -> dict:
    return {"step": step, "reward_mean": 0.5, "pass_rate": 0.5, "loss": 0.0,
            "groups_kept": 0 if no_signal else 1, "no_signal": no_signal,
            "no_signal_consecutive": step if no_signal else 0, "kl": 0.0}


def _open(server, page, wait_for_app) -> None:
    from playwright.sync_api import expect

    page.goto(server.url + "/Training")
    expect(page.get_by_role("heading", name="Training")).to_be_visible(timeout=120_000)
    wait_for_app(page)


def _watch(page, job_id: str) -> None:
    from playwright.sync_api import expect

    watch = page.get_by_test_id("stSelectbox").filter(has_text="Watch job")
    # The first run loads a tokenizer for the context check before the jobs panel.
    expect(watch).to_be_visible(timeout=180_000)
    choose_option(page, watch, job_id)
    expect(watch.get_by_role("combobox")).to_have_value(job_id)


def _metric(page, label: str):
    return page.get_by_test_id("stMetric").filter(has=page.get_by_test_id(
        "stMetricLabel").filter(has_text=label))


@pytest.mark.e2e
def test_no_signal_job_and_one_step_count_that_stays_live(
        runs, streamlit_server, browser_page, wait_for_app, db_path: Path) -> None:
    from playwright.sync_api import expect

    quiet = _job("succeeded", [_row(1, True), _row(2, True)], steps=2)
    running = _job("running", [_row(1, False)], steps=3)
    page = browser_page
    _open(streamlit_server(db_path), page, wait_for_app)
    _watch(page, running.id)
    table = page.get_by_test_id("stDataFrame")
    expect(_metric(page, "Step")).to_contain_text("1/3")
    expect(table).to_contain_text("1/3")
    # The run goes on: the panel and the table follow it without a reload, together.
    _append(running, [_row(2, False)])
    expect(_metric(page, "Step")).to_contain_text("2/3", timeout=60_000)
    expect(table).to_contain_text("2/3", timeout=60_000)
    # The job that learned nothing.
    expect(table).to_contain_text("succeeded — no learning signal")
    _watch(page, quiet.id)
    expect(_metric(page, "State")).to_contain_text("succeeded — no learning signal",
                                                   timeout=60_000)
    expect(page.get_by_test_id("stAlert").filter(has_text="learned nothing")).to_be_visible()


@pytest.mark.e2e
def test_eval_before_shows_its_progress(runs, streamlit_server, browser_page, wait_for_app,
                                        db_path: Path) -> None:
    from playwright.sync_api import expect

    spec = _job("running", [], log="[eval before] 1/4 held-out seeds\n", steps=2,
                eval_seeds=4)
    page = browser_page
    _open(streamlit_server(db_path), page, wait_for_app)
    expect(page.get_by_text("evaluating before training: 1/4 held-out seeds")).to_be_visible()
    with (spec.path / "log.txt").open("a") as fh:
        fh.write("[eval before] 3/4 held-out seeds\n")
    expect(page.get_by_text("evaluating before training: 3/4 held-out seeds")).to_be_visible(
        timeout=60_000)


@pytest.mark.e2e
@pytest.mark.slow
def test_launch_moves_the_watch_selector_to_the_new_job(
        runs, streamlit_server, browser_page, wait_for_app, db_path: Path) -> None:
    from playwright.sync_api import expect

    old = _job("succeeded", [_row(1, False)], steps=1)
    page = browser_page
    _open(streamlit_server(db_path), page, wait_for_app)
    watch = page.get_by_test_id("stSelectbox").filter(has_text="Watch job")
    expect(watch.get_by_role("combobox")).to_have_value(old.id, timeout=180_000)
    for label, value in (("Steps", "1"), ("Group size G", "2"), ("Seeds per step", "1"),
                         ("Max tokens / turn", "2"), ("Held-out seeds (before/after)", "0"),
                         ("LoRA rank", "2")):
        box = page.get_by_label(label, exact=True)
        box.fill(value)
        box.press("Tab")
    page.get_by_role("button", name="Launch").click()
    expect(page.get_by_text("Launched job")).to_be_visible(timeout=90_000)
    launched = [s for s in jobs.list_jobs() if s.id != old.id]
    assert len(launched) == 1
    try:
        expect(watch.get_by_role("combobox")).to_have_value(launched[0].id)
    finally:
        wb_jobs.cancel(db_path, launched[0].id, grace_s=5)


@pytest.mark.e2e
@pytest.mark.slow
def test_warns_before_launch_when_the_prompt_does_not_fit(
        runs, streamlit_server, browser_page, wait_for_app, db_path: Path,
        tmp_path: Path) -> None:
    from playwright.sync_api import expect

    from trace_lib.runtime.base_models import TinyLlama

    short = tmp_path / "tiny-512"
    short.mkdir()
    TinyLlama(max_position_embeddings=512).build(short)
    page = browser_page
    _open(streamlit_server(db_path), page, wait_for_app)
    page.get_by_text("also offer built-in environments not approved yet (smoke runs)",
                     exact=True).click()  # the label: it takes the pointer, not the input
    expect(page.get_by_label("also offer built-in environments not approved yet (smoke runs)"
                             )).to_be_checked()
    wait_for_app(page)
    choose_option(page, page.get_by_test_id("stSelectbox").filter(has_text="Environment"),
                  "retail/structured_data_reasoning")
    wait_for_app(page)
    choose_option(page, page.get_by_test_id("stSelectbox").filter(
        has_text=re.compile(r"^\s*Model")), "other (folder or hub name)")
    wait_for_app(page)
    folder = page.get_by_label("Model folder / hub name (for 'other')", exact=True)
    folder.fill(str(short))
    folder.press("Enter")
    expect(page.get_by_test_id("stAlert").filter(
        has_text="longer than the model's context of 512 tokens")).to_be_visible(
        timeout=120_000)
    assert not jobs.list_jobs()  # a warning before launch, nothing started
