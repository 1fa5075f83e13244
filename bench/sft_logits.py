"""SFT steps with the LM head on every suffix position vs only on the positions a loss
reads (`local_rollouts.scored_positions`): CPU-s per step, peak memory, the same losses.

    PYTHONPATH=. OMP_NUM_THREADS=1 nice -n 10 python bench/sft_logits.py \\
        --capability precondition_verification --steps 3 --out bench/results/sft-logits.json

The routing demo's SFT (its environment options, 2 demos a step, the demos' shared prompt
without gradient) on SmolLM2-135M, run twice in two child processes (peak RSS apart): the
demos passed to the forward without their loss masks (every position's logits, how SFT
ran before) and with them. Same seed, same batches: the losses must agree.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path


def _child(capability: str, steps: int, masked: bool) -> dict:
    import torch

    from trace_lib.compose.demo import DemoConfig, _makers
    from trace_lib.runtime.base_models import load_model, resolve_model
    from trace_lib.runtime.lora import LoraSettings, attach_lora, trainable_parameters
    from trace_lib.train import local_rollouts as lr

    torch.set_num_threads(1)
    cfg = DemoConfig()
    make_env = _makers(cfg)[capability]
    base, tok = load_model(resolve_model(cfg.model))
    model = attach_lora(base, LoraSettings(rank=cfg.lora_rank, alpha=cfg.lora_rank),
                        seed=cfg.seed)
    demos = lr.reference_demos(make_env, tok, cfg.sft_seeds, cfg.max_turns.get(capability, 3))
    params = trainable_parameters(model)
    opt = torch.optim.AdamW(params, lr=cfg.sft_lr, weight_decay=0.0)
    fwd = lr.PrefixForward(model, lr.demo_prefix(demos), 1.0)
    forward = fwd if masked else (lambda ids, att, kf, rolls: fwd(ids, att, kf, []))
    t = os.times()
    c0, w0 = t.user + t.system, time.perf_counter()
    losses = lr.sft(params, opt, demos, forward, steps=steps, batch=cfg.sft_batch,
                    pad_id=tok.pad_token_id or 0, seed=cfg.seed,
                    train_mode=lambda on: model.train(on))
    t = os.times()
    return {"masked": masked, "cpu_s": round(t.user + t.system - c0, 1),
            "wall_s": round(time.perf_counter() - w0, 1), "losses": losses,
            "demo_tokens": [len(s) for s, _ in demos[:4]],
            "loss_tokens": [sum(m) for _, m in demos[:4]],
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capability", default="precondition_verification")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", default="bench/results/sft-logits.json")
    ap.add_argument("--child", choices=("all", "masked"))
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args.capability, args.steps, args.child == "masked")))
        return 0
    runs = {}
    for mode in ("all", "masked"):
        proc = subprocess.run([sys.executable, __file__, "--capability", args.capability,
                               "--steps", str(args.steps), "--child", mode],
                              capture_output=True, text=True, check=True)
        runs[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(mode, runs[mode], flush=True)
    a, m = runs["all"], runs["masked"]
    out = {"capability": args.capability, "steps": args.steps, "all_positions": a,
           "loss_positions": m, "cpu_ratio": round(m["cpu_s"] / a["cpu_s"], 3),
           "max_loss_diff": max(abs(x - y) for x, y in zip(a["losses"], m["losses"],
                                                             strict=True)),
           "load_average": round(os.getloadavg()[0], 2),
           "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: out[k] for k in ("cpu_ratio", "max_loss_diff")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
