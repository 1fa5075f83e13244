"""Does composition beat collapse? Base, each adapter, a linear merge and the composed model
on held-out seeds of every capability environment.

Design decisions
- All policies are the same `GatedMoE` object driven differently, so they share the base
  weights, the tokenizer, the prompt rendering and the decoding exactly: base = force slot
  0, adapter k = force slot k, linear merge = fixed mixture [0, 1/K, ..., 1/K] on every
  token (exactly the uniform merge of the adapters, a test holds it to peft's loading of
  `linear_merge`'s folder), composed = the gates as trained.
- Rollouts are the training stage's greedy `evaluate` (temperature 0, one rollout per
  seed, no hints) on seeds the gate training never saw (`eval_seed_start` and up).
- Rows come out as they finish (`on_row`), so the page and the CLI show figures as they
  come; the table is also written to `<moe>/eval.json` for the app to record.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_lib.compose.gated import GatedMoE
from trace_lib.compose.local_client import LocalMoEClient, env_factory


@dataclass
class EvalConfig:
    envs: list[str]
    seeds: int = 8
    seed_start: int = 10_000
    max_turns: int = 4
    max_tokens: int = 96
    max_sequence: int = 4096
    include_merge: bool = True


def policies(moe: GatedMoE, include_merge: bool = True) -> list[tuple[str, dict[str, Any]]]:
    """(label, LocalMoEClient kwargs) for every policy the table compares."""
    out: list[tuple[str, dict[str, Any]]] = [("base", {"force": 0})]
    out += [(f"adapter:{name}", {"force": k + 1}) for k, name in enumerate(moe.slots[1:])]
    if include_merge and moe.k > 1:
        out.append(("linear merge", {"mix": [0.0] + [1.0 / moe.k] * moe.k}))
    out.append((f"composed ({moe.config.mode})", {}))
    return out


def evaluate_composition(
    moe: GatedMoE, cfg: EvalConfig,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    env_specs: dict[str, dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """One greedy row per (environment, policy). Names resolve through `env_factory`
    (built-ins, module:Attr, .py files, and generated environments by their serialised
    spec in `env_specs`)."""
    from trace_lib.runtime.rollout import RolloutConfig, evaluate

    greedy = RolloutConfig(cfg.max_turns, cfg.max_tokens, cfg.max_sequence, temperature=0.0)
    seeds = [cfg.seed_start + i for i in range(cfg.seeds)]
    makers = {name: env_factory(name, env_spec=(env_specs or {}).get(name))
              for name in cfg.envs}  # fail before any rollout
    rows = []
    for env_name in cfg.envs:
        make_env = makers[env_name]
        for label, kwargs in policies(moe, cfg.include_merge):
            t0 = time.perf_counter()
            res = evaluate(make_env, seeds, LocalMoEClient(moe, **kwargs), greedy, model="moe")
            row = {"env": env_name, "policy": label, "reward_mean": res.reward_mean,
                   "pass_rate": res.pass_rate, "n": res.n,
                   "wall_s": time.perf_counter() - t0}
            rows.append(row)
            if on_row:
                on_row(row)
    return rows


def summary_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean over environments per policy, best first: the headline of the table."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["policy"], []).append(r)
    out = [{"policy": p, "reward_mean": sum(r["reward_mean"] for r in rs) / len(rs),
            "pass_rate": sum(r["pass_rate"] for r in rs) / len(rs), "envs": len(rs)}
           for p, rs in by.items()]
    return sorted(out, key=lambda r: -r["reward_mean"])


def write_eval(folder: str | Path, rows: list[dict[str, Any]], cfg: EvalConfig) -> Path:
    path = Path(folder) / "eval.json"
    path.write_text(json.dumps({"config": cfg.__dict__, "rows": rows,
                                "summary": summary_rows(rows)}, indent=2))
    return path
