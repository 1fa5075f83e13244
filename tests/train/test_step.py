"""The one GRPO step (`trace_lib.train.step`): no-signal accounting, the old policy with
several epochs, hinted rollouts' truncated importance weight, temperature in the loss, and
the in-process rollouts' shared-prompt forward. Real tiny model, real backward passes."""

from __future__ import annotations

import pytest
import torch

from trace_lib.runtime.base_models import load_model
from trace_lib.runtime.lora import attach_lora, trainable_parameters
from trace_lib.runtime.rollout import Rollout
from trace_lib.train.config import LoraSettings
from trace_lib.train.grpo import token_logprobs
from trace_lib.train.step import GRPOStep, NoSignalError, StepSettings, TokenForward

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny():
    base, tok = load_model("tiny")
    model = attach_lora(base, LoraSettings(rank=4, alpha=4, targets=["q_proj", "v_proj"]))
    model.eval()
    return model, tok


def _rollout(tok, reward: float, hinted: bool = False, lp: float | None = -1.0) -> Rollout:
    ids = tok("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
              add_special_tokens=False)["input_ids"]
    out = tok("yes it is<|im_end|>", add_special_tokens=False)["input_ids"]
    return Rollout(seed=0, hinted=hinted, token_ids=ids + out,
                   loss_mask=[0] * len(ids) + [1] * len(out),
                   sampler_logprobs=[None] * len(ids) + [lp] * len(out), messages=[],
                   reward=reward)


def _step(model, settings: StepSettings) -> GRPOStep:
    params = trainable_parameters(model)
    opt = torch.optim.AdamW(params, lr=1e-3)
    return GRPOStep(params, opt, settings, forward=TokenForward(model, settings.temperature),
                    train_mode=lambda on: model.train(on))


def test_constant_groups_are_no_signal_steps_counted_and_warned(tiny, capsys):
    model, tok = tiny
    step = _step(model, StepSettings(no_signal_warn_after=2))
    flat = [[_rollout(tok, 0.0), _rollout(tok, 0.0)]]
    first = step.update(flat).metrics
    assert first["no_signal"] and first["no_signal_steps"] == 1 and first["loss"] == 0.0
    assert first["no_signal_warning"] is None
    second = step.update(flat).metrics
    assert second["no_signal_consecutive"] == 2 and "no learning signal" in \
        second["no_signal_warning"]
    assert "WARNING: no learning signal for 2 consecutive steps" in capsys.readouterr().err
    moving = step.update([[_rollout(tok, 0.0), _rollout(tok, 1.0)]]).metrics
    assert not moving["no_signal"] and moving["no_signal_consecutive"] == 0
    assert moving["no_signal_steps"] == 2 and moving["grad_norm"] > 0


def test_stop_on_no_signal_raises(tiny):
    model, tok = tiny
    step = _step(model, StepSettings(no_signal_warn_after=1, stop_on_no_signal=True))
    with pytest.raises(NoSignalError, match="no learning signal"):
        step.update([[_rollout(tok, 1.0), _rollout(tok, 1.0)]])


def test_several_epochs_use_the_samplers_logprobs_as_old_policy(tiny):
    """With the sampler's log-probs far from the model's, the ratio is far from 1 and
    clipping shows it from the first epoch; with one epoch the ratio is exactly 1."""
    model, tok = tiny
    group = [[_rollout(tok, 0.0, lp=-30.0), _rollout(tok, 1.0, lp=-30.0)]]
    two = _step(model, StepSettings(epochs_per_step=2)).update(group).metrics
    one = _step(model, StepSettings(epochs_per_step=1)).update(group).metrics
    assert two["clip_fraction"] > 0.4
    assert one["clip_fraction"] == 0.0


def test_hinted_tokens_get_a_truncated_importance_weight(tiny):
    model, tok = tiny
    # sampler log-prob 0 (p=1 under the hint) vs the plain prompt's lower p: weight < 1
    group = [[_rollout(tok, 0.0, hinted=True, lp=0.0), _rollout(tok, 1.0, hinted=True, lp=0.0)]]
    m = _step(model, StepSettings()).update(group).metrics
    assert 0.0 < m["hint_weight_mean"] < 1.0
    plain = _step(model, StepSettings()).update([[_rollout(tok, 0.0), _rollout(tok, 1.0)]])
    assert plain.metrics["hint_weight_mean"] == 1.0


def test_loss_logprobs_use_the_samplers_temperature(tiny):
    model, tok = tiny
    r = _rollout(tok, 0.0)
    ids = torch.tensor([r.token_ids])
    att = torch.ones_like(ids)
    with torch.no_grad():
        at1 = token_logprobs(model, ids, att)
        at2 = token_logprobs(model, ids, att, temperature=2.0)
        logits = model(input_ids=ids).logits[0, :-1].float() / 2.0
        manual = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    assert torch.allclose(at2[0], manual, atol=1e-5)
    assert not torch.allclose(at1, at2)
    assert TokenForward(model, 2.0).temperature == 2.0


def test_prefix_forward_equals_the_full_forward_and_rollouts_keep_their_tokens(tiny):
    from trace_lib.envs.capabilities import make_capability_env
    from trace_lib.train.local_rollouts import (
        LocalRolloutConfig,
        LocalRollouts,
        PrefixForward,
        reference_episode,
    )

    model, tok = tiny

    def make_env():
        return make_capability_env("airline", "precondition_verification", difficulty=1,
                                   tools="capability", policy="excerpt", distractors=0)

    engine = LocalRollouts(model, tok, LocalRolloutConfig(max_tokens=6, max_turns=2, chunk=4))
    [[greedy, sampled]] = engine.run(make_env, [5], [0.0, 1.0])
    assert engine.prefix_ids and greedy.token_ids[: len(engine.prefix_ids)] == engine.prefix_ids
    fwd = PrefixForward(model, engine.prefix_ids, temperature=1.0)
    ids = torch.tensor([sampled.token_ids])
    att = torch.ones_like(ids)
    with torch.no_grad():
        a = fwd(ids, att, 0, []).logprobs
        b = token_logprobs(model, ids, att)
    mask = torch.tensor([sampled.loss_mask])[:, 1:].bool()
    assert mask.any() and torch.allclose(a[mask], b[mask], atol=1e-4)
    # the sampler's log-probs are the model's, token for token
    samp = torch.tensor([[x if x is not None else 0.0 for x in sampled.sampler_logprobs]])
    assert torch.allclose(samp[:, 1:][mask], b[mask], atol=1e-4)
    # reference episodes for SFT: assistant tokens masked in, the rest out
    seq, m = reference_episode(make_env(), 5, tok)
    text = tok.decode([t for t, k in zip(seq, m, strict=True) if k])
    assert "get_reservation_details" in text and "<tool_response>" not in text


def test_a_pass_scores_its_own_shared_prompt_once_and_equals_the_full_forward(tiny):
    """`PrefixForward(model, None)`: the GRPO step's forward for a policy server's rollouts.
    The pass's common prefix, capped at `keep_from` so no scored token falls inside it,
    runs without gradient; right-padded rows of different lengths score as the full
    forward does, and the loss still reaches the adapter through the rest."""
    from trace_lib.train.local_rollouts import PrefixForward

    model, _ = tiny
    torch.manual_seed(0)
    shared = torch.randint(5, 100, (12,)).tolist()
    rows = [shared + [7, 8, 9, 10, 11], shared + [7, 8, 20], shared[:10]]  # 3rd: shorter
    T = max(map(len, rows))
    ids = torch.tensor([r + [0] * (T - len(r)) for r in rows])
    att = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in rows])
    fwd = PrefixForward(model, None, temperature=1.0)
    assert fwd._prefix(ids, att, keep_from=8) == shared[:8]  # capped at keep_from
    assert fwd._prefix(ids, att, keep_from=99) == shared[:9]  # the short row's length - 1
    a = fwd(ids, att, 8, []).logprobs
    with torch.no_grad():
        b = token_logprobs(model, ids, att)
    scored = att[:, 1:].bool()
    scored[:, :8] = False  # positions < keep_from carry no loss (zeros in both)
    assert torch.allclose(a[scored], b[scored], atol=1e-4)
    model.zero_grad()
    (-a[scored].sum()).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and any(g.abs().max() > 0 for g in grads)
    model.zero_grad()
    # With the rows' loss masks (rollouts), only the positions a loss reads are scored:
    # the same values there, zeros elsewhere, and the same gradient.
    masks = [[0] * 13 + [1, 1, 0, 1], [0] * 14 + [1], [0] * 10]
    rolls = [Rollout(seed=0, hinted=False, token_ids=r, loss_mask=m, sampler_logprobs=[],
                     messages=[]) for r, m in zip(rows, masks, strict=True)]
    loss_at = torch.zeros_like(scored)
    for row, m in enumerate(masks):
        for i, k in enumerate(m):
            if k:
                loss_at[row, i - 1] = True
    c = fwd(ids, att, 8, rolls).logprobs.detach()
    assert torch.allclose(c[loss_at], b[loss_at], atol=1e-4)
    kept = {12, 13, 15}  # positions any row scores (12, 13, 15 for row 0; 13 for row 1)
    assert all(float(c[:, t].abs().max()) == 0.0 for t in range(T - 1) if t not in kept)
    grad_of = {}
    for name, given in (("all", []), ("masked", rolls)):
        model.zero_grad()
        (-fwd(ids, att, 8, given).logprobs[loss_at].sum()).backward()
        grad_of[name] = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    assert all(torch.allclose(x, y, atol=1e-5)
               for x, y in zip(grad_of["all"], grad_of["masked"], strict=True))


def test_a_pass_is_bounded_by_rows_and_padded_tokens():
    from trace_lib.train.step import micro_batches

    assert micro_batches([10, 10, 10, 10, 10], rows=2) == [[0, 1], [2, 3], [4]]
    # long episodes: 3 x 3000 padded would be 9000 > 6144, so two passes
    assert micro_batches([3000, 2000, 3000], rows=4, tokens=6144) == [[0, 1], [2]]
    # a row longer than the cap still gets its own pass; short ones regroup after it
    assert micro_batches([100, 9000, 100, 100], rows=4, tokens=6144) == [[0], [1], [2, 3]]
    assert micro_batches([], rows=4) == []
