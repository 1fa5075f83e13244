"""Evaluation table, environment rollouts and ingested trajectories through the router."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trace_lib.compose.evaluate import EvalConfig, evaluate_composition, summary_rows, write_eval
from trace_lib.compose.gated import compose

HERE = Path(__file__).resolve().parent


def test_evaluation_covers_base_singles_merge_and_composed(tiny_dir, adapter_dirs, tmp_path,
                                                           monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))
    moe = compose(str(tiny_dir), [(None, p) for p in adapter_dirs], out=tmp_path / "moe")
    seen = []
    cfg = EvalConfig(envs=["toy_env:VowelEnv"], seeds=2, max_turns=1, max_tokens=6)
    rows = evaluate_composition(moe, cfg, on_row=seen.append)
    assert [r["policy"] for r in rows] == [
        "base", "adapter:precondition_verification", "adapter:tool_calling_precision",
        "adapter:structured_reasoning", "linear merge", "composed (top1)"]
    assert seen == rows and all(r["n"] == 2 and 0 <= r["reward_mean"] <= 1 for r in rows)
    # Zero gates: the composed model is the base, so greedy rollouts score the same.
    assert rows[-1]["reward_mean"] == rows[0]["reward_mean"]
    path = write_eval(tmp_path / "moe", rows, cfg)
    data = json.loads(path.read_text())
    assert len(data["summary"]) == 6 and data["summary"] == summary_rows(rows)


def test_env_rollout_trace_has_roles_and_outcome(tiny_dir, adapter_dirs, monkeypatch) -> None:
    from trace_lib.compose.local_client import route_env

    monkeypatch.syspath_prepend(str(HERE))
    moe = compose(str(tiny_dir), [(None, p) for p in adapter_dirs])
    trace = route_env(moe, "toy_env:VowelEnv", seed=4, force=1, max_tokens=6, max_turns=1)
    assert trace.meta["source"] == "env" and trace.meta["outcome"] in ("success", "failure")
    assert {"system", "user", "assistant"} <= set(trace.roles)
    assert (trace.chosen == 1).all()


def test_unknown_env_name_is_explained() -> None:
    from trace_lib.compose.local_client import env_factory
    from trace_lib.errors import UserInputError

    with pytest.raises(UserInputError, match="DOMAIN/CAPABILITY"):
        env_factory("nonsense")
    with pytest.raises(UserInputError, match="no 'Nope'"):
        env_factory("json:Nope")


def test_ingested_trajectory_is_replayed_with_roles(tiny_dir, adapter_dirs, db_path,
                                                    tmp_path, capsys) -> None:
    from trace_lib.cli import main
    from trace_lib.ingest import ingest_bytes

    record = {
        "id": "t-1", "task_id": "task-1", "domain": "airline", "agent_model": "m",
        "reward": 0.0,
        "messages": [
            {"role": "system", "content": "policy"},
            {"role": "user", "content": "cancel <b>ABC123</b>"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {
                    "name": "get_reservation_details",
                    "arguments": json.dumps({"reservation_id": "ABC123"})}}]},
            {"role": "tool", "tool_call_id": "c1", "name": "get_reservation_details",
             "content": "{\"status\": \"ok\"}"},
            {"role": "assistant", "content": "It is cancelled."},
        ],
    }
    ingest_bytes("one.jsonl", (json.dumps(record) + "\n").encode(), db=db_path)
    import duckdb

    con = duckdb.connect(str(db_path), read_only=True)
    tid = con.execute("SELECT id FROM trajectories").fetchone()[0]
    con.close()
    compose(str(tiny_dir), [(None, p) for p in adapter_dirs], out=tmp_path / "moe")
    assert main(["route", "--db", str(db_path), "--moe", str(tmp_path / "moe"),
                 "--trajectory", tid, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"system", "user", "assistant", "tool"} <= set(out["roles"])
    assert out["meta"]["outcome"] == "failure" and out["meta"]["trajectory_id"] == tid
    assert max(out["turns"]) == 1
    assert main(["route", "--db", str(db_path), "--moe", str(tmp_path / "moe"),
                 "--trajectory", "missing", "--no-save"]) == 1
    assert "no such trajectory" in capsys.readouterr().err
