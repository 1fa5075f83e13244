"""The gated model: exactness against peft, sparse == dense, gradients only on gates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trace_lib.compose.adapters import Adapter, LoRAFactors, linear_merge, read_adapters
from trace_lib.compose.gated import GatedMoE, MoEConfig, compose, load_moe
from trace_lib.errors import UserInputError


def _ids(n: int = 2, t: int = 10, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(5, 900, (n, t), generator=g)


def _randomise_gates(moe: GatedMoE, seed: int = 0, std: float = 2.0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for gate in moe.gates:
            gate.weight.copy_(torch.randn(gate.weight.shape, generator=g) * std)
            gate.bias.copy_(torch.randn(gate.bias.shape, generator=g))


@pytest.fixture
def moe(tiny_dir: Path, adapter_dirs: list[Path]) -> GatedMoE:
    return compose(str(tiny_dir), [(None, p) for p in adapter_dirs])


def _peft_logits(tiny_dir: Path, adapter: Path, ids: torch.Tensor) -> torch.Tensor:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(tiny_dir), dtype=torch.float32)
    with torch.no_grad():
        return PeftModel.from_pretrained(base, str(adapter)).eval()(input_ids=ids).logits


def test_zero_gates_are_the_base_and_remove_restores_it(moe: GatedMoE) -> None:
    ids = _ids()
    with torch.no_grad():
        routed = moe(input_ids=ids).logits
        with moe.recording() as rec:
            moe(input_ids=ids)
        moe.remove()
        plain = moe.model(input_ids=ids).logits
    assert torch.equal(routed, plain)
    assert rec.chosen is not None and int(rec.chosen.max()) == 0  # zero gates -> slot 0


@pytest.mark.parametrize("slot", [1, 3])
def test_forcing_a_slot_equals_that_peft_adapter(moe, tiny_dir, adapter_dirs, slot) -> None:
    ids = _ids()
    with torch.no_grad(), moe.force(slot):
        ours = moe(input_ids=ids).logits
    ref = _peft_logits(tiny_dir, adapter_dirs[slot - 1], ids)
    with torch.no_grad():
        base = moe.model(input_ids=ids).logits
    assert (ref - base).abs().max() > 1e-2  # the adapter really changes the model
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-4)


def test_soft_mode_with_zero_gates_is_the_uniform_linear_merge(tiny_dir, adapter_dirs,
                                                               tmp_path) -> None:
    adapters = read_adapters([(None, p) for p in adapter_dirs])
    k = len(adapters)
    # Uniform over K+1 slots: each adapter gets 1/(K+1), the base slot adds nothing.
    merged = linear_merge(adapters, tmp_path / "merge", weights=[1.0 / (k + 1)] * k)
    ids = _ids()
    moe = compose(str(tiny_dir), [(None, p) for p in adapter_dirs], config=MoEConfig("soft"))
    with torch.no_grad():
        ours = moe(input_ids=ids).logits
    torch.testing.assert_close(ours, _peft_logits(tiny_dir, merged, ids), atol=1e-5, rtol=1e-4)


def test_sparse_dispatch_equals_dense_reference_in_forward(moe: GatedMoE) -> None:
    _randomise_gates(moe)
    ids = _ids(3, 16)
    with torch.no_grad(), moe.recording() as rec:
        sparse = moe(input_ids=ids).logits
    counts = torch.bincount(rec.chosen.flatten().long(), minlength=4)
    assert (counts > 0).sum() >= 3  # the test exercises a real mix of experts
    moe.config.dispatch = "dense"
    with torch.no_grad():
        dense = moe(input_ids=ids).logits
    torch.testing.assert_close(sparse, dense, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("estimator", ["chosen", "full"])
def test_sparse_and_dense_agree_in_gate_gradients(tiny_dir, adapter_dirs, estimator) -> None:
    ids = _ids(2, 12, seed=3)
    grads, outs = {}, {}
    for dispatch in ("sparse", "dense"):
        moe = compose(str(tiny_dir), [(None, p) for p in adapter_dirs],
                      config=MoEConfig("top1", dispatch=dispatch, estimator=estimator))
        _randomise_gates(moe, seed=1)
        logits = moe(input_ids=ids).logits
        logits.float().pow(2).mean().backward()
        grads[dispatch] = [g.weight.grad.clone() for g in moe.gates]
        outs[dispatch] = logits.detach()
        with torch.no_grad():
            no_grad = moe(input_ids=ids).logits
        # Straight-through: the training forward's values are the one-hot routing's.
        torch.testing.assert_close(outs[dispatch], no_grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs["sparse"], outs["dense"], atol=1e-5, rtol=1e-5)
    for gs, gd in zip(grads["sparse"], grads["dense"], strict=True):
        assert gd.abs().sum() > 0
        torch.testing.assert_close(gs, gd, atol=1e-6, rtol=1e-4)


def test_only_gates_require_grad_and_their_count(moe: GatedMoE) -> None:
    trainable = [p for p in moe.model.parameters() if p.requires_grad]
    gate_ids = {id(p) for p in moe.gate_parameters()}
    assert {id(p) for p in trainable} == gate_ids
    layers, hidden, k = moe.layers, moe.hidden, moe.k
    assert moe.gate_param_count() == layers * (hidden * (k + 1) + k + 1)
    assert all(g.weight.dtype == torch.float32 for g in moe.gates)
    assert all(float(g.weight.detach().abs().sum()) == 0.0 for g in moe.gates)


def test_reference_backbone_gate_count_is_491760() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=2048, intermediate_size=64, num_hidden_layers=48,
                         num_attention_heads=16, num_key_value_heads=16, vocab_size=64)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    adapters = [Adapter(name=f"cap{i}", path=Path(f"/a{i}"), base_model=None, rank=1, alpha=1,
                        target_modules=["q_proj"],
                        factors={"model.layers.0.self_attn.q_proj": LoRAFactors(
                            A=torch.zeros(1, 2048), B=torch.zeros(2048, 1), scale=1.0)})
                for i in range(4)]
    moe = GatedMoE(model, adapters)
    assert (moe.layers, moe.hidden, moe.k) == (48, 2048, 4)
    assert moe.gate_param_count() == 491_760


def test_trajectory_mode_holds_one_choice_through_generation(tiny_dir, adapter_dirs) -> None:
    moe = compose(str(tiny_dir), [(None, p) for p in adapter_dirs],
                  config=MoEConfig("trajectory"))
    _randomise_gates(moe, seed=5)
    ids = _ids(1, 12, seed=9)
    with torch.no_grad(), moe.recording() as rec:
        out = moe.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6,
                           do_sample=False, pad_token_id=0)
    chosen = rec.chosen[0]  # [T, L]
    assert chosen.shape[0] == out.shape[1] - 1  # prefill + every decode step but the last
    assert (chosen == chosen[:1]).all()  # one slot per layer for the whole sequence
    pooled = rec.probs[0, :12].mean(0)  # [L, K+1] over the prompt
    assert torch.equal(chosen[0].long(), pooled.argmax(-1))


def test_top1_generation_with_cache_matches_without(moe: GatedMoE) -> None:
    _randomise_gates(moe, seed=2)
    ids = _ids(1, 8, seed=4)
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
              pad_token_id=0)
    with torch.no_grad():
        cached = moe.generate(input_ids=ids, use_cache=True, **kw)
        uncached = moe.generate(input_ids=ids, use_cache=False, **kw)
    assert torch.equal(cached, uncached)


def test_save_and_load_roundtrip(moe: GatedMoE, tmp_path: Path, tiny_dir: Path) -> None:
    _randomise_gates(moe, seed=7)
    ids = _ids()
    with torch.no_grad():
        before = moe(input_ids=ids).logits
    moe.save(tmp_path / "moe")
    meta = json.loads((tmp_path / "moe" / "moe.json").read_text())
    assert meta["experts"] == moe.slots[1:] and meta["gate_params"] == moe.gate_param_count()
    assert all((tmp_path / "moe" / a["path"] / "adapter_model.safetensors").is_file()
               for a in meta["adapters"])
    again = load_moe(tmp_path / "moe")
    with torch.no_grad():
        after = again(input_ids=ids).logits
    torch.testing.assert_close(before, after)


def test_capability_names_come_from_trace_adapter_json(moe: GatedMoE) -> None:
    assert moe.slots == ["base", "precondition_verification", "tool_calling_precision",
                         "structured_reasoning"]


def test_adapter_for_another_base_is_refused_with_its_path(tiny_dir, tmp_path) -> None:
    from safetensors.torch import save_file

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": 2, "lora_alpha": 2, "target_modules": ["q_proj"]}))
    save_file({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight":
               torch.zeros(2, 99),
               "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight":
               torch.zeros(64, 2)}, str(bad / "adapter_model.safetensors"))
    with pytest.raises(UserInputError, match=r"bad.*q_proj.*another base"):
        compose(str(tiny_dir), [(None, bad)])


@pytest.mark.parametrize("config,match", [
    ({"peft_type": "LORA", "use_dora": True}, "DoRA"),
    ({"peft_type": "LORA", "modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"peft_type": "IA3"}, "expected 'LORA'"),
])
def test_unsupported_adapter_kinds_are_named(tmp_path, config, match) -> None:
    from trace_lib.compose.adapters import read_adapter

    (tmp_path / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(UserInputError, match=match):
        read_adapter(tmp_path)


def test_missing_folder_and_duplicate_names(tmp_path, adapter_dirs) -> None:
    from trace_lib.compose.adapters import read_adapter

    with pytest.raises(UserInputError, match="no adapter_config.json"):
        read_adapter(tmp_path / "nope")
    with pytest.raises(UserInputError, match="two adapters are named"):
        read_adapters([("x", adapter_dirs[0]), ("x", adapter_dirs[1])])


def test_mix_is_the_exact_linear_merge(moe: GatedMoE, tiny_dir, adapter_dirs, tmp_path) -> None:
    k = moe.k
    merged = linear_merge(moe.adapters, tmp_path / "merge", weights=[1.0 / k] * k)
    ids = _ids()
    _randomise_gates(moe)  # a fixed mix ignores the gates
    with torch.no_grad(), moe.mix([0.0] + [1.0 / k] * k):
        ours = moe(input_ids=ids).logits
    torch.testing.assert_close(ours, _peft_logits(tiny_dir, merged, ids), atol=1e-5, rtol=1e-4)
    with pytest.raises(UserInputError, match="expected 4 weights"):
        with moe.mix([1.0]):
            pass


# --------------------------------------------------------------- trajectory: the request
def _episode(tok):
    """A two-turn tool episode: (first prompt ids, full episode ids, its messages)."""
    from trace_lib.runtime.chat_format import render_prompt

    messages = [{"role": "system", "content": "Policy: be careful. " * 6},
                {"role": "user", "content": "Cancel reservation ABC123 please"},
                {"role": "assistant", "content": "",
                 "tool_calls": [{"id": "c1", "type": "function",
                                 "function": {"name": "get", "arguments": {"id": "ABC123"}}}]},
                {"role": "tool", "tool_call_id": "c1", "name": "get",
                 "content": "{\"status\": \"flown\"}"},
                {"role": "assistant", "content": "It has flown, so no."}]
    first = tok(render_prompt(messages[:2], None), add_special_tokens=False)["input_ids"]
    full = tok(render_prompt(messages, None, add_generation_prompt=False),
               add_special_tokens=False)["input_ids"]
    return first, full, messages


def test_request_mask_is_the_user_turn_not_tool_results(moe: GatedMoE) -> None:
    from trace_lib.compose.gated import request_mask

    first, full, _ = _episode(moe.tokenizer)
    mask = request_mask(torch.tensor([full]), moe._markers)[0]
    text = moe.tokenizer.decode([t for t, m in zip(full, mask.tolist(), strict=True) if m])
    assert text.startswith("Cancel reservation ABC123 please")
    assert "flown" not in text and "Policy" not in text and "assistant" not in text
    assert mask[len(first):].sum() == 0  # nothing after the first prompt is "the request"


def test_trajectory_choice_is_the_same_in_every_turn_and_in_the_loss_pass(
        tiny_dir, adapter_dirs) -> None:
    """Rollout turn 1 (prefill of the first prompt), a later turn (the prompt grown by a
    reply and a tool result) and the loss pass (the whole episode, teacher-forced) all pool
    over the request tokens, so they route identically."""
    moe = compose(str(tiny_dir), [(None, p) for p in adapter_dirs],
                  config=MoEConfig("trajectory"))
    _randomise_gates(moe, seed=5, std=4.0)
    first, full, _ = _episode(moe.tokenizer)
    turn2 = full[:-5]  # a later turn's prompt: everything up to part of the last reply
    choices = []
    for ids in (first, turn2, full):
        with torch.no_grad(), moe.recording() as rec:
            moe(input_ids=torch.tensor([ids]))
        choices.append(rec.chosen[0, -1].tolist())  # the held per-layer choice
    assert choices[0] == choices[1] == choices[2]


def test_zero_gates_get_a_gradient_through_the_straight_through_estimator(
        tiny_dir, adapter_dirs) -> None:
    """From zero init every token goes to the base, yet the full estimator gives every
    gate a gradient; the chosen-slot estimator gives none (slot 0 multiplies nothing)."""
    ids = _ids(1, 12, seed=2)
    for mode in ("top1", "trajectory"):
        moe = compose(str(tiny_dir), [(None, p) for p in adapter_dirs],
                      config=MoEConfig(mode, estimator="full"))
        moe(input_ids=ids).logits.float().pow(2).mean().backward()
        assert all(float(g.weight.grad.abs().sum()) > 0 for g in moe.gates), mode
    moe = compose(str(tiny_dir), [(None, p) for p in adapter_dirs],
                  config=MoEConfig("top1", estimator="chosen"))
    out = moe(input_ids=ids).logits
    assert not out.requires_grad  # the loss does not depend on zero gates at all
