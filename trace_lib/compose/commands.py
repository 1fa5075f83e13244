"""CLI verbs of the compose stage: `compose`, `route`, `moe-merge`.

Design decisions
- `compose` builds the gated model with zero gates and writes its folder (and registers
  it in the store), so the page, the notebook and `route` all start from a folder.
- `route` prints, per token, the role and for each layer the chosen slot and the gate
  probabilities; the trace is also saved under `<moe>/traces/` and indexed, unless
  `--no-save` (then nothing touches the database).
- Heavy imports (torch, transformers) happen inside handlers so `--help` stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _compose(args: argparse.Namespace) -> int:
    from trace_lib.cli import print_json
    from trace_lib.compose.adapters import parse_adapter_arg
    from trace_lib.compose.catalog import register_moe
    from trace_lib.compose.gated import MoEConfig, compose

    moe = compose(args.model, parse_adapter_arg(args.adapters), out=args.out,
                  config=MoEConfig(mode=args.mode))
    moe_id = None if args.no_register else register_moe(args.db, args.out)
    result = {"path": str(Path(args.out).resolve()), "layers": moe.layers, "hidden": moe.hidden,
              "experts": moe.slots[1:], "gate_params": moe.gate_param_count(), "id": moe_id,
              "mode": moe.config.mode}
    if args.json:
        print_json(result)
    else:
        print(f"composed {len(result['experts'])} experts over {args.model}: {result['layers']} "
              f"layers x hidden {result['hidden']}, {result['gate_params']:,} gate parameters "
              f"-> {result['path']}")
    return 0


def _route(args: argparse.Namespace) -> int:
    from trace_lib.cli import print_json
    from trace_lib.compose import traces
    from trace_lib.compose.gated import load_moe
    from trace_lib.errors import UserInputError

    given = sum(x is not None for x in (args.prompt, args.env, args.trajectory))
    if given != 1:
        raise UserInputError("route: give exactly one of --prompt, --env (with --seed), "
                             "--trajectory")
    moe = load_moe(args.moe, mode=args.mode)
    if args.prompt is not None:
        trace = traces.route_prompt(moe, args.prompt, system=args.system,
                                    max_new_tokens=args.max_new_tokens, force=args.force)
        source = "prompt"
    elif args.env is not None:
        from trace_lib.compose.local_client import route_env

        trace = route_env(moe, args.env, args.seed, force=args.force,
                          max_tokens=args.max_new_tokens, max_turns=args.max_turns)
        source = "env"
    else:
        from trace_lib.compose.catalog import trajectory_messages

        messages, tools, meta = trajectory_messages(args.db, args.trajectory)
        trace = traces.replay_trajectory(moe, messages, tools, force=args.force, meta=meta)
        source = "trajectory"
    out = trace.to_json()
    if not args.no_save:
        from trace_lib.compose.catalog import save_and_index

        out["path"] = str(save_and_index(args.db, args.moe, trace, source))
    if args.json:
        print_json(out)
    else:
        for i, (tok, role) in enumerate(zip(trace.tokens, trace.roles, strict=True)):
            slots = " ".join(str(int(c)) for c in trace.chosen[i])
            print(f"{i:5d} {role:9s} {json.dumps(tok, ensure_ascii=False):24s} {slots}")
        print(f"slots: {', '.join(f'{i}={s}' for i, s in enumerate(trace.slots))}",
              file=sys.stderr)
    return 0


def _merge(args: argparse.Namespace) -> int:
    from trace_lib.cli import print_json
    from trace_lib.compose.adapters import linear_merge, parse_adapter_arg, read_adapters

    adapters = read_adapters(parse_adapter_arg(args.adapters))
    weights = [float(w) for w in args.weights.split(",")] if args.weights else None
    path = linear_merge(adapters, args.out, weights)
    result = {"path": str(path.resolve()), "adapters": [a.name for a in adapters],
              "weights": weights or [1.0 / len(adapters)] * len(adapters)}
    if args.json:
        print_json(result)
    else:
        print(f"merged {', '.join(result['adapters'])} -> {result['path']}")
    return 0


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add this stage's verbs to the CLI."""
    p = sub.add_parser("compose", parents=[common],
                       help="compose a base + K LoRA adapters into a token-gated mixture")
    p.add_argument("--model", required=True, help="base model: registry name or HF folder")
    p.add_argument("--adapters", required=True,
                   help="comma-separated PEFT adapter folders, optionally cap=PATH")
    p.add_argument("--mode", default="top1", choices=["top1", "soft", "trajectory"])
    p.add_argument("--out", required=True, help="folder to write the composed model into")
    p.add_argument("--no-register", action="store_true", help="do not record it in the store")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_compose)

    p = sub.add_parser("route", parents=[common],
                       help="per-token, per-layer routing of a composed model")
    p.add_argument("--moe", required=True, help="composed model folder")
    p.add_argument("--prompt", default=None, help="a user message to answer")
    p.add_argument("--system", default=None, help="optional system message with --prompt")
    p.add_argument("--env", default=None, help="capability environment name (with --seed)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trajectory", default=None, help="an ingested trajectory id to replay")
    p.add_argument("--mode", default=None, choices=["top1", "soft", "trajectory"],
                   help="override the folder's routing mode")
    p.add_argument("--force", type=int, default=None, help="route every token to slot K")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--max-turns", type=int, default=4)
    p.add_argument("--no-save", action="store_true", help="do not save or index the trace")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_route)

    p = sub.add_parser("moe-merge", parents=[common],
                       help="exact linear merge of LoRA adapters (baseline, vLLM export)")
    p.add_argument("--adapters", required=True, help="comma-separated adapter folders")
    p.add_argument("--weights", default=None, help="comma-separated weights (default equal)")
    p.add_argument("--out", required=True)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_merge)
