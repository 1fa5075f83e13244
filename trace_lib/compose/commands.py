"""CLI verbs of the compose stage: `compose`, `route`, `gates`, `moe-eval`, `moe-serve`,
`moe-merge`.

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


def _gates(args: argparse.Namespace) -> int:
    from trace_lib.cli import print_json
    from trace_lib.compose import gate_training
    from trace_lib.compose.catalog import register_moe

    cfg = gate_training.GateTrainConfig.from_dict({
        "moe": str(Path(args.moe).resolve()), "envs": args.envs,
        "warm_seeds": args.warm_seeds, "warm_steps": args.warm_steps, "steps": args.steps,
        "group": args.group, "groups_per_step": args.groups_per_step,
        "max_tokens": args.max_tokens, "max_turns": args.max_turns, "lr": args.lr,
        "balance_coef": args.balance_coef, "eval_seeds": args.eval_seeds, "seed": args.seed,
    }, where="gates")
    if args.background:
        from trace_lib.train.records import record_job

        spec = gate_training.submit_gate_job(cfg, backend=args.backend)
        record_job(args.db, spec)
        result = {"job_id": spec.id, "run_dir": spec.run_dir, "state": "queued"}
    else:
        from trace_lib.jobs import new_job_id, runs_dir

        job_id = new_job_id(gate_training.JOB_KIND)
        result = gate_training.train_gates(cfg, runs_dir() / job_id, progress=not args.json)
        result["job_id"] = job_id
        result["id"] = register_moe(args.db, result["moe_path"], job_id=job_id,
                                    metrics={"final_reward": result["final_reward"],
                                             "warm_rewards": result["warm_rewards"]})
    if args.json:
        print_json(result)
    else:
        print(json.dumps({k: result[k] for k in result if k != "warm_rewards"}, default=str))
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from trace_lib.cli import print_json
    from trace_lib.compose.catalog import register_moe
    from trace_lib.compose.evaluate import (
        EvalConfig,
        evaluate_composition,
        policies,
        summary_rows,
        write_eval,
    )
    from trace_lib.compose.gated import load_moe

    moe = load_moe(args.moe)
    cfg = EvalConfig(envs=[e for e in args.envs.split(",") if e], seeds=args.seeds,
                     seed_start=args.seed_start, max_tokens=args.max_tokens,
                     max_turns=args.max_turns, include_merge=not args.no_merge)
    bar = tqdm(total=len(cfg.envs) * len(policies(moe, cfg.include_merge)), desc="moe-eval",
               file=sys.stderr)

    def on_row(row: dict) -> None:
        bar.update(1)
        bar.set_postfix_str(f"{row['env']} {row['policy']}: {row['reward_mean']:.3f}")

    rows = evaluate_composition(moe, cfg, on_row=on_row)
    bar.close()
    path = write_eval(args.moe, rows, cfg)
    register_moe(args.db, args.moe, metrics={"eval": rows, "eval_summary": summary_rows(rows)})
    out = {"path": str(path), "rows": rows, "summary": summary_rows(rows)}
    if args.json:
        print_json(out)
    else:
        for r in out["summary"]:
            print(f"{r['policy']:40s} reward {r['reward_mean']:.3f} pass {r['pass_rate']:.3f}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    import time

    from trace_lib.compose.serving import MoEPolicyServer

    server = MoEPolicyServer(args.moe, record_dir=args.record_dir, mode=args.mode,
                             host=args.host, port=args.port,
                             served_model_name=args.served_model_name)
    server.start()
    print(f"serving {args.moe} as {server.model_name!r} on {server.base_url}"
          + (f", traces -> {args.record_dir}" if args.record_dir else ""), file=sys.stderr)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


def _register_job_kind() -> None:
    """`train_gates` jobs run through the training stage's runner; import lazily."""
    from trace_lib.jobs import register_job_kind

    def run(spec, run_dir, should_stop):  # type: ignore[no-untyped-def]
        from trace_lib.compose.gate_training import _job

        return _job(spec, run_dir, should_stop)

    register_job_kind("train_gates", run)


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add this stage's verbs to the CLI."""
    _register_job_kind()
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

    p = sub.add_parser("gates", parents=[common],
                       help="train a composed model's gates (KL warm start, then GRPO)")
    p.add_argument("--moe", required=True, help="composed model folder")
    p.add_argument("--envs", required=True, help="comma-separated capability environments")
    p.add_argument("--warm-seeds", type=int, default=4)
    p.add_argument("--warm-steps", type=int, default=30)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--groups-per-step", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--max-turns", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--balance-coef", type=float, default=0.01)
    p.add_argument("--eval-seeds", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--background", action="store_true", help="run as a background job")
    p.add_argument("--backend", default="local", choices=["local", "ray"])
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_gates)

    p = sub.add_parser("moe-eval", parents=[common],
                       help="base vs each adapter vs linear merge vs composed, held-out seeds")
    p.add_argument("--moe", required=True, help="composed model folder")
    p.add_argument("--envs", required=True, help="comma-separated capability environments")
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--seed-start", type=int, default=10_000)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--max-turns", type=int, default=4)
    p.add_argument("--no-merge", action="store_true", help="skip the linear-merge baseline")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_evaluate)

    p = sub.add_parser("moe-serve", parents=[common],
                       help="serve a composed model with the policy server's OpenAI API")
    p.add_argument("--moe", required=True, help="composed model folder")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8001)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--mode", default=None, choices=["top1", "soft", "trajectory"])
    p.add_argument("--record-dir", default=None, help="save a routing trace per completion")
    p.set_defaults(func=_serve)

    p = sub.add_parser("moe-merge", parents=[common],
                       help="exact linear merge of LoRA adapters (baseline, vLLM export)")
    p.add_argument("--adapters", required=True, help="comma-separated adapter folders")
    p.add_argument("--weights", default=None, help="comma-separated weights (default equal)")
    p.add_argument("--out", required=True)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_merge)
