"""GRPO arithmetic: group advantages, per-token log-probabilities and the clipped loss.

Design decisions
- A group is the G rollouts of one seed. The advantage of rollout i is
  (r_i - mean(group)) / (std + eps); `scale` chooses the std: "group" (the group's own,
  the DeepSeekMath form), "batch" (the std over every kept rollout of the step, which
  stops a near-constant group from blowing small differences up), or "none" (no division,
  the Dr. GRPO form). std is the population std (ddof=0), as in the reference.
- Groups whose rewards are all equal carry no signal (every advantage is 0) and are
  dropped before any forward pass, so they cost no compute; how many were dropped is a
  metric.
- The loss is token-level (DAPO): the clipped surrogate is summed over every sampled token
  of every sequence in the step and divided by the number of those tokens, so long
  rollouts do not get less weight per token than short ones. With gradient accumulation
  each micro-batch divides by the token count of the whole step, so the accumulated
  gradient equals the gradient of one big batch exactly.
- Clip-higher: ratio clipped to [1 - clip_low, 1 + clip_high] (0.2 / 0.28 by default).
- KL is optional and off by default (the reference trains without it). When on, it is the
  k3 estimator exp(ref - new) - (ref - new) - 1 against the frozen base, which for a LoRA
  policy is the same model with the adapter disabled: no second copy of the weights.
- Only tokens the policy sampled carry loss: `loss_mask` is 1 on them and 0 on system,
  user and tool tokens; masked positions contribute exactly zero gradient (they are
  multiplied out before the sum, not merely down-weighted).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trace_lib.train.config import ADVANTAGE_SCALES, AdvantageScale, LossConfig


@dataclass
class GroupAdvantages:
    """Advantages of the kept rollouts, in the order of `kept` (indices into the flat batch)."""

    advantages: list[float]
    kept: list[int]
    n_groups: int
    n_dropped_groups: int


def group_advantages(
    rewards: list[list[float]], scale: AdvantageScale = "group", eps: float = 1e-6
) -> GroupAdvantages:
    """Advantages for `rewards[g][i]` (group g, rollout i); constant groups are dropped.

    `kept` indexes the flattened batch (group-major), so rollout i of group g is
    `sum(len(rewards[:g])) + i`.
    """
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"advantage scale must be one of {ADVANTAGE_SCALES}, got {scale!r}")
    kept_groups: list[tuple[int, torch.Tensor]] = []
    offset = 0
    n_dropped = 0
    for group in rewards:
        r = torch.tensor(group, dtype=torch.float64)
        # A tolerance, not ==: rewards computed as fractions can differ by rounding only.
        if len(group) < 2 or float(r.max() - r.min()) <= 1e-12:
            n_dropped += 1
        else:
            kept_groups.append((offset, r))
        offset += len(group)
    advantages: list[float] = []
    kept: list[int] = []
    if kept_groups:
        batch_std = torch.cat([r for _, r in kept_groups]).std(unbiased=False)
        for start, r in kept_groups:
            centred = r - r.mean()
            if scale == "group":
                adv = centred / (r.std(unbiased=False) + eps)
            elif scale == "batch":
                adv = centred / (batch_std + eps)
            else:
                adv = centred
            advantages.extend(float(a) for a in adv)
            kept.extend(range(start, start + len(r)))
    return GroupAdvantages(advantages, kept, len(rewards), n_dropped)


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    keep_from: int = 0,
    temperature: float = 1.0,
) -> torch.Tensor:
    """log p(token_t | tokens_<t) for t = 1..T-1, shape [B, T-1] (position t-1 scores token t).

    Positions before `keep_from` (the shared prompt, which carries no loss) get 0 and their
    logits are never computed (`logits_to_keep`): with a 49k vocabulary and a long system
    prompt that is most of the memory of the step. log_softmax runs in float32 one row at
    a time, so the peak is one [T, V] block, not [B, T, V].

    `temperature` is the sampler's: logits are divided by it before the softmax, as TRL
    does, so the loss scores tokens under the distribution they were drawn from (0 means
    greedy decoding and is scored at 1).
    """
    T = input_ids.shape[1]
    keep_from = max(0, min(keep_from, T - 2))
    # Batches are built on the CPU; the model may live on a GPU (`TrainConfig.device`).
    device = next(model.parameters()).device
    input_ids = input_ids.to(device)
    attention_mask = attention_mask.to(device)
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=T - keep_from
    ).logits[:, :-1, :]
    targets = input_ids[:, keep_from + 1 :]
    out = []
    for b in range(logits.shape[0]):
        row = logits[b].float()
        if temperature > 0 and temperature != 1.0:
            row = row / temperature
        lp = F.log_softmax(row, dim=-1)
        out.append(lp.gather(-1, targets[b].unsqueeze(-1)).squeeze(-1))
    kept = torch.stack(out)
    if keep_from == 0:
        return kept
    return torch.cat([kept.new_zeros(kept.shape[0], keep_from), kept], dim=1)


@dataclass
class LossStats:
    loss: float
    clip_fraction: float
    kl: float
    n_tokens: int


def grpo_loss(
    new_logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    cfg: LossConfig,
    *,
    ref_logp: torch.Tensor | None = None,
    total_tokens: int | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """The clipped GRPO surrogate, token-level.

    Shapes: `new_logp`, `old_logp`, `loss_mask`, `ref_logp` are [B, T]; `advantages` is [B].
    `total_tokens` is the number of loss tokens in the whole optimizer step (for gradient
    accumulation); it defaults to this micro-batch's count.
    """
    mask = loss_mask.to(new_logp.dtype)
    n_tokens = int(loss_mask.sum().item())
    denom = float(total_tokens if total_tokens is not None else max(n_tokens, 1))
    ratio = torch.exp(new_logp - old_logp)
    adv = advantages.to(new_logp.dtype).unsqueeze(-1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    kl_value = 0.0
    if cfg.kl_coef > 0.0:
        if ref_logp is None:
            raise ValueError("kl_coef > 0 needs ref_logp (the base model's log-probabilities)")
        delta = ref_logp - new_logp
        kl = torch.exp(delta) - delta - 1.0
        per_token = per_token + cfg.kl_coef * kl
        kl_value = float((kl.detach() * mask).sum().item() / max(n_tokens, 1))
    # Multiply by the mask (not index) so masked positions provably get zero gradient.
    loss = (per_token * mask).sum() / denom
    with torch.no_grad():
        was_clipped = (unclipped != clipped).to(mask.dtype) * mask
        clip_fraction = float(was_clipped.sum().item() / max(n_tokens, 1))
    return loss, LossStats(float(loss.detach().item()), clip_fraction, kl_value, n_tokens)
