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
- Tokens per turn, when the config gives none, come from the environments: their longest
  reference turn in the composed model's tokens + 25% (`reference_turn_budget`, the one
  home adapter and gate training derive theirs from too). A fixed default (96) cut the
  right call of environments whose reference turn is longer, so every policy scored the
  same zero. `eval.json` records the value used and what it came from.
- Rows come out as they finish (`on_row`), so the page and the CLI show figures as they
  come; the table is also written to `<moe>/eval.json` for the app to record.
"""

from __future__ import annotations

import dataclasses
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
    max_tokens: int | None = None  # None: the envs' longest reference turn + 25%
    max_sequence: int = 4096
    include_merge: bool = True
    # How a derived `max_tokens` was reached (`TurnBudget.record()`); None when given.
    turn_budget: dict[str, Any] | None = None


def env_makers(cfg: EvalConfig, env_specs: dict[str, dict[str, Any]] | None = None
               ) -> dict[str, Callable[[], Any]]:
    """Constructors for `cfg.envs` by `env_factory` (generated ones by their spec)."""
    return {name: env_factory(name, env_spec=(env_specs or {}).get(name)) for name in cfg.envs}


def with_turn_budget(moe: GatedMoE, cfg: EvalConfig,
                     makers: dict[str, Callable[[], Any]]) -> EvalConfig:
    """`cfg` with `max_tokens` set: as given, or derived from `makers`' environments in the
    composed model's tokens (`reference_turn_budget`), with the derivation recorded."""
    if cfg.max_tokens is not None:
        return cfg
    from trace_lib.train.local_rollouts import reference_turn_budget

    measured = reference_turn_budget(makers, moe.tokenizer, cfg.max_turns)
    print(f"[moe-eval] --max-tokens {measured.max_tokens}: the environments' longest "
          f"reference turn is {measured.longest_reference_turn} tokens, +25%"
          + "".join(f"; {n} not measured ({why})" for n, why in measured.unmeasured.items()),
          flush=True)
    return dataclasses.replace(cfg, max_tokens=measured.max_tokens,
                               turn_budget=measured.record())


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
    spec in `env_specs`). A config without `max_tokens` is given one by `with_turn_budget`
    (the caller who records the config calls that first)."""
    from trace_lib.runtime.rollout import RolloutConfig, evaluate

    makers = env_makers(cfg, env_specs)  # fail before any rollout
    cfg = with_turn_budget(moe, cfg, makers)
    greedy = RolloutConfig(cfg.max_turns, cfg.max_tokens, cfg.max_sequence, temperature=0.0)
    seeds = [cfg.seed_start + i for i in range(cfg.seeds)]
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
