"""Signals that do not mislead: a job that learned nothing is not a plain "succeeded" (page,
`job status`, `job list`), the eval-before phase has its own progress, and the context
check warns when an environment's prompt does not fit the model.

Run directories are written the way a job writes them (spec.json, status.json,
metrics.jsonl rows with the GRPO step's `no_signal` flag, log lines of the evaluation)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from trace_lib import jobs
from trace_lib.cli import main
from trace_lib.jobs.run_dir import write_json_atomic
from trace_lib.workbench import job_progress, training
from trace_lib.workbench import jobs as wb_jobs


def _job(tmp_path: Path, monkeypatch, state: str, rows: list[dict], log: str = "",
         kind: str = jobs.TRAIN_ADAPTER, steps: int = 3, eval_seeds: int = 4) -> jobs.JobStatus:
    monkeypatch.setenv(jobs.RUNS_ENV, str(tmp_path / "runs"))
    spec = jobs.JobSpec(kind=kind, config={"env": "toy", "model": "tiny", "steps": steps,
                                           "eval_seeds": eval_seeds})
    spec.path.mkdir(parents=True)
    write_json_atomic(spec.path / "spec.json", spec.to_dict())
    jobs.update_status(spec.path, state=state, backend="local", kind=kind,
                       pid=None if state in jobs.TERMINAL else 2**22 + 12345)
    (spec.path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (spec.path / "log.txt").write_text(log)
    return jobs.job_status(spec)


def _row(step: int, no_signal: bool) -> dict:
    return {"step": step, "reward_mean": 0.0, "pass_rate": 0.0, "loss": 0.0,
            "groups_kept": 0 if no_signal else 1, "no_signal": no_signal,
            "no_signal_consecutive": step if no_signal else 0}


def test_constant_reward_everywhere_is_not_a_plain_success(tmp_path, monkeypatch, capsys):
    st = _job(tmp_path, monkeypatch, "succeeded", [_row(i, True) for i in (1, 2, 3)])
    sig = job_progress.learning_signal(st, jobs.read_metrics(st.run_dir))
    assert sig["state"] == job_progress.NO_SIGNAL_STATE == "succeeded — no learning signal"
    assert (sig["steps"], sig["no_signal_steps"], sig["learned"]) == (3, 3, False)
    assert "learned nothing" in sig["warning"]
    assert [v["state"] for v in wb_jobs.job_views()] == [job_progress.NO_SIGNAL_STATE]
    assert main(["job", "status", st.id, "--db", str(tmp_path / "t.duckdb")]) == 0
    out = capsys.readouterr().out
    assert "succeeded — no learning signal" in out and "no-signal steps=3/3" in out
    assert "WARNING: No learning signal" in out
    assert main(["job", "status", st.id, "--json", "--db", str(tmp_path / "t.duckdb")]) == 0
    assert json.loads(capsys.readouterr().out)["learning_signal"]["no_signal_steps"] == 3


def test_one_step_with_signal_is_a_success(tmp_path, monkeypatch, capsys):
    st = _job(tmp_path, monkeypatch, "succeeded", [_row(1, True), _row(2, False)])
    sig = job_progress.learning_signal(st, jobs.read_metrics(st.run_dir))
    assert (sig["state"], sig["no_signal_steps"], sig["warning"]) == ("succeeded", 1, None)
    assert main(["job", "status", st.id, "--db", str(tmp_path / "t.duckdb")]) == 0
    assert "no-signal steps=1/2" in capsys.readouterr().out


def test_gates_that_did_not_move_are_not_a_plain_success(tmp_path, monkeypatch):
    rows = [{"phase": "grpo", "step": 1, "gate_delta": 0.0, "gate_norm": 0.0,
             "groups_kept": 0}]
    st = _job(tmp_path, monkeypatch, "succeeded", rows, kind=jobs.TRAIN_GATES)
    sig = job_progress.learning_signal(st, rows)
    assert sig["state"] == job_progress.NO_SIGNAL_STATE and "have not moved" in sig["warning"]


def test_eval_before_has_its_own_progress(tmp_path, monkeypatch):
    st = _job(tmp_path, monkeypatch, "succeeded", [],
              log="[eval before] 1/4 held-out seeds\n[eval before] 3/4 held-out seeds\n")
    st = dataclasses.replace(st, state="running")  # as the live panel sees it mid-run
    ph = job_progress.phase(st, [], jobs.read_log(st.run_dir))
    assert (ph["name"], ph["done"], ph["total"]) == ("eval before", 3, 4)
    assert ph["text"] == "evaluating before training: 3/4 held-out seeds"
    mid = job_progress.phase(st, [_row(1, False)], "")
    assert mid["name"] == "training"


@pytest.mark.slow
def test_context_check_warns_when_the_prompt_does_not_fit(tmp_path):
    from trace_lib.runtime.base_models import TinyLlama

    short = tmp_path / "tiny-512"
    short.mkdir()
    TinyLlama(max_position_embeddings=512).build(short)
    name = "retail/structured_data_reasoning"
    fit = training.context_check(tmp_path / "t.duckdb", name, str(short),
                                 {"tools": "all", "policy": "full", "difficulty": 1}, 64)
    assert fit["context"] == 512 and fit["prompt_tokens"] > 512
    assert "longer than the model's context of 512 tokens" in fit["warning"]


def test_the_sft_warm_start_has_its_own_progress(tmp_path, monkeypatch):
    st = _job(tmp_path, monkeypatch, "succeeded", [],
              log="[train] SFT step 1/20 loss 0.4565\n[train] SFT step 2/20 loss 0.5324\n")
    st = dataclasses.replace(st, state="running",
                             config={**st.config, "sft_steps": 20, "eval_seeds": 4})
    ph = job_progress.phase(st, [], jobs.read_log(st.run_dir))
    assert (ph["name"], ph["done"], ph["total"]) == ("sft", 2, 20)
    assert ph["text"] == "SFT warm start: 2/20 steps"
    done = "".join(f"[train] SFT step {i}/20 loss 0.1\n" for i in range(1, 21))
    after = job_progress.phase(st, [], done + "[train] SFT warm start: 20 steps on 32 "
                                      "reference episodes, loss 0.4 -> 0.1\n"
                                      "[eval before] 1/4 held-out seeds\n")
    assert after["name"] == "eval before"  # the warm start is over
