"""Episodes of one `GatedMoE` policy, played in-process: the rows of the composition table.

Used by `bench/compose_real.py` for every policy of its in-process engine, and by
`bench/compose_served.py` for the token-level modes vLLM cannot serve (`top1`, `soft`).

Design decisions
- One row per (environment, seed): the greedy episode's reward, pass, tool calls and final
  words, and with `samples` > 0 the mean reward and pass of that many T=1 episodes (they
  share the prompt, so the seed is the unit the intervals count). The served engine writes
  the same row from its own episodes (`episode_row`), so both tables read alike.
- `max_turns` may differ per environment (`--env-max-turns`: each environment as its
  adapter was trained), so it is a mapping, not one number.
- Routing accuracy is measured, not read off the decoder: one teacher-forced forward over
  the greedy episode's own token ids records the choices (routing is causal, so they are
  the choices decoding made), and the slot most sampled token x layer choices went to is
  the episode's slot.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def episode_slot(moe: Any, rollout: Any) -> int:
    """The slot most of the episode's sampled token x layer choices went to."""
    import torch

    ids = torch.tensor([rollout.token_ids])
    with torch.no_grad(), moe.recording() as rec:
        moe.model(input_ids=ids, use_cache=False)
    sampled = torch.tensor(rollout.loss_mask).bool()
    chosen = rec.chosen[0][sampled] if bool(sampled.any()) else rec.chosen[0]
    return int(torch.bincount(chosen.reshape(-1).long(), minlength=moe.k + 1).argmax())


def episode_row(rollouts: list[Any]) -> dict[str, Any]:
    """One seed: greedy episode first, then the sampled ones."""
    greedy, sampled = rollouts[0], rollouts[1:]
    row: dict[str, Any] = {"greedy_reward": float(greedy.reward),
                           "greedy_passed": float(greedy.passed),
                           "greedy_calls": [c["function"]["name"]
                                            for m in greedy.messages if m["role"] == "assistant"
                                            for c in m.get("tool_calls") or []],
                           "greedy_final": next((m.get("content") or "" for m
                                                 in reversed(greedy.messages)
                                                 if m["role"] == "assistant"), "")[:300]}
    if sampled:
        row["reward"] = sum(r.reward for r in sampled) / len(sampled)
        row["passed"] = sum(r.passed for r in sampled) / len(sampled)
    return row


def evaluate_policy(moe: Any, makers: dict[str, Callable[[], Any]],
                    own_slot: dict[str, int], client_kwargs: dict[str, Any],
                    mode: str | None, seeds: list[int], samples: int, max_tokens: int,
                    max_turns: dict[str, int]) -> dict[str, list[dict[str, Any]]]:
    """Per environment, one row per seed. `mode` None plays the MoE as `client_kwargs` fix
    it (a forced slot or a fixed mixture); a routing mode also records `routed_own`."""
    from tqdm import tqdm

    from trace_lib.compose.local_client import LocalMoEClient
    from trace_lib.runtime.rollout import RolloutConfig, run_group

    if mode is not None:
        moe.set_mode(mode)
    client = LocalMoEClient(moe, **client_kwargs)
    label = mode or str(client_kwargs)
    out: dict[str, list[dict[str, Any]]] = {}
    for env_name, make in makers.items():
        greedy_cfg = RolloutConfig(max_turns[env_name], max_tokens, 8192, temperature=0.0)
        sampled_cfg = RolloutConfig(max_turns[env_name], max_tokens, 8192, temperature=1.0)
        out[env_name] = []
        for seed in tqdm(seeds, desc=f"{label} {env_name}", unit="seed", leave=False):
            rollouts = run_group(make, seed, client, greedy_cfg, model="moe", group_size=1,
                                 request_seed=seed)
            if samples:
                rollouts += run_group(make, seed, client, sampled_cfg, model="moe",
                                      group_size=samples, request_seed=seed)
            row: dict[str, Any] = {"seed": seed, **episode_row(rollouts)}
            if mode is not None:
                row["routed_own"] = float(episode_slot(moe, rollouts[0]) == own_slot[env_name])
            out[env_name].append(row)
    return out
