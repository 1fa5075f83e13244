"""What the "Build the routing demo" button costs (issue 36): CPU seconds of the whole build.

    OMP_NUM_THREADS=1 nice -n 10 python bench/routing_demo.py --models-dir /tmp/fresh-models \\
        --out bench/results/routing-demo-i36.json

Runs the product's verb, `python -m trace_lib demo adapters --model M --json`, as a child
process in a fresh models folder (so the base model's preparation is counted, as on a
fresh `make demo`), waits for it and reads the CPU time of the process tree
(`RUSAGE_CHILDREN`: user + system of every waited-for descendant). Prints the CPU-s, the
routing accuracy on the example requests and each policy's pass count, and writes them,
with the build's own per-phase CPU-s, to `--out`.
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--models-dir", required=True,
                    help="models folder for this run (fresh: the base model is prepared)")
    ap.add_argument("--out", default="bench/results/routing-demo-i36.json")
    ap.add_argument("--log", default="/tmp/routing-demo-build.log",
                    help="the build's progress lines (stderr) go here")
    args = ap.parse_args()
    env = {**os.environ, "TRACE_MODELS_DIR": str(Path(args.models_dir).resolve()),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(args.log, "w") as log:
        proc = subprocess.run([sys.executable, "-m", "trace_lib", "demo", "adapters",
                               "--model", args.model, "--json"], env=env, stdout=subprocess.PIPE,
                              stderr=log, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter() - t0
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        print(Path(args.log).read_text()[-4000:], file=sys.stderr)
        return proc.returncode
    report = json.loads(proc.stdout[proc.stdout.index("{"):])
    demo = json.loads((Path(report["path"]) / "demo.json").read_text())
    n = demo["per_env"]
    out = {"model": args.model, "cpu_s": round(cpu, 1), "wall_s": round(wall, 1),
           "max_rss_mb": round(after.ru_maxrss / 1024, 1),
           "routing": demo["routing"], "passes": demo["passes"], "per_env": n,
           "mean_reward": demo["mean_reward"], "cpu_s_by_phase": demo["cpu_s"],
           "max_tokens": demo["max_tokens"], "adapters": demo["adapters"],
           "warm": demo["warm"], "what_you_see": demo["what_you_see"],
           "examples": [{k: e[k] for k in ("capability", "seed", "routed_to", "right")}
                        | {"passed": {p: r["passed"] for p, r in e["replies"].items()},
                           "reward": {p: round(r["reward"], 3)
                                      for p, r in e["replies"].items()}}
                        for e in demo["examples"]],
           "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"CPU-s of the build (process tree): {cpu:.0f} ({cpu / 60:.1f} CPU-min), "
          f"wall {wall:.0f} s")
    print(f"routing: {demo['routing']['right']}/{demo['routing']['total']} example requests "
          "to their own adapter")
    for p, cells in demo["passes"].items():
        print(f"  {p:40s} " + "  ".join(f"{c} {v}/{n}" for c, v in cells.items()))
    print("by phase (CPU-s):", demo["cpu_s"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
