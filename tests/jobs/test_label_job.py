"""The `label` job kind: labeling as a background job on the local and Ray backends.

Real DuckDB stores built by the demo, real job processes, a real local Ray head (the
fixture of test_jobs_ray.py), and a real HTTP server on 127.0.0.1 for the killed job."""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from trace_lib import jobs, store
from trace_lib.diagnose import label_job
from trace_lib.diagnose.label_prompt import fence_nonce
from trace_lib.diagnose.labeling import run_labeling
from trace_lib.workbench import jobs as wb_jobs
from trace_lib.workbench.jobs import record_label_job, submit_label_job

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "llm"))
from wire_server import Reply, WireServer, openai_reply  # noqa: E402

COLS = ("trajectory_id, capability, value, evidence, confidence, error, cut_messages, "
        "cut_tokens, evidence_dropped, unsupported")


@pytest.fixture(scope="module")
def demo_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store of 30 demo trajectories (`demo build`), copied per test."""
    from trace_lib.demo import build_demo

    root = tmp_path_factory.mktemp("label_job_demo")
    db = root / "demo.duckdb"
    build_demo(root / "files", n=30, seed=0, db=db)
    return db


@pytest.fixture
def demo_db(demo_template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(jobs.RUNS_ENV, str(tmp_path / "runs"))
    db = tmp_path / "demo.duckdb"
    shutil.copy(demo_template, db)
    return db


def _labels(db: Path, run_id: str) -> list[tuple]:
    with store.connect(db) as con:
        return con.execute(f"SELECT {COLS} FROM labels WHERE run_id = ? ORDER BY "
                           f"trajectory_id, capability", [run_id]).fetchall()


def _run_status(db: Path, run_id: str) -> tuple | None:
    with store.connect(db) as con:
        return con.execute("SELECT status, status_reason FROM label_runs WHERE id = ?",
                           [run_id]).fetchone()


def _materialised_runs(db: Path) -> dict:
    with store.connect(db) as con:
        row = con.execute("SELECT runs FROM label_materialised").fetchone()
    return json.loads(row[0]) if row else {}


def test_local_label_job_records_the_in_process_labels_once(demo_db: Path) -> None:
    run_labeling(demo_db, "heuristic", run_prefix="inproc")
    (spec,) = wb_jobs.submit_labeling(demo_db, "heuristic", run_prefix="bg", shard_size=7)
    assert spec.config["shards"] == [label_job.shard_name(i) for i in range(5)]  # 30 / 7
    assert _run_status(demo_db, "bg") == ("running", None)
    assert wb_jobs.record_label_job(demo_db, spec.id)["outcome"] in ("running", "recorded")

    st = jobs.wait(spec.id, timeout_s=300)
    assert st.state == "succeeded", jobs.read_log(spec.path)
    assert st.kind == "label" and st.steps_done == 30  # progress: trajectories labeled
    # local: every shard labeled in the job process itself
    assert set(jobs.read_result(spec.path)["shard_pids"].values()) == {
        jobs.read_status(spec.path)["pid"]}
    out = wb_jobs.record_label_job(demo_db, spec.id)
    assert out["outcome"] in ("recorded", "already")
    assert _run_status(demo_db, "bg") == ("finished", None)
    expected = _labels(demo_db, "inproc")
    assert expected and _labels(demo_db, "bg") == expected
    assert _materialised_runs(demo_db)["bg"] == len(expected)

    # Exactly once: recording again (directly or by the sync) changes nothing.
    assert wb_jobs.record_label_job(demo_db, spec.id)["outcome"] == "already"
    assert wb_jobs.sync(demo_db).labels == []
    assert _labels(demo_db, "bg") == expected


def test_cli_background_wait_and_job_status(demo_db: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "trace_lib", "label", "--background", "--wait", "--run", "cli",
         "--shard-size", "16", "--json", "--db", str(demo_db)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    (out,) = json.loads(run.stdout)
    assert out["run_id"] == "cli" and out["outcome"] == "recorded" and out["n_trajectories"] == 30
    assert _run_status(demo_db, "cli") == ("finished", None)
    status = subprocess.run(
        [sys.executable, "-m", "trace_lib", "job", "status", out["job_id"], "--json",
         "--db", str(demo_db)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert status.returncode == 0, status.stderr
    st = json.loads(status.stdout)
    assert st["kind"] == "label" and st["state"] == "succeeded" and st["steps_done"] == 30


def test_job_side_never_imports_the_store(demo_db: Path) -> None:
    """The label job process itself (a rerun of its spec.json: a resume with every shard
    already labeled) imports neither the store nor DuckDB."""
    (spec,) = wb_jobs.submit_labeling(demo_db, "heuristic", run_prefix="imp", shard_size=10)
    assert jobs.wait(spec.id, timeout_s=300).state == "succeeded", jobs.read_log(spec.path)
    mods = spec.path.parent / "modules.json"
    probe = ("import json, sys\n"
             "from trace_lib.jobs.runner import run_job\n"
             "code = run_job(sys.argv[1])\n"
             "bad = [m for m in ('duckdb', 'trace_lib.store') if m in sys.modules]\n"
             "open(sys.argv[2], 'w').write(json.dumps(bad))\n"
             "raise SystemExit(code)\n")
    res = subprocess.run([sys.executable, "-c", probe, str(spec.path / "spec.json"), str(mods)],
                         cwd=REPO, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 0, jobs.read_log(spec.path)
    assert json.loads(mods.read_text()) == []
    assert "0 of 3 shards to label" in jobs.read_log(spec.path)  # a rerun resumes


def test_labels_page_runs_in_background_and_records_on_a_later_render(
        demo_db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("TRACE_DB", str(demo_db))
    at = AppTest.from_file(str(REPO / "pages" / "2_Labels.py"), default_timeout=120).run()
    at.checkbox(key="label_background").check().run()
    at.button(key="run_labeler").click().run()
    assert not at.exception
    with store.connect(demo_db) as con:
        run_id, params = con.execute("SELECT id, params FROM label_runs").fetchone()
    job_id = json.loads(params)["job"]
    assert any(job_id in i.value for i in at.info)
    assert jobs.wait(job_id, timeout_s=300).state == "succeeded"
    at.run()  # the next render records the ended job
    assert not at.exception
    assert any(run_id in s.value for s in at.success)
    assert _run_status(demo_db, run_id) == ("finished", None)
    assert len(_labels(demo_db, run_id)) > 0


def test_openai_labeler_job_records_the_in_process_labels_and_cost(demo_db: Path) -> None:
    """The OpenAI-compatible labeler in the job (a real HTTP server on 127.0.0.1): the
    labeler config travels in the spec, and the labels and cost match an in-process run."""
    def respond(path: str, body: dict, n: int) -> Reply:
        if path == "/v1/models":  # no model card: both runs size prompts the same way
            return Reply(status=404, body={"error": {"message": "no model list"}})
        props = list(body["response_format"]["json_schema"]["schema"]["properties"])
        # a value that depends on the transcript only, so both runs must agree pair by pair
        value = ("lacking", "present")[len(body["messages"][1]["content"]) % 2]
        return openai_reply(json.dumps({c: {"value": value, "evidence": [],
                                            "confidence": 0.5} for c in props}),
                            prompt_tokens=10, completion_tokens=2)

    cfg = {"model": "test-model", "max_retries": 0, "concurrency": 2}
    with WireServer(respond) as srv:
        cfg["base_url"] = srv.url + "/v1"
        run_labeling(demo_db, "openai", run_prefix="inproc", **cfg)
        spec = submit_label_job(demo_db, "openai", run_id="llm", labeler_cfg=cfg,
                                shard_size=8)
        assert wb_jobs.wait_label_jobs(demo_db, [spec.id], timeout_s=300)[0]["outcome"] == "recorded"
    assert _labels(demo_db, "llm") == _labels(demo_db, "inproc") != []
    with store.connect(demo_db) as con:
        costs = dict(con.execute("SELECT id, cost FROM label_runs").fetchall())
    job_cost, own_cost = json.loads(costs["llm"]), json.loads(costs["inproc"])
    assert job_cost["requests"] == own_cost["requests"] == 30
    assert job_cost["input_tokens"] == own_cost["input_tokens"] == 300
    with store.connect(demo_db) as con:  # the job's notes are recorded on its run too
        notes = dict(con.execute("SELECT id, notes FROM label_runs").fetchall())
    assert notes["llm"] == notes["inproc"] and "context 32768 tokens (assumed" in notes["llm"]


def _keyed_answer(path: str, body: dict, n: int) -> Reply:
    """A label answer whose value depends on every byte of the prompt: two runs store the
    same labels only if they sent the same bytes (as a deterministic model at temperature
    0 would answer)."""
    if path == "/v1/models":  # no model card: every run sizes prompts the same way
        return Reply(status=404, body={"error": {"message": "no model list"}})
    props = list(body["response_format"]["json_schema"]["schema"]["properties"])
    digest = hashlib.sha256(body["messages"][1]["content"].encode()).digest()
    return openai_reply(json.dumps({c: {"value": ("lacking", "present")[digest[i] % 2],
                                        "evidence": [], "confidence": 0.5}
                                    for i, c in enumerate(props)}),
                        prompt_tokens=10, completion_tokens=2)


def _prompts(srv: WireServer) -> dict[str, str]:
    """The user message sent for each trajectory, by trajectory id."""
    return {re.search(r"^trajectory: (\S+)$", b["messages"][1]["content"], re.M)[1]:
            b["messages"][1]["content"] for p, b in srv.requests if p == "/v1/chat/completions"}


def test_one_fence_key_sends_the_same_prompts_in_process_and_in_label_jobs(
        demo_db: Path) -> None:
    """The path Ray workers take (the labeler built from the job's spec, shard by shard):
    a label job run twice with the same settings and fence key sends, byte for byte, the
    prompts of an in-process run, and stores the same labels. A job given no key draws one
    and keeps it in its spec (so every shard uses it) and in its run's params."""
    cfg = {"model": "test-model", "max_retries": 0, "concurrency": 2, "fence_key": "k-31"}
    sent = {}
    for run in ("inproc", "job1", "job2", "own-key"):
        with WireServer(_keyed_answer) as srv:
            cfg["base_url"] = srv.url + "/v1"
            if run == "inproc":
                run_labeling(demo_db, "openai", run_prefix=run, **cfg)
            else:
                spec = submit_label_job(
                    demo_db, "openai", run_id=run, shard_size=8, labeler_cfg=(
                        {k: v for k, v in cfg.items() if k != "fence_key"}
                        if run == "own-key" else cfg))
                assert wb_jobs.wait_label_jobs(demo_db, [spec.id], timeout_s=300)[0][
                    "outcome"] == "recorded", jobs.read_log(spec.path)
        sent[run] = _prompts(srv)
    assert len(sent["inproc"]) == 30
    assert sent["job1"] == sent["job2"] == sent["inproc"]
    assert _labels(demo_db, "job1") == _labels(demo_db, "job2") == _labels(demo_db, "inproc")

    key = spec.config["labeler_cfg"]["fence_key"]  # the last job's: drawn at staging
    assert re.fullmatch(r"[0-9a-f]{64}", key)
    with store.connect(demo_db) as con:
        params = json.loads(con.execute("SELECT params FROM label_runs WHERE id = 'own-key'"
                                        ).fetchone()[0])
    assert params["fence_key"] == key
    caps = [c["name"] for c in spec.config["capabilities"]]
    for tid, user in sent["own-key"].items():  # every shard fenced with the staged key
        nonce, inside = re.search(r"^<transcript-(\w+)>\n(.*)\n</transcript-\1>$", user,
                                  re.M | re.S).groups()
        assert nonce == fence_nonce(key, tid, caps, 0, inside)


def _blocking_server(answered: int, release: threading.Event) -> WireServer:
    """Answers `answered` calls (with a 500: the pairs fail, the shard still completes),
    then holds every further call until `release` is set."""
    calls = itertools.count()

    def respond(path: str, body: dict, n: int) -> Reply:
        if path == "/v1/models":  # the labeler's context lookup: not a label call
            return Reply(status=404, body={"error": {"message": "no model list"}})
        if next(calls) >= answered:
            release.wait(600)
        return Reply(status=500, body={"error": {"message": "scripted"}})

    return WireServer(respond)


def test_a_killed_job_records_nothing_and_leaves_the_run_failed(demo_db: Path) -> None:
    release = threading.Event()
    with _blocking_server(3, release) as srv:
        spec = submit_label_job(
            demo_db, "openai", run_id="killed", shard_size=1,
            labeler_cfg={"model": "m", "base_url": srv.url + "/v1", "max_retries": 0,
                         "concurrency": 1, "timeout": 600})
        deadline = time.monotonic() + 300
        # Wait on state the job exposes: its progress file says 2 shards are labeled.
        while not any(m.get("shards_done", 0) >= 2 for m in jobs.read_metrics(spec.path)):
            assert jobs.job_status(spec.id).state in jobs.ACTIVE, jobs.read_log(spec.path)
            assert time.monotonic() < deadline, jobs.read_log(spec.path)
            time.sleep(0.2)
        pgid = jobs.read_status(spec.path)["pgid"]
        os.killpg(pgid, signal.SIGKILL)  # no chance to record an end state
        while jobs.job_status(spec.id).state in jobs.ACTIVE:  # until the pid is gone
            assert time.monotonic() < deadline
            time.sleep(0.1)
        release.set()
    assert label_job.labels_path(spec.path, label_job.shard_name(0)).exists()  # half-way
    out = record_label_job(demo_db, spec.id)
    assert out["outcome"] == "failed" and "orphaned" in out["error"]
    status, reason = _run_status(demo_db, "killed")
    assert status == "failed" and spec.id in reason
    assert _labels(demo_db, "killed") == []
    assert "killed" not in _materialised_runs(demo_db)
    assert record_label_job(demo_db, spec.id)["outcome"] == "failed"  # again: still nothing
    assert _labels(demo_db, "killed") == []


def test_bad_config_is_a_clear_error(tmp_path: Path) -> None:
    from trace_lib.errors import UserInputError

    spec = jobs.JobSpec(kind="label", config={"labeler": "heuristic"}, run_dir=str(tmp_path))
    with pytest.raises(UserInputError, match="config lacks"):
        label_job.run_job(spec, tmp_path, lambda: False)


# ------------------------------------------------------------------------------- ray

HAVE_RAY = importlib.util.find_spec("ray") is not None
sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_jobs_ray as _ray_fixture  # noqa: E402  (its head fixture; imports no ray itself)

ray_head = _ray_fixture.ray_head


@pytest.mark.skipif(not HAVE_RAY, reason="ray is not importable")
@pytest.mark.ray
@pytest.mark.slow
def test_ray_label_job_shards_into_tasks_and_records_the_same_labels(
        ray_head: str, demo_db: Path) -> None:
    assert "ray[default]" in (REPO / "requirements.txt").read_text()
    run_labeling(demo_db, "heuristic", run_prefix="inproc")
    (spec,) = wb_jobs.submit_labeling(demo_db, "heuristic", run_prefix="onray", shard_size=12,
                                      backend="ray", backend_options={"address": ray_head})
    st = jobs.wait(spec.id, timeout_s=600)
    assert st.state == "succeeded", jobs.read_log(spec.path)
    assert "3 of 3 shards to label (ray)" in jobs.read_log(spec.path)
    pids = jobs.read_result(spec.path)["shard_pids"]
    assert sorted(pids) == spec.config["shards"]
    assert jobs.read_status(spec.path)["pid"] not in pids.values()  # Ray tasks labeled them
    assert wb_jobs.record_label_job(demo_db, spec.id)["outcome"] == "recorded"
    assert _labels(demo_db, "onray") == _labels(demo_db, "inproc")
    assert _run_status(demo_db, "onray") == ("finished", None)


@pytest.mark.skipif(not HAVE_RAY, reason="ray is not importable")
@pytest.mark.ray
@pytest.mark.slow
def test_ray_label_job_sends_the_prompts_of_a_local_run(ray_head: str, demo_db: Path
                                                       ) -> None:
    """Ray equality made achievable: with one fence key, the LLM labeler's requests from
    Ray tasks are byte-identical to an in-process run's, so are the labels."""
    cfg = {"model": "test-model", "max_retries": 0, "concurrency": 2, "fence_key": "k-ray"}
    sent = {}
    for run in ("inproc", "onray"):
        with WireServer(_keyed_answer) as srv:
            cfg["base_url"] = srv.url + "/v1"
            if run == "inproc":
                run_labeling(demo_db, "openai", run_prefix=run, **cfg)
            else:
                spec = submit_label_job(demo_db, "openai", run_id=run, labeler_cfg=cfg,
                                        shard_size=15, backend="ray",
                                        backend_options={"address": ray_head})
                st = jobs.wait(spec.id, timeout_s=600)
                assert st.state == "succeeded", jobs.read_log(spec.path)
                assert "2 of 2 shards to label (ray)" in jobs.read_log(spec.path)
        sent[run] = _prompts(srv)
    assert len(sent["inproc"]) == 30 and sent["onray"] == sent["inproc"]
    assert wb_jobs.record_label_job(demo_db, spec.id)["outcome"] == "recorded"
    assert _labels(demo_db, "onray") == _labels(demo_db, "inproc")
