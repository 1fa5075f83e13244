"""Job lifecycle on the local backend: real detached processes, real run directories.

submit -> progress -> succeeded (and recorded in a real DuckDB file by the app side),
cancel of a running job, a crash that shows `failed` with the log tail, an orphan whose
process was SIGKILLed, and the CLI verbs. The job never opens the database.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from trace_lib import cli, jobs, store
from trace_lib.workbench import jobs as records
from trace_lib.workbench import training

TOY = {
    "env": "trace_lib.train.smoke_envs:TargetLetterEnv", "model": "tiny", "group": 4, "groups_per_step": 1,
    "max_tokens": 3, "lr": 2e-2, "checkpoint_every": 2,
    "lora": {"rank": 4, "alpha": 8, "targets": ["q_proj", "v_proj", "lm_head"]},
}


@pytest.fixture
def runs(tmp_path, monkeypatch):
    monkeypatch.setenv(jobs.RUNS_ENV, str(tmp_path / "runs"))
    # Any attempt by the job to open the store would create this file.
    monkeypatch.setenv("TRACE_DB", str(tmp_path / "job_must_not_open.duckdb"))
    return tmp_path / "runs"


def _wait_for(pred, timeout=120.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_submit_progress_succeed_and_record(runs, tmp_path, db_path):
    spec = jobs.submit(jobs.JobSpec(kind="train_adapter", config={**TOY, "steps": 3}))
    records.record_job(db_path, spec)
    assert jobs.job_status(spec.id).state in ("queued", "running")
    st = jobs.wait(spec.id, timeout_s=240)
    assert st.state == "succeeded", jobs.read_log(spec.path)
    assert st.exit_code == 0 and st.steps_done == 3
    run = Path(st.run_dir)
    for name in ("spec.json", "status.json", "metrics.jsonl", "log.txt", "result.json"):
        assert (run / name).exists(), name
    assert (run / "checkpoints" / "step_2" / "adapter_model.safetensors").exists()
    assert (run / "adapter" / "adapter_config.json").exists()
    status = json.loads((run / "status.json").read_text())
    assert status["pid"] and status["pgid"] and status["heartbeat"]
    assert not (tmp_path / "job_must_not_open.duckdb").exists()
    # The app side records the finished job and its adapter, once.
    records.sync(db_path)
    records.sync(db_path)
    adapters = training.list_adapters(db_path)
    assert len(adapters) == 1 and adapters[0]["job_id"] == spec.id
    assert adapters[0]["capability"] == "toy_target_letter"
    assert adapters[0]["path"].endswith("adapter")
    with store.connect(db_path, read_only=True) as con:
        row = con.execute("SELECT status, finished_at FROM jobs WHERE id = ?", [spec.id]).fetchone()
    assert row[0] == "succeeded" and row[1] is not None


def test_cancel_running_job(runs):
    spec = jobs.submit(jobs.JobSpec(kind="train_adapter", config={**TOY, "steps": 500}))
    _wait_for(lambda: jobs.read_metrics(spec.path), what="the first metrics line")
    pid = jobs.read_status(spec.path)["pid"]
    st = jobs.cancel(spec.id, grace_s=30)
    assert st.state == "cancelled"
    assert st.exit_code == 143  # it stopped itself on SIGTERM, no SIGKILL needed
    _wait_for(lambda: not jobs._pid_alive(pid), timeout=10, what="the job process to exit")
    assert "cancelled" in jobs.read_log(spec.path)
    assert jobs.job_status(spec.id).state == "cancelled"  # stays cancelled


def test_crash_shows_failed_with_log_tail(runs):
    spec = jobs.submit(jobs.JobSpec(kind="train_adapter",
                                    config={**TOY, "env": "trace_lib.train.smoke_envs:NoSuchEnv", "steps": 2}))
    st = jobs.wait(spec.id, timeout_s=120)
    assert st.state == "failed" and st.exit_code == 1
    assert "NoSuchEnv" in st.error
    assert "Traceback" in st.log_tail and "NoSuchEnv" in st.log_tail


def test_orphan_is_detected(runs):
    spec = jobs.submit(jobs.JobSpec(kind="train_adapter", config={**TOY, "steps": 500}))
    _wait_for(lambda: jobs.read_status(spec.path).get("state") == "running",
              what="the job to start")
    status = jobs.read_status(spec.path)
    os.killpg(status["pgid"], signal.SIGKILL)  # no chance to record an end state
    _wait_for(lambda: jobs.job_status(spec.id).state == "failed", timeout=20,
              what="orphan detection")
    st = jobs.job_status(spec.id)
    assert "orphaned" in st.error and st.log_tail is not None


def test_cli_verbs(runs, db_path, capsys):
    assert cli.main(["train", "--db", str(db_path), "--background", "--json",
                     "--env", "trace_lib.train.smoke_envs:TargetLetterEnv", "--steps", "2", "--group", "4",
                     "--groups-per-step", "1", "--max-tokens", "3", "--lora-rank", "4",
                     "--lora-targets", "q_proj,v_proj"]) == 0
    job_id = json.loads(capsys.readouterr().out)["job_id"]
    assert cli.main(["job", "wait", job_id, "--db", str(db_path), "--json",
                     "--timeout", "240"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "succeeded"
    assert cli.main(["job", "list", "--db", str(db_path), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [j["id"] for j in listed] == [job_id]
    assert cli.main(["job", "logs", job_id, "--tail", "5"]) == 0
    assert "succeeded" in capsys.readouterr().out
    assert cli.main(["job", "status", job_id, "--db", str(db_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps_done"] == 2
    assert training.list_adapters(db_path)[0]["job_id"] == job_id
    # Bad input: a clear error, exit 1.
    assert cli.main(["job", "status", "nope"]) == 1
    assert "nope" in capsys.readouterr().err
    assert cli.main(["train", "--env", "x", "--group", "1", "--background"]) == 1
    assert "group" in capsys.readouterr().err

