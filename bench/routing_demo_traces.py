"""The routing choice and per-token trace of a built routing demo's example requests,
each from scratch vs over one shared opening (issue 36): what the build's example phase
pays per request for them either way.

    PYTHONPATH=. OMP_NUM_THREADS=1 nice -n 10 python bench/routing_demo_traces.py \\
        --demo /tmp/fresh-models/routing-demo/smollm2-135m \\
        --out bench/results/routing-demo-traces.json

Loads the demo's composed model (`moe/`) and its router, and per environment takes every
example request's routing choice and its composed reply's trace (`top1`, as the build)
twice: from scratch (`request_choice`'s full prefill, `replay_trajectory`'s whole
forward: how the build did before), then over the shared opening (system prompt and tool
block): `Router.choice` over its cached prefix, `trace_prefix` once and each reply from
its KV cache. Reports the CPU-s of each (this process, one torch thread), the opening's
length, and whether every choice and every token's slot is the same and the gate
probabilities agree.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from routing_demo_decode import _cpu, load_demo


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demo", required=True, help="a built demo folder (holds demo.json)")
    ap.add_argument("--out", default="bench/results/routing-demo-traces.json")
    args = ap.parse_args()

    import numpy as np

    from trace_lib.compose.demo import _makers, _opening, _shared_opening
    from trace_lib.compose.export import Router, request_choice
    from trace_lib.compose.traces import replay_trajectory, trace_prefix

    demo, cfg, moe = load_demo(args.demo)
    routes = Path(args.demo) / "per_request"
    router = Router.over(moe, json.loads((routes / "router.json").read_text()), routes)
    makers = _makers(cfg)
    rows = []
    for cap in cfg.capabilities:
        examples = [e for e in demo["examples"] if e["capability"] == cap]
        openings = [_opening(makers[cap], e["seed"]) for e in examples]
        chats = [(e["replies"]["composed"]["messages"], tools)
                 for e, (_, tools) in zip(examples, openings, strict=True)]
        c0 = _cpu()
        choices = [request_choice(moe, m, t) for m, t in openings]
        moe.set_mode("top1")
        whole = [replay_trajectory(moe, m, t) for m, t in chats]
        moe.set_mode("trajectory")
        c1 = _cpu()
        cached = [router.choice(m, t) for m, t in openings]
        moe.set_mode("top1")
        prefix = trace_prefix(moe, _shared_opening(moe, openings))
        shared = [replay_trajectory(moe, m, t, prefix=prefix) for m, t in chats]
        moe.set_mode("trajectory")
        c2 = _cpu()
        rows.append({
            "capability": cap, "requests": len(chats),
            "tokens": [t.n_tokens for t in whole],
            "opening_tokens": len(prefix.ids) if prefix else 0,
            "whole": {"cpu_s": round(c1 - c0, 1)},
            "shared_opening": {"cpu_s": round(c2 - c1, 1)},
            "same_choices": choices == cached, "route_stats": dict(router.route_stats),
            "same_slots": all(bool((a.chosen == b.chosen).all())
                              for a, b in zip(whole, shared, strict=True)),
            "max_prob_diff": float(max(np.abs(a.probs - b.probs).max()
                                       for a, b in zip(whole, shared, strict=True)))})
    out = {"demo": args.demo, "rows": rows,
           "whole_cpu_s": round(sum(r["whole"]["cpu_s"] for r in rows), 1),
           "shared_opening_cpu_s": round(sum(r["shared_opening"]["cpu_s"] for r in rows), 1),
           "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
