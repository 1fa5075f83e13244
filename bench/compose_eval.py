"""Does composition beat collapse? Real figures for stage 4 on this CPU, with toy tasks.

    python bench/compose_eval.py [--out DIR] [--repeats 3] [--steps 12] [--eval-seeds 64]

1. trains one LoRA adapter per toy task on the `tiny` model with the project's own GRPO
   trainer (`trace_lib.train.trainer.train`, its CPU policy server and rollout loop);
2. composes them behind token-level top-1 gates (`trace_lib.compose.gated.compose`);
3. warm-starts the gates by KL on per-seed rewards and trains them with GRPO on the
   round-robin mixture of the tasks (`trace_lib.compose.gate_training.train_gates`);
4. evaluates base, each single adapter, the uniform linear merge and the composed model
   greedily on held-out seeds of every task (`trace_lib.compose.evaluate`), prints the
   table and the wall time, and writes `eval.json` into the composed folder (the Routing
   page's Evaluate tab reads it) and `compose_eval.json` (table + timings) into --out.

Design decisions
- The tasks conflict by construction: `LetterEnv` rewards an answer that contains the
  letter "e", `NoLetterEnv` one that contains none; each has its own prompt wording, so a
  gate that reads the context can tell them apart, while a merged adapter must pull the
  same output tokens both ways at once. That is the situation "collapse" names.
- Both answers are a few tokens (`max_tokens` 3), as in the trainer's smoke recipe
  (notebooks/03_train.ipynb), so a random-init policy sits between 0 and 1 and groups are
  informative.
- LoRA targets stay inside the decoder blocks (q/k/v/o/gate/up/down, no `lm_head`): the
  gated model only wraps projections inside blocks (`gated.py` refuses others), so the
  smoke recipe's `lm_head` target is replaced by all seven block projections and a higher
  learning rate.
- Gate warm start at lr 1e-2 for 200 steps (the library default is 5e-2 x 30): the block
  inputs of `tiny` have a norm of about 0.17 and the two tasks' last prompt token differs
  by about 0.03 in block 1 (and not at all in block 0, which sees only the token), so the
  zero-initialised gates need large weights; at 5e-2 and above Adam overshoots and the KL
  rises (1.1 -> 6-7), at 1e-3 it barely moves in 80 steps; 1e-2 x 200 reaches ~0.65.
- Besides `top1` (the table `evaluate_composition` makes), the same trained gates are
  evaluated under `trajectory` (one choice per request, pooled over the prompt) and `soft`
  routing, because on this toy they answer different questions: whether the gates know the
  task (prompt tokens) versus whether a per-token gate can act on it while decoding.
- `--repeats` reruns the whole pipeline with seeds 0..N-1: greedy answers of `tiny` barely
  depend on the seed number in the prompt, so each cell of one repeat is close to 0 or 1
  and the repeats are the real sample.
- One torch thread: on two shared cores the tiny model is many times faster that way.
- Everything is this project's code path (trainer, policy server, compose, gate GRPO,
  evaluate); nothing is simulated. Seeds: training 0.., gate warm 0.., gate GRPO 100..,
  held-out evaluation 10,000.. (disjoint).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trace_lib.train.smoke_envs import TargetLetterEnv  # noqa: E402

LETTER = "e"


class LetterEnv(TargetLetterEnv):
    """Pass when the short answer contains LETTER."""

    name = "toy/letter_e"
    capability = "use_e"
    target = LETTER

    @property
    def messages(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": self.system_prompt},
                {"role": "user", "content": f"Request {self._seed}: answer with many letters."}]


class NoLetterEnv(TargetLetterEnv):
    """Pass when the short answer is non-empty and has no LETTER: the opposite skill."""

    name = "toy/no_letter_e"
    capability = "avoid_e"
    target = LETTER

    @property
    def messages(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": "Follow the rule exactly."},
                {"role": "user", "content": f"Order {self._seed}: reply in one word, no vowels."}]

    @property
    def hint(self) -> str | None:
        return f"do not use the letter {self.target}"

    def summary(self) -> dict[str, Any]:
        text = (self._answer or "").strip().lower()
        ok = bool(text) and self.target not in text
        return {"reward": float(ok), "passed": ok, "steps": self._steps,
                "reasons": ["non-empty answer without 'e'" if ok
                            else ("empty answer" if not text else "the answer contains 'e'")]}


TASKS = {"use_e": f"{__name__}:LetterEnv", "avoid_e": f"{__name__}:NoLetterEnv"}
MAKERS = {TASKS["use_e"]: LetterEnv, TASKS["avoid_e"]: NoLetterEnv}


def train_adapters(out: Path, steps: int, lr: float, eval_seeds: int,
                   seed: int = 0) -> dict[str, Any]:
    from trace_lib.train.trainer import TrainConfig, train

    results = {}
    for cap, env in TASKS.items():
        cfg = TrainConfig.from_dict({
            "env": env, "model": "tiny", "steps": steps, "group": 8, "groups_per_step": 2,
            "max_tokens": 3, "lr": lr, "checkpoint_every": 0, "eval_seeds": eval_seeds,
            "seed": seed,
            "lora": {"rank": 8, "alpha": 16,
                     "targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                 "up_proj", "down_proj"]},
        })
        t0 = time.perf_counter()
        res = train(cfg, out / f"train_{cap}", resume=False)
        results[cap] = {"adapter": res.adapter_path, "wall_s": time.perf_counter() - t0,
                        "final_reward": res.final_reward,
                        "eval_before": res.eval_before, "eval_after": res.eval_after}
        print(f"[adapter {cap}] {results[cap]['wall_s']:.0f}s  train-time held-out pass "
              f"{(res.eval_before or {}).get('pass_rate')} -> "
              f"{(res.eval_after or {}).get('pass_rate')}", flush=True)
    return results


def print_table(rows: list[dict[str, Any]]) -> None:
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    envs = list(dict.fromkeys(r["env"] for r in rows))
    names = {v: k for k, v in TASKS.items()}
    head = "| policy | " + " | ".join(f"{names.get(e, e)} reward / pass" for e in envs) \
        + " | mean reward |"
    print(head)
    print("|" + "---|" * (len(envs) + 2))
    for p in policies:
        cells = [next(r for r in rows if r["policy"] == p and r["env"] == e) for e in envs]
        mean = sum(c["reward_mean"] for c in cells) / len(cells)
        print(f"| {p} | " + " | ".join(f"{c['reward_mean']:.3f} / {c['pass_rate']:.3f}"
                                       for c in cells) + f" | {mean:.3f} |")


def run_once(out: Path, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One full pipeline (adapters -> compose -> gates -> evaluation) with one seed."""
    from trace_lib.compose.evaluate import EvalConfig, evaluate_composition, write_eval
    from trace_lib.compose.gate_training import GateTrainConfig, train_gates
    from trace_lib.compose.gated import compose, load_moe
    from trace_lib.compose.local_client import LocalMoEClient
    from trace_lib.runtime.rollout import RolloutConfig, evaluate

    timings: dict[str, float] = {}
    t_all = t0 = time.perf_counter()
    adapters = train_adapters(out, args.steps, args.lr, eval_seeds=8, seed=seed)
    timings["train_adapters_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    compose("tiny", [(cap, Path(a["adapter"])) for cap, a in adapters.items()],
            out=out / "moe_init")
    gcfg = GateTrainConfig(moe=str(out / "moe_init"), envs=list(TASKS.values()),
                           warm_seeds=args.warm_seeds, warm_steps=args.warm_steps,
                           warm_lr=args.warm_lr, steps=args.gate_steps, groups_per_step=2,
                           group=8, lr=args.gate_lr, max_tokens=3, torch_threads=1, seed=seed)
    gates = train_gates(gcfg, out / "gates", env_makers=MAKERS)
    timings["gates_s"] = time.perf_counter() - t0
    metrics = [json.loads(x) for x in (out / "gates" / "metrics.jsonl").read_text().splitlines()]
    warm = [r["kl"] for r in metrics if r["phase"] == "warm"]
    grpo_rows = [r for r in metrics if r["phase"] == "grpo"]
    print(f"[gates] warm KL {warm[0]:.3f} -> {warm[-1]:.3f}; warm rewards per seed "
          f"(slots {gates['slots']}):", flush=True)
    for env, by_seed in gates["warm_rewards"].items():
        print(f"  {env}: {list(by_seed.values())}")
    for r in grpo_rows:
        print(f"  gate GRPO step {r['step']}: reward {r['reward_mean']:.3f} groups kept "
              f"{r['groups_kept']} entropy {r['routing_entropy']:.3f}")

    t0 = time.perf_counter()
    moe = load_moe(gates["moe_path"])
    ecfg = EvalConfig(envs=list(TASKS.values()), seeds=args.eval_seeds, max_tokens=3)

    def show(r: dict[str, Any]) -> None:
        print(f"  {r['policy']:<22} {r['env'].split(':')[-1]:<12} reward "
              f"{r['reward_mean']:.3f} pass {r['pass_rate']:.3f}", flush=True)

    rows = evaluate_composition(moe, ecfg, on_row=show)
    # The same trained gates under the other routing rules (docs/COMPOSE.md): per-request
    # (`trajectory`, what vLLM can serve) and the reference's dense `soft` mix.
    greedy = RolloutConfig(ecfg.max_turns, ecfg.max_tokens, ecfg.max_sequence, temperature=0.0)
    seeds = [ecfg.seed_start + i for i in range(ecfg.seeds)]
    for mode in ("trajectory", "soft"):
        moe.set_mode(mode)
        for env_name in ecfg.envs:
            t1 = time.perf_counter()
            res = evaluate(MAKERS[env_name], seeds, LocalMoEClient(moe), greedy, model="moe")
            row = {"env": env_name, "policy": f"composed ({mode})",
                   "reward_mean": res.reward_mean, "pass_rate": res.pass_rate, "n": res.n,
                   "wall_s": time.perf_counter() - t1}
            rows.append(row)
            show(row)
    moe.set_mode("top1")
    write_eval(gates["moe_path"], rows, ecfg)
    timings["eval_s"] = time.perf_counter() - t0
    timings["total_s"] = time.perf_counter() - t_all
    return {"seed": seed, "rows": rows, "timings": timings, "adapters": adapters,
            "warm_kl": [warm[0], warm[-1]], "warm_rewards": gates["warm_rewards"],
            "gate_grpo": grpo_rows, "moe_path": gates["moe_path"]}


def mean_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (env, policy): mean over repeats, with min and max of the pass rate."""
    keys = list(dict.fromkeys((r["env"], r["policy"]) for run in runs for r in run["rows"]))
    out = []
    for env, policy in keys:
        cells = [r for run in runs for r in run["rows"] if (r["env"], r["policy"]) == (env, policy)]
        out.append({"env": env, "policy": policy,
                    "reward_mean": sum(c["reward_mean"] for c in cells) / len(cells),
                    "pass_rate": sum(c["pass_rate"] for c in cells) / len(cells),
                    "pass_min": min(c["pass_rate"] for c in cells),
                    "pass_max": max(c["pass_rate"] for c in cells), "repeats": len(cells)})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="output dir (default: a temp dir)")
    ap.add_argument("--repeats", type=int, default=3, help="whole pipeline, seeds 0..N-1")
    ap.add_argument("--steps", type=int, default=12, help="GRPO steps per adapter")
    ap.add_argument("--lr", type=float, default=2e-2, help="adapter learning rate")
    ap.add_argument("--warm-seeds", type=int, default=8)
    ap.add_argument("--warm-steps", type=int, default=200)
    ap.add_argument("--warm-lr", type=float, default=1e-2)
    ap.add_argument("--gate-steps", type=int, default=10)
    ap.add_argument("--gate-lr", type=float, default=1e-3)
    ap.add_argument("--eval-seeds", type=int, default=64, help="held-out seeds per task")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    out = args.out or Path(tempfile.mkdtemp(prefix="trace_compose_eval_"))
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TRACE_RUNS_DIR", str(out / "runs"))
    t_all = time.perf_counter()
    runs = []
    for seed in range(args.repeats):
        print(f"=== repeat {seed + 1}/{args.repeats} (seed {seed})", flush=True)
        runs.append(run_once(out / f"seed_{seed}", seed, args))
        print_table(runs[-1]["rows"])
    total = time.perf_counter() - t_all

    table = mean_rows(runs)
    print(f"\n=== mean over {len(runs)} repeats ({args.eval_seeds} held-out seeds per task each)")
    print_table(table)
    print("pass-rate range over repeats: " + "; ".join(
        f"{r['policy']} {r['env'].split(':')[-1]} {r['pass_min']:.2f}-{r['pass_max']:.2f}"
        for r in table if r["pass_min"] != r["pass_max"]) or "none")
    keys = runs[0]["timings"]
    print(f"wall time: total {total:.0f}s; per repeat (mean) " + ", ".join(
        f"{k} {sum(r['timings'][k] for r in runs) / len(runs):.0f}s" for k in keys))
    report = {"table": table, "runs": runs, "wall_s": total,
              "args": {k: str(v) for k, v in vars(args).items()}}
    (out / "compose_eval.json").write_text(json.dumps(report, indent=2, default=str))
    print(f"written: {out / 'compose_eval.json'} (and eval.json in each seed_*/gates/moe/)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
