"""`compose`, `route` and `moe-merge` through the real CLI entry point, with a real store."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import numpy as np
import pytest
import torch

from trace_lib.cli import main
from trace_lib.compose.traces import RoutingTrace, entropy, majority, share


def _run(capsys, *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def composed(tmp_path, tiny_dir, adapter_dirs, db_path, capsys) -> Path:
    out = tmp_path / "moe"
    result = _run(capsys, "compose", "--db", str(db_path), "--model", str(tiny_dir),
                  "--adapters", ",".join(str(p) for p in adapter_dirs), "--out", str(out),
                  "--json")
    assert result["path"] == str(out.resolve())
    assert (result["layers"], result["hidden"]) == (2, 64)
    assert result["experts"] == ["precondition_verification", "tool_calling_precision",
                                 "structured_reasoning"]
    assert result["gate_params"] == 2 * (64 * 4 + 4)
    # Give the gates a real routing so the trace shows a mix of experts.
    from safetensors.torch import load_file, save_file

    gates = load_file(str(out / "gates.safetensors"))
    g = torch.Generator().manual_seed(0)
    save_file({k: torch.randn(v.shape, generator=g) * 2 for k, v in gates.items()},
              str(out / "gates.safetensors"))
    return out


def test_route_prompt_prints_tokens_roles_and_routing(composed, db_path, capsys) -> None:
    out = _run(capsys, "route", "--db", str(db_path), "--moe", str(composed), "--prompt",
               "Cancel reservation <b>ABC123</b> please", "--system", "Be careful.",
               "--max-new-tokens", "5", "--json")
    n = len(out["tokens"])
    assert n == len(out["roles"]) == len(out["chosen"]) == len(out["probs"])
    assert set(out["roles"]) >= {"system", "user", "assistant"}
    assert out["roles"].index("system") < out["roles"].index("user")
    assert all(len(row) == 2 for row in out["chosen"])  # one slot per layer
    assert all(abs(sum(p) - 1) < 1e-2 for row in out["probs"] for p in row)
    assert "".join(out["tokens"]).count("ABC123") == 1
    assert out["slots"][0] == "base" and len(out["slots"]) == 4
    assert out["prompt_len"] < n  # it generated
    trace = RoutingTrace.load(out["path"])
    assert trace.chosen.tolist() == out["chosen"]
    con = duckdb.connect(str(db_path), read_only=True)
    row = con.execute("SELECT moe_id, n_tokens, n_layers, source FROM routing_traces").fetchone()
    moe_row = con.execute("SELECT id, gate_params, mode FROM moe_models").fetchone()
    con.close()
    assert row[0] == moe_row[0] and row[1:] == (n, 2, "prompt")
    assert moe_row[1:] == (520, "top1")


def test_route_force_routes_every_token_to_one_slot(composed, db_path, capsys) -> None:
    out = _run(capsys, "route", "--db", str(db_path), "--moe", str(composed), "--prompt", "hi",
               "--force", "2", "--max-new-tokens", "3", "--no-save", "--json")
    assert {c for row in out["chosen"] for c in row} == {2}
    assert "path" not in out


def test_route_needs_exactly_one_source(composed, db_path, capsys) -> None:
    assert main(["route", "--db", str(db_path), "--moe", str(composed)]) == 1
    assert "exactly one of --prompt" in capsys.readouterr().err


def test_compose_refuses_a_missing_adapter(tmp_path, tiny_dir, db_path, capsys) -> None:
    code = main(["compose", "--db", str(db_path), "--model", str(tiny_dir), "--adapters",
                 str(tmp_path / "missing"), "--out", str(tmp_path / "o")])
    assert code == 1
    assert "missing" in capsys.readouterr().err


def test_moe_merge_writes_a_peft_folder(adapter_dirs, tmp_path, capsys) -> None:
    out = _run(capsys, "moe-merge", "--adapters", f"a={adapter_dirs[0]},b={adapter_dirs[1]}",
               "--weights", "0.7,0.3", "--out", str(tmp_path / "m"), "--json")
    assert out["adapters"] == ["a", "b"] and out["weights"] == [0.7, 0.3]
    cfg = json.loads((tmp_path / "m" / "adapter_config.json").read_text())
    assert cfg["r"] == 8 and cfg["peft_type"] == "LORA"


def test_trace_summaries_are_consistent() -> None:
    chosen = np.array([[0, 1], [1, 1], [2, 2], [2, 0]])
    probs = np.full((4, 2, 3), 1 / 3)
    trace = RoutingTrace(token_ids=[1, 2, 3, 4], tokens=["a", "b", "c", "d"],
                         roles=["user", "user", "assistant", "assistant"], turns=[0, 0, 0, 1],
                         chosen=chosen, probs=probs, slots=["base", "x", "y"], prompt_len=2)
    assert majority(trace).tolist() == [0, 1, 2, 0]
    np.testing.assert_allclose(entropy(trace), np.log(3))
    rows = {(r["role"], r["expert"]): r["share"] for r in share(trace, by="role")}
    assert rows[("user", "x")] == 0.75 and rows[("assistant", "y")] == 0.75
    assert sum(v for (role, _), v in rows.items() if role == "user") == pytest.approx(1.0)
    turn_rows = share(trace, by="turn", layer=1)
    assert {r["turn"] for r in turn_rows} == {0, 1}


def _trained_run(make_adapter, tiny_dir: Path, run: Path, seed: int, no_signal: list[bool],
                 sft_steps: int = 0) -> Path:
    """An adapter as a training run leaves it: `<run>/adapter` and `<run>/metrics.jsonl`
    with one row per GRPO step (and `sft.jsonl` for a warm start)."""
    adapter = make_adapter(tiny_dir, run / "adapter", seed=seed, capability=run.name)
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"step": i, "reward_mean": 0.0, "no_signal": q}) + "\n"
        for i, q in enumerate(no_signal)))
    if sft_steps:
        (run / "sft.jsonl").write_text("".join(
            json.dumps({"step": i, "loss": 1.0}) + "\n" for i in range(sft_steps)))
    return adapter


def test_composing_an_adapter_that_learned_nothing_warns(tmp_path, tiny_dir, db_path,
                                                        adapter_factory, capsys) -> None:
    """Issue 34: the run's own metrics say every GRPO step had no signal; compose still
    builds the mixture (a control may be wanted) and says so, on stderr and in --json."""
    from trace_lib.workbench import composition

    quiet = _trained_run(adapter_factory, tiny_dir, tmp_path / "quiet_run", 1, [True, True, True])
    learned = _trained_run(adapter_factory, tiny_dir, tmp_path / "good_run", 2, [True, False, True])
    warm = _trained_run(adapter_factory, tiny_dir, tmp_path / "warm_run", 3, [True, True], sft_steps=4)
    out = _run(capsys, "compose", "--db", str(db_path), "--model", str(tiny_dir),
               "--adapters", f"quiet={quiet},good={learned}", "--out",
               str(tmp_path / "moe"), "--json")
    [warning] = out["warnings"]
    assert warning.startswith("Adapter quiet") and "no learning signal" in warning
    assert "all 3 GRPO steps" in warning and "base model under another name" in warning
    assert out["experts"] == ["quiet", "good"]  # composed all the same
    assert main(["compose", "--db", str(db_path), "--model", str(tiny_dir), "--adapters",
                 f"quiet={quiet}", "--out", str(tmp_path / "moe2")]) == 0
    assert "warning: Adapter quiet" in capsys.readouterr().err
    # a warm start changed the adapter: said so; an adapter from elsewhere: no verdict
    [warm_warning] = composition.adapter_warnings(db_path, f"warm={warm}")
    assert "only its 4-step SFT warm start changed it" in warm_warning
    assert composition.adapter_warnings(db_path, f"good={learned}") == []


def test_the_recorded_job_run_directory_is_used(tmp_path, tiny_dir, db_path,
                                                adapter_factory) -> None:
    """An adapter copied out of its run is still judged by its job's run (the jobs row)."""
    import shutil

    from trace_lib import jobs
    from trace_lib.workbench import composition
    from trace_lib.workbench import jobs as wb_jobs
    from trace_lib.workbench.training import record_adapter

    run = tmp_path / "runs" / "train-x"
    adapter = _trained_run(adapter_factory, tiny_dir, run, 4, [True, True])
    moved = tmp_path / "elsewhere" / "my_adapter"
    shutil.copytree(adapter, moved)
    spec = jobs.JobSpec(kind=jobs.TRAIN_ADAPTER, config={"env": "x"}, id="train-x",
                        run_dir=str(run))
    wb_jobs.record_job(db_path, spec)
    record_adapter(db_path, {"capability": "cap", "env": "x", "base_model": "tiny",
                             "adapter_path": str(moved.resolve())}, "train-x")
    [warning] = composition.adapter_warnings(db_path, str(moved))
    assert "train-x" in warning and "all 2 GRPO steps" in warning
