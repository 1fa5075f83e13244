"""GRPO arithmetic and the loss mask, on a real tiny Llama with a real LoRA adapter."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from trace_lib.runtime.lora import LoraSettings, attach_lora, trainable_parameters
from trace_lib.train.grpo import LossConfig, group_advantages, grpo_loss, token_logprobs


def _tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )
    return LlamaForCausalLM(cfg)


def test_group_advantages_match_hand_arithmetic():
    out = group_advantages([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5], [1.0, 0.0]])
    # group 0: mean 0.5, population std 0.5 -> +-1; group 1 constant -> dropped
    assert out.n_groups == 3 and out.n_dropped_groups == 1
    assert out.kept == [0, 1, 2, 3, 8, 9]
    expected = [1, -1, -1, 1, 1, -1]
    assert out.advantages == pytest.approx(expected, abs=1e-5)


def test_group_advantages_scales():
    rewards = [[1.0, 0.0, 0.0, 0.0], [0.2, 0.4, 0.2, 0.4]]
    none = group_advantages(rewards, scale="none")
    assert none.advantages == pytest.approx([0.75, -0.25, -0.25, -0.25, -0.1, 0.1, -0.1, 0.1])
    grp = group_advantages(rewards, scale="group")
    std0 = math.sqrt(0.75 * 0.25)
    assert grp.advantages[0] == pytest.approx(0.75 / std0, rel=1e-5)
    assert grp.advantages[4] == pytest.approx(-1.0, rel=1e-4)
    batch = group_advantages(rewards, scale="batch")
    flat = torch.tensor(rewards[0] + rewards[1], dtype=torch.float64)
    bstd = float(flat.std(unbiased=False))
    assert batch.advantages[0] == pytest.approx(0.75 / bstd, rel=1e-5)
    assert batch.advantages[5] == pytest.approx(0.1 / bstd, rel=1e-5)
    with pytest.raises(ValueError, match="advantage scale"):
        group_advantages(rewards, scale="weird")  # type: ignore[arg-type]


def test_all_constant_groups_keep_nothing():
    out = group_advantages([[0.0, 0.0], [1.0, 1.0]])
    assert out.kept == [] and out.advantages == [] and out.n_dropped_groups == 2


def test_loss_clipping_and_token_normalisation():
    cfg = LossConfig(clip_low=0.2, clip_high=0.28)
    old = torch.zeros(2, 3)
    new = torch.log(torch.tensor([[1.5, 1.0, 0.5], [1.5, 1.0, 0.5]])).requires_grad_()
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    loss, stats = grpo_loss(new, old, adv, mask, cfg)
    # row 0 (A=+1): min(r, clip(r)) -> 1.28, 1.0, 0.5 ; row 1 (A=-1): min(-r, -clip(r)) -> -1.5, -1.0
    expected = -(1.28 + 1.0 + 0.5 - 1.5 - 1.0) / 5
    assert stats.loss == pytest.approx(expected, rel=1e-5)
    assert stats.n_tokens == 5
    # clipped where the clipped term differs: row0 t0 (1.5>1.28), row0 t2 (0.5<0.8), row1 t0
    assert stats.clip_fraction == pytest.approx(3 / 5)
    loss.backward()
    assert new.grad[1, 2] == 0.0  # masked
    assert new.grad[0, 0] == 0.0  # clipped: no gradient through the clipped branch
    # total_tokens rescales for gradient accumulation
    loss2, _ = grpo_loss(new, old, adv, mask, cfg, total_tokens=10)
    assert float(loss2.detach()) == pytest.approx(expected / 2, rel=1e-5)


def test_kl_term_needs_reference_and_is_zero_at_reference():
    cfg = LossConfig(kl_coef=0.1)
    lp = torch.randn(1, 4)
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(lp, lp, torch.ones(1), torch.ones(1, 4), cfg)
    _, stats = grpo_loss(lp, lp, torch.ones(1), torch.ones(1, 4), cfg, ref_logp=lp)
    assert stats.kl == pytest.approx(0.0, abs=1e-7)
    _, stats = grpo_loss(lp, lp, torch.ones(1), torch.ones(1, 4), cfg, ref_logp=lp - 0.5)
    assert stats.kl == pytest.approx(math.exp(-0.5) + 0.5 - 1.0, rel=1e-5)


def test_masked_tokens_get_no_gradient_through_a_real_model():
    """An all-zero mask gives an exactly zero LoRA gradient, and the loss's gradient with
    respect to each position's log-prob is zero wherever the mask is 0."""
    model = attach_lora(_tiny_llama(), LoraSettings(rank=4, alpha=8), seed=1)
    # make B non-zero so gradients reach A as well
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(3))
    att = torch.ones_like(ids)
    mask = torch.zeros(2, 11, dtype=torch.long)
    mask[:, 6:] = 1  # only the last tokens were "sampled by the policy"
    adv = torch.tensor([1.0, -0.5])

    def grads(input_ids, m):
        model.zero_grad()
        lp = token_logprobs(model, input_ids, att)
        loss, _ = grpo_loss(lp, lp.detach(), adv, m, LossConfig())
        loss.backward()
        return [p.grad.clone() if p.grad is not None else torch.zeros_like(p)
                for p in trainable_parameters(model)]

    g1 = grads(ids, mask)
    assert any(g.abs().sum() > 0 for g in g1)
    zero = grads(ids, torch.zeros_like(mask))
    assert all(float(g.abs().sum()) == 0.0 for g in zero)
    # Per-position check: gradient of the loss w.r.t. the log-probs is zero where masked.
    lp = token_logprobs(model, ids, att).detach().requires_grad_()
    loss, _ = grpo_loss(lp, lp.detach(), adv, mask, LossConfig())
    loss.backward()
    assert float(lp.grad[:, :6].abs().sum()) == 0.0
    assert float(lp.grad[:, 6:].abs().min()) > 0.0


def test_token_logprobs_match_a_manual_computation():
    model = _tiny_llama()
    ids = torch.tensor([[1, 5, 9, 2]])
    lp = token_logprobs(model, ids, torch.ones_like(ids))
    logits = model(input_ids=ids).logits
    manual = torch.log_softmax(logits[0, :-1], -1)[torch.arange(3), ids[0, 1:]]
    assert torch.allclose(lp[0], manual, atol=1e-5)


def test_token_logprobs_keep_from_skips_prompt_logits_only():
    model = _tiny_llama()
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(0))
    att = torch.ones_like(ids)
    full = token_logprobs(model, ids, att)
    part = token_logprobs(model, ids, att, keep_from=4)
    assert part.shape == full.shape
    assert torch.allclose(part[:, 4:], full[:, 4:], atol=1e-5)
    assert float(part[:, :4].abs().sum()) == 0.0
