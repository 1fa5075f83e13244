"""The job entry point: a real job process imports no CLI, no store and no DuckDB, and builds a
generated environment from the serialised spec it carries (in the sandbox), never by name."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from envs_fixture import generated_spec

from trace_lib import jobs

FORBIDDEN = ("trace_lib.cli", "trace_lib.store", "duckdb", "streamlit", "trace_lib.workbench")


def _imported_modules(log: str) -> set[str]:
    # -X importtime lines: "import time:   self [us] |  cumulative | imported package"
    names = re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s+(\S.*)$", log, flags=re.M)
    return {n.strip() for n in names}


def test_a_real_job_imports_no_cli_store_or_duckdb_and_builds_its_env_from_the_spec(
        tmp_path, monkeypatch):
    monkeypatch.setenv(jobs.RUNS_ENV, str(tmp_path / "runs"))
    # Any attempt by the job to open the store would create this file.
    monkeypatch.setenv("TRACE_DB", str(tmp_path / "job_must_not_open.duckdb"))
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")  # the job logs every import it makes
    name = "toy/count_digits/gen1"  # a name no database here knows: only the spec can build it
    env_spec = generated_spec(name).to_json()
    config = {"env": name, "env_spec": env_spec, "model": "tiny", "steps": 1, "group": 2,
              "groups_per_step": 1, "max_turns": 1, "max_tokens": 2, "checkpoint_every": 0,
              "lora": {"rank": 2, "alpha": 4, "targets": ["q_proj"]}}
    spec = jobs.submit(jobs.JobSpec(kind="train_adapter", config=config))
    status = jobs.wait(spec.id, timeout_s=300)
    log = jobs.read_log(spec.path)
    assert status.state == "succeeded", log[-3000:]
    imported = _imported_modules(log)
    # The runner itself runs as __main__; what it imports is in the log. The kind's own
    # module (trace_lib.train.trainer) is loaded by importlib.import_module, which
    # -X importtime does not list; what that module imports (train.step), it does.
    assert {"trace_lib.jobs.kinds", "trace_lib.train.step", "trace_lib.envs.sandbox"} <= imported
    leaked = sorted(m for m in imported if m.split(".")[0] in FORBIDDEN
                    or any(m == f or m.startswith(f + ".") for f in FORBIDDEN))
    assert leaked == []
    assert not (tmp_path / "job_must_not_open.duckdb").exists()
    result = jobs.read_result(spec.path)
    assert result["capability"] == "count_digits" and result["steps"] == 1


def test_importing_the_runner_pulls_in_nothing_heavy():
    code = ("import sys, trace_lib.jobs.runner as r; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('duckdb', 'torch', 'streamlit', 'ray') or m.startswith(('trace_lib.cli', "
            "'trace_lib.store', 'trace_lib.compose', 'trace_lib.train', 'trace_lib.workbench'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_entry_point_usage_and_bad_spec(tmp_path):
    run = [sys.executable, "-m", "trace_lib.jobs.runner"]
    usage = subprocess.run(run, capture_output=True, text=True)
    assert usage.returncode == 2 and "usage" in usage.stderr
    missing = subprocess.run([*run, str(tmp_path / "spec.json")], capture_output=True, text=True)
    assert missing.returncode == 1 and "no job spec file here" in missing.stderr
    assert "Traceback" not in missing.stderr
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kind": "paint", "config": {}}))
    out = subprocess.run([*run, str(bad)], capture_output=True, text=True)
    assert out.returncode == 1 and "field `kind` is 'paint'" in out.stderr

