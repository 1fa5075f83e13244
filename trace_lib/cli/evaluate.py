"""CLI verbs `evaluate` (a policy on the target tasks) and `compare` (two runs side by side).

    python -m trace_lib evaluate --model tiny --tasks 3 --tools capability --json
    python -m trace_lib evaluate --adapter data/runs/<job>/adapter --tasks all --background
    python -m trace_lib compare DATASET_A DATASET_B --json
    python -m trace_lib compare airline_demo.jsonl@scripted-careful airline_demo.jsonl@scripted-hasty

Design decisions
- Thin: flags become one `EvalConfig` dict and go to `workbench.evaluation` (in the
  background to `workbench.jobs`, where every job kind is submitted and synced), the
  same use cases the Evaluate/Compare page and notebook 05 call.
- `--background` submits an `evaluate` job and prints its id; with `--wait` it also waits
  for it and imports the result, printing the same document as a foreground run;
  `--sync` runs the one job sync and prints the evaluations it imported (what the Compare
  page does on each visit).
- `--tasks all`, a number N (the first N) or START:END (a slice of the split, e.g. dev's
  tasks kept for choosing a checkpoint); anything else is refused by argparse with the
  accepted forms.
"""

from __future__ import annotations

import argparse
from typing import Any

from trace_lib.cli.output import print_json


def _tasks(text: str) -> tuple[int, int | None]:
    """(offset, count) of `--tasks`: N, START:END or all (argparse shows the message)."""
    from trace_lib.workbench.evaluation import parse_task_slice

    try:
        return parse_task_slice(text)
    except ValueError as exc:  # UserInputError: argparse words only this type's errors
        raise argparse.ArgumentTypeError(str(exc)) from None


def config_from_args(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "model": args.model, "adapter": args.adapter, "moe": args.moe, "router": args.router,
        "server_url": args.server_url, "served_model": args.served_model,
        "api_key_env": args.api_key_env, "domain": args.domain, "tasks": args.tasks[1],
        "task_offset": args.tasks[0],
        "trials": args.trials, "tools": args.tools, "max_turns": args.max_turns,
        "max_tokens": args.max_tokens, "max_sequence": args.max_sequence,
        "max_model_len": args.max_model_len, "temperature": args.temperature,
        "split": args.split, "seed": args.seed, "concurrency": args.concurrency, "label": args.label,
        "request_timeout_s": args.request_timeout, "shard_episodes": args.shard_episodes,
        "shard_cpus": args.shard_cpus,
    }


def _print_result(out: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(out)
        return
    lo, hi = out["ci95"]
    rate = "n/a" if out["pass_rate"] is None else f"{out['pass_rate']:.1%}"
    ci = "" if lo is None else f" (95% CI {lo:.1%}-{hi:.1%})"
    split = f" {out['split']}" if out.get("split") else ""
    print(f"{out['policy']} on {out['tasks']} {out['domain']}{split} tasks x {out['trials']} trials: "
          f"{out['successes']}/{out['trajectories']} passed, {rate}{ci}")
    floor = out.get("floor")
    if floor and floor.get("status", "known") != "unknown":  # older results: no status
        print(f"do-nothing floor on these tasks: {floor['passes']}/{floor['tasks']} (a policy "
              "that makes no call and says nothing passes them)")
    print(f"dataset {out['dataset']} ({out['dataset_id']})")


def _cmd_evaluate(args: argparse.Namespace) -> int:
    import sys

    from trace_lib.workbench import evaluation, jobs

    if args.sync:
        done = jobs.sync(args.db).evaluations
        if args.json:
            print_json(done)
        for out in ([] if args.json else done):
            _print_result(out, False)
        if not done and not args.json:
            print("no finished evaluation job left to import")
        return 0
    config = config_from_args(args)
    if args.trials > 1 and args.temperature == 0:
        print("note: at temperature 0 every trial of a task decodes the same; pass "
              "--temperature > 0 for trials that differ", file=sys.stderr)
    if args.background:
        options = {"address": args.ray_address} if args.ray_address else {}
        spec = jobs.submit_evaluation(args.db, config, backend=args.backend,
                                      backend_options=options)
        if args.wait:
            _print_result(jobs.wait_evaluation(args.db, spec.id), args.json)
            return 0
        out = {"job_id": spec.id, "run_dir": spec.run_dir, "backend": spec.backend}
        print_json(out) if args.json else print(spec.id)
        return 0

    def progress(done: int, total: int) -> None:
        if not args.json:
            print(f"\r{done}/{total} episodes", end="", file=sys.stderr, flush=True)

    out = evaluation.evaluate(args.db, config, on_progress=progress)
    if not args.json:
        print(file=sys.stderr)
    _print_result(out, args.json)
    return 0


def _fmt_rate(rate: float | None, ci: list[float | None]) -> str:
    if rate is None:
        return "n/a"
    lo, hi = ci
    return f"{rate:.1%} [{lo:.1%}, {hi:.1%}]"


def _fmt_floor(fl: dict[str, Any]) -> str:
    if fl["status"] == "unknown":
        return "do-nothing floor unknown"
    rate = f"{fl['pass_rate']:.1%}"
    part = f", {fl['unknown_tasks']} tasks unknown" if fl["unknown_tasks"] else ""
    return f"do-nothing floor {fl['passes']}/{fl['tasks']} tasks ({rate}{part})"


def _cmd_compare(args: argparse.Namespace) -> int:
    from trace_lib.workbench import evaluation

    out = evaluation.compare(args.db, args.a, args.b)
    if args.json:
        print_json(out)
        return 0
    for key in ("a", "b"):
        s = out[key]
        print(f"{key.upper()}: {s['label']}  {s['successes']}/{s['n']} passed  "
              f"{_fmt_rate(s['pass_rate'], s['ci95'])}  ({_fmt_floor(out['floor'][key])})")
    p = out["paired"]
    print(f"paired on {p['tasks']} tasks ({p['rule']}): A only {p['a_only']}, "
          f"B only {p['b_only']}, both {p['both']}, neither {p['neither']}; "
          f"exact McNemar p = {p['p_value']:.4g}")
    flipped = [t for t in out["tasks"] if t["flip"]]
    for t in flipped:
        idle = " — passes by doing nothing" if t["passes_by_doing_nothing"] else ""
        print(f"  flipped {t['task_id']}: passed by {'A' if t['flip'] == 'a_only' else 'B'} "
              f"only (A {t['a_successes']}/{t['a_trials']}, B {t['b_successes']}/"
              f"{t['b_trials']}){idle}")
    for c in out["capabilities"]:
        lo, hi = c["ci95"]
        print(f"  {c['capability']}: lacking A {c['a_lacking_rate']:.1%} -> "
              f"B {c['b_lacking_rate']:.1%} (delta {c['delta']:+.1%}, 95% CI "
              f"{lo:+.1%} to {hi:+.1%})")
    for note in out["notes"]:
        print(f"note: {note}")
    return 0


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add `evaluate` and `compare` to the CLI."""
    p = sub.add_parser(
        "evaluate", parents=[common], help="run a policy on the domain's target tasks",
        description="Roll a policy (base model, + adapter, composed model, or any "
                    "OpenAI-compatible endpoint) out on the domain's target tasks (airline: the "
                    "demo's task set; retail: drawn from its capability task builders) and "
                    "import the episodes as a dataset.")
    p.add_argument("--model", default="tiny", help="base model: tiny | smollm2-135m | folder")
    p.add_argument("--adapter", default=None, help="PEFT LoRA folder served on --model")
    p.add_argument("--moe", default=None, help="composed model folder")
    p.add_argument("--router", default=None,
                   help="`moe-merge --per-request` folder: each episode to the adapter its "
                        "request routes to (on --server-url, or a local server)")
    p.add_argument("--server-url", default=None, help="OpenAI-compatible endpoint (vLLM, ...)")
    p.add_argument("--served-model", default=None, help="model name on --server-url")
    p.add_argument("--api-key-env", default=None, help="env var holding --server-url's key")
    p.add_argument("--domain", default="airline", help="airline | retail")
    p.add_argument("--tasks", type=_tasks, default="all",
                   help="N (the first N), START:END (a slice of the split) or all")
    p.add_argument("--trials", type=int, default=1, help="episodes per task")
    p.add_argument("--tools", default="all", choices=("all", "capability"),
                   help="all domain tools, or only those the task set uses")
    p.add_argument("--max-turns", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=None,
                   help="per assistant turn (default: the tasks' longest reference turn in "
                        "the policy's tokens + 25%%, rounded up to 32)")
    p.add_argument("--max-sequence", type=int, default=8192)
    p.add_argument("--max-model-len", type=int, default=None,
                   help="local server's context (default: the model's)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--split", default=None, choices=("demo", "dev", "test"),
                   help="target-task split: demo (the 50 tasks the demo played, the default), "
                        "dev (100: choose settings here), test (150: held out, once per "
                        "final configuration)")
    p.add_argument("--seed", type=int, default=None,
                   help="a task-set seed of your own instead of a split")
    p.add_argument("--concurrency", type=int, default=4, help="episodes in flight")
    p.add_argument("--request-timeout", type=float, default=3600.0,
                   help="seconds one chat request may take")
    p.add_argument("--label", default=None, help="agent_model to record (default derived)")
    p.add_argument("--shard-episodes", type=int, default=10,
                   help="episodes per shard (the unit of resume; one Ray task each)")
    p.add_argument("--shard-cpus", type=float, default=1.0,
                   help="--backend ray: CPUs reserved per shard task")
    p.add_argument("--background", action="store_true", help="run as an `evaluate` job")
    p.add_argument("--wait", action="store_true", help="with --background: wait and import")
    p.add_argument("--backend", default="local", choices=("local", "ray"))
    p.add_argument("--ray-address", default=None, help="Ray dashboard URL (else RAY_ADDRESS)")
    p.add_argument("--sync", action="store_true",
                   help="only import finished background evaluations (the app does it too)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_evaluate)

    c = sub.add_parser("compare", parents=[common], help="two runs side by side",
                       description="Pass rates with Wilson intervals beside the do-nothing "
                                   "floor on the same tasks, tasks paired by id (majority "
                                   "over trials) with the exact McNemar test, capability "
                                   "lacking-rate deltas, flipped tasks first. A side is a "
                                   "dataset, or one agent model's runs in it: "
                                   "DATASET@AGENT_MODEL.")
    c.add_argument("a", metavar="A", help="DATASET[@AGENT_MODEL]: dataset id or name, "
                                          "optionally narrowed to one agent model")
    c.add_argument("b", metavar="B", help="DATASET[@AGENT_MODEL]")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=_cmd_compare)
