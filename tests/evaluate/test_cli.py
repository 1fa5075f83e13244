"""`python -m trace_lib evaluate` as a user types it: foreground, background job, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from trace_lib import store

REPO = Path(__file__).resolve().parents[2]
TINY = ["--model", "tiny", "--tasks", "1", "--tools", "capability", "--max-model-len",
        "16384", "--max-tokens", "8", "--max-turns", "1"]


def _cli(*args: str, db: Path, runs: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRACE_RUNS_DIR": str(runs), "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "trace_lib", *args, "--db", str(db)],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)


def test_foreground_json(db_path, tmp_path):
    proc = _cli("evaluate", *TINY, "--json", db=db_path, runs=tmp_path / "runs")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert (out["trajectories"], out["successes"], out["failures"]) == (1, 0, 1)
    assert out["dataset"].startswith("tiny__airline__") and out["policy"] == "tiny"
    assert out["ci95"][0] == 0.0


def test_a_named_split_is_evaluated_and_recorded(db_path, tmp_path):
    # a slice of the split (`--tasks START:END`, the last --tasks wins): dev keeps its tail
    # for choosing a checkpoint
    proc = _cli("evaluate", *TINY, "--split", "dev", "--tasks", "80:81", "--json", db=db_path,
                runs=tmp_path / "r")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["split"] == "dev" and out["tasks"] == 1
    assert out["floor"]["tasks"] == 1 and out["floor"]["passes"] in (0, 1)
    with store.connect(db_path, read_only=True) as con:
        task_id, meta = con.execute(
            "SELECT t.task_id, t.meta FROM trajectories t JOIN datasets d "
            "ON t.dataset_id = d.id WHERE d.name = ?", [out["dataset"]]).fetchone()
    meta = json.loads(meta)
    # the record names its split wherever it is read: its meta and its provenance
    assert task_id == "airline_1_080" and meta["split"] == "dev"
    assert meta["provenance"]["split"] == "dev" and meta["provenance"]["task_set_seed"] == 1
    bad = _cli("evaluate", *TINY, "--split", "dev", "--seed", "5", db=db_path, runs=tmp_path / "r")
    assert bad.returncode == 1 and "--split dev is task-set seed 1" in bad.stderr
    assert "Traceback" not in bad.stderr
    for tasks, said in (("5:3", "START:END"), ("95:120", "--tasks 95:120: the airline dev "
                                                        "split has 100 tasks")):
        bad = _cli("evaluate", *TINY, "--split", "dev", "--tasks", tasks, db=db_path,
                   runs=tmp_path / "r")
        assert bad.returncode != 0 and said in bad.stderr and "Traceback" not in bad.stderr


def test_retail_target_tasks_evaluate_into_a_dataset(db_path, tmp_path):
    proc = _cli("evaluate", "--domain", "retail", "--tasks", "3", "--trials", "1", "--model",
                "tiny", "--tools", "capability", "--max-model-len", "16384", "--max-tokens",
                "8", "--max-turns", "1", "--json", db=db_path, runs=tmp_path / "runs")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["trajectories"] == 3 and out["successes"] + out["failures"] == 3
    assert out["dataset"].startswith("tiny__retail__") and out["split"] == "demo"
    with store.connect(db_path, read_only=True) as con:
        rows = con.execute("SELECT t.task_id, t.domain FROM trajectories t JOIN datasets d "
                           "ON t.dataset_id = d.id WHERE d.name = ? ORDER BY t.task_id",
                           [out["dataset"]]).fetchall()
    assert rows == [(f"retail_0_00{k}", "retail") for k in range(3)]


def test_background_job_is_recorded_and_imported(db_path, tmp_path):
    runs = tmp_path / "runs"
    proc = _cli("evaluate", *TINY, "--background", "--wait", "--json", db=db_path, runs=runs)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["trajectories"] == 1 and out["job_id"].startswith("evaluate-")
    run_dir = runs / out["job_id"]
    assert json.loads((run_dir / "status.json").read_text())["state"] == "succeeded"
    assert (run_dir / "metrics.jsonl").read_text().count("\n") == 1
    with store.connect(db_path, read_only=True) as con:
        kind = con.execute("SELECT kind FROM jobs WHERE id = ?", [out["job_id"]]).fetchone()
        n = con.execute("SELECT count(*) FROM datasets").fetchone()[0]
    assert kind == ("evaluate",) and n == 1
    # importing again (the app syncing, or `evaluate --sync`) adds nothing
    again = _cli("evaluate", "--sync", "--json", db=db_path, runs=runs)
    assert again.returncode == 0 and json.loads(again.stdout) == []


def test_bad_input_exits_1_with_a_sentence(db_path, tmp_path):
    runs = tmp_path / "runs"
    for args, message in ((["--domain", "telecom"], "unknown domain"),
                          (["--adapter", str(tmp_path)], "not a PEFT adapter folder"),
                          (["--router", str(tmp_path)], "no router.json"),
                          (["--server-url", "http://127.0.0.1:9/v1"], "needs --served-model")):
        proc = _cli("evaluate", *args, db=db_path, runs=runs)
        assert proc.returncode == 1, (args, proc.stderr)
        assert message in proc.stderr and "Traceback" not in proc.stderr
    proc = _cli("evaluate", "--tasks", "zero", db=db_path, runs=runs)
    assert proc.returncode == 2 and "START:END (that slice of the split) or 'all'" in proc.stderr


def test_a_job_finished_elsewhere_is_imported_by_sync(db_path, tmp_path, monkeypatch):
    from trace_lib import jobs

    runs = tmp_path / "runs"
    monkeypatch.setenv("TRACE_RUNS_DIR", str(runs))
    proc = _cli("evaluate", *TINY, "--background", "--json", db=db_path, runs=runs)
    assert proc.returncode == 0, proc.stderr[-2000:]
    job_id = json.loads(proc.stdout)["job_id"]
    assert jobs.wait(job_id, timeout_s=600).state == "succeeded"
    synced = _cli("evaluate", "--sync", "--json", db=db_path, runs=runs)
    (out,) = json.loads(synced.stdout)
    assert out["job_id"] == job_id and out["trajectories"] == 1
