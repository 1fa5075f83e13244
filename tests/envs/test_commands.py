"""The `env` CLI verbs end to end on a real DuckDB file."""

from __future__ import annotations

import json

from trace_lib.cli import main
from trace_lib.envs import is_approved

NAME = "retail/precondition_verification"


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def as_json(text):
    return json.loads(text)


def test_list_sample_play(capsys, db_path):
    code, out, _ = run(capsys, "env", "list", "--json", "--db", str(db_path))
    rows = as_json(out)
    assert code == 0 and len(rows) >= 8
    assert {"name", "capability", "domain", "version", "source", "status"} <= set(rows[0])
    assert all(r["status"] == "draft" for r in rows)

    code, out, _ = run(capsys, "env", "sample", NAME, "--seed", "4", "--json",
                       "--db", str(db_path))
    sample = as_json(out)
    assert sample["messages"][0]["role"] == "system" and sample["tool_schemas"]
    assert sample["ground_truth"]["reference_actions"]
    assert sample["system_prompt"].startswith("# Retail service policy")

    code, out, _ = run(capsys, "env", "play", NAME, "--seed", "4", "--reference", "--json",
                       "--db", str(db_path))
    played = as_json(out)
    assert played["summary"]["passed"] and played["summary"]["reward"] == 1.0

    code, out, _ = run(capsys, "env", "play", NAME, "--seed", "4", "--db", str(db_path),
                       "--action", '{"content": "bye"}')
    assert code == 0 and "reward 0.0" in out


def test_validate_then_approve_then_reject(capsys, db_path):
    code, _, err = run(capsys, "env", "approve", NAME, "--db", str(db_path))
    assert code == 1 and "only a validated environment" in err

    code, out, _ = run(capsys, "env", "validate", NAME, "--json", "--db", str(db_path))
    report = as_json(out)
    assert code == 0 and report["status"] == "validated"
    assert report["config"]["n_seeds"] == 50
    assert set(report["figures"]) >= {"determinism", "schema_fidelity", "reference_solves",
                                      "trivial_null", "trivial_random", "distinct_instances"}
    assert not is_approved(NAME, db=db_path)

    code, out, _ = run(capsys, "env", "approve", NAME, "--note", "looks right", "--json",
                       "--db", str(db_path))
    assert code == 0 and as_json(out)["status"] == "approved"
    assert is_approved(NAME, db=db_path)

    code, out, _ = run(capsys, "env", "calibrate", NAME, "--policy", "epsilon:0.5",
                       "--seeds", "3", "--group", "4", "--json", "--db", str(db_path))
    calib = as_json(out)
    assert code == 0 and "pass@4" in calib and "in_band" in calib

    code, out, _ = run(capsys, "env", "list", "--json", "--db", str(db_path))
    row = next(r for r in as_json(out) if r["name"] == NAME)
    assert row["status"] == "approved"
    assert row["calibration_mean_reward"] == calib["mean_reward"]

    code, out, _ = run(capsys, "env", "reject", NAME, "--db", str(db_path))
    assert code == 0 and not is_approved(NAME, db=db_path)


def test_generate_and_validate_a_path(capsys, db_path, tmp_path):
    code, out, _ = run(capsys, "env", "generate", "multi_step_task_completion", "--domain",
                       "retail", "--seeds", "6", "--json", "--db", str(db_path))
    result = as_json(out)
    assert code == 0 and result["status"] == "validated"

    module = tmp_path / "mine.py"
    module.write_text("import socket\n\ndef make_env():\n    return socket.socket()\n")
    code, out, _ = run(capsys, "env", "validate", str(module), "--json", "--db", str(db_path))
    report = as_json(out)
    assert code == 2 and report["status"] == "rejected"
    assert "violation" in report["errors"][0]

    code, _, err = run(capsys, "env", "sample", "nope/nothing", "--db", str(db_path))
    assert code == 1 and "not a built-in" in err
