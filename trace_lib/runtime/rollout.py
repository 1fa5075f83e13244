"""Multi-turn rollouts: an Environment and a policy talking through the OpenAI chat API.

Design decisions
- The policy is reached only through an OpenAI-compatible `/v1/chat/completions` with
  `tools`: our CPU server or vLLM, the same client code. The request asks for
  `logprobs` and vLLM's `return_token_ids`, so every turn brings back the exact prompt
  token ids the server rendered and the token ids it sampled; the trainer never
  re-tokenises what the policy generated (re-tokenising generated text is not guaranteed
  to give the sampled ids back, and then the gradient would be on tokens nobody sampled).
- One training sequence per rollout is grown turn by turn: the first prompt's ids, then
  each turn's sampled ids (loss mask 1), then the part of the next prompt the server added
  after them (tool results, the next header: mask 0). If a server's next prompt does not
  extend the sequence (its template re-rendered an earlier turn differently), the sequence
  restarts from that prompt with every earlier token masked and `prefix_mismatches`
  counts it: correct, at the cost of that rollout's earlier turns.
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
from typing import Any, Protocol

import httpx

from trace_lib.envs.protocol import Environment


@dataclass
class Sample:
    """One choice of a chat completion, with what the trainer needs from it."""

    message: dict[str, Any]  # OpenAI assistant message: content, tool_calls
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None


class ChatClient(Protocol):
    """What the rollout loop needs from a policy server."""

    def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        model: str,
        n: int,
        max_tokens: int,
        temperature: float,
        seed: int | None,
    ) -> list[Sample]: ...


class OpenAIChatClient:
    """`/v1/chat/completions` over HTTP with token ids and log-probs (vLLM's extension)."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 600.0):
        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[: -len("/v1")]
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def _post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        resp = self._http.post(path, json=body)
        if resp.status_code != 200:
            raise RuntimeError(
                f"{self.base_url}{path} answered {resp.status_code}: {resp.text[:500]}"
            )
        return resp

    def load_adapter(self, name: str, path: str) -> None:
        """vLLM's runtime LoRA loading (needs VLLM_ALLOW_RUNTIME_LORA_UPDATING=True there)."""
        self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})

    def unload_adapter(self, name: str) -> None:
        self._post("/v1/unload_lora_adapter", {"lora_name": name})

    def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        model: str,
        n: int = 1,
        max_tokens: int = 256,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[Sample]:
        body: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "n": n,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "logprobs": True,
            "return_token_ids": True,
        }
        if tools:
            body["tools"] = tools
        if seed is not None:
            body["seed"] = seed
        data = self._post("/v1/chat/completions", body).json()
        prompt_ids = data.get("prompt_token_ids")
        if prompt_ids is None:
            raise RuntimeError(
                f"{self.base_url}: the response has no `prompt_token_ids`; the policy server "
                "must support `return_token_ids` (our CPU server does, vLLM >= 0.10.2 does)"
            )
        samples = []
        for choice in data["choices"]:
            ids = choice.get("token_ids")
            content = (choice.get("logprobs") or {}).get("content") or []
            if ids is None:
                raise RuntimeError(f"{self.base_url}: a choice has no `token_ids`")
            lps = [float(c["logprob"]) for c in content]
            if len(lps) != len(ids):
                # The logprob entries are per generated token; a missing one is a server bug
                # we cannot train through, so say which lengths disagreed.
                raise RuntimeError(
                    f"{self.base_url}: {len(ids)} token ids but {len(lps)} logprobs in a choice"
                )
            msg = choice["message"]
            samples.append(
                Sample(
                    message={
                        "role": "assistant",
                        "content": msg.get("content"),
                        **({"tool_calls": msg["tool_calls"]} if msg.get("tool_calls") else {}),
                    },
                    prompt_token_ids=list(prompt_ids),
                    token_ids=list(ids),
                    logprobs=lps,
                    finish_reason=choice.get("finish_reason"),
                )
            )
        return samples


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
    prefix_mismatches: int = 0
    truncated: bool = False

    @property
    def n_sampled(self) -> int:
        return sum(self.loss_mask)


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
    client: ChatClient,
    cfg: RolloutConfig,
    *,
    model: str,
    group_size: int,
    n_hinted: int = 0,
    request_seed: int | None = None,
    parallel: bool = False,
) -> list[Rollout]:
    """G rollouts of one environment seed; the first `n_hinted` see the hint.

    `parallel` sends independent requests from threads (needs a thread-safe client)."""
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
        return client.chat(hinted_msgs if hinted else base_msgs, tools, model=model, n=n,
                           max_tokens=cfg.max_tokens, temperature=cfg.temperature,
                           seed=sub_seed(0, 1 if hinted else 0))

    if parallel and n_hinted and group_size > n_hinted:
        with ThreadPoolExecutor(2) as pool:
            hinted_s, plain_s = pool.map(first_turn, [True, False])
    else:
        hinted_s, plain_s = first_turn(True), first_turn(False)
    first = [(s, True) for s in hinted_s] + [(s, False) for s in plain_s]
    plain_prompt: list[int] | None = plain_s[0].prompt_token_ids if plain_s else None
    if n_hinted and plain_prompt is None:
        # Every rollout was hinted: ask the server for the plain prompt's ids (1 token).
        probe = client.chat(base_msgs, tools, model=model, n=1, max_tokens=1,
                            temperature=cfg.temperature, seed=sub_seed(0, 2))
        plain_prompt = probe[0].prompt_token_ids

    def finish(i: int, sample: Sample, hinted: bool, env: Environment) -> Rollout:
        msgs = [dict(m) for m in (hinted_msgs if hinted else base_msgs)]
        opening = list(sample.prompt_token_ids)
        seq = list(opening)
        mask = [0] * len(seq)
        lps: list[float | None] = [None] * len(seq)
        mismatches = 0
        truncated = False
        turns = 0
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
            sample = client.chat(msgs, tools, model=model, n=1, max_tokens=cfg.max_tokens,
                                 temperature=cfg.temperature, seed=sub_seed(i, turns))[0]
            prompt = sample.prompt_token_ids
            if prompt[: len(seq)] == seq:
                delta = prompt[len(seq):]
            else:
                mismatches += 1
                seq, mask, lps = [], [], []
                delta = prompt
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
            truncated=truncated,
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
    client: ChatClient,
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
