"""Calibration: is an environment at the right difficulty for GRPO with a given policy?

    result = calibrate(env, "openai:Qwen3-1.7B@http://127.0.0.1:8000/v1", CalibrationConfig())

Design decisions
- GRPO learns only from groups whose rewards differ, so the figures are per group of G
  rollouts of one seed: the share of all-success groups (every rollout passed), all-fail
  groups (none passed), informative groups (reward not constant within the group), the
  mean reward, the reward histogram, and pass@k for k in 1/4/8/16 (the unbiased estimator
  1 - C(n-c, k)/C(n, k) per seed, averaged; k > G is left out).
- The target band is the reference's: mean reward 0.2-0.6, at most 20% all-success or
  all-fail groups (each), at least 50% informative groups. The result says which bounds
  were missed, not only a yes/no.
- Calibration seeds start at 10,000 by default, away from the 0-49 that validation uses,
  so a policy tuned on validation seeds does not flatter the figures.
- Rollout i of a group gets policy seed i: offline policies (random, epsilon) vary within
  a group as a sampled LLM does; a deterministic policy yields constant groups, which
  the figures then show plainly.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from trace_lib.envs.policies import make_policy, run_episode
from trace_lib.envs.protocol import Environment


@dataclass
class CalibrationConfig:
    seeds: int = 100
    group: int = 16
    seed_offset: int = 10_000
    mean_low: float = 0.2
    mean_high: float = 0.6
    max_all_success: float = 0.2
    max_all_fail: float = 0.2
    min_informative: float = 0.5
    bins: int = 10


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c successes (Chen et al., 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def group_figures(groups: list[list[dict[str, Any]]], config: CalibrationConfig
                  ) -> dict[str, Any]:
    """The calibration figures from per-seed groups of episode summaries."""
    rewards = [float(r["reward"]) for g in groups for r in g]
    n_groups = max(1, len(groups))
    all_success = sum(all(r.get("passed") for r in g) for g in groups) / n_groups
    all_fail = sum(not any(r.get("passed") for r in g) for g in groups) / n_groups
    informative = sum(len({round(float(r["reward"]), 9) for r in g}) > 1 for g in groups)
    informative /= n_groups
    hist = [0] * config.bins
    for x in rewards:
        hist[min(config.bins - 1, int(x * config.bins))] += 1
    ks = [k for k in (1, 4, 8, 16) if k <= config.group]
    pass_k = {
        f"pass@{k}": sum(pass_at_k(len(g), sum(bool(r.get("passed")) for r in g), k)
                         for g in groups) / n_groups
        for k in ks
    }
    mean = sum(rewards) / len(rewards) if rewards else 0.0
    misses = []
    if not config.mean_low <= mean <= config.mean_high:
        misses.append(f"mean reward {mean:.3f} outside [{config.mean_low}, {config.mean_high}]")
    if all_success > config.max_all_success:
        misses.append(f"all-success groups {all_success:.0%} > {config.max_all_success:.0%}")
    if all_fail > config.max_all_fail:
        misses.append(f"all-fail groups {all_fail:.0%} > {config.max_all_fail:.0%}")
    if informative < config.min_informative:
        misses.append(f"informative groups {informative:.0%} < {config.min_informative:.0%}")
    return {
        "mean_reward": mean,
        "all_success_share": all_success,
        "all_fail_share": all_fail,
        "informative_share": informative,
        "histogram": {"edges": [i / config.bins for i in range(config.bins + 1)],
                      "counts": hist},
        **pass_k,
        "in_band": not misses,
        "band_misses": misses,
        "group_means": [sum(float(r["reward"]) for r in g) / max(1, len(g)) for g in groups],
    }


def calibrate(
    env: Environment,
    policy: str,
    config: CalibrationConfig | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Roll out `policy` G times on each of N seeds; return the figures and the band verdict."""
    cfg = config or CalibrationConfig()
    started = time.monotonic()
    groups: list[list[dict[str, Any]]] = []
    total, done = cfg.seeds * cfg.group, 0
    policies = [make_policy(policy, seed=i) for i in range(cfg.group)]
    for s in range(cfg.seed_offset, cfg.seed_offset + cfg.seeds):
        group = []
        for pol in policies:
            summary = run_episode(env, s, pol)
            group.append({"reward": float(summary["reward"]), "passed": bool(summary["passed"]),
                          "steps": summary.get("steps")})
            done += 1
            if progress:
                progress(done, total)
        groups.append(group)
    figures = group_figures(groups, cfg)
    return {
        "name": getattr(env, "name", "?"),
        "policy": policy,
        "config": asdict(cfg),
        **figures,
        "mean_steps": sum(r["steps"] or 0 for g in groups for r in g) / max(1, total),
        "seconds": round(time.monotonic() - started, 2),
    }
