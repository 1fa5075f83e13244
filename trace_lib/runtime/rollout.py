"""Multi-turn rollouts: an Environment and a policy talking through the OpenAI chat API.

Design decisions
- The policy is reached only through `policy_client.PolicyClient` (one client family):
  `OpenAIPolicyClient` over `/v1/chat/completions` with `tools` (our CPU server or vLLM,
  the same code) or an in-process client with the same `chat` (compose's LocalMoEClient). The request asks for
  `logprobs` and vLLM's `return_token_ids`, so every turn brings back the exact prompt
  token ids the server rendered and the token ids it sampled; the trainer never
  re-tokenises what the policy generated (re-tokenising generated text is not guaranteed
  to give the sampled ids back, and then the gradient would be on tokens nobody sampled).
- One training sequence per rollout is grown turn by turn: the first prompt's ids, then
  each turn's sampled ids exactly as sampled (loss mask 1), then only the tokens of the
  new tool/user turn and the next assistant header (mask 0). A turn is never re-rendered
  or re-tokenised: when the server renders an earlier turn differently from what was
  sampled (a compact-JSON tool call comes back with canonical spacing), `new_turn_tokens`
  cuts the new turn out of the server's prompt by its `<|im_start|>` and the sampled turn
  keeps its tokens and its loss; `rerendered_turns` counts these. (The server then
  conditioned the next turn on its canonical rendering: a small off-policy gap, visible
  as `sampler_logprob_gap`, that vanishes once the model writes canonical calls.)
  Only a server prompt that does not extend the previous one restarts the sequence
  (`prefix_mismatches`).
- The first turn of a group is one request with `n` (the server batches it); later turns
  diverge and go one request per rollout. With `parallel=True` (the trainer, over HTTP) the
  hinted and plain first requests and every rollout's later turns are sent from threads at
  once, so the server's dynamic batching decodes them together instead of one after the
  other; results do not depend on it, since every request's seed fixes its samples.
  In-process clients keep the default sequential path (they need not be thread-safe).
- Hints: the environment's hint is appended to the opening user message of the first
  `n_hinted` rollouts of each group. Before the gradient step the hinted first prompt is
  replaced by the plain one, so the policy learns to act as if it had found the hint
  itself; the transcript keeps the hint for people reading it.
- Each request carries a `seed` derived from (run seed, step, group, rollout, turn), so a
  server that honours it (ours, and vLLM) replays a step exactly: resuming from a
  checkpoint gives the same rollouts as running through.
- Tool errors and malformed calls become observations ("Error: ..."), as in tau2-bench;
  they are the policy's mistakes to learn from, not crashes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from trace_lib.runtime.environment import Environment
from trace_lib.runtime.policy_client import ChatPolicy, Completion

# The policy client family lives in `policy_client` (one Protocol, one HTTP client); a
# rollout's turn is its `Completion`. `Sample` is the same class under the name the
# in-process clients (compose's LocalMoEClient) have used.
Sample = Completion


@dataclass
class RolloutConfig:
    max_turns: int = 8
    max_tokens: int = 128  # per assistant turn
    max_sequence: int = 8192  # stop before the next turn could overrun this many tokens
    temperature: float = 1.0


@dataclass
class Rollout:
    seed: int
    hinted: bool
    token_ids: list[int]
    loss_mask: list[int]  # 1 where the policy sampled the token
    sampler_logprobs: list[float | None]
    messages: list[dict[str, Any]]  # the transcript as the policy saw it (hint included)
    reward: float = 0.0
    passed: bool = False
    turns: int = 0
    reasons: list[str] = field(default_factory=list)
    prefix_mismatches: int = 0  # turns whose server prompt did not extend the last one
    truncated: bool = False
    rerendered_turns: int = 0  # turns the server re-rendered differently from the samples

    @property
    def n_sampled(self) -> int:
        return sum(self.loss_mask)


def new_turn_tokens(prev_prompt: list[int], prompt: list[int], sampled: list[int],
                    seq: list[int]) -> tuple[list[int] | None, bool]:
    """The tokens to append after a sampled turn: only what the server added after it.

    `prev_prompt` is the prompt the turn was sampled from, `prompt` the server's next one,
    `sampled` the ids the policy drew. The next prompt is `prev_prompt` + the server's
    rendering of the assistant turn (`<|im_end|>` and a newline at its end) + the new
    tool/user turn and the next assistant header, which begins with `<|im_start|>` (the
    first token of every prompt). We keep `sampled` exactly and append only the new turn
    (with the closing `<|im_end|>` when the sample stopped without one), never the
    re-rendered turn. Returns (delta, whether the server's rendering differed from the
    samples); delta is None when `prompt` does not extend `prev_prompt` at all.
    """
    if prompt[: len(seq)] == seq:  # the server rendered our samples back exactly
        return prompt[len(seq):], False
    if not prev_prompt or prompt[: len(prev_prompt)] != prev_prompt:
        return None, True
    im_start = prev_prompt[0]
    rest = prompt[len(prev_prompt):]
    try:
        j = rest.index(im_start)
    except ValueError:
        return None, True
    if j < 2:
        return None, True
    im_end = rest[j - 2]
    # rest[:j] is the server's assistant turn: text..., <|im_end|>, "\n"
    delta = rest[j - 1:] if sampled and sampled[-1] == im_end else rest[j - 2:]
    return delta, True


def _with_hint(messages: list[dict[str, Any]], hint: str) -> list[dict[str, Any]]:
    out = [dict(m) for m in messages]
    for m in reversed(out):
        if m["role"] == "user":
            m["content"] = f"{m.get('content') or ''}\n\nHint: {hint}"
            return out
    out.append({"role": "user", "content": f"Hint: {hint}"})
    return out


def _apply_turn(env: Environment, message: dict[str, Any]) -> list[dict[str, Any]]:
    """Send one assistant message to the environment; return the tool messages it produced."""
    calls = message.get("tool_calls") or []
    if not calls:
        env.step({"content": message.get("content") or ""})
        return []
    replies = []
    for call in calls:
        fn = call.get("function", {})
        raw_args = fn.get("arguments", {})
        try:
            args = json.loads(raw_args) if isinstance(raw_args, str) else raw_args
            obs = env.step({"name": fn.get("name", ""), "arguments": args})
        except (ValueError, TypeError, KeyError) as exc:
            obs = f"Error: {exc}"
        replies.append(
            {"role": "tool", "tool_call_id": call.get("id"), "name": fn.get("name"),
             "content": obs if isinstance(obs, str) else json.dumps(obs)}
        )
        if env.done:
            break
    return replies


def run_group(
    make_env: Callable[[], Environment],
    seed: int,
    client: ChatPolicy,
    cfg: RolloutConfig,
    *,
    model: str,
    group_size: int,
    n_hinted: int = 0,
    request_seed: int | None = None,
    parallel: bool = False,
    token_ids: bool = True,
) -> list[Rollout]:
    """G rollouts of one environment seed; the first `n_hinted` see the hint.

    `parallel` sends independent requests from threads (needs a thread-safe client).
    `token_ids=False` accepts a client that returns no token ids (evaluation against a
    hosted provider): the transcript and reward are kept, the sequences stay empty."""
    envs = [make_env() for _ in range(group_size)]
    for env in envs:
        env.reset(seed)
    base_msgs = envs[0].messages
    tools = envs[0].tool_schemas or None
    hint = envs[0].hint
    n_hinted = n_hinted if hint else 0
    hinted_msgs = _with_hint(base_msgs, hint) if n_hinted else None

    def sub_seed(*parts: int) -> int | None:
        if request_seed is None:
            return None
        value = request_seed
        for part in parts:
            value = (value * 1_000_003 + part + 1) % (2**31 - 1)
        return value

    def first_turn(hinted: bool) -> list[Sample]:
        n = n_hinted if hinted else group_size - n_hinted
        if not n:
            return []
        return client.chat(hinted_msgs if hinted else base_msgs, tools=tools, model=model, n=n,
                           max_tokens=cfg.max_tokens, temperature=cfg.temperature,
                           seed=sub_seed(0, 1 if hinted else 0))

    if parallel and n_hinted and group_size > n_hinted:
        with ThreadPoolExecutor(2) as pool:
            hinted_s, plain_s = pool.map(first_turn, [True, False])
    else:
        hinted_s, plain_s = first_turn(True), first_turn(False)
    first = [(s, True) for s in hinted_s] + [(s, False) for s in plain_s]
    if token_ids and any(not s.prompt_token_ids for s, _ in first):
        raise RuntimeError("the policy server returned no `prompt_token_ids`; it must support "
                           "`return_token_ids` (our CPU server does, vLLM >= 0.10.2 does)")
    plain_prompt: list[int] | None = plain_s[0].prompt_token_ids if plain_s else None
    if n_hinted and plain_prompt is None:
        # Every rollout was hinted: ask the server for the plain prompt's ids (1 token).
        probe = client.chat(base_msgs, tools=tools, model=model, n=1, max_tokens=1,
                            temperature=cfg.temperature, seed=sub_seed(0, 2))
        plain_prompt = probe[0].prompt_token_ids

    def finish(i: int, sample: Completion, hinted: bool, env: Environment) -> Rollout:
        msgs = [dict(m) for m in (hinted_msgs if hinted else base_msgs)]
        opening = list(sample.prompt_token_ids)
        seq = list(opening)
        mask = [0] * len(seq)
        lps: list[float | None] = [None] * len(seq)
        mismatches = 0
        rerenders = 0
        truncated = False
        turns = 0
        prev_prompt = list(sample.prompt_token_ids)
        while True:
            turns += 1
            seq += sample.token_ids
            mask += [1] * len(sample.token_ids)
            lps += sample.logprobs
            msgs.append(sample.message)
            msgs.extend(_apply_turn(env, sample.message))
            if env.done:
                break
            if turns >= cfg.max_turns or len(seq) + cfg.max_tokens > cfg.max_sequence:
                truncated = True
                break
            sampled = sample.token_ids
            sample = client.chat(msgs, tools=tools, model=model, n=1,
                                 max_tokens=cfg.max_tokens, temperature=cfg.temperature,
                                 seed=sub_seed(i, turns))[0]
            prompt = sample.prompt_token_ids
            delta, rerendered = new_turn_tokens(prev_prompt, prompt, sampled, seq)
            prev_prompt = list(prompt)
            if delta is None:  # the server's prompt does not extend the last one at all
                mismatches += 1
                seq, mask, lps = [], [], []
                delta = list(prompt)
            rerenders += int(rerendered)
            seq += delta
            mask += [0] * len(delta)
            lps += [None] * len(delta)
        if hinted and plain_prompt is not None:
            if seq[: len(opening)] == opening:
                seq = plain_prompt + seq[len(opening):]
                mask = [0] * len(plain_prompt) + mask[len(opening):]
                lps = [None] * len(plain_prompt) + lps[len(opening):]
            else:
                # The hint could not be cut out cleanly: train on nothing of this rollout
                # rather than on tokens conditioned on a hint the policy will not have.
                mask = [0] * len(seq)
        summary = env.summary()
        if hasattr(env, "close"):  # sandboxed environments hold a subprocess
            env.close()
        return Rollout(
            seed=seed, hinted=hinted, token_ids=seq, loss_mask=mask, sampler_logprobs=lps,
            messages=msgs, reward=float(summary.get("reward", 0.0)),
            passed=bool(summary.get("passed", False)), turns=turns,
            reasons=list(summary.get("reasons", [])), prefix_mismatches=mismatches,
            truncated=truncated, rerendered_turns=rerenders,
        )

    jobs = [(i, s, h, env) for i, ((s, h), env) in enumerate(zip(first, envs, strict=True))]
    if parallel and len(jobs) > 1:
        with ThreadPoolExecutor(len(jobs)) as pool:
            return list(pool.map(lambda job: finish(*job), jobs))  # map keeps the order
    return [finish(*job) for job in jobs]


@dataclass
class EvalResult:
    pass_rate: float
    reward_mean: float
    n: int
    wall_s: float


def evaluate(
    make_env: Callable[[], Environment],
    seeds: list[int],
    client: ChatPolicy,
    cfg: RolloutConfig,
    *,
    model: str,
    on_progress: Callable[[int, int], None] | None = None,
) -> EvalResult:
    """Greedy (temperature 0) pass rate over `seeds`, one rollout each, no hints."""
    greedy = RolloutConfig(cfg.max_turns, cfg.max_tokens, cfg.max_sequence, temperature=0.0)
    t0 = time.perf_counter()
    passed, rewards = 0, []
    for k, seed in enumerate(seeds):
        r = run_group(make_env, seed, client, greedy, model=model, group_size=1,
                      request_seed=seed)[0]
        passed += int(r.passed)
        rewards.append(r.reward)
        if on_progress:
            on_progress(k + 1, len(seeds))
    n = max(len(seeds), 1)
    return EvalResult(passed / n, sum(rewards) / n, len(seeds), time.perf_counter() - t0)
