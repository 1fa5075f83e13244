"""Gate training on a GPU vs a CPU: the product's warm start, gate GRPO update and rollouts.

    python bench/gpu_gates.py --device cpu  --shapes smollm2-135m                 # a CPU
    python bench/gpu_gates.py --device cuda --shapes smollm2-135m,smollm2-1.7b     # GPU box

What it times is `trace_lib.compose` itself on a composed model of two adapters
(`GatedMoE`, top-1 routing, per-block gates), placed as `gates --device` places it
(`GateTrainConfig.device`/`dtype`: bf16 base on CUDA, fp32 gates):
- the KL warm start: `gate_training.warm_features` (one forward per prompt, routing forced
  to the prompt's target) and `warm_start` (`--warm-steps` Adam steps on those features);
- one gate GRPO update: `gate_training.gate_grpo` / `gate_grpo_step`, the project's
  `GRPOStep` with `GateForward` (straight-through gate gradient, load-balance term), on real
  episode token sequences (the reference episodes of `--env`, as bench/gpu_train.py);
- rollouts: `LocalMoEClient.chat`, the in-process decoder gate training samples with, one
  group of `--group` completions of `--max-tokens` tokens on the environment's prompt.

Design decisions
- Random-initialised base in the shapes of the SmolLM2 family (`bench/gpu_train.SHAPES`)
  and random adapters (r=16 on q/v/o/up, B ~ N(0, 0.02)), because no weights can travel
  to the GPU machine. Times and memory do not depend on the values; what gates learn does
  (bench/compose_real.py measures that on real adapters).
- GRPO groups are one episode repeated `--group` times with rewards alternating 1/0: the
  advantages are synthetic, the compute is a real step's (every sampled token in the loss,
  a backward pass through the frozen base into the gates of every block).
- Random weights rarely sample an end-of-text token, so a rollout group decodes its full
  `--max-tokens`: the decode figure is per generated token, the worst case of a real run.
- Every timed section synchronises the device; peak memory is CUDA's allocator peak (or
  the process's max RSS on the CPU). The gates are checked after the update: finite, moved.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.gpu_train import (  # noqa: E402
    build_model,
    demos_of,
    env_maker,
    peak_gib,
    shape_arguments,
    sync,
)
from trace_lib.compose.adapters import Adapter, LoRAFactors  # noqa: E402
from trace_lib.compose.gate_training import (  # noqa: E402
    GateTrainConfig,
    gate_delta,
    gate_grpo,
    gate_grpo_step,
    soft_targets,
    warm_features,
    warm_start,
)
from trace_lib.compose.gated import GatedMoE, MoEConfig  # noqa: E402
from trace_lib.compose.local_client import LocalMoEClient  # noqa: E402
from trace_lib.runtime.base_models import resolve_device, resolve_dtype  # noqa: E402
from trace_lib.runtime.rollout import Rollout  # noqa: E402

TARGETS = ("self_attn.q_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.up_proj")


def random_adapter(model: torch.nn.Module, name: str, rank: int, seed: int) -> Adapter:
    """An adapter on every targeted projection of every block, as a trained one would be."""
    g = torch.Generator().manual_seed(seed)
    factors = {}
    for module_name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and module_name.endswith(TARGETS):
            a = torch.randn(rank, module.in_features, generator=g) / module.in_features ** 0.5
            b = torch.randn(module.out_features, rank, generator=g) * 0.02
            factors[module_name] = LoRAFactors(A=a, B=b, scale=2.0)
    return Adapter(name=name, path=Path(f"<random {name}>"), base_model=None, rank=rank,
                   alpha=2.0 * rank, target_modules=list(TARGETS), factors=factors)


def env_prompt(env_name: str, seed: int) -> tuple[list[dict], list[dict]]:
    """The first turn an agent sees in `env_name`, built as the episodes are (`env_maker`)."""
    env = env_maker(env_name)()
    env.reset(seed)
    return list(env.messages), env.tool_schemas


def timed(device: str, fn) -> tuple[float, object]:
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t0, out


def run_shape(shape: str, args: argparse.Namespace, tokenizer, demos: list,
              device: str) -> dict:
    dtype = resolve_dtype(args.dtype, device)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    base = build_model(shape, device, dtype, args.seed)
    adapters = [random_adapter(base, name, args.rank, args.seed + i)
                for i, name in enumerate(("tool_calling_precision", "precondition_verification"))]
    moe = GatedMoE(base, adapters, MoEConfig(mode="top1"), tokenizer=tokenizer,
                   base_model=shape)
    start = [p.detach().clone() for p in moe.gate_parameters()]

    # Warm start: the prompts of `--warm-prompts` seeds, targets alternating between slots.
    prompts = []
    for i in range(args.warm_prompts):
        ids, _mask = demos[i % len(demos)]
        prompts.append((ids[: args.warm_prompt_tokens],
                        soft_targets([0.0, 1.0, 0.0] if i % 2 else [0.0, 0.0, 1.0], 0.1)))
    feat_s, _ = timed(device, lambda: warm_features(moe, prompts))
    warm_s, losses = timed(device, lambda: warm_start(moe, prompts, args.warm_steps, 0.1))

    # One gate GRPO update on episodes repeated with alternating rewards (timed after warmup).
    cfg = GateTrainConfig(moe="-", envs=[args.env], micro_batch=args.micro_batch,
                          balance_coef=0.01)
    step, forward = gate_grpo(moe, cfg)

    def groups_for(k: int) -> list[list[Rollout]]:
        out = []
        for g in range(args.groups_per_step):
            ids, mask = demos[(k * args.groups_per_step + g) % len(demos)]
            out.append([Rollout(seed=g, hinted=False, token_ids=list(ids), loss_mask=list(mask),
                                sampler_logprobs=[None] * len(ids), messages=[],
                                reward=float(i % 2)) for i in range(args.group)])
        return out

    for w in range(args.warmup):
        gate_grpo_step(step, forward, groups_for(w))
    grpo_times, tokens, metrics = [], 0, {}
    for k in range(args.grpo_steps):
        groups = groups_for(args.warmup + k)
        tokens = sum(len(r.token_ids) for grp in groups for r in grp)
        seconds, metrics = timed(device, lambda groups=groups: gate_grpo_step(step, forward,
                                                                               groups))
        grpo_times.append(seconds)

    # Rollouts: one group sampled by the decoder gate training uses, on the env's prompt.
    messages, tools = env_prompt(args.env, 100_000)
    client = LocalMoEClient(moe)
    decode_times, generated = [], 0
    for k in range(args.decode_reps):
        seconds, samples = timed(device, lambda k=k: client.chat(
            messages, tools, n=args.group, max_tokens=args.max_tokens, temperature=1.0,
            seed=args.seed + k))
        decode_times.append(seconds)
        generated = sum(len(s.token_ids) for s in samples)
    gates = moe.gate_parameters()
    row = {
        "shape": shape, "device": device, "dtype": str(dtype).removeprefix("torch."),
        "gate_params": moe.gate_param_count(),
        "gate_dtype": str(gates[0].dtype).removeprefix("torch."),
        "warm_prompts": len(prompts), "warm_features_s": feat_s,
        "warm_steps": args.warm_steps, "warm_s": warm_s,
        "warm_kl_first_last": [losses[0], losses[-1]] if losses else None,
        "grpo_s_per_step": statistics.median(grpo_times) if grpo_times else None,
        "grpo_tokens_per_step": tokens,
        "grpo_tokens_per_s": tokens / statistics.median(grpo_times) if grpo_times else None,
        "grpo_grad_norm": metrics.get("grad_norm"),
        "decode_s_per_group": statistics.median(decode_times) if decode_times else None,
        "decode_tokens_per_group": generated,
        "decode_tokens_per_s": generated / statistics.median(decode_times)
        if decode_times else None,
        "peak_gib": round(peak_gib(device), 2),
        "gates_moved_max_abs": gate_delta(moe, start),
        "gates_finite": all(bool(torch.isfinite(p).all()) for p in gates),
    }
    return row


def main() -> None:
    p = shape_arguments(__doc__, seeds=8)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--warm-prompts", type=int, default=8)
    p.add_argument("--warm-prompt-tokens", type=int, default=1200)
    p.add_argument("--warm-steps", type=int, default=100)
    p.add_argument("--max-tokens", type=int, default=224)
    p.add_argument("--decode-reps", type=int, default=2)
    args = p.parse_args()

    from transformers import AutoTokenizer

    device = resolve_device(args.device)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    demos = demos_of(args, tokenizer)
    header = {"device": device, "torch": torch.__version__, "threads": torch.get_num_threads(),
              "gpu": torch.cuda.get_device_name(0) if device.startswith("cuda") else None,
              "env": args.env, "episodes": len(demos),
              "episode_tokens": sorted(len(ids) for ids, _ in demos)}
    print(json.dumps(header), flush=True)
    rows = []
    for shape in args.shapes.split(","):
        row = run_shape(shape, args, tokenizer, demos, device)
        if device.startswith("cuda"):  # the shape's model is garbage now: free its blocks
            torch.cuda.empty_cache()
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.out:  # after every shape: a timeout keeps what finished
            Path(args.out).write_text(json.dumps({"run": header, "rows": rows}, indent=2))
    print(f"\n{'shape':14} {'device':6} {'dtype':9} {'warm s':>7} {'GRPO s/step':>11} "
          f"{'GRPO tok/s':>10} {'decode tok/s':>12} {'peak GiB':>8}")
    for r in rows:
        print(f"{r['shape']:14} {r['device']:6} {r['dtype']:9} "
              f"{r['warm_features_s'] + r['warm_s']:7.2f} {r['grpo_s_per_step']:11.3f} "
              f"{r['grpo_tokens_per_s']:10.0f} {r['decode_tokens_per_s']:12.1f} "
              f"{r['peak_gib']:8.2f}")


if __name__ == "__main__":
    main()
