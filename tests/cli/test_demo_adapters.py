"""`demo adapters` (issue 36) as a person runs it: in the background as a job, followed with
`job wait`, then again, which finds the build and does nothing. Real processes, `tiny`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _cli(tmp_path: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRACE_MODELS_DIR": str(tmp_path / "models"),
           "TRACE_RUNS_DIR": str(tmp_path / "runs"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("TRACE_DB", None)
    env.pop("TRACE_ROUTING_DEMO_DIR", None)  # under the models folder
    proc = subprocess.run([sys.executable, "-m", "trace_lib", *args, "--db",
                           str(tmp_path / "trace.duckdb")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_demo_adapters_in_the_background_then_found(tmp_path: Path):
    started = json.loads(_cli(tmp_path, "demo", "adapters", "--model", "tiny",
                              "--background", "--json").stdout)
    assert started["state"] == "submitted" and started["job"].startswith("routing_demo")
    folder = tmp_path / "models" / "routing-demo" / "tiny"
    assert Path(started["path"]) == folder.resolve()

    waited = json.loads(_cli(tmp_path, "job", "wait", started["job"], "--json").stdout)
    assert waited["state"] == "succeeded", waited
    demo = json.loads((folder / "demo.json").read_text())
    assert len(demo["examples"]) == 2 and set(demo["passes"]) == set(demo["policies"])
    # `job wait` ran the one job sync: it recorded the composed model
    from trace_lib.workbench import composition

    assert [m["path"] for m in composition.list_moe_models(tmp_path / "trace.duckdb")] == [
        str((folder / "moe").resolve())]

    again = _cli(tmp_path, "demo", "adapters", "--model", "tiny")
    assert f"routing demo already built in {folder.resolve()}; nothing to do" in again.stdout
    assert demo["what_you_see"].splitlines()[0] in again.stdout
    as_json = json.loads(_cli(tmp_path, "demo", "adapters", "--model", "tiny",
                              "--json").stdout)
    assert as_json["state"] == "built" and as_json["skipped"] is True
