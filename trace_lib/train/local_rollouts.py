"""In-process batched rollouts, shared-prompt forwards and SFT on reference actions.

    engine = LocalRollouts(model, tokenizer, LocalRolloutConfig(max_tokens=64, max_turns=3))
    rollouts = engine.run(make_env, seeds, temperatures=[0.0, 1.0, 1.0])   # per seed
    fwd = PrefixForward(model, engine.prefix_ids, temperature=1.0)        # for GRPOStep
    sft(model, optimizer, demos, fwd, steps=20)

What the learning benchmark (bench/learning.py) and `train --sft-steps` stand on when the
model lives in this process (no policy server): one CPU, one copy of the weights.

Design decisions
- Every seed of a capability environment opens with the same system prompt and tool
  block; only the user request differs. That shared prefix is prefilled once (batch 1)
  and its KV cache repeated to every row, so a batch of 192 episodes pays for ~1,000
  prompt tokens once instead of 192 times. Each row keeps its KV cache across turns:
  a turn feeds only the row's new tokens (its request, then each tool turn).
- Rows are left-padded per feed with attention 0 and explicit position ids (cumulative
  count of attended tokens), so rows of different lengths decode together; finished rows
  are dropped from the cache (`batch_select_indices`).
- Token bookkeeping is the policy server's contract: sampled ids are kept as sampled (loss
  mask 1, their log-prob at the sampler's temperature), and after a turn only the new tool
  turn and the next assistant header are tokenised and appended (mask 0). A turn is never
  re-rendered or re-tokenised.
- `PrefixForward` scores a batch of sequences that all start with the shared prefix: the
  prefix's KV is computed without gradient under the current weights (values exact) and
  the gradient flows through the rest only. This stop-gradient at the shared prompt is
  what makes a CPU step affordable (the prompt is 2/3 of every sequence); the adapter
  still changes how the prompt is read (its effect on the prefix KV is in the forward),
  it is just not optimised through it. Documented in docs/TRAINING.md.
- SFT warm start: the environment's reference actions (the same calls the verifier
  replays) rendered in the chat convention and tokenised turn by turn exactly as rollouts
  are; cross-entropy on the assistant tokens only, the demos' shared prompt (`demo_prefix`)
  run once a pass without gradient (`PrefixForward`), as the oracle and the routing demo
  do.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from trace_lib.envs.protocol import Environment
from trace_lib.runtime.chat_format import IM_END, format_assistant, parse_assistant, render_prompt
from trace_lib.runtime.rollout import Rollout, _apply_turn
from trace_lib.runtime.turn_budget import RULE, derived_max_tokens
from trace_lib.train.step import ForwardOut, micro_batches


@dataclass
class LocalRolloutConfig:
    max_tokens: int = 96  # per assistant turn
    max_turns: int = 4
    chunk: int = 64  # rows decoded together (memory: KV of chunk x sequence)
    seed: int = 0


def tool_turn_text(tool_msgs: list[dict[str, Any]], closed: bool) -> str:
    """The text the chat template puts after an assistant turn: its close, the tool turn
    and the next assistant header (`closed`: the sample already ended with <|im_end|>)."""
    text = "" if closed else IM_END
    text += "\n<|im_start|>user"
    for m in tool_msgs:
        text += "\n<tool_response>\n" + str(m.get("content") or "") + "\n</tool_response>"
    return text + "<|im_end|>\n<|im_start|>assistant\n"


def common_prefix(rows: list[list[int]]) -> list[int]:
    first = rows[0]
    n = min(len(r) for r in rows) - 1  # keep at least one token per row to feed
    for r in rows[1:]:
        i = 0
        while i < n and r[i] == first[i]:
            i += 1
        n = i
    return first[:n]


def demo_prefix(demos: list[tuple[list[int], list[int]]]) -> list[int]:
    """The prompt every demo (ids, loss mask) shares, ending before the token that scores
    the first assistant token of any of them: what `PrefixForward` runs without gradient."""
    prefix = common_prefix([ids for ids, _ in demos])
    first = min((m.index(1) for _, m in demos if 1 in m), default=len(prefix) + 1)
    return prefix[:max(0, min(len(prefix), first - 1))]


@dataclass
class _Row:
    seed: int
    temperature: float
    env: Environment
    seq: list[int]
    mask: list[int]
    lps: list[float | None]
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    pending: list[int]
    turns: int = 0
    done: bool = False
    truncated: bool = False


class LocalRollouts:
    """Batched multi-turn episodes of one environment on an in-process model."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, cfg: LocalRolloutConfig):
        self.model = model
        self.tok = tokenizer
        self.cfg = cfg
        self.prefix_ids: list[int] = []
        self.stop_ids = {tokenizer.convert_tokens_to_ids(IM_END)}
        if tokenizer.eos_token_id is not None:
            self.stop_ids.add(tokenizer.eos_token_id)
        self.im_end = tokenizer.convert_tokens_to_ids(IM_END)
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def _ids(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def prompt_ids(self, env: Environment) -> list[int]:
        return self._ids(render_prompt(env.messages, env.tool_schemas or None))

    def set_prefix(self, make_env: Callable[[], Environment], seeds: list[int]) -> list[int]:
        rows = []
        for s in seeds[:8] if len(seeds) > 1 else [*seeds, seeds[0] + 1]:
            env = make_env()
            env.reset(s)
            rows.append(self.prompt_ids(env))
        self.prefix_ids = common_prefix(rows)
        return self.prefix_ids

    @torch.no_grad()
    def _prefix_cache(self) -> Any:
        ids = torch.tensor([self.prefix_ids])
        return self.model(input_ids=ids, use_cache=True, logits_to_keep=1).past_key_values

    @torch.no_grad()
    def run(self, make_env: Callable[[], Environment], seeds: list[int],
            temperatures: list[float], on_chunk: Callable[[int, int], None] | None = None
            ) -> list[list[Rollout]]:
        """For each seed, one episode per entry of `temperatures` (0 = greedy)."""
        if not self.prefix_ids:
            self.set_prefix(make_env, seeds)
        self.model.eval()
        rows: list[_Row] = []
        for s in seeds:
            for t in temperatures:
                env = make_env()
                env.reset(s)
                ids = self.prompt_ids(env)
                if ids[: len(self.prefix_ids)] != self.prefix_ids:
                    raise RuntimeError(f"seed {s}: the prompt does not start with the shared "
                                       "prefix (the system prompt differs across seeds)")
                rows.append(_Row(s, t, env, list(ids), [0] * len(ids), [None] * len(ids),
                                 [dict(m) for m in env.messages], env.tool_schemas or None,
                                 ids[len(self.prefix_ids):]))
        prefix_cache = self._prefix_cache()
        gen = torch.Generator().manual_seed(self.cfg.seed)
        for k in range(0, len(rows), self.cfg.chunk):
            self._run_chunk(rows[k:k + self.cfg.chunk], prefix_cache, gen)
            if on_chunk:
                on_chunk(min(k + self.cfg.chunk, len(rows)), len(rows))
        out: list[list[Rollout]] = []
        n = len(temperatures)
        for i in range(0, len(rows), n):
            out.append([self._finish(r) for r in rows[i:i + n]])
        return out

    def _finish(self, r: _Row) -> Rollout:
        summary = r.env.summary()
        if hasattr(r.env, "close"):
            r.env.close()
        return Rollout(seed=r.seed, hinted=False, token_ids=r.seq, loss_mask=r.mask,
                       sampler_logprobs=r.lps, messages=r.messages,
                       reward=float(summary.get("reward", 0.0)),
                       passed=bool(summary.get("passed", False)), turns=r.turns,
                       reasons=list(summary.get("reasons", [])), truncated=r.truncated)

    def _run_chunk(self, rows: list[_Row], prefix_cache: Any, gen: torch.Generator) -> None:
        cache = copy.deepcopy(prefix_cache)
        cache.batch_repeat_interleave(len(rows))
        att = torch.ones(len(rows), len(self.prefix_ids), dtype=torch.long)
        live = list(range(len(rows)))  # row indices, in cache order
        while live:
            width = max(len(rows[i].pending) for i in live)
            feed = torch.full((len(live), width), self.pad, dtype=torch.long)
            fmask = torch.zeros((len(live), width), dtype=torch.long)
            for j, i in enumerate(live):
                p = rows[i].pending
                feed[j, width - len(p):] = torch.tensor(p)
                fmask[j, width - len(p):] = 1
            att = torch.cat([att, fmask], dim=1)
            pos = (att.cumsum(-1) - 1).clamp(min=0)
            logits = self.model(input_ids=feed, attention_mask=att, position_ids=pos[:, -width:],
                                past_key_values=cache, use_cache=True,
                                logits_to_keep=1).logits[:, -1, :].float()
            temps = torch.tensor([rows[i].temperature for i in live])
            new: list[list[int]] = [[] for _ in live]
            new_lp: list[list[float]] = [[] for _ in live]
            alive = torch.ones(len(live), dtype=torch.bool)
            for _ in range(self.cfg.max_tokens):
                greedy = temps <= 0
                scaled = logits / torch.where(greedy, torch.ones_like(temps), temps)[:, None]
                logp = F.log_softmax(scaled, dim=-1)
                sampled = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(-1)
                choice = torch.where(greedy, logits.argmax(-1), sampled)
                chosen_lp = logp.gather(-1, choice[:, None]).squeeze(-1)
                for j in range(len(live)):
                    if alive[j]:
                        new[j].append(int(choice[j]))
                        new_lp[j].append(float(chosen_lp[j]))
                        if int(choice[j]) in self.stop_ids:
                            alive[j] = False
                if not bool(alive.any()):
                    break
                step_mask = alive.long()[:, None]
                att = torch.cat([att, step_mask], dim=1)
                pos = (att.cumsum(-1) - 1).clamp(min=0)
                logits = self.model(input_ids=torch.where(alive, choice, self.pad)[:, None],
                                    attention_mask=att, position_ids=pos[:, -1:],
                                    past_key_values=cache, use_cache=True,
                                    logits_to_keep=1).logits[:, -1, :].float()
            keep = []
            for j, i in enumerate(live):
                r = rows[i]
                r.turns += 1
                r.seq += new[j]
                r.mask += [1] * len(new[j])
                r.lps += new_lp[j]
                text = self.tok.decode(new[j], skip_special_tokens=False)
                msg = parse_assistant(text, parse_tools=bool(r.tools)).to_message()
                r.messages.append(msg)
                tool_msgs = _apply_turn(r.env, msg)
                r.messages.extend(tool_msgs)
                if r.env.done:
                    r.done = True
                    continue
                if r.turns >= self.cfg.max_turns:
                    r.done = r.truncated = True
                    continue
                closed = bool(new[j]) and new[j][-1] in self.stop_ids
                delta = self._ids(tool_turn_text(tool_msgs, closed))
                r.seq += delta
                r.mask += [0] * len(delta)
                r.lps += [None] * len(delta)
                r.pending = delta
                keep.append(j)
            if len(keep) < len(live):
                if keep:
                    cache.batch_select_indices(torch.tensor(keep))
                att = att[keep]
                live = [live[j] for j in keep]


class PrefixForward:
    """`step.Forward` for sequences that all begin with `prefix_ids` (stop-gradient there).

    `prefix_ids` None: each pass's own shared prompt, the rows' common prefix up to
    `keep_from` (no scored token inside it): what a policy server's rollouts share, where
    no prefix is known before they come back (the trainer's GRPO step)."""

    def __init__(self, model: torch.nn.Module, prefix_ids: list[int] | None,
                 temperature: float = 1.0):
        self.model = model
        self.prefix_ids = None if prefix_ids is None else list(prefix_ids)
        self.temperature = temperature

    def _prefix(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                keep_from: int) -> list[int]:
        if self.prefix_ids is not None:
            return self.prefix_ids
        lengths = attention_mask.sum(-1).tolist()  # rows are right-padded
        rows = [r[:int(n)] for r, n in zip(input_ids.tolist(), lengths, strict=True)]
        return common_prefix(rows)[:max(0, keep_from)]

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, keep_from: int,
                 rollouts: list[Rollout]) -> ForwardOut:
        prefix = self._prefix(input_ids, attention_mask, keep_from)
        P = len(prefix)
        B, T = input_ids.shape
        if P == 0 or T <= P + 1 or input_ids[:, :P].tolist() != [prefix] * B:
            from trace_lib.train.grpo import token_logprobs

            return ForwardOut(token_logprobs(self.model, input_ids, attention_mask, keep_from,
                                             temperature=self.temperature))
        with torch.no_grad():
            cache = self.model(input_ids=torch.tensor([prefix]), use_cache=True,
                               logits_to_keep=1).past_key_values
        cache.batch_repeat_interleave(B)
        pos = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        # Positions j of the suffix whose logits score a token of the loss (j scores the
        # suffix's token j+1); all of them when no rollout says which.
        keep = scored_positions(rollouts, P, T)
        at = (torch.arange(T - P - 1) if keep is None else keep).to(input_ids.device)
        logits = self.model(input_ids=input_ids[:, P:], attention_mask=attention_mask,
                            position_ids=pos[:, P:], past_key_values=cache, use_cache=True,
                            logits_to_keep=at).logits
        targets = input_ids[:, P + 1:][:, at]
        rows = []
        for b in range(B):
            row = logits[b].float()
            if self.temperature > 0 and self.temperature != 1.0:
                row = row / self.temperature
            rows.append(F.log_softmax(row, -1).gather(-1, targets[b][:, None]).squeeze(-1))
        scored = torch.stack(rows)
        out = scored.new_zeros(B, T - 1)  # position t scores token t+1; unscored ones 0
        return ForwardOut(out.index_copy(1, at + P, scored))


def scored_positions(rollouts: list[Rollout], P: int, T: int) -> torch.Tensor | None:
    """The suffix positions (after a P-token prefix, of a T-token pass) whose log-prob a
    loss reads: j where some row's token P+j+1 has loss mask 1. None without rollouts.

    The LM head and its log-softmax then run on those positions only: on target-task
    episodes the tool results are most of the suffix and carry no loss, and each scored
    position costs a [49,152] row of logits and of log-softmax kept for the backward
    (0.87x CPU on the routing demo's SFT, bench/sft_logits.py; the pass's memory is
    mostly attention, 10.7 -> 9.5 GB)."""
    if not rollouts:
        return None
    need: set[int] = set()
    for r in rollouts:
        m = r.loss_mask
        need.update(i - 1 - P for i in range(P + 1, min(len(m), T)) if m[i])
    return torch.tensor(sorted(need), dtype=torch.long) if need else None


# ------------------------------------------------------------------------------ SFT
def reference_episode(env: Environment, seed: int, tokenizer: Any,
                      max_turns: int = 8) -> tuple[list[int], list[int]] | None:
    """Token ids and loss mask of the reference policy's episode on `seed`, built turn by
    turn like a rollout (assistant tokens mask 1); None if the env has no reference."""
    env.reset(seed)
    ids = tokenizer(render_prompt(env.messages, env.tool_schemas or None),
                    add_special_tokens=False)["input_ids"]
    seq, mask = list(ids), [0] * len(ids)
    for _ in range(max_turns):
        action = env.reference_action() if hasattr(env, "reference_action") else None
        if action is None:
            break
        if "name" in action:
            call = {"id": "call_0", "type": "function",
                    "function": {"name": action["name"], "arguments": action["arguments"]}}
            msg = {"role": "assistant", "content": None, "tool_calls": [call]}
            text = format_assistant(None, [call])
        else:
            msg = {"role": "assistant", "content": action.get("content") or ""}
            text = msg["content"]
        a_ids = tokenizer(text + IM_END, add_special_tokens=False)["input_ids"]
        seq += a_ids
        mask += [1] * len(a_ids)
        tool_msgs = _apply_turn(env, msg)
        if env.done:
            break
        d = tokenizer(tool_turn_text(tool_msgs, True), add_special_tokens=False)["input_ids"]
        seq += d
        mask += [0] * len(d)
    return (seq, mask) if any(mask) else None


def reference_demos(make_env: Callable[[], Environment], tokenizer: Any, n: int,
                    max_turns: int = 8) -> list[tuple[list[int], list[int]]]:
    """The SFT demos: `reference_episode` on the seeds `10**6 - n .. 10**6 - 1` (disjoint
    from training seeds 0.. and every evaluation's), each on a fresh environment that is
    closed after (sandboxed ones hold a worker); seeds without a reference are left out."""
    demos = []
    for seed in range(10**6 - n, 10**6):
        env = make_env()
        try:
            ep = reference_episode(env, seed, tokenizer, max_turns=max_turns)
        finally:
            if hasattr(env, "close"):
                env.close()
        if ep is not None:
            demos.append(ep)
    return demos


def longest_reference_turn(env: Environment, seeds: Any, tokenizer: Any,
                           max_turns: int = 8) -> int:
    """Tokens of the longest assistant turn of the reference episodes on `seeds` (0 when
    the environment has no reference): what a rollout's `max_tokens` must hold for the
    right answer to fit at all."""
    longest = 0
    for seed in seeds:
        ep = reference_episode(env, seed, tokenizer, max_turns)
        run = 0
        for keep in (ep[1] if ep else []):
            run = run + 1 if keep else 0
            longest = max(longest, run)
    return longest


@dataclass(frozen=True)
class TurnBudget:
    """The per-turn token default of a run given no `max_tokens`, and what it came from."""

    max_tokens: int  # derived_max_tokens(longest_reference_turn)
    longest_reference_turn: int  # in the model's tokens, over the environments measured
    unmeasured: dict[str, str]  # env name -> why it had no reference to measure

    def record(self) -> dict[str, Any]:
        """What a run writes beside its settings: the value and where it came from."""
        return {"max_tokens": self.max_tokens,
                "longest_reference_turn": self.longest_reference_turn,
                "rule": RULE,
                **({"unmeasured": dict(self.unmeasured)} if self.unmeasured else {})}


def reference_turn_budget(makers: dict[str, Callable[[], Environment]], tokenizer: Any,
                          max_turns: int = 8, seeds: Any = range(4)) -> TurnBudget:
    """The one home of every run's default tokens per assistant turn (adapter training,
    gate training, a composed model's evaluation, the pages' hints): the longest reference
    turn over `makers`' environments on `seeds`, in `tokenizer`'s tokens, through
    `derived_max_tokens`. An environment that cannot give a reference (a generated one's
    sandbox says so by an error) is left out and named in `unmeasured`; it never fails
    the run. Each environment made here is closed here."""
    longest, unmeasured = 0, {}
    for name, make_env in makers.items():
        env = None
        try:
            env = make_env()
            longest = max(longest, longest_reference_turn(env, seeds, tokenizer, max_turns))
        except Exception as exc:  # noqa: BLE001 - advice only: never the reason a run fails
            text = str(exc).splitlines()[-1] if str(exc) else ""
            unmeasured[name] = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
        finally:
            if env is not None and hasattr(env, "close"):
                env.close()
    return TurnBudget(derived_max_tokens(longest), longest, unmeasured)


def sft(
    params: list[torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
    demos: list[tuple[list[int], list[int]]],
    forward: Callable[..., ForwardOut],
    *,
    steps: int,
    batch: int = 4,
    micro_batch: int | None = None,
    pad_id: int = 0,
    seed: int = 0,
    train_mode: Callable[[bool], None] | None = None,
    log: Callable[[dict[str, Any]], None] | None = None,
    start_step: int = 0,
    on_step: Callable[[int], None] | None = None,
) -> list[float]:
    """`steps` AdamW steps of token cross-entropy on the demos' assistant tokens.

    `micro_batch` (default: the whole batch) splits each step's batch into forward and
    backward passes of at most that many demos and `step.PASS_TOKENS` padded tokens
    (`step.micro_batches`), accumulating gradients: the same update (the loss is
    normalised by the batch's assistant tokens, not each micro-batch's) at a fraction of
    the activation memory. Target-task demos run to ~5k tokens: at 4 a pass a SmolLM2
    step held 23 GiB, past this machine's memory.

    `start_step` resumes: the batches of the steps before it are drawn (the order is a
    function of the seed) but not trained on, so step k trains on what an uninterrupted
    run's step k would. `on_step(k)` runs after step k's update (the caller checkpoints)."""
    rng = random.Random(seed)
    losses = []
    order: list[int] = []
    size = max(1, min(micro_batch or batch, batch))
    if train_mode:
        train_mode(True)
    try:
        for step in range(steps):
            if len(order) < batch:
                order += rng.sample(range(len(demos)), len(demos))
            idx, order = order[:batch], order[batch:]
            if step < start_step:
                continue  # trained before the resume; its batch is drawn all the same
            rows = [demos[i] for i in idx]
            tokens = sum(sum(m[1:]) for _, m in rows)
            optimizer.zero_grad(set_to_none=True)
            total = 0.0
            for chunk in micro_batches([len(seq) for seq, _ in rows], size):
                part = [rows[j] for j in chunk]
                width = max(len(s) for s, _ in part)
                ids = torch.tensor([s + [pad_id] * (width - len(s)) for s, _ in part])
                att = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s, _ in part])
                mask = torch.tensor([m + [0] * (width - len(m)) for _, m in part])[:, 1:].float()
                ids, att, mask = (t.to(params[0].device) for t in (ids, att, mask))
                first = min(m.index(1) for _, m in part)
                # The demos as rollouts: their loss masks say which positions are scored.
                lp = forward(ids, att, max(first - 1, 0),
                             [Rollout(seed=0, hinted=False, token_ids=seq, loss_mask=m,
                                      sampler_logprobs=[], messages=[])
                              for seq, m in part]).logprobs
                loss = -(lp * mask).sum() / max(tokens, 1)
                loss.backward()
                total += float(loss.detach())
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            losses.append(total)
            if log:
                log({"phase": "sft", "sft_step": step + 1, "loss": losses[-1]})
            if on_step:
                on_step(step + 1)
    finally:
        if train_mode:
            train_mode(False)
    return losses
