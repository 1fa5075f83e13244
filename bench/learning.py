"""Does a real model learn a capability here, honestly? base vs SFT-only vs SFT+GRPO.

    nice -n 5 .venv/bin/python bench/learning.py                     # the full run
    .venv/bin/python bench/learning.py --eval-seeds 4 --sft-steps 2 --grpo-steps 1  # smoke

SmolLM2-135M-Instruct with one LoRA adapter per environment, on two capability
environments whose correct behaviours conflict: `airline/tool_calling_precision` (the
right move is a write with exact arguments) and `airline/precondition_verification` (read
the reservation, then cancel only when the policy allows, otherwise refuse without a
write). Per environment:

1. base: the model as it is;
2. SFT-only: `--sft-steps` of cross-entropy on the environment's reference actions
   (training seeds), the adapter saved under `--adapters/<env>/sft`;
3. SFT+GRPO: `--grpo-steps` GRPO steps from the SFT adapter (`trace_lib.train.step`, the
   same step the trainer and gate training use), saved under `--adapters/<env>/grpo`.

All environments are trained first (SFT, then GRPO; adapters saved after each phase and
GRPO step), then each condition is measured on the same `--eval-seeds` held-out seeds with one greedy and
`--samples` sampled episodes per seed. Reported: mean reward and pass rate with 95%
intervals (seeds as the unit, normal approximation), the paired per-seed difference
SFT+GRPO - SFT-only with its 95% interval, and the behaviour behind the reward (share of
episodes with a well-formed tool call, with a call equal to a reference action, reads
before the first write, writes, refusals on eligible / ineligible instances) so that a
loophole cannot pass as learning. Results go to `--out` (JSON, rewritten after every
phase, so a run stopped early still leaves what it measured) and stdout.

Rollouts run in-process (`trace_lib.train.local_rollouts`: shared-prompt KV cache,
batched decoding), because on this 2-core machine a policy-server round trip per turn
does not fit the budget; the verifier, the environments, the chat format and the GRPO
step are the product's own.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _ci(values: list[float]) -> dict[str, float]:
    n = len(values)
    if n == 0:
        return {"mean": float("nan"), "lo": float("nan"), "hi": float("nan"), "n": 0}
    m = sum(values) / n
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    h = 1.96 * sd / math.sqrt(n)
    return {"mean": round(m, 4), "lo": round(m - h, 4), "hi": round(m + h, 4), "n": n}


def behaviour(rollouts: list[Any], make_env: Any) -> dict[str, float]:
    """What the episodes did, read from the transcripts and the instances' ground truth."""
    from trace_lib.envs.capabilities.task_env import REFUSAL_PHRASES, answer_contains

    n = len(rollouts)
    counts = {"tool_call": 0, "reference_call": 0, "write": 0, "reads_before_write": 0,
              "refusal": 0, "refusal_ineligible": 0, "ineligible": 0, "refusal_eligible": 0,
              "eligible": 0, "passed": 0}
    probe = make_env()
    writes_of = set(probe.write_tool_names())
    for r in rollouts:
        probe.reset(r.seed)
        gt = probe.ground_truth
        ref = {(a["name"], json.dumps(a["arguments"], sort_keys=True))
               for a in gt["reference_actions"]}
        needed_reads = {(a["name"], json.dumps(a["arguments"], sort_keys=True))
                        for a in gt["required_reads"]}
        calls, final = [], None
        msgs = r.messages
        for k, m in enumerate(msgs):
            if m["role"] == "assistant":
                for c in m.get("tool_calls") or []:
                    fn = c["function"]
                    try:
                        args = json.loads(fn["arguments"]) if isinstance(fn["arguments"], str) \
                            else fn["arguments"]
                    except ValueError:
                        args = {}
                    result = next((x["content"] for x in msgs[k + 1:]
                                   if x["role"] == "tool" and x.get("tool_call_id") == c.get("id")),
                                  "")
                    calls.append((fn["name"], json.dumps(args, sort_keys=True),
                                  not str(result).startswith("Error")))
                if not m.get("tool_calls"):
                    final = m.get("content") or ""
        ok_writes = [i for i, c in enumerate(calls) if c[0] in writes_of and c[2]]
        counts["tool_call"] += bool(calls)
        counts["reference_call"] += any((c[0], c[1]) in ref for c in calls)
        counts["write"] += bool(ok_writes)
        if ok_writes and needed_reads:
            before = {(c[0], c[1]) for c in calls[: ok_writes[0]] if c[2]}
            counts["reads_before_write"] += needed_reads <= before
        refused = final is not None and not ok_writes and \
            any(answer_contains(final, p) for p in REFUSAL_PHRASES)
        counts["refusal"] += refused
        eligible = gt["facts"].get("eligible")
        if eligible is not None:
            key = "eligible" if eligible else "ineligible"
            counts[key] += 1
            counts[f"refusal_{key}"] += refused
        counts["passed"] += r.passed
    out = {f"share_{k}": round(v / max(n, 1), 4) for k, v in counts.items()
           if k not in ("eligible", "ineligible", "refusal_eligible", "refusal_ineligible",
                        "reads_before_write")}
    out["reads_before_write_of_writes"] = round(counts["reads_before_write"]
                                                / max(counts["write"], 1), 4)
    if counts["eligible"] or counts["ineligible"]:
        out["refusal_rate_eligible"] = round(counts["refusal_eligible"]
                                             / max(counts["eligible"], 1), 4)
        out["refusal_rate_ineligible"] = round(counts["refusal_ineligible"]
                                               / max(counts["ineligible"], 1), 4)
    out["episodes"] = n
    return out


def measure(engine: Any, make_env: Any, seeds: list[int], samples: int, temperature: float,
            label: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    groups = engine.run(make_env, seeds, [0.0] + [temperature] * samples,
                        on_chunk=lambda k, n: print(f"  [{label}] {k}/{n} episodes",
                                                    flush=True))
    greedy = [g[0] for g in groups]
    sampled = [r for g in groups for r in g[1:]]
    per_seed = [sum(r.reward for r in g) / len(g) for g in groups]
    res = {
        "greedy_reward": _ci([r.reward for r in greedy]),
        "greedy_pass": _ci([float(r.passed) for r in greedy]),
        "sampled_reward": _ci([sum(r.reward for r in g[1:]) / max(len(g) - 1, 1)
                               for g in groups]),
        "sampled_pass": _ci([sum(r.passed for r in g[1:]) / max(len(g) - 1, 1)
                             for g in groups]),
        "per_seed_reward": per_seed,
        "behaviour_greedy": behaviour(greedy, make_env),
        "behaviour_sampled": behaviour(sampled, make_env),
        "example": greedy[0].messages[2:] if greedy else [],
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    print(f"[{label}] greedy reward {res['greedy_reward']['mean']:.3f} "
          f"[{res['greedy_reward']['lo']:.3f}, {res['greedy_reward']['hi']:.3f}] pass "
          f"{res['greedy_pass']['mean']:.3f}; sampled reward {res['sampled_reward']['mean']:.3f}"
          f" ({res['wall_s']:.0f}s)", flush=True)
    return res


def paired(a: list[float], b: list[float]) -> dict[str, float]:
    return _ci([x - y for x, y in zip(a, b, strict=True)])


def _setup(name: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch  # noqa: F401

    from trace_lib.envs.capabilities import make_capability_env
    from trace_lib.runtime.base_models import load_model, resolve_model
    from trace_lib.runtime.lora import attach_lora, trainable_parameters
    from trace_lib.train.config import LoraSettings
    from trace_lib.train.local_rollouts import LocalRolloutConfig, LocalRollouts

    domain, cap = name.split("/")

    def make_env() -> Any:
        return make_capability_env(domain, cap, difficulty=args.difficulty, tools=args.tools,
                                   policy=args.policy, distractors=args.distractors)

    model_path = resolve_model(args.model)
    base, tok = load_model(model_path)
    model = attach_lora(base, LoraSettings(rank=args.rank, alpha=args.rank), seed=args.seed)
    model.eval()
    engine = LocalRollouts(model, tok, LocalRolloutConfig(max_tokens=args.max_tokens,
                                                          max_turns=args.max_turns,
                                                          chunk=args.chunk, seed=args.seed))
    eval_seeds = [args.eval_seed_start + i for i in range(args.eval_seeds)]
    engine.set_prefix(make_env, eval_seeds)
    return {"make_env": make_env, "model": model, "tok": tok, "engine": engine,
            "params": trainable_parameters(model), "model_path": model_path,
            "eval_seeds": eval_seeds,
            "folder": Path(args.adapters) / name.replace("/", "__")}


def train_env(name: str, args: argparse.Namespace, out: dict[str, Any], save: Any) -> None:
    """SFT then GRPO on training seeds; both adapters saved (they feed composition)."""
    import torch

    from trace_lib.runtime.lora import save_adapter
    from trace_lib.train.config import LossConfig
    from trace_lib.train.local_rollouts import PrefixForward, reference_episode, sft
    from trace_lib.train.step import GRPOStep, StepSettings

    t_env = time.perf_counter()
    ctx = _setup(name, args)
    model, tok, engine, params = ctx["model"], ctx["tok"], ctx["engine"], ctx["params"]
    make_env, eval_seeds = ctx["make_env"], ctx["eval_seeds"]
    res: dict[str, Any] = out["envs"].setdefault(name, {})
    grpo_seed0 = args.sft_seeds  # GRPO seeds follow the SFT ones; both far below eval seeds
    assert grpo_seed0 + args.grpo_steps * args.groups_per_step < eval_seeds[0]
    probe = make_env()
    probe.reset(eval_seeds[0])
    res["prompt_tokens"] = {"shared_prefix": len(engine.prefix_ids),
                            "first_prompt": len(engine.prompt_ids(probe))}
    res["tools_shown"] = probe.tool_names_shown()
    res["seeds"] = {"eval": [eval_seeds[0], eval_seeds[-1]], "sft": [0, args.sft_seeds - 1],
                    "grpo": [grpo_seed0, grpo_seed0 + args.grpo_steps * args.groups_per_step]}

    def train_mode(on: bool) -> None:
        model.train(on)

    t0 = time.perf_counter()
    demos = []
    for s in range(args.sft_seeds):
        ep = reference_episode(make_env(), s, tok, max_turns=args.max_turns)
        if ep is not None:
            demos.append(ep)
    opt = torch.optim.AdamW(params, lr=args.sft_lr, weight_decay=0.0)
    losses = sft(params, opt, demos, PrefixForward(model, engine.prefix_ids, 1.0),
                 steps=args.sft_steps, batch=args.sft_batch, pad_id=tok.pad_token_id or 0,
                 seed=args.seed, train_mode=train_mode,
                 log=lambda row: print(f"  [{name} sft] step {row['sft_step']} loss "
                                       f"{row['loss']:.4f}", flush=True))
    sft_dir = save_adapter(model, ctx["folder"] / "sft", ctx["model_path"])
    res["sft"] = {"steps": args.sft_steps, "demos": len(demos), "losses": losses,
                  "adapter": str(sft_dir), "wall_s": round(time.perf_counter() - t0, 1)}
    save(out)

    t0 = time.perf_counter()
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    step = GRPOStep(params, opt, StepSettings(loss=LossConfig(), micro_batch=args.micro_batch,
                                              temperature=args.temperature),
                    forward=PrefixForward(model, engine.prefix_ids, args.temperature),
                    pad_id=tok.pad_token_id or 0, train_mode=train_mode)
    rows = []
    for k in range(args.grpo_steps):
        if args.deadline_s and time.perf_counter() - t_env > args.deadline_s:
            print(f"  [{name} grpo] stopping at step {k}: the time budget is spent", flush=True)
            break
        t1 = time.perf_counter()
        seeds = [grpo_seed0 + k * args.groups_per_step + g for g in range(args.groups_per_step)]
        groups = engine.run(make_env, seeds, [args.temperature] * args.group)
        t_roll = time.perf_counter() - t1
        outcome = step.update(groups)
        row = {k2: v for k2, v in outcome.metrics.items() if k2 != "no_signal_warning"}
        row.update(step=k + 1, rollout_s=round(t_roll, 1),
                   wall_s=round(time.perf_counter() - t1, 1))
        rows.append(row)
        print(f"  [{name} grpo] step {k + 1} reward {row['reward_mean']:.3f} pass "
              f"{row['pass_rate']:.2f} groups kept {row['groups_kept']}/{len(groups)} "
              f"loss {row['loss']:.4f} {row['wall_s']:.0f}s", flush=True)
        grpo_dir = save_adapter(model, ctx["folder"] / "grpo", ctx["model_path"])
        res["grpo"] = {"steps_run": len(rows), "steps_planned": args.grpo_steps,
                       "metrics": rows, "no_signal_steps": step.monitor.total,
                       "adapter": str(grpo_dir), "wall_s": round(time.perf_counter() - t0, 1)}
        save(out)
    if not rows:
        grpo_dir = save_adapter(model, ctx["folder"] / "grpo", ctx["model_path"])
        res["grpo"] = {"steps_run": 0, "steps_planned": args.grpo_steps, "metrics": [],
                       "adapter": str(grpo_dir), "wall_s": 0.0}
    res["train_wall_s"] = round(time.perf_counter() - t_env, 1)
    save(out)


def eval_env(name: str, args: argparse.Namespace, out: dict[str, Any], save: Any) -> None:
    """base, SFT-only and SFT+GRPO on the same held-out seeds; paired differences."""
    from trace_lib.runtime.lora import load_adapter_weights

    t_env = time.perf_counter()
    ctx = _setup(name, args)
    model, engine, make_env = ctx["model"], ctx["engine"], ctx["make_env"]
    res: dict[str, Any] = out["envs"].setdefault(name, {})
    with model.disable_adapter():
        res["base"] = measure(engine, make_env, ctx["eval_seeds"], args.samples,
                              args.temperature, f"{name} base")
    save(out)
    for key, sub in (("sft_only", "sft"), ("sft_grpo", "grpo")):
        load_adapter_weights(model, ctx["folder"] / sub)
        res[key] = measure(engine, make_env, ctx["eval_seeds"], args.samples,
                           args.temperature, f"{name} {key}")
        save(out)
    res["paired_grpo_minus_sft"] = paired(res["sft_grpo"]["per_seed_reward"],
                                          res["sft_only"]["per_seed_reward"])
    res["paired_sft_minus_base"] = paired(res["sft_only"]["per_seed_reward"],
                                          res["base"]["per_seed_reward"])
    res["eval_wall_s"] = round(time.perf_counter() - t_env, 1)
    d = res["paired_grpo_minus_sft"]
    print(f"[{name}] SFT+GRPO - SFT per-seed reward {d['mean']:+.3f} [{d['lo']:+.3f}, "
          f"{d['hi']:+.3f}]", flush=True)
    save(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--envs", default="airline/precondition_verification,"
                                      "airline/tool_calling_precision")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--difficulty", type=int, default=1)
    p.add_argument("--tools", default="capability", choices=["capability", "all"])
    p.add_argument("--policy", default="excerpt", choices=["excerpt", "full"])
    p.add_argument("--distractors", type=int, default=1)
    p.add_argument("--eval-seeds", type=int, default=64)
    p.add_argument("--eval-seed-start", type=int, default=100_000)
    p.add_argument("--samples", type=int, default=2)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=80)
    p.add_argument("--max-turns", type=int, default=4)
    p.add_argument("--chunk", type=int, default=64)
    p.add_argument("--sft-seeds", type=int, default=64)
    p.add_argument("--sft-steps", type=int, default=30)
    p.add_argument("--sft-batch", type=int, default=4)
    p.add_argument("--sft-lr", type=float, default=5e-4)
    p.add_argument("--grpo-steps", type=int, default=6)
    p.add_argument("--group", type=int, default=6)
    p.add_argument("--groups-per-step", type=int, default=4)
    p.add_argument("--micro-batch", type=int, default=6)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--deadline-s", type=float, default=0.0,
                   help="per environment: start no GRPO step after this many seconds")
    p.add_argument("--eval-only", action="store_true",
                   help="evaluate the adapters already under --adapters (no training)")
    p.add_argument("--adapters", default=str(ROOT / "data" / "adapters-bench"))
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "learning.json"))
    args = p.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    out: dict[str, Any] = {"config": vars(args), "envs": {}, "started": time.strftime(
        "%Y-%m-%d %H:%M:%S", time.gmtime())}
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)

    def save(obj: dict[str, Any]) -> None:
        path.write_text(json.dumps(obj, indent=1, default=str))

    names = [e for e in args.envs.split(",") if e]
    # Training first for every environment (the adapters feed composition even if the
    # evaluation is cut short), then the held-out evaluation of all three conditions.
    if not args.eval_only:
        for name in names:
            train_env(name, args, out, save)
    for name in names:
        eval_env(name, args, out, save)
    out["finished"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    save(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
