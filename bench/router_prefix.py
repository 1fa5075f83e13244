"""The router's cost per request: the cached shared prefix against the full prefill.

    OMP_NUM_THREADS=2 python bench/router_prefix.py --router data/compose-s13/per_request \
        --domain airline --tasks all --tools capability --out bench/results/router-prefix.json

`evaluate --router` routes each episode once, on its opening request (system, tools,
first user turn). On a target benchmark that request is ~95% one shared system + tools
block, so `compose.export.Router.route` keeps that block's KV cache per route pattern and
runs only the user turn over it (exact when the choice comes back equal to the pattern it
assumed; otherwise the full prefill). The peer is the full prefill of the whole request,
the router's only path before (`request_choice` + `route_from_choice`). Both run on the
same requests, in the same process, one after the other; the bench prints the time per
request of each, the ratio, how many requests took each path and whether every route
agrees.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any


def opening_requests(domain: str, tasks: int | None, tools: str
                     ) -> list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]]:
    """Each target task's opening request, as `evaluate` sends it."""
    from trace_lib.evaluate.routed import opening_request
    from trace_lib.evaluate.tasks import load_task_set

    ts = load_task_set(domain, tasks)
    out = []
    for task in ts.tasks:
        env = ts.environment(task, tools)
        env.reset(0)
        out.append((opening_request(list(env.messages)), env.tool_schemas or None))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--router", required=True, help="a `moe-merge --per-request` folder")
    ap.add_argument("--domain", default="airline")
    ap.add_argument("--tasks", default="all", help="N or all")
    ap.add_argument("--tools", default="capability")
    ap.add_argument("--out", default=None, help="write the figures here as JSON")
    args = ap.parse_args(argv)

    from tqdm import tqdm

    from trace_lib.compose.export import Router, request_choice, request_ids

    requests = opening_requests(args.domain, None if args.tasks == "all" else int(args.tasks),
                                args.tools)
    router = Router.load(args.router)
    first = request_ids(router.moe, *requests[0])
    full_s, full_routes = [], []
    for messages, tools in tqdm(requests, desc="full prefill"):
        t = time.perf_counter()
        full_routes.append(router.route_from_choice(request_choice(router.moe, messages, tools)))
        full_s.append(time.perf_counter() - t)
    cached_s, cached_routes = [], []
    for messages, tools in tqdm(requests, desc="cached prefix"):
        t = time.perf_counter()
        cached_routes.append(router.route(messages, tools))
        cached_s.append(time.perf_counter() - t)
    agree = sum(a == b for a, b in zip(full_routes, cached_routes, strict=True))
    result = {
        "router": args.router, "domain": args.domain, "tools": args.tools,
        "requests": len(requests), "prompt_tokens": len(first),
        "shared_prefix_tokens": router.shared_prefix_length(first),
        "full_prefill_s": {"total": sum(full_s), "median": statistics.median(full_s)},
        "cached_prefix_s": {"total": sum(cached_s), "median": statistics.median(cached_s),
                            "first": cached_s[0]},
        "ratio_total": sum(full_s) / sum(cached_s),
        "paths": dict(router.route_stats), "routes_agree": f"{agree}/{len(requests)}",
        "routes": {r: cached_routes.count(r) for r in sorted(set(cached_routes))},
    }
    print(f"{'':24}{'full prefill (peer)':>22}{'cached prefix':>16}{'ratio':>8}")
    print(f"{'total s':24}{sum(full_s):>22.1f}{sum(cached_s):>16.1f}"
          f"{sum(full_s) / sum(cached_s):>8.1f}x")
    print(f"{'median s per request':24}{statistics.median(full_s):>22.2f}"
          f"{statistics.median(cached_s):>16.2f}"
          f"{statistics.median(full_s) / statistics.median(cached_s):>8.1f}x")
    print(f"paths {router.route_stats}; routes agree {agree}/{len(requests)}; "
          f"routes {result['routes']}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0 if agree == len(requests) else 1


if __name__ == "__main__":
    raise SystemExit(main())
