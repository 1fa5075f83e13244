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


def _request_dependent_moe(tiny_dir: Path, adapter_dirs: list[Path]):
    """Gates with random weights: different requests make different choices."""
    moe = compose(str(tiny_dir), [(None, p) for p in adapter_dirs[:2]],
                  config=MoEConfig("trajectory"))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for gate in moe.gates:
            gate.weight.copy_(torch.randn(gate.weight.shape, generator=g) * 6.0)
    return moe


# One long shared system block, as a target benchmark's prompts have, and short requests.
SHARED = {"role": "system", "content": "You are an airline agent. " * 40}
REQUESTS = [[SHARED, {"role": "user", "content": f"Please cancel reservation {c}{i}X{i * 7}"}]
            for i in range(12) for c in "AB"]


def test_router_over_the_cached_shared_prefix_routes_as_the_full_prefill(
        tiny_dir, adapter_dirs, tmp_path) -> None:
    moe = _request_dependent_moe(tiny_dir, adapter_dirs)
    full = [request_choice(moe, m) for m in REQUESTS]
    kinds = sorted({tuple(c) for c in full}, key=lambda c: -full.count(list(c)))
    assert len(kinds) >= 3  # two routes, and requests that fit neither
    cap1, cap2 = moe.slots[1:]
    examples = {cap: [(REQUESTS[full.index(list(kinds[i]))], None)]
                for i, cap in enumerate((cap1, cap2))}
    export_per_request(moe, tmp_path / "export", examples)
    router = Router.load(tmp_path / "export")
    assert [router.patterns[cap1], router.patterns[cap2]] == [list(kinds[0]), list(kinds[1])]
    routed = [router.route(m) for m in REQUESTS]
    assert routed == [router.route_from_choice(c) for c in full]
    # A choice that is no route's pattern pays the full prefill the first time it is seen;
    # its prefix cache is kept, so the next request making it runs over the cache too.
    seen, first_seen = set(kinds[:2]), 0
    for c in full:
        first_seen += tuple(c) not in seen
        seen.add(tuple(c))
    assert first_seen >= 1
    assert router.route_stats == {"prefix_cache": len(REQUESTS) - first_seen,
                                  "full_prefill": first_seen}
    assert len(router._prefixes) == 1  # every request shared the one prefix
    assert set(next(iter(router._prefixes.values()))) == seen
    assert [router.route(m) for m in REQUESTS[::-1]] == routed[::-1]  # all over the cache now
    assert router.route_stats["full_prefill"] == first_seen


def test_a_request_over_a_prefix_prefilled_under_its_own_choice_is_the_full_prefill(
        tiny_dir, adapter_dirs) -> None:
    from trace_lib.compose.export import prefill_choice, request_ids

    moe = _request_dependent_moe(tiny_dir, adapter_dirs)
    router = Router(moe=moe, patterns={}, adapters={})
    ids = request_ids(moe, REQUESTS[0])
    split = router.shared_prefix_length(ids)
    assert 0 < split < len(ids) - 5
    pattern = request_choice(moe, REQUESTS[0])
    assert prefill_choice(moe, ids, keep_prefix=split)[0] == pattern
    with torch.no_grad():
        whole = moe(input_ids=torch.tensor([ids])).logits[0, -1]
        with moe.force(pattern):
            cache = moe(input_ids=torch.tensor([ids[:split]]), use_cache=True).past_key_values
        with moe.request_over_prefix(), moe.recording() as rec:
            tail = moe(input_ids=torch.tensor([ids[split:]]), past_key_values=cache,
                       use_cache=True).logits[0, -1]
    assert rec.chosen[0, -1].tolist() == pattern
    torch.testing.assert_close(tail, whole, atol=1e-5, rtol=1e-4)
    with pytest.raises(UserInputError, match="a pattern of 1 layers"), moe.force([1]):
        pass


def test_router_prefix_bench_routes_target_tasks_both_ways(moe, tmp_path, capsys) -> None:
    """bench/router_prefix.py on tiny: the airline target tasks' opening requests, full
    prefill and cached prefix, the same routes."""
    import importlib.util

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("bench_router_prefix",
                                                  root / "bench" / "router_prefix.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    export_per_request(moe, tmp_path / "export")
    out = tmp_path / "figures.json"
    assert bench.main(["--router", str(tmp_path / "export"), "--tasks", "3",
                       "--out", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["routes_agree"] == "3/3" and figures["requests"] == 3
    assert 0 < figures["shared_prefix_tokens"] < figures["prompt_tokens"]
    assert sum(figures["paths"].values()) == 3
    assert "ratio" in capsys.readouterr().out
