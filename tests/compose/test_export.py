"""`moe-merge --per-request`: merged adapters per capability are exact, the router is the
gates' request-level choice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trace_lib.compose.export import Router, export_per_request, request_choice
from trace_lib.compose.gated import MoEConfig, compose
from trace_lib.errors import UserInputError

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Cancel ABC"}]


def _peft_logits(tiny_dir: Path, adapter: Path, ids: torch.Tensor) -> torch.Tensor:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(tiny_dir), dtype=torch.float32)
    with torch.no_grad():
        return PeftModel.from_pretrained(base, str(adapter)).eval()(input_ids=ids).logits


@pytest.fixture
def moe(tiny_dir, adapter_dirs):
    moe = compose(str(tiny_dir), [(None, p) for p in adapter_dirs[:2]],
                  config=MoEConfig("trajectory"))
    with torch.no_grad():  # layer 0 picks adapter 1, layer 1 picks adapter 2, for any request
        moe.gates[0].bias.copy_(torch.tensor([0.0, 4.0, 0.0]))
        moe.gates[1].bias.copy_(torch.tensor([0.0, 0.0, 4.0]))
    return moe


def test_merged_adapter_equals_the_composed_model_on_its_requests(moe, tiny_dir,
                                                                  tmp_path) -> None:
    cap1, cap2 = moe.slots[1:]
    out = export_per_request(moe, tmp_path / "export", {cap1: [(MSGS, None)] * 2})
    routes = out["routes"]
    assert routes[cap1]["layer_slots"] == [1, 2] and routes[cap1]["pattern_agreement"] == 1.0
    assert routes[cap2]["layer_slots"] == [2, 2] and routes[cap2]["requests"] == 0
    assert "--lora-modules" in out["vllm"]
    from trace_lib.runtime.chat_format import render_prompt

    ids = torch.tensor([moe.tokenizer(render_prompt(MSGS, None),
                                      add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        composed = moe(input_ids=ids).logits
    merged = _peft_logits(tiny_dir, tmp_path / "export" / routes[cap1]["adapter"], ids)
    torch.testing.assert_close(merged, composed, atol=1e-5, rtol=1e-4)
    with torch.no_grad(), moe.force(2):
        forced = moe(input_ids=ids).logits  # cap2's pattern is adapter 2 everywhere
    torch.testing.assert_close(_peft_logits(tiny_dir, tmp_path / "export" /
                                            routes[cap2]["adapter"], ids),
                               forced, atol=1e-5, rtol=1e-4)


def test_router_routes_by_the_gates_choice(moe, tmp_path) -> None:
    cap1, cap2 = moe.slots[1:]
    export_per_request(moe, tmp_path / "export", {cap1: [(MSGS, None)]})
    router = Router.load(tmp_path / "export")
    assert request_choice(router.moe, MSGS) == [1, 2]
    assert router.route(MSGS) == cap1
    assert router.route_from_choice([2, 2]) == cap2
    meta = json.loads((tmp_path / "export" / "router.json").read_text())
    assert meta["format"] == "trace-router/1" and set(meta["routes"]) == {cap1, cap2}
    with pytest.raises(UserInputError, match="not capabilities"):
        export_per_request(moe, tmp_path / "x", {"nope": [(MSGS, None)]})


def test_moe_merge_per_request_cli(moe, tmp_path, db_path, capsys) -> None:
    from trace_lib.cli import main

    moe.save(tmp_path / "moe")
    out = tmp_path / "export"
    assert main(["moe-merge", "--db", str(db_path), "--per-request", "--moe",
                 str(tmp_path / "moe"), "--envs",
                 f"{moe.slots[1]}=trace_lib.train.smoke_envs:TargetLetterEnv", "--seeds", "2",
                 "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["routes"][moe.slots[1]]["requests"] == 2
    assert (out / "router.json").is_file() and (out / "moe" / "moe.json").is_file()
    assert main(["moe-merge", "--db", str(db_path), "--per-request", "--out", str(out)]) != 0
    assert "give --moe" in capsys.readouterr().err  # a clear message, not a traceback
