"""The gated model as an in-process chat policy: rollouts, evaluation and env traces.

Design decisions
- `LocalMoEClient` implements the rollout loop's `ChatClient` protocol
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
"""

from __future__ import annotations

from typing import Any

import torch

from trace_lib.compose.gated import GatedMoE
from trace_lib.compose.traces import RoutingTrace, replay_trajectory


def env_factory(name: str):
    """A zero-argument constructor for environment `name`: "package.module:Attr" (your own
    Environment class or factory), the environments registry when it knows the name (what
    adapter training uses), else a built-in DOMAIN/CAPABILITY."""
    import importlib

    from trace_lib.envs.capabilities import make_capability_env
    from trace_lib.errors import UserInputError

    if ":" in name:
        module_name, attr = name.split(":", 1)
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise UserInputError(f"env {name!r}: cannot import {module_name!r}: {exc}") from exc
        if not hasattr(module, attr):
            raise UserInputError(f"env {name!r}: module {module_name!r} has no {attr!r}")
        return getattr(module, attr)

    try:
        registry = importlib.import_module("trace_lib.envs.registry")
        make = registry.make_env
        make(name)
        return lambda: make(name)
    except (ImportError, AttributeError, KeyError, UserInputError, ValueError):
        pass  # not registered there: fall back to the built-in capability environments
    domain, sep, capability = name.partition("/")
    if not sep:
        raise UserInputError(f"--env {name!r}: expected DOMAIN/CAPABILITY, e.g. "
                             f"airline/precondition_verification")
    try:
        make_capability_env(domain, capability)
    except (KeyError, ValueError) as exc:
        raise UserInputError(f"--env {name!r}: {exc}") from exc
    return lambda: make_capability_env(domain, capability)


def environment_names() -> list[str]:
    """Names of the built-in capability environments, for pickers."""
    from trace_lib.envs.capabilities import builtin_pairs

    return [f"{domain}/{cap}" for domain, cap in builtin_pairs()]


class LocalMoEClient:
    """`ChatClient` over a GatedMoE in this process (optionally forced to one slot)."""

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
        from trace_lib.runtime.rollout import Sample

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
            ids = new[i].tolist()
            finish = "length"
            for j, t in enumerate(ids):
                if t in eos_ids:
                    ids = ids[: j + 1]
                    finish = "stop"
                    break
            text = tok.decode(ids, skip_special_tokens=False)
            parsed = parse_assistant(text, parse_tools=bool(tools))
            samples.append(Sample(message=parsed.to_message(), prompt_token_ids=list(prompt_ids),
                                  token_ids=ids, logprobs=lp[i, : len(ids)].tolist(),
                                  finish_reason=finish))
        return samples


def route_env(moe: GatedMoE, env_name: str, seed: int, force: int | None = None,
              max_tokens: int = 64, max_turns: int = 4) -> RoutingTrace:
    """Roll the gated model out greedily on one environment seed and trace the transcript."""
    from trace_lib.runtime.rollout import RolloutConfig, run_group

    make_env = env_factory(env_name)
    client = LocalMoEClient(moe, force=force)
    cfg = RolloutConfig(max_turns=max_turns, max_tokens=max_tokens, temperature=0.0)
    rollout = run_group(make_env, seed, client, cfg, model="moe", group_size=1,
                        request_seed=seed)[0]
    env = make_env()
    env.reset(seed)
    return replay_trajectory(
        moe, rollout.messages, env.tool_schemas or None, force=force,
        meta={"source": "env", "env": env_name, "seed": seed, "reward": rollout.reward,
              "outcome": "success" if rollout.passed else "failure"},
    )
