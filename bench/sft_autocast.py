"""The loop's SFT step in float32 vs under bf16 autocast (`TrainConfig.autocast`): CPU-s
per step, wall, peak memory and the losses, side by side.

    HF_HUB_OFFLINE=1 nice -n 10 python bench/sft_autocast.py [--steps 1] \\
        [--env airline/multi_step_task_completion] [--difficulty 5] \\
        [--out bench/results/sft-autocast.json]

The SFT the self-trace loop runs (`trainer.warm_start`'s pieces: the environment's
reference demos on seeds 10**6-32.., batch 4, the demos' shared prompt scored once without
gradient, AdamW at `sft_lr`) on SmolLM2-135M, from the same LoRA initialisation, in one
process: float32 first (the peer: what the loop ran), then bf16 autocast. Micro-batch 1
(the same update, a quarter of the activation memory) so it fits beside a running job;
the figures are per step. On a CPU without native bf16 the second row is emulated and
slower: the bench prints the CPU's bf16 flags beside the figures.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def cpu_bf16_flags() -> list[str]:
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return []
    return sorted({f for f in flags if f in ("avx512_bf16", "amx_bf16", "amx_tile")})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--env", default="airline/multi_step_task_completion")
    ap.add_argument("--difficulty", type=int, default=5)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import torch

    from trace_lib.runtime.base_models import autocast_forward, load_model, resolve_model
    from trace_lib.runtime.lora import attach_lora, trainable_parameters
    from trace_lib.train.config import TrainConfig
    from trace_lib.train.local_rollouts import PrefixForward, demo_prefix, reference_demos, sft
    from trace_lib.train.trainer import build_options, env_factory
    from trace_lib.workbench.training import build_config

    cfg = TrainConfig.from_dict(build_config(args.env, args.model, sft_steps=args.steps,
                                             steps=0, difficulty=args.difficulty,
                                             max_turns=10))
    make_env = env_factory(cfg.env, cfg.env_spec, build_options(cfg))
    base, tok = load_model(resolve_model(cfg.model), dtype=torch.float32, device="cpu")
    model = attach_lora(base, cfg.lora, seed=cfg.seed)
    params = trainable_parameters(model)
    init = [p.detach().clone() for p in params]
    demos = reference_demos(make_env, tok, cfg.sft_seeds, cfg.max_turns)
    rows = {}
    for mode in ("off", "bf16"):
        with torch.no_grad():
            for p, w in zip(params, init, strict=True):
                p.copy_(w)
        opt = torch.optim.AdamW(params, lr=cfg.sft_lr, weight_decay=0.0)
        forward = autocast_forward(PrefixForward(model, demo_prefix(demos), 1.0), "cpu", mode)
        c0, t0 = time.process_time(), time.perf_counter()
        losses = sft(params, opt, demos, forward, steps=args.steps, batch=cfg.micro_batch,
                     micro_batch=1, pad_id=tok.pad_token_id or 0, seed=cfg.seed,
                     train_mode=lambda on: model.train(on))
        rows[mode] = {"cpu_s_per_step": round((time.process_time() - c0) / args.steps, 1),
                      "wall_s_per_step": round((time.perf_counter() - t0) / args.steps, 1),
                      "losses": [round(x, 4) for x in losses],
                      "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                                            / 2**20, 2)}
        print(mode, rows[mode], flush=True)
    doc = {"env": args.env, "difficulty": args.difficulty, "model": args.model,
           "demos": len(demos), "demo_tokens_median": sorted(len(d[0]) for d in demos)[
               len(demos) // 2], "batch": cfg.micro_batch, "steps": args.steps,
           "cpu_bf16_flags": cpu_bf16_flags(), "rows": rows,
           "ratio_cpu_bf16_to_fp32": round(rows["bf16"]["cpu_s_per_step"]
                                           / rows["off"]["cpu_s_per_step"], 3),
           "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    print("| precision | CPU-s / step | wall s / step | loss | peak RSS |\n|---|---|---|---|---|")
    for mode, r in rows.items():
        print(f"| {'fp32' if mode == 'off' else 'bf16 autocast'} | {r['cpu_s_per_step']} | "
              f"{r['wall_s_per_step']} | {r['losses'][-1]} | {r['peak_rss_gib']} GiB |")
    print(f"bf16 / fp32 CPU per step: {doc['ratio_cpu_bf16_to_fp32']}x "
          f"(CPU bf16 flags: {', '.join(doc['cpu_bf16_flags']) or 'none'})")
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
