"""Batched vs one-at-a-time greedy episodes on a built routing demo (issue 36): what the
build's example phase pays per episode either way, on the same model, seeds and policy.

    PYTHONPATH=. OMP_NUM_THREADS=1 nice -n 10 python bench/routing_demo_decode.py \\
        --demo /tmp/fresh-models/routing-demo/smollm2-135m --policy base \\
        --capability tool_calling_precision --out bench/results/routing-demo-decode.json

Loads the demo's composed model (`moe/`), rolls the example seeds out greedily under one
policy's routing twice: one after the other (`run_group` with `LocalMoEClient`, how the
build decoded before) and together (`local_client.greedy_episodes`, how it decodes now),
and reports the CPU-s of each (this process, one torch thread) and whether every
episode's transcript and verdict are the same.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def load_demo(folder: str) -> tuple[dict, object, object]:
    """A built demo's demo.json, its DemoConfig and its composed model (trajectory mode, as
    the build leaves it), on one torch thread; what bench/routing_demo_traces.py uses too."""
    import torch

    from trace_lib.compose.demo import DemoConfig
    from trace_lib.compose.gated import load_moe

    demo = json.loads((Path(folder) / "demo.json").read_text())
    cfg = DemoConfig(**{**demo["config"], "out": folder})
    torch.set_num_threads(1)
    moe = load_moe(Path(folder) / "moe")
    moe.set_mode("trajectory")
    return demo, cfg, moe


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demo", required=True, help="a built demo folder (holds demo.json)")
    ap.add_argument("--policy", default="base",
                    help="base, adapter:CAPABILITY or 'linear merge'")
    ap.add_argument("--capability", default="tool_calling_precision")
    ap.add_argument("--out", default="bench/results/routing-demo-decode.json")
    args = ap.parse_args()

    from trace_lib.compose.demo import _makers, _policy_kwargs
    from trace_lib.compose.local_client import LocalMoEClient, greedy_episodes
    from trace_lib.runtime.rollout import RolloutConfig, run_group

    demo, cfg, moe = load_demo(args.demo)
    make_env = _makers(cfg)[args.capability]
    roll = RolloutConfig(cfg.max_turns.get(args.capability, 3),
                         demo["max_tokens"][args.capability], cfg.max_sequence,
                         temperature=0.0)
    kw = _policy_kwargs(cfg.capabilities)[args.policy]
    seeds = [cfg.example_seed_start + i for i in range(cfg.examples)]

    c0, w0 = _cpu(), time.perf_counter()
    alone = [run_group(make_env, s, LocalMoEClient(moe, **kw), roll, model="moe",
                       group_size=1, request_seed=s)[0] for s in seeds]
    c1, w1 = _cpu(), time.perf_counter()
    together = greedy_episodes(moe, [(make_env, s, roll) for s in seeds], **kw)
    c2, w2 = _cpu(), time.perf_counter()

    same = [a.messages == b.messages for a, b in zip(alone, together, strict=True)]
    verdicts = [(a.reward, a.passed) == (b.reward, b.passed)
                for a, b in zip(alone, together, strict=True)]
    out = {"demo": args.demo, "policy": args.policy, "capability": args.capability,
           "seeds": seeds, "max_tokens": roll.max_tokens, "max_turns": roll.max_turns,
           "sequential": {"cpu_s": round(c1 - c0, 1), "wall_s": round(w1 - w0, 1)},
           "batched": {"cpu_s": round(c2 - c1, 1), "wall_s": round(w2 - w1, 1)},
           "same_transcripts": same, "same_verdicts": verdicts,
           "turns": [a.turns for a in alone],
           "sampled_tokens": [a.n_sampled for a in alone],
           "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(json.dumps({k: out[k] for k in ("sequential", "batched", "same_transcripts",
                                           "same_verdicts", "sampled_tokens")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
