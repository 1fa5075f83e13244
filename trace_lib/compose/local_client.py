"""The gated model as an in-process chat policy: rollouts, evaluation and env traces.

Design decisions
- `LocalMoEClient` implements the rollout loop's `policy_client.ChatPolicy` protocol
  (`trace_lib.runtime.rollout`) directly on a `GatedMoE`, so the training stage's own
  `run_group` / `evaluate` drive composed models without an HTTP hop: gate GRPO, the
  warm-start reward table and the evaluation all reuse that loop unchanged. Over HTTP
  the same model is served by the project's policy server (it is an ordinary HF causal
  LM with hooks; see docs/COMPOSE.md).
- It returns exactly what the server returns: the rendered prompt's ids, the sampled ids
  (up to and including the stop token) and their log-probabilities under the sampling
  temperature, so the GRPO ratio is computed against the sampler's numbers.
- The prompt is rendered by `chat_format.render_prompt` (the one tool-call convention)
  and replies are parsed with `parse_assistant`, never raising on malformed output.
- `force` passes through: a client bound to slot k is the "single adapter k" policy.
- `greedy_episodes` decodes several greedy episodes of one policy together: each episode
  is the training stage's own `run_group` (group of 1, so the transcript, the tool turns
  and the environment's verdict are exactly a sequential rollout's), run in a thread,
  and `BatchingMoEClient` holds each turn's request until every live episode has asked,
  then answers them with one left-padded `generate` call, the rows' shared prompt prefix
  prefilled once (fixed routing only). Measured on SmolLM2 (bench/routing_demo_decode.py,
  5 base episodes writing to the 192-token limit): 56.9 CPU-s batched vs 61.4 one at a
  time, so a modest saving on this 2-core box, not the batch-size factor a GPU gives.
  Greedy only: a sampled batch could not replay each request's seed. A row's greedy
  tokens are its own (padding is masked out); only float rounding of the batched matrix
  products differs from decoding it alone (the 5 transcripts above were identical).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from trace_lib.compose.gated import GatedMoE
from trace_lib.compose.traces import RoutingTrace, replay_trajectory
from trace_lib.errors import UserInputError


def env_factory(name: str, code: str | None = None,
                env_spec: dict[str, Any] | None = None) -> Callable[[], Any]:
    """A zero-argument constructor for environment `name`, through the environments
    registry (`trace_lib.envs.registry`: the one name -> environment path training and the
    app use too), never through the store:

    - `env_spec` given (a serialised `EnvSpec`, code included for generated ones: what the
      app side resolved with `workbench.environments.job_env_specs`): built from it;
      `code` alone is a generated module;
    - else a name that needs no store: a built-in DOMAIN/CAPABILITY (in-process),
      "package.module:Attr" (your own Environment class or factory) or a .py file
      (sandboxed).

    Composition code runs inside jobs as well as in the app, so it resolves nothing from the
    database itself (the "never reach the store" contract). Every failure is a
    UserInputError naming the environment; nothing falls back silently.
    """
    from trace_lib.envs import registry

    if code is not None and env_spec is None:
        env_spec = {"name": name, "capability": "", "domain": "", "version": 1,
                    "source": "generated", "code": code}
    if ":" not in name and "/" not in name and not name.endswith(".py") and env_spec is None:
        raise UserInputError(f"env {name!r}: expected DOMAIN/CAPABILITY (e.g. "
                             f"airline/precondition_verification), a generated DOMAIN/"
                             f"CAPABILITY/genN, a .py file or module:Class")
    # A serialised spec names itself (a .py file's spec is named after its stem, while the
    # config lists the path): build from the spec, under its own name.
    own = str(env_spec.get("name") or name) if env_spec is not None else name
    spec = registry.spec_for_job(own, env_spec, where=f"env {name!r}")
    return registry.env_factory(spec)


def spec_factory(spec: Any) -> Callable[[], Any]:
    """Constructor for a resolved `EnvSpec`: built-ins in-process, the rest sandboxed."""
    from trace_lib.envs import registry

    return registry.env_factory(spec)


def environment_names() -> list[str]:
    """Names of the built-in capability environments, for pickers."""
    from trace_lib.envs.capabilities import builtin_pairs

    return [f"{domain}/{cap}" for domain, cap in builtin_pairs()]


def _cut_at_eos(ids: list[int], eos_ids: set[int] | list[int]) -> tuple[list[int], str]:
    """A decoded row up to and including its first end token, and the finish reason."""
    for j, t in enumerate(ids):
        if t in eos_ids:
            return ids[: j + 1], "stop"
    return ids, "length"


class LocalMoEClient:
    """`policy_client.ChatPolicy` over a GatedMoE in this process (optionally forced to one slot)."""

    def __init__(self, moe: GatedMoE, force: int | None = None,
                 mix: list[float] | None = None):
        self.moe = moe
        self.force = force
        self.mix = mix

    def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        model: str = "moe",
        n: int = 1,
        max_tokens: int = 128,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[Any]:
        from trace_lib.runtime.chat_format import parse_assistant, render_prompt
        from trace_lib.runtime.policy_client import Completion as Sample

        tok = self.moe.tokenizer
        prompt = render_prompt(messages, tools)
        prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        device = next(self.moe.model.parameters()).device
        input_ids = torch.tensor([prompt_ids] * n, device=device)
        gen_cfg = self.moe.model.generation_config
        eos = gen_cfg.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if tok.eos_token_id is not None:
            eos_ids.add(tok.eos_token_id)
        kwargs: dict[str, Any] = {"max_new_tokens": max_tokens, "do_sample": temperature > 0,
                                  "return_dict_in_generate": True, "output_logits": True,
                                  "pad_token_id": tok.pad_token_id}
        if temperature > 0:
            kwargs["temperature"] = temperature
            kwargs["top_k"] = 0
            kwargs["top_p"] = 1.0
        if seed is not None:
            torch.manual_seed(seed)
        with torch.no_grad(), self.moe.force(self.force), self.moe.mix(self.mix):
            out = self.moe.generate(input_ids=input_ids,
                                    attention_mask=torch.ones_like(input_ids), **kwargs)
        new = out.sequences[:, len(prompt_ids):]
        logits = torch.stack(out.logits, dim=1).float()  # [n, steps, V]
        if temperature > 0:
            logits = logits / temperature
        lp = torch.log_softmax(logits, -1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
        samples = []
        for i in range(n):
            ids, finish = _cut_at_eos(new[i].tolist(), eos_ids)
            text = tok.decode(ids, skip_special_tokens=False)
            parsed = parse_assistant(text, parse_tools=bool(tools))
            samples.append(Sample(message=parsed.to_message(), prompt_token_ids=list(prompt_ids),
                                  token_ids=ids, logprobs=lp[i, : len(ids)].tolist(),
                                  finish_reason=finish))
        return samples


class BatchingMoEClient:
    """Greedy `ChatPolicy` over a GatedMoE for `width` concurrent episodes (threads): each
    `chat` queues its request and waits; `serve()`, in the caller's thread, decodes once
    every live episode has a request pending (or has `leave()`-d), all of them in one
    left-padded `generate` call (see the module docstring). One thread does every decode,
    so torch's buffers come from one allocator arena (decoding in whichever episode
    thread completed a batch grew the build to 8.4 GB and the OOM killer ended it)."""

    def __init__(self, moe: GatedMoE, width: int, force: int | list[int] | None = None,
                 mix: list[float] | None = None):
        self.moe = moe
        self.force = force
        self.mix = mix
        self.live = width
        self.calls = 0  # generate calls made (one per batch of turns)
        self._cv = threading.Condition()
        self._pending: list[dict[str, Any]] = []
        self._prefix: tuple[list[int], Any] | None = None  # (ids, their KV cache)
        self._failed: BaseException | None = None

    def fail(self, exc: BaseException) -> None:
        """The decoder stopped (`serve` raised): every waiting and later request raises."""
        with self._cv:
            self._failed = exc
            for req in self._pending:
                req["error"] = exc
            self._pending = []
            self._cv.notify_all()

    def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *,
             model: str = "moe", n: int = 1, max_tokens: int = 128, temperature: float = 1.0,
             seed: int | None = None) -> list[Any]:
        if n != 1 or temperature > 0:
            raise UserInputError("BatchingMoEClient decodes greedy single replies only "
                                 f"(got n={n}, temperature={temperature})")
        from trace_lib.runtime.chat_format import render_prompt

        ids = self.moe.tokenizer(render_prompt(messages, tools),
                                 add_special_tokens=False)["input_ids"]
        req: dict[str, Any] = {"ids": ids, "tools": bool(tools), "max_tokens": max_tokens}
        with self._cv:
            if self._failed is not None:
                raise self._failed
            self._pending.append(req)
            self._cv.notify_all()
            self._cv.wait_for(lambda: "out" in req or "error" in req)
        if "error" in req:
            raise req["error"]
        return [req["out"]]

    def leave(self) -> None:
        """One episode finished: the others no longer wait for its next request."""
        with self._cv:
            self.live -= 1
            self._cv.notify_all()

    def serve(self) -> None:
        """Decode batches until every episode has left (run it in the caller's thread)."""
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self.live <= 0 or (
                    self._pending and len(self._pending) >= self.live))
                if not self._pending:
                    return
                batch, self._pending = self._pending, []
            try:
                samples = self._decode(batch)
            except Exception as exc:  # every waiting episode sees the failure
                with self._cv:
                    for req in batch:
                        req["error"] = exc
                    self._cv.notify_all()
                continue
            with self._cv:
                for req, sample in zip(batch, samples, strict=True):
                    req["out"] = sample
                self._cv.notify_all()

    def _prefix_cache(self, prefix: list[int], rows: int) -> Any:
        """The KV cache of `prefix` (computed once per prefix, under this client's routing),
        copied and repeated for `rows` rows: generate extends it in place."""
        import copy

        if self._prefix is None or self._prefix[0] != prefix:
            device = next(self.moe.model.parameters()).device
            cache = self.moe.model(input_ids=torch.tensor([prefix], device=device),
                                   use_cache=True, logits_to_keep=1).past_key_values
            self._prefix = (list(prefix), cache)
        cache = copy.deepcopy(self._prefix[1])
        cache.batch_repeat_interleave(rows)
        return cache

    def _decode(self, batch: list[dict[str, Any]]) -> list[Any]:
        from trace_lib.runtime.chat_format import parse_assistant
        from trace_lib.runtime.policy_client import Completion

        tok = self.moe.tokenizer
        eos = self.moe.model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if tok.eos_token_id is not None:
            eos_ids.add(tok.eos_token_id)
        pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos_ids, default=0)
        device = next(self.moe.model.parameters()).device
        rows = [r["ids"] for r in batch]
        # The rows' shared prefix (system + tools: ~90% of a demo prompt, the same for every
        # seed and turn of one environment) is prefilled once per client and reused; only
        # under fixed routing (`force` / `mix`), where a token's route does not depend on
        # the rest of the request. Pads go between the prefix and each row's own tokens,
        # masked out; positions follow the mask, so every row sees its own sequence.
        cut = _shared_prefix(rows) if self.force is not None or self.mix is not None else 0
        width = max(len(r) - cut for r in rows)
        input_ids = torch.tensor([r[:cut] + [pad] * (width - len(r) + cut) + r[cut:]
                                  for r in rows], device=device)
        mask = torch.tensor([[1] * cut + [0] * (width - len(r) + cut) + [1] * (len(r) - cut)
                             for r in rows], device=device)
        kwargs: dict[str, Any] = {}
        with torch.no_grad(), self.moe.force(self.force), self.moe.mix(self.mix):
            if cut:
                kwargs["past_key_values"] = self._prefix_cache(rows[0][:cut], len(rows))
            out = self.moe.generate(input_ids=input_ids, attention_mask=mask,
                                    max_new_tokens=max(r["max_tokens"] for r in batch),
                                    do_sample=False, return_dict_in_generate=True,
                                    output_logits=True, pad_token_id=pad, **kwargs)
        self.calls += 1
        width += cut
        new = out.sequences[:, width:]
        # step by step: the stacked [rows, steps, vocabulary] log-softmax was ~0.2 GB a batch
        lp = torch.stack([torch.log_softmax(step.float(), -1).gather(
            -1, new[:, k:k + 1]).squeeze(-1) for k, step in enumerate(out.logits)], dim=1)
        samples = []
        for i, req in enumerate(batch):
            ids, finish = _cut_at_eos(new[i, : req["max_tokens"]].tolist(), eos_ids)
            parsed = parse_assistant(tok.decode(ids, skip_special_tokens=False),
                                     parse_tools=req["tools"])
            samples.append(Completion(message=parsed.to_message(),
                                      prompt_token_ids=list(req["ids"]), token_ids=ids,
                                      logprobs=lp[i, : len(ids)].tolist(),
                                      finish_reason=finish))
        return samples


def _shared_prefix(rows: list[list[int]], least: int = 16) -> int:
    """Tokens every row starts with, leaving each row at least one of its own (0 when
    fewer than `least`: not worth a cache)."""
    from trace_lib.train.local_rollouts import common_prefix

    n = len(common_prefix(rows))
    return n if n >= least else 0


def greedy_episodes(moe: GatedMoE, jobs: list[tuple[Callable[[], Any], int, Any]],
                    force: int | list[int] | None = None,
                    mix: list[float] | None = None) -> list[Any]:
    """One greedy `Rollout` per (make_env, seed, RolloutConfig) job, all under the same
    routing (`force` / `mix`), their turns decoded together; in the jobs' order. Each is
    `run_group(..., group_size=1, request_seed=seed)`, as a sequential episode is."""
    from trace_lib.runtime.rollout import run_group

    if not jobs:
        return []
    client = BatchingMoEClient(moe, len(jobs), force=force, mix=mix)

    def one(job: tuple[Callable[[], Any], int, Any]) -> Any:
        make_env, seed, cfg = job
        try:
            return run_group(make_env, seed, client, cfg, model="moe", group_size=1,
                             request_seed=seed)[0]
        finally:
            client.leave()

    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = [pool.submit(one, job) for job in jobs]
        try:
            client.serve()
        except BaseException as exc:  # the episode threads must not wait forever
            client.fail(exc)
            raise
        return [f.result() for f in futures]  # in the jobs' order


def route_env(moe: GatedMoE, env_name: str, seed: int, force: int | None = None,
              max_tokens: int = 64, max_turns: int = 4,
              env_spec: dict[str, Any] | None = None) -> RoutingTrace:
    """Roll the gated model out greedily on one environment seed and trace the transcript
    (`env_spec`: the environment's serialised spec, for one the store holds)."""
    from trace_lib.runtime.rollout import RolloutConfig, run_group

    make_env = env_factory(env_name, env_spec=env_spec)
    client = LocalMoEClient(moe, force=force)
    cfg = RolloutConfig(max_turns=max_turns, max_tokens=max_tokens, temperature=0.0)
    rollout = run_group(make_env, seed, client, cfg, model="moe", group_size=1,
                        request_seed=seed)[0]
    env = make_env()
    try:
        env.reset(seed)
        tools = env.tool_schemas or None
    finally:
        if hasattr(env, "close"):  # sandboxed environments hold a worker process
            env.close()
    return replay_trajectory(
        moe, rollout.messages, tools, force=force,
        meta={"source": "env", "env": env_name, "seed": seed, "reward": rollout.reward,
              "outcome": "success" if rollout.passed else "failure"},
    )
