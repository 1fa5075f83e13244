"""CLI verbs of the compose stage: `compose`, `route`, `gates`, `moe-eval`, `moe-serve`,
`moe-merge`.

Design decisions
- Thin: each handler calls one use case of `trace_lib.workbench.composition`.
- `compose` builds the gated model with zero gates and writes its folder (and registers
  it in the store), so the page, the notebook and `route` all start from a folder.
- `route` prints, per token, the role and for each layer the chosen slot and the gate
  probabilities; the trace is also saved under `<moe>/traces/` and indexed, unless
  `--no-save` (then nothing touches the database).
- Heavy imports (torch, transformers) happen inside handlers so `--help` stays fast.
- Flags several verbs share (`--moe`, `--envs`, `--mode`, `--max-tokens`, `--max-turns`,
  `--json`) are defined once in `SHARED` and added by `_verb`, so their help and defaults
  cannot drift between verbs.
"""

from __future__ import annotations

import argparse
import json
import sys

from trace_lib.cli.output import print_json
from trace_lib.cli.train import add_device_arguments


def _compose(args: argparse.Namespace) -> int:
    from trace_lib.workbench import composition

    result = composition.compose(args.db, args.model, args.adapters, args.out, mode=args.mode,
                                 register=not args.no_register)
    for warning in result["warnings"]:  # stderr: --json keeps stdout one document
        print(f"warning: {warning}", file=sys.stderr)
    if args.json:
        print_json(result)
    else:
        print(f"composed {len(result['experts'])} experts over {args.model}: {result['layers']} "
              f"layers x hidden {result['hidden']}, {result['gate_params']:,} gate parameters "
              f"-> {result['path']}")
    return 0


def _route(args: argparse.Namespace) -> int:
    from trace_lib.errors import UserInputError
    from trace_lib.workbench import composition

    given = sum(x is not None for x in (args.prompt, args.env, args.trajectory))
    if given != 1:
        raise UserInputError("route: give exactly one of --prompt, --env (with --seed), "
                             "--trajectory")
    if args.prompt is not None:
        source = composition.RouteSource("prompt", prompt=args.prompt, system=args.system,
                                         max_new_tokens=args.max_new_tokens)
    elif args.env is not None:
        source = composition.RouteSource("env", env=args.env, seed=args.seed,
                                         max_new_tokens=args.max_new_tokens,
                                         max_turns=args.max_turns)
    else:
        source = composition.RouteSource("trajectory", trajectory=args.trajectory)
    trace, path = composition.route(args.db, args.moe, source, force=args.force,
                                    mode=args.mode, save=not args.no_save)
    out = trace.to_json()
    if path is not None:
        out["path"] = str(path)
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
    from trace_lib.errors import UserInputError
    from trace_lib.workbench import composition

    if args.per_request:
        if not args.moe:
            raise UserInputError("moe-merge --per-request: give --moe (a composed folder)")
        env_map = {}
        for part in (x.strip() for x in (args.envs or "").split(",") if x.strip()):
            cap, sep, name = part.partition("=")
            if not sep:
                raise UserInputError(f"--envs {part!r}: expected CAPABILITY=ENVIRONMENT")
            env_map[cap] = name
        result = composition.merge_per_request(args.db, args.moe, args.out, env_map or None,
                                               seeds=args.seeds, seed_start=args.seed_start)
        if args.json:
            print_json(result)
        else:
            for cap, entry in result["routes"].items():
                print(f"{cap}: layer slots {entry['layer_slots']} -> "
                      f"{entry['adapter'] or 'the base'} ({entry['requests']} requests)")
            print(result["vllm"])
        return 0
    if not args.adapters:
        raise UserInputError("moe-merge: give --adapters (or --per-request --moe DIR)")
    weights = [float(w) for w in args.weights.split(",")] if args.weights else None
    result = composition.merge(args.adapters, args.out, weights)
    if args.json:
        print_json(result)
    else:
        print(f"merged {', '.join(result['adapters'])} -> {result['path']}")
    return 0


def _gates(args: argparse.Namespace) -> int:
    from trace_lib.workbench import composition

    cfg = composition.gate_config(
        args.moe, args.envs, warm_seeds=args.warm_seeds, warm_steps=args.warm_steps,
        steps=args.steps, group=args.group, groups_per_step=args.groups_per_step,
        max_tokens=args.max_tokens, max_turns=args.max_turns, lr=args.lr,
        balance_coef=args.balance_coef, eval_seeds=args.eval_seeds, seed=args.seed,
        warm_lr=args.warm_lr, estimator=args.estimator, device=args.device, dtype=args.dtype)
    if args.background:
        from trace_lib.workbench import jobs

        spec = jobs.submit_gates(args.db, cfg, backend=args.backend)
        result = {"job_id": spec.id, "run_dir": spec.run_dir, "state": "queued"}
    else:
        result = composition.train_gates(args.db, cfg, progress=not args.json)
    if args.json:
        print_json(result)
    else:
        print(json.dumps({k: result[k] for k in result if k != "warm_rewards"}, default=str))
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from trace_lib.workbench import composition

    moe = composition.load_moe(args.moe)
    envs = [e for e in args.envs.split(",") if e]
    bar = tqdm(total=len(envs) * composition.eval_policy_count(moe, not args.no_merge),
               desc="moe-eval", file=sys.stderr)

    def on_row(row: dict) -> None:
        bar.update(1)
        bar.set_postfix_str(f"{row['env']} {row['policy']}: {row['reward_mean']:.3f}")

    out = composition.moe_eval(args.db, args.moe, envs, seeds=args.seeds,
                               seed_start=args.seed_start, max_tokens=args.max_tokens,
                               max_turns=args.max_turns, include_merge=not args.no_merge,
                               moe=moe, on_row=on_row)
    bar.close()
    if args.json:
        print_json(out)
    else:
        for r in out["summary"]:
            print(f"{r['policy']:40s} reward {r['reward_mean']:.3f} pass {r['pass_rate']:.3f}")
        print(f"max tokens per turn: {out['max_tokens']}"
              + (" (derived from the environments' longest reference turn, "
                 f"{out['turn_budget']['longest_reference_turn']} tokens)"
                 if out.get("turn_budget") else " (given)"))
    return 0


def _serve(args: argparse.Namespace) -> int:
    import time

    from trace_lib.workbench import composition

    server = composition.start_composed_server(
        args.moe, record_dir=args.record_dir, mode=args.mode, trace=not args.no_trace,
        host=args.host, port=args.port, served_model_name=args.served_model_name)
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


MODES = ["top1", "soft", "trajectory"]

# The flags several verbs share, defined once: name -> (flag, argparse options). A verb
# names the ones it takes (with per-verb overrides) in `_verb`.
SHARED: dict[str, tuple[str, dict]] = {
    "moe": ("--moe", {"required": True, "help": "composed model folder"}),
    "envs": ("--envs", {"required": True, "help": "comma-separated capability environments"}),
    "mode": ("--mode", {"default": None, "choices": MODES,
                        "help": "override the folder's routing mode"}),
    "max_tokens": ("--max-tokens", {
        "type": int, "default": None,
        "help": "per turn (default: the environments' longest reference turn in the "
                "model's tokens + 25%%, rounded up to 32)"}),
    "max_turns": ("--max-turns", {"type": int, "default": 4}),
    "json": ("--json", {"action": "store_true"}),
}


def _verb(sub: argparse._SubParsersAction, common: argparse.ArgumentParser, name: str,
          text: str, func, *shared: str, **overrides: dict) -> argparse.ArgumentParser:
    """A verb's parser with the shared flags it names (`overrides`: name -> options that
    differ for this verb) and its handler."""
    p = sub.add_parser(name, parents=[common], help=text)
    for key in shared:
        flag, options = SHARED[key]
        p.add_argument(flag, **{**options, **overrides.get(key, {})})
    p.set_defaults(func=func)
    return p


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add this stage's verbs to the CLI."""
    p = _verb(sub, common, "compose",
              "compose a base + K LoRA adapters into a token-gated mixture", _compose,
              "mode", "json", mode={"default": "top1", "help": None})
    p.add_argument("--model", required=True, help="base model: registry name or HF folder")
    p.add_argument("--adapters", required=True,
                   help="comma-separated PEFT adapter folders, optionally cap=PATH")
    p.add_argument("--out", required=True, help="folder to write the composed model into")
    p.add_argument("--no-register", action="store_true", help="do not record it in the store")

    p = _verb(sub, common, "route", "per-token, per-layer routing of a composed model",
              _route, "moe", "mode", "max_turns", "json")
    p.add_argument("--prompt", default=None, help="a user message to answer")
    p.add_argument("--system", default=None, help="optional system message with --prompt")
    p.add_argument("--env", default=None, help="capability environment name (with --seed)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trajectory", default=None, help="an ingested trajectory id to replay")
    p.add_argument("--force", type=int, default=None, help="route every token to slot K")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--no-save", action="store_true", help="do not save or index the trace")

    p = _verb(sub, common, "gates", "train a composed model's gates (KL warm start, then GRPO)",
              _gates, "moe", "envs", "max_tokens", "max_turns", "json")
    p.add_argument("--warm-seeds", type=int, default=4)
    p.add_argument("--warm-steps", type=int, default=100)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--groups-per-step", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warm-lr", type=float, default=None,
                   help="warm-start Adam rate (default 1e-2, backtracking: never overshoots)")
    p.add_argument("--estimator", default=None, choices=["full", "chosen"],
                   help="gate gradient: full straight-through (default; learns from zero)")
    p.add_argument("--balance-coef", type=float, default=0.01)
    add_device_arguments(p, "the composed model (rollouts and gate update)")
    p.add_argument("--eval-seeds", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--background", action="store_true", help="run as a background job")
    p.add_argument("--backend", default="local", choices=["local", "ray"])

    p = _verb(sub, common, "moe-eval",
              "base vs each adapter vs linear merge vs composed, held-out seeds", _evaluate,
              "moe", "envs", "max_tokens", "max_turns", "json")
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--seed-start", type=int, default=10_000)
    p.add_argument("--no-merge", action="store_true", help="skip the linear-merge baseline")

    p = _verb(sub, common, "moe-serve",
              "serve a composed model with the policy server's OpenAI API", _serve,
              "moe", "mode", mode={"help": None})
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8001)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--record-dir", default=None, help="save a routing trace per completion")
    p.add_argument("--no-trace", action="store_true",
                   help="no per-completion routing summary (saves one forward per choice)")

    p = _verb(sub, common, "moe-merge",
              "exact linear merge of LoRA adapters (baseline, vLLM export)", _merge, "json")
    p.add_argument("--adapters", default=None, help="comma-separated adapter folders")
    p.add_argument("--weights", default=None, help="comma-separated weights (default equal)")
    p.add_argument("--per-request", action="store_true",
                   help="from --moe: one merged adapter per capability + the gates' router")
    p.add_argument("--moe", default=None, help="composed model folder (--per-request)")
    p.add_argument("--envs", default=None,
                   help="CAP=ENV,...: requests that measure each capability's layer choice")
    p.add_argument("--seeds", type=int, default=8, help="requests per environment")
    p.add_argument("--seed-start", type=int, default=0)
    p.add_argument("--out", required=True)
