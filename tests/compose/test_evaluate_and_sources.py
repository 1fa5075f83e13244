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


def test_moe_eval_derives_its_turn_budget_from_the_environments(tiny_dir, adapter_dirs,
                                                                 db_path, tmp_path, capsys,
                                                                 monkeypatch) -> None:
    """Issue 30: `moe-eval` had a fixed --max-tokens 96. Given none, it derives the budget
    as training does (the one `reference_turn_budget`: the environments' longest reference
    turn in the composed model's tokens + 25%, rounded up to 32), says so on stderr (stdout
    stays one JSON document) and records it in eval.json and on the model's row."""
    from trace_lib import cli
    from trace_lib.runtime.chat_format import IM_END
    from trace_lib.train.local_rollouts import derived_max_tokens
    from trace_lib.workbench import composition

    monkeypatch.syspath_prepend(str(HERE))
    from toy_env import ReferenceVowelEnv

    moe = compose(str(tiny_dir), [(None, p) for p in adapter_dirs[:2]], out=tmp_path / "moe")
    parser = cli.build_parser()
    for verb in ("moe-eval", "gates"):
        args = parser.parse_args([verb, "--moe", "m", "--envs", "e"])
        assert args.max_tokens is None, verb  # no fixed default left on either verb
    # What the reference turn is, counted here by hand: the answer and its end marker.
    longest = len(moe.tokenizer(ReferenceVowelEnv.REFERENCE + IM_END,
                                add_special_tokens=False)["input_ids"])
    expected = derived_max_tokens(longest)
    assert longest > 64 and expected % 32 == 0
    assert expected >= longest * 1.25 and expected != 96

    env = "toy_env:ReferenceVowelEnv"
    argv = ["moe-eval", "--db", str(db_path), "--moe", str(tmp_path / "moe"), "--envs", env,
            "--seeds", "1", "--max-turns", "1", "--no-merge", "--json"]
    capsys.readouterr()
    assert cli.main(argv) == 0
    out = capsys.readouterr()
    result = json.loads(out.out)
    assert result["max_tokens"] == expected
    assert result["turn_budget"]["longest_reference_turn"] == longest
    assert f"[moe-eval] --max-tokens {expected}: the environments' longest reference turn " \
           f"is {longest} tokens" in out.err
    saved = json.loads((tmp_path / "moe" / "eval.json").read_text())
    assert saved["config"]["max_tokens"] == expected
    assert saved["config"]["turn_budget"]["max_tokens"] == expected
    row = next(m for m in composition.list_moe_models(db_path)
               if Path(m["path"]).resolve() == (tmp_path / "moe").resolve())
    assert row["metrics"]["eval_settings"]["max_tokens"] == expected
    # The page's hint before the click is the same number, from the same function.
    hint = composition.eval_max_tokens_default(moe, [env], db_path, max_turns=1)
    assert hint["max_tokens"] == expected and hint["longest_reference_turn"] == longest

    # A given budget is used as given and recorded as given (no derivation).
    assert cli.main([*argv[:-1], "--max-tokens", "5", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["max_tokens"] == 5 and result["turn_budget"] is None
    assert json.loads((tmp_path / "moe" / "eval.json").read_text())["config"]["max_tokens"] == 5
