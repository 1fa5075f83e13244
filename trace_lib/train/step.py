"""One GRPO step, parameterised by what trains: rollouts -> advantages -> loss -> update.

    step = GRPOStep(params, optimizer, StepSettings(loss=LossConfig(), temperature=1.0),
                    forward=TokenForward(model), pad_id=0)
    out = step.update(groups)        # groups: list[list[Rollout]], one list per seed
    out.metrics["no_signal"]          # True when every group had constant reward
    step.monitor.consecutive          # no-signal steps in a row (warns loudly at N)

Adapter training (`trainer.train`) and gate training (`compose.gate_training`) both call
this; they differ only in the trainable parameters handed to the optimizer and in the
`forward` they pass (the gated model adds a load-balance loss and routing statistics).

Design decisions
- Collecting rollouts is the caller's job (policy server, in-process engine, gated model):
  the step starts from finished `Rollout`s, so it does not care where they came from.
- `forward(input_ids, attention_mask, keep_from, rollouts) -> ForwardOut` returns per-token
  log-probabilities [B, T-1] at the sampler's temperature, plus an optional extra loss
  (already scaled by the caller) and extra statistics to average into the metrics.
  `TokenForward(model, temperature)` is the plain one.
- Groups with constant reward carry no signal and are dropped before any forward pass.
  A step where *every* group is constant is a "no signal" step: no optimizer update, counted
  in `metrics["no_signal"]`, and `NoSignalMonitor` warns loudly (stderr) once `warn_after`
  such steps come in a row; `stop_on_no_signal` makes it raise `NoSignalError` instead.
- Old policy: with one epoch the ratio is 1 by construction (old = new.detach()); with
  `epochs_per_step > 1` the old log-probs are the sampler's own (taken at generation time),
  so the clipping is against the policy that actually produced the tokens. Positions whose
  sampler log-prob is missing fall back to a no-grad forward taken before the first epoch.
- Hinted rollouts were sampled with a hint in the prompt, then trained on the plain prompt:
  off-policy. Each of their tokens is weighted by the truncated importance ratio
  min(cap, p_plain(token) / p_hinted(token)) (p_plain from this forward, detached; p_hinted
  the sampler's log-prob). Tokens the plain prompt already finds as likely keep full weight;
  tokens only the hint made likely are down-weighted instead of pushed blindly. Plain
  rollouts have weight 1. (Truncated IS, as in IMPALA/V-trace's rho-bar.)
- A forward/backward pass holds at most `micro_batch` rows and `PASS_TOKENS` padded tokens
  (`micro_batches`; one row always fits): activation memory grows with a pass's tokens,
  not its rows. Target-task episodes run to 5-8k tokens, and 4 of them in one pass held
  15-23 GiB (a loop's SFT warm start at difficulty 5 was OOM-killed on this 24 GiB box).
  The update is the same (the loss is normalised by the whole batch's tokens).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from trace_lib.runtime.rollout import Rollout
from trace_lib.train.config import LossConfig
from trace_lib.train.grpo import group_advantages, grpo_loss, token_logprobs

PASS_TOKENS = 6144  # padded tokens per forward/backward pass (~7 GiB for SmolLM2 in fp32)


def micro_batches(lengths: list[int], rows: int, tokens: int = PASS_TOKENS) -> list[list[int]]:
    """Consecutive index chunks of at most `rows` rows whose padded size (rows x longest)
    stays within `tokens`; a row longer than `tokens` gets a pass of its own."""
    chunks: list[list[int]] = []
    cur: list[int] = []
    width = 0
    for i, n in enumerate(lengths):
        wider = max(width, n)
        if cur and (len(cur) >= rows or wider * (len(cur) + 1) > tokens):
            chunks.append(cur)
            cur, wider = [], n
        cur.append(i)
        width = wider
    if cur:
        chunks.append(cur)
    return chunks


class NoSignalError(RuntimeError):
    """Raised when `stop_on_no_signal` is set and too many steps in a row had no signal."""


@dataclass
class StepSettings:
    loss: LossConfig = field(default_factory=LossConfig)
    micro_batch: int = 4
    epochs_per_step: int = 1
    max_grad_norm: float = 1.0
    temperature: float = 1.0  # the sampler's: log-probs in the loss use logits / temperature
    hint_weight_cap: float = 1.0  # truncated importance weight for hinted rollouts
    no_signal_warn_after: int = 3  # consecutive no-signal steps before the loud warning
    stop_on_no_signal: bool = False


@dataclass
class ForwardOut:
    logprobs: torch.Tensor  # [B, T-1], position t-1 scores token t
    extra_loss: torch.Tensor | None = None  # added to the GRPO loss before backward
    stats: dict[str, float] = field(default_factory=dict)


class Forward(Protocol):
    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, keep_from: int,
                 rollouts: list[Rollout]) -> ForwardOut: ...


class TokenForward:
    """The plain forward: `token_logprobs` of `model` at the sampler's temperature."""

    def __init__(self, model: torch.nn.Module, temperature: float = 1.0):
        self.model = model
        self.temperature = temperature

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, keep_from: int,
                 rollouts: list[Rollout]) -> ForwardOut:
        return ForwardOut(token_logprobs(self.model, input_ids, attention_mask, keep_from,
                                         temperature=self.temperature))


@dataclass
class NoSignalMonitor:
    warn_after: int = 3
    stop: bool = False
    consecutive: int = 0
    total: int = 0
    warned: bool = False

    def record(self, no_signal: bool, step: int) -> str | None:
        """Count a step; return the warning text when the run has gone quiet too long."""
        if not no_signal:
            self.consecutive = 0
            return None
        self.consecutive += 1
        self.total += 1
        if self.warn_after and self.consecutive >= self.warn_after:
            msg = (f"WARNING: no learning signal for {self.consecutive} consecutive steps "
                   f"(through step {step}): every group's rollouts got the same reward, so "
                   "nothing is being learned. Try --sft-steps, hints, a lower difficulty or a "
                   "larger group.")
            print(msg, file=sys.stderr, flush=True)
            self.warned = True
            if self.stop:
                raise NoSignalError(msg)
            return msg
        return None


@dataclass
class StepOutcome:
    metrics: dict[str, Any]
    kept: list[Rollout]
    advantages: list[float]


def _pad(rows: list[list[int]], value: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=torch.long)


def _pad_f(rows: list[list[float]], value: float) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=torch.float32)


class GRPOStep:
    """The reusable optimizer step; see the module docstring for the contract."""

    def __init__(
        self,
        params: list[torch.nn.Parameter],
        optimizer: torch.optim.Optimizer,
        settings: StepSettings,
        *,
        forward: Forward,
        pad_id: int = 0,
        train_mode: Callable[[bool], None] | None = None,
        ref_forward: Forward | None = None,
    ) -> None:
        self.params = list(params)
        self.optimizer = optimizer
        self.settings = settings
        self.forward = forward
        self.ref_forward = ref_forward  # needed only when loss.kl_coef > 0
        self.pad_id = pad_id
        self.train_mode = train_mode or (lambda on: None)
        self.monitor = NoSignalMonitor(settings.no_signal_warn_after, settings.stop_on_no_signal)
        self.steps = 0

    def update(self, groups: list[list[Rollout]]) -> StepOutcome:
        """Advantages over `groups`, `epochs_per_step` updates; metrics of the step."""
        s = self.settings
        self.steps += 1
        flat = [r for grp in groups for r in grp]
        adv = group_advantages([[r.reward for r in grp] for grp in groups], s.loss.scale,
                               s.loss.eps)
        kept = [flat[i] for i in adv.kept]
        stats = self._optimise(kept, adv.advantages) if kept else {}
        no_signal = not kept or all(r.n_sampled == 0 for r in kept)
        warning = self.monitor.record(no_signal, self.steps)
        rewards = torch.tensor([r.reward for r in flat]) if flat else torch.zeros(1)
        metrics: dict[str, Any] = {
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std(unbiased=False)),
            "pass_rate": sum(r.passed for r in flat) / max(len(flat), 1),
            "loss": stats.get("loss", 0.0),
            "clip_fraction": stats.get("clip_fraction", 0.0),
            "kl": stats.get("kl", 0.0),
            "grad_norm": stats.get("grad_norm", 0.0),
            "sampler_logprob_gap": stats.get("sampler_logprob_gap", 0.0),
            "hint_weight_mean": stats.get("hint_weight_mean", 1.0),
            "groups_kept": adv.n_groups - adv.n_dropped_groups,
            "groups_dropped": adv.n_dropped_groups,
            "no_signal": no_signal,
            "no_signal_steps": self.monitor.total,
            "no_signal_consecutive": self.monitor.consecutive,
            "no_signal_warning": warning,
            "rollouts": len(flat),
            "sampled_tokens": sum(r.n_sampled for r in flat),
            **stats.get("extra", {}),
        }
        return StepOutcome(metrics, kept, adv.advantages)

    def _optimise(self, batch: list[Rollout], advantages: list[float]) -> dict[str, Any]:
        s = self.settings
        total_tokens = sum(r.n_sampled for r in batch)
        if total_tokens == 0:
            return {}
        chunks = micro_batches([len(r.token_ids) for r in batch], s.micro_batch)
        dev = self.params[0].device  # the model's device (CPU or CUDA); batches move there
        tensors = []
        for idx in chunks:
            rows = [batch[i] for i in idx]
            ids = _pad([r.token_ids for r in rows], self.pad_id)
            att = _pad([[1] * len(r.token_ids) for r in rows], 0)
            mask = _pad([r.loss_mask for r in rows], 0)[:, 1:]
            samp = _pad_f([[float("nan") if lp is None else lp for lp in r.sampler_logprobs]
                           for r in rows], float("nan"))[:, 1:]
            hinted = torch.tensor([r.hinted for r in rows], dtype=torch.bool)
            a = torch.tensor([advantages[i] for i in idx], dtype=torch.float32)
            firsts = [r.loss_mask.index(1) for r in rows if 1 in r.loss_mask]
            keep_from = max(min(firsts) - 1, 0) if firsts else ids.shape[1] - 1
            tensors.append((ids.to(dev), att.to(dev), mask.to(dev), samp.to(dev),
                            hinted.to(dev), a.to(dev), keep_from, rows))
        old: list[torch.Tensor | None] = [None] * len(tensors)
        if s.epochs_per_step > 1:
            for k, (ids, att, mask, samp, _h, _a, kf, rows) in enumerate(tensors):
                have = ~torch.isnan(samp)
                if bool((have | (mask == 0)).all()):
                    old[k] = torch.where(have, samp, torch.zeros_like(samp))
                else:  # a server that gave no log-prob for some sampled token
                    with torch.no_grad():
                        old[k] = self.forward(ids, att, kf, rows).logprobs.detach()
        ref: list[torch.Tensor | None] = [None] * len(tensors)
        if s.loss.kl_coef > 0:
            if self.ref_forward is None:
                raise ValueError("loss.kl_coef > 0 needs a ref_forward (the frozen policy)")
            with torch.no_grad():
                ref = [self.ref_forward(ids, att, kf, rows).logprobs
                       for ids, att, _m, _s, _h, _a, kf, rows in tensors]
        self.train_mode(True)
        out: dict[str, Any] = {}
        try:
            for epoch in range(s.epochs_per_step):
                self.optimizer.zero_grad(set_to_none=True)
                loss_sum = clip_sum = kl_sum = gap_sum = w_sum = 0.0
                n_gap = n_w = 0
                extra: dict[str, float] = {}
                for k, (ids, att, mask, samp, hinted, a, kf, rows) in enumerate(tensors):
                    fo = self.forward(ids, att, kf, rows)
                    new = fo.logprobs
                    old_k = old[k] if old[k] is not None else new.detach()
                    weight_mask = mask.to(new.dtype)
                    have = ~torch.isnan(samp) & (mask == 1)
                    if epoch == 0 and bool(have.any()):
                        gap_sum += float((new.detach() - samp).abs()[have].sum())
                        n_gap += int(have.sum())
                    if bool(hinted.any()):
                        ratio = torch.exp(new.detach() - torch.nan_to_num(samp, nan=0.0))
                        w = torch.clamp(ratio, max=s.hint_weight_cap)
                        w = torch.where(hinted[:, None] & have, w, torch.ones_like(w))
                        hm = hinted[:, None] & have
                        if bool(hm.any()):
                            w_sum += float(w[hm].sum())
                            n_w += int(hm.sum())
                        weight_mask = weight_mask * w
                    loss, st = grpo_loss(new, old_k, a, weight_mask, s.loss, ref_logp=ref[k],
                                         total_tokens=total_tokens)
                    if fo.extra_loss is not None:
                        loss = loss + fo.extra_loss
                    loss.backward()
                    loss_sum += float(loss.detach())
                    clip_sum += st.clip_fraction * st.n_tokens
                    kl_sum += st.kl * st.n_tokens
                    for key, v in fo.stats.items():
                        extra[key] = extra.get(key, 0.0) + v / len(tensors)
                norm = torch.nn.utils.clip_grad_norm_(self.params, s.max_grad_norm)
                self.optimizer.step()
                out = {"loss": loss_sum, "clip_fraction": clip_sum / total_tokens,
                       "kl": kl_sum / total_tokens, "grad_norm": float(norm),
                       "sampler_logprob_gap": gap_sum / max(n_gap, 1),
                       "hint_weight_mean": w_sum / n_w if n_w else 1.0,
                       "extra": extra}
        finally:
            self.train_mode(False)
        return out
