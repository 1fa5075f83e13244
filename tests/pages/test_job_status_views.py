"""Every view that shows a job reads its status through the one sync (issue 34): Home's
"jobs running", the Compare page's "Latest evaluation", the Training page's jobs table.

The jobs are real run directories whose process is a real `sleep` (so the local backend
sees it alive); the store's row is what submission wrote (`queued`). Ending a job is
what the job process does: its run directory's status.json says `succeeded`.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from trace_lib import jobs, store
from trace_lib.jobs.run_dir import write_json_atomic
from trace_lib.workbench import jobs as wb_jobs

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def env(env) -> Path:
    """The shared store and runs directory (conftest), the store created."""
    with store.connect(env):
        pass
    return env


@pytest.fixture
def alive() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    proc.kill()
    proc.wait()


def running_job(db: Path, kind: str, config: dict, pid: int) -> jobs.JobSpec:
    """A job as a backend leaves it: spec, status `running` with its process id, and the
    store's row as submission wrote it (`queued`)."""
    spec = jobs.JobSpec(kind=kind, config=config)
    spec.path.mkdir(parents=True)
    write_json_atomic(spec.path / "spec.json", spec.to_dict())
    jobs.update_status(spec.path, state="running", backend="local", kind=kind, pid=pid)
    wb_jobs.record_job(db, spec)
    return spec


def end(spec: jobs.JobSpec) -> None:
    jobs.update_status(spec.path, state="succeeded", exit_code=0)


def stored_state(db: Path, job_id: str) -> str:
    with store.connect(db, read_only=True) as con:
        return con.execute("SELECT status FROM jobs WHERE id = ?", [job_id]).fetchone()[0]


EVAL_CONFIG = {"model": "tiny", "tasks": 1, "label": "fake-policy"}


# ------------------------------------------------------------------------- the sync


def test_a_job_under_another_runs_directory_is_synced_from_its_row(env, alive, tmp_path,
                                                                    monkeypatch):
    """The bug: a job submitted under one TRACE_RUNS_DIR stayed `running` in the store (and
    on Home) after it ended, until a CLI with that runs directory synced it."""
    spec = running_job(env, jobs.EVALUATE, EVAL_CONFIG, alive.pid)
    monkeypatch.setenv(jobs.RUNS_ENV, str(tmp_path / "elsewhere"))
    synced = wb_jobs.sync(env)
    assert [st.id for st in synced.statuses] == [spec.id]  # found where its row says
    assert stored_state(env, spec.id) == "running"
    assert [st.id for st in wb_jobs.active(synced.statuses)] == [spec.id]
    end(spec)
    assert wb_jobs.sync(env).statuses[0].state == "succeeded"
    assert stored_state(env, spec.id) == "succeeded"
    assert wb_jobs.active(wb_jobs.sync(env).statuses) == []


def test_poll_reads_each_watched_job_from_its_run_directory(env, alive):
    spec = running_job(env, jobs.EVALUATE, EVAL_CONFIG, alive.pid)
    watched = wb_jobs.active(wb_jobs.sync(env).statuses, jobs.EVALUATE)
    assert wb_jobs.active(wb_jobs.sync(env).statuses, jobs.TRAIN_ADAPTER) == []
    assert not wb_jobs.any_ended(watched)
    end(spec)
    assert [st.state for st in wb_jobs.poll(watched)] == ["succeeded"]
    assert wb_jobs.any_ended(watched)
    assert stored_state(env, spec.id) == "running"  # polling never writes the store


# ------------------------------------------------------------------------- the views


def test_home_counts_a_job_as_running_only_while_it_runs(env, alive):
    spec = running_job(env, jobs.EVALUATE, EVAL_CONFIG, alive.pid)
    at = AppTest.from_file(str(REPO / "app.py"), default_timeout=60).run()
    assert not at.exception
    assert {m.label: m.value for m in at.metric}["jobs running"] == "1"
    assert any("1 job(s) running" in c.value for c in at.caption)  # it follows the job
    end(spec)
    at.run()
    assert {m.label: m.value for m in at.metric}["jobs running"] == "0"
    assert not any("job(s) running" in c.value for c in at.caption)


def test_compare_shows_the_latest_evaluation_as_its_run_directory_says(env, alive):
    spec = running_job(env, jobs.EVALUATE, EVAL_CONFIG, alive.pid)
    at = AppTest.from_file(str(REPO / "pages" / "7_Compare.py"), default_timeout=60).run()
    assert not at.exception
    assert {m.label: m.value for m in at.metric}["Latest evaluation"] == "running"
    assert any("follows the job" in c.value for c in at.caption)
    end(spec)
    at.run()
    assert {m.label: m.value for m in at.metric}["Latest evaluation"] == "succeeded"
    assert list(at.dataframe[0].value.state) == ["succeeded"]


def test_training_lists_the_run_directory_state(env, alive):
    config = {"env": "airline/tool_calling_precision", "model": "tiny", "steps": 3}
    spec = running_job(env, jobs.TRAIN_ADAPTER, config, alive.pid)
    at = AppTest.from_file(str(REPO / "pages" / "5_Training.py"), default_timeout=120).run()
    assert not at.exception
    assert list(at.dataframe[0].value.state) == ["running"]
    end(spec)
    at.run()
    assert list(at.dataframe[0].value.state) == ["succeeded"]
    assert stored_state(env, spec.id) == "succeeded"
