"""Evaluation in shards: the same bytes at any shard size, resume of the missing shards,
`evaluate` jobs on the local backend and on a real local Ray head.

The policy is the reference-policy server (a real HTTP endpoint on 127.0.0.1) in every
test; the Ray head is the fixture of tests/jobs/test_jobs_ray.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from trace_lib import jobs, store
from trace_lib.errors import UserInputError
from trace_lib.evaluate import runner, shards
from trace_lib.evaluate.policy import EvalConfig
from trace_lib.evaluate.runner import run_evaluation
from trace_lib.evaluate.tasks import load_task_set
from trace_lib.workbench import evaluation
from trace_lib.workbench import jobs as wb_jobs

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))
from reference_policy import ReferencePolicyServer, tasks_with_writes  # noqa: E402


@pytest.fixture(autouse=True)
def _runs_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(jobs.RUNS_ENV, str(tmp_path / "runs"))


def _cfg(srv: ReferencePolicyServer, **kw) -> dict:
    return {"server_url": srv.url, "served_model": srv.model, "tasks": 6, "concurrency": 3,
            "run_id": "shard-test", **kw}


def _asked(srv: ReferencePolicyServer) -> list[tuple[str, int | None]]:
    """(task id, seed) of every request the server got, sorted."""
    return _asked_in(srv, srv.requests)


def _asked_in(srv: ReferencePolicyServer, bodies: list[dict]) -> list[tuple[str, int | None]]:
    out = []
    for body in bodies:
        user = next(m["content"] for m in body["messages"] if m["role"] == "user")
        out.append((srv.by_request[user].task_id, body.get("seed")))
    return sorted(out, key=str)


def _shard_files(folder: Path) -> list[str]:
    return sorted(p.name for p in (folder / shards.SHARDS).glob("*/*"))


def test_sharding_changes_no_request_and_no_byte(tmp_path):
    """Sampled (seeded) trials: one shard, shards of 5 and of 1 episode give the same
    requests, seeds and episodes file, byte for byte."""
    ts = load_task_set("airline", 6)
    with ReferencePolicyServer(ts, set(tasks_with_writes(ts)[:2])) as srv:
        runs = {}
        for size in (100, 5, 1):
            srv.requests.clear()
            result = run_evaluation(EvalConfig(**_cfg(srv, trials=2, temperature=0.7,
                                                      shard_episodes=size)),
                                    tmp_path / f"size{size}")
            first = [b for b in srv.requests  # every episode's opening request
                     if not any(m["role"] == "assistant" for m in b["messages"])]
            runs[size] = (result, Path(result["episodes_path"]).read_bytes(), _asked(srv),
                          _asked_in(srv, first))
    (one, one_bytes, one_asked, _), _, _ = runs.values()
    for size, (result, data, asked, _) in runs.items():
        assert data == one_bytes and asked == one_asked, size
        n_shards = -(-12 // size)
        assert _shard_files(tmp_path / f"size{size}") == [
            f"{shards.shard_name(s)}.jsonl" for s in range(n_shards)]
        assert set(result["shard_pids"].values()) == {os.getpid()}
        same = {k: v for k, v in result.items() if k not in ("wall_s", "config", "shard_pids",
                                                            "episodes_path")}
        assert same == {k: one[k] for k in same}
    assert (one["trajectories"], one["successes"]) == (12, 8)
    # each episode's first request carries the seed the rollout loop derives (turn 0) from
    # the runner's per-(task, trial) seed `(seed * 1_000_003 + task index) * 1_000 + trial`
    def turn0(request_seed: int) -> int:
        for part in (0, 0):
            request_seed = (request_seed * 1_000_003 + part + 1) % (2**31 - 1)
        return request_seed

    by_task = {t.task_id: i for i, t in enumerate(ts.tasks)}
    assert sorted(runs[100][3]) == sorted(
        (t, turn0(by_task[t] * 1_000 + trial)) for t in by_task for trial in range(2))
    recs = [json.loads(line) for line in one_bytes.decode().splitlines()]
    assert "tools" in recs[0] and all("tools" not in r for r in recs[1:])
    assert [(r["task_id"], r["trial"]) for r in recs] == [
        (t.task_id, k) for t in ts.tasks for k in range(2)]  # (task, trial) order


def test_a_stopped_run_keeps_whole_shards_and_a_rerun_runs_only_the_missing(tmp_path):
    ts = load_task_set("airline", 6)
    with ReferencePolicyServer(ts) as srv:
        whole = run_evaluation(EvalConfig(**_cfg(srv)), tmp_path / "whole")
        out = tmp_path / "stopped"
        first = shards.shard_dir(out, "shard-test") / "shard-0000.jsonl"
        cfg = _cfg(srv, shard_episodes=2, concurrency=1)
        # stop as soon as the first shard is whole: the episode after it never starts
        with pytest.raises(jobs.Cancelled):
            run_evaluation(EvalConfig(**cfg), out, should_stop=first.exists)
        assert _shard_files(out) == ["shard-0000.jsonl"]  # no partial shard, no temp file
        assert len(first.read_text().splitlines()) == 2
        assert not list(out.glob("*.jsonl"))  # nothing merged

        before = first.stat()
        srv.requests.clear()
        done = []
        result = run_evaluation(EvalConfig(**cfg), out,
                                on_progress=lambda d, n: done.append((d, n)))
        assert {task for task, _ in _asked(srv)} == {t.task_id for t in ts.tasks[2:]}
        assert done == [(k, 6) for k in range(3, 7)]  # progress counts the resumed shard
        assert result["shard_pids"] == {"shard-0000": None, "shard-0001": os.getpid(),
                                        "shard-0002": os.getpid()}
        after = first.stat()
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
        assert Path(result["episodes_path"]).read_bytes() == \
            Path(whole["episodes_path"]).read_bytes()

        # every shard there: nothing runs, not even the endpoint, and the file is the same
        Path(result["episodes_path"]).unlink()
        srv.requests.clear()
        again = run_evaluation(EvalConfig(**cfg), out)
        assert srv.requests == [] and set(again["shard_pids"].values()) == {None}
        assert Path(again["episodes_path"]).read_bytes() == \
            Path(whole["episodes_path"]).read_bytes()


def test_local_job_writes_shards_resumes_and_is_recorded(db_path):
    ts = load_task_set("airline", 4)
    with ReferencePolicyServer(ts, set(tasks_with_writes(ts)[:1])) as srv:
        cfg = _cfg(srv, tasks=4, shard_episodes=2, concurrency=2, run_id=None)
        spec = wb_jobs.submit_evaluation(db_path, cfg)
        st = jobs.wait(spec.id, timeout_s=300)
        assert st.state == "succeeded", jobs.read_log(spec.path)
        assert "2 of 2 shards to run (local)" in jobs.read_log(spec.path)
        result = jobs.read_result(spec.path)
        assert set(result["shard_pids"].values()) == {jobs.read_status(spec.path)["pid"]}
        metrics = jobs.read_metrics(spec.path)
        assert [(m["step"], m["total"]) for m in metrics] == [(k, 4) for k in range(1, 5)]
        merged = Path(result["episodes_path"])
        data = merged.read_bytes()

        # a rerun of the job's spec (the job function) runs only the missing shard
        (shards.shard_dir(spec.path, spec.id) / "shard-0001.jsonl").unlink()
        merged.unlink()
        srv.requests.clear()
        again = runner.run_job(jobs.JobSpec.load(spec.path / "spec.json"), spec.path,
                               lambda: False)
    assert {task for task, _ in _asked(srv)} == {t.task_id for t in ts.tasks[2:]}
    assert again["shard_pids"] == {"shard-0000": None, "shard-0001": os.getpid()}
    assert merged.read_bytes() == data
    assert jobs.read_metrics(spec.path)[-1]["step"] == 4
    out = wb_jobs.wait_evaluation(db_path, spec.id)
    assert (out["job_id"], out["trajectories"], out["successes"]) == (spec.id, 4, 3)


def test_shard_settings_and_a_foreign_shard_folder_are_refused(db_path, tmp_path):
    for config, message in (({"shard_episodes": 0}, "shard_episodes must be a positive"),
                            ({"shard_episodes": "10"}, "shard_episodes must be a positive"),
                            ({"shard_cpus": -1}, "shard_cpus must be a number >= 0")):
        with pytest.raises(UserInputError, match=message):
            evaluation.evaluate(db_path, config)
    assert not db_path.exists()

    ts = load_task_set("airline", 3)
    with ReferencePolicyServer(ts) as srv:
        run_evaluation(EvalConfig(**_cfg(srv, tasks=3, shard_episodes=2)), tmp_path / "o")
        srv.requests.clear()
        with pytest.raises(UserInputError, match="another run or shard size"):
            run_evaluation(EvalConfig(**_cfg(srv, tasks=3, shard_episodes=3)), tmp_path / "o")
        assert srv.requests == []  # refused before any episode
        # another run sharing the output folder keeps its shards apart
        first = sorted(shards.shard_dir(tmp_path / "o", "shard-test").iterdir())
        before = [p.read_bytes() for p in first]
        run_evaluation(EvalConfig(**_cfg(srv, tasks=3, run_id="another-run")), tmp_path / "o")
        assert len({task for task, _ in _asked(srv)}) == 3
        assert [p.read_bytes() for p in first] == before
        assert [p.name for p in shards.shard_dir(tmp_path / "o", "another-run").iterdir()] == [
            "shard-0000.jsonl"]


# ------------------------------------------------------------------------------- ray

HAVE_RAY = importlib.util.find_spec("ray") is not None
sys.path.insert(0, str(REPO / "tests" / "jobs"))
import test_jobs_ray as _ray_fixture  # noqa: E402  (its head fixture; imports no ray itself)

ray_head = _ray_fixture.ray_head


@pytest.mark.skipif(not HAVE_RAY, reason="ray is not importable")
@pytest.mark.ray
@pytest.mark.slow
def test_ray_evaluate_job_runs_each_shard_as_a_task_and_is_recorded(ray_head, db_path,
                                                                   tmp_path):
    ts = load_task_set("airline", 4)
    with ReferencePolicyServer(ts, set(tasks_with_writes(ts)[:1])) as srv:
        cfg = _cfg(srv, tasks=4, shard_episodes=2, concurrency=2, temperature=0.7,
                   run_id="ray-eval")
        local = run_evaluation(EvalConfig(**cfg), tmp_path / "local")
        asked_local = _asked(srv)
        srv.requests.clear()
        spec = wb_jobs.submit_evaluation(db_path, cfg, backend="ray",
                                         backend_options={"address": ray_head})
        assert spec.backend_options["num_cpus"] == 0  # the entry point only waits
        st = jobs.wait(spec.id, timeout_s=600)
        assert st.state == "succeeded", jobs.read_log(spec.path)
        assert _asked(srv) == asked_local  # the same requests, seeds included
    assert "2 of 2 shards to run (ray)" in jobs.read_log(spec.path)
    result = jobs.read_result(spec.path)
    pids = result["shard_pids"]
    assert sorted(pids) == ["shard-0000", "shard-0001"] and None not in pids.values()
    assert jobs.read_status(spec.path)["pid"] not in pids.values()  # Ray tasks ran them
    assert [(m["step"], m["total"]) for m in jobs.read_metrics(spec.path)] == [(2, 4), (4, 4)]
    assert Path(result["episodes_path"]).read_bytes() == \
        Path(local["episodes_path"]).read_bytes()

    # the app records it as it does any evaluate job
    out = wb_jobs.wait_evaluation(db_path, spec.id)
    assert (out["job_id"], out["trajectories"], out["successes"]) == (spec.id, 4, 3)
    with store.connect(db_path, read_only=True) as con:
        job = con.execute("SELECT kind, backend FROM jobs WHERE id = ?", [spec.id]).fetchone()
        (source,) = con.execute("SELECT source FROM datasets WHERE id = ?",
                                [out["dataset_id"]]).fetchone()
        n = con.execute("SELECT count(*) FROM trajectories WHERE dataset_id = ?",
                        [out["dataset_id"]]).fetchone()[0]
    assert job == ("evaluate", "ray") and n == 4
    assert source == str(Path(result["episodes_path"]).resolve())
    assert wb_jobs.sync(db_path).evaluations == []  # once


class _HeldPolicy(ReferencePolicyServer):
    """The reference policy, but every answer waits until `release` is set."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.release = threading.Event()

    def answer(self, body: dict) -> tuple[int, dict]:
        self.release.wait(120)
        return super().answer(body)


@pytest.mark.skipif(not HAVE_RAY, reason="ray is not importable")
@pytest.mark.ray
@pytest.mark.slow
def test_ray_evaluate_job_cancels_its_shard_tasks(ray_head, db_path):
    ts = load_task_set("airline", 2)
    with _HeldPolicy(ts) as srv:
        try:
            spec = wb_jobs.submit_evaluation(
                db_path, _cfg(srv, tasks=2, shard_episodes=1, run_id=None), backend="ray",
                backend_options={"address": ray_head})
            deadline = time.monotonic() + 300
            while not srv.requests:  # a shard task is in an episode
                assert jobs.job_status(spec.id).state in jobs.ACTIVE, jobs.read_log(spec.path)
                assert time.monotonic() < deadline, jobs.read_log(spec.path)
                time.sleep(0.2)
            st = jobs.cancel(spec.id, grace_s=30)
        finally:
            srv.release.set()
    assert st.state == "cancelled", jobs.read_log(spec.path)
    assert jobs.read_status(spec.path)["exit_code"] == 143  # the job's own Cancelled
    assert not (spec.path / shards.SHARDS).exists() and not jobs.read_result(spec.path)
