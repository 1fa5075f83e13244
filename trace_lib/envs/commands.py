"""CLI verbs of the environments stage: `python -m trace_lib env VERB ...`.

    env list | sample NAME --seed S | validate NAME|PATH | calibrate NAME --policy P
    env generate CAPABILITY --domain D [--generator template|llm] | approve NAME | reject NAME
    env play NAME --seed S (--action JSON ... | --reference)

Design decisions
- Thin: each handler parses, calls one library function, prints (text or one JSON document
  with --json). Heavy imports happen inside handlers.
- validate/calibrate of a named environment record their report in the store; validating
  a PATH only prints (nothing unreviewed enters the store by a side door).
- Long loops show a tqdm bar on stderr; stdout stays clean for --json.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def _bar(total: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, file=sys.stderr, leave=False, disable=None)


def _progress(desc: str):
    state: dict[str, Any] = {}

    def update(done: int, total: int) -> None:
        if "bar" not in state:
            state["bar"] = _bar(total, desc)
        bar = state["bar"]
        bar.update(done - bar.n)
        if done >= total:
            bar.close()

    return update


def _out(args: argparse.Namespace, obj: Any, text: str) -> int:
    from trace_lib.cli import print_json

    if args.json:
        print_json(obj)
    else:
        print(text)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from trace_lib.envs.catalog import list_environments

    rows = list_environments(db=args.db)
    lines = [f"{r['name']:<52} {r['status']:<10} {r['source']:<9} v{r['version']}" for r in rows]
    return _out(args, rows, "\n".join(lines) or "(no environments)")


def cmd_sample(args: argparse.Namespace) -> int:
    from trace_lib.envs.registry import open_environment

    with open_environment(args.name, db=args.db) as env:
        env.reset(args.seed)
        sample = {
            "name": env.name, "capability": env.capability, "domain": env.domain,
            "version": env.version, "seed": args.seed, "system_prompt": env.system_prompt,
            "tool_schemas": env.tool_schemas, "messages": env.messages, "hint": env.hint,
            "ground_truth": getattr(env, "ground_truth", None),
        }
    text = (f"# {sample['name']} seed {args.seed}\n\n## user\n{sample['messages'][-1]['content']}"
            f"\n\n## ground truth\n{json.dumps(sample['ground_truth'], indent=2, default=str)}")
    return _out(args, sample, text)


def cmd_validate(args: argparse.Namespace) -> int:
    from trace_lib.envs import catalog
    from trace_lib.envs.registry import open_environment, resolve
    from trace_lib.envs.sandbox import SandboxError
    from trace_lib.envs.validate import ValidationConfig, validate_environment

    spec = resolve(args.target, db=args.db)
    cfg = ValidationConfig(n_seeds=args.seeds)
    try:
        with open_environment(spec, db=args.db) as env:
            report = validate_environment(env, cfg, progress=_progress(f"validate {spec.name}"))
            report["sandbox_layers"] = getattr(env, "layers", None)
    except SandboxError as exc:
        report = {"name": spec.name, "status": "rejected",
                  "checks": {"sandbox": {"passed": False, **exc.to_dict()}},
                  "figures": {"sandbox": exc.kind},
                  "errors": [f"loading the module failed [{exc.kind}]: {exc.message[:1500]}"]}
    if spec.source != "file":
        row = catalog.get_row(spec.name, db=args.db)
        keep_approval = row and row["status"] == "approved" and report["status"] == "validated"
        catalog.record_report(spec, "validation", report,
                              status="approved" if keep_approval else report["status"],
                              db=args.db)
    lines = [f"{spec.name}: {report['status']}"]
    lines += [f"  {k:<20} {v}" for k, v in report.get("figures", {}).items()]
    lines += [f"  ! {e}" for e in report.get("errors", [])]
    _out(args, report, "\n".join(lines))
    return 0 if report["status"] == "validated" else 2


def cmd_calibrate(args: argparse.Namespace) -> int:
    from trace_lib.envs import catalog
    from trace_lib.envs.calibrate import CalibrationConfig, calibrate
    from trace_lib.envs.registry import open_environment, resolve

    spec = resolve(args.name, db=args.db)
    cfg = CalibrationConfig(seeds=args.seeds, group=args.group, seed_offset=args.seed_offset)
    with open_environment(spec, db=args.db) as env:
        result = calibrate(env, args.policy, cfg, progress=_progress(f"calibrate {spec.name}"))
    if spec.source != "file":
        catalog.record_report(spec, "calibration", {k: v for k, v in result.items()
                                                    if k != "group_means"}, db=args.db)
    keys = ("mean_reward", "all_success_share", "all_fail_share", "informative_share",
            "pass@1", "pass@4", "pass@8", "pass@16", "in_band")
    lines = [f"{spec.name} with {args.policy}:"]
    lines += [f"  {k:<18} {result[k]:.3f}" if isinstance(result[k], float)
              else f"  {k:<18} {result[k]}" for k in keys if k in result]
    lines += [f"  ! {m}" for m in result["band_misses"]]
    return _out(args, result, "\n".join(lines))


def _store_examples(capability: str, db: Any) -> tuple[str, list[str]]:
    """The capability's description and example failed trajectories, from the store."""
    from trace_lib.store import connect

    try:
        with connect(db) as con:
            row = con.execute("SELECT description, examples FROM capabilities WHERE name = ?",
                              [capability]).fetchone()
            if not row:
                return "", []
            ids = json.loads(row[1]) if isinstance(row[1], str) else (row[1] or [])
            texts = []
            for tid in [str(i) for i in ids][:3]:
                msgs = con.execute("SELECT role, content FROM messages WHERE trajectory_id = ? "
                                   "ORDER BY idx", [tid]).fetchall()
                texts.append("\n".join(f"{r}: {c or ''}"[:400] for r, c in msgs) if msgs else tid)
            return row[0] or "", texts
    except Exception:  # no capabilities yet, or an older schema: generate without them
        return "", []


def cmd_generate(args: argparse.Namespace) -> int:
    from trace_lib.envs.generate import GenerationConfig, GenerationRequest, generate_environment
    from trace_lib.envs.validate import ValidationConfig

    description, examples = _store_examples(args.capability, args.db)
    request = GenerationRequest(capability=args.capability, domain=args.domain,
                                description=args.description or description, examples=examples)
    cfg = GenerationConfig(generator=args.generator, provider=args.provider, model=args.model,
                           base_url=args.base_url, max_attempts=args.attempts,
                           difficulty=args.difficulty,
                           validation=ValidationConfig(n_seeds=args.seeds))
    result = generate_environment(request, cfg, db=args.db,
                                  progress=lambda m: print(m, file=sys.stderr))
    lines = [f"{result['name']}: {result['status']} after {result['attempts']} attempt(s)"]
    for h in result["history"]:
        lines.append(f"  attempt {h['attempt']}: {h['status']}")
        lines += [f"    ! {e}" for e in h["errors"]]
    _out(args, result, "\n".join(lines))
    return 0 if result["status"] == "validated" else 2


def _review(args: argparse.Namespace, status: str) -> int:
    from trace_lib.envs import catalog
    from trace_lib.envs.registry import resolve

    spec = resolve(args.name, db=args.db)
    row = catalog.set_status(spec, status, note=args.note or "",
                             force=getattr(args, "force", False), db=args.db)
    return _out(args, {"name": spec.name, "status": row.get("status")},
                f"{spec.name}: {row.get('status')}")


def cmd_play(args: argparse.Namespace) -> int:
    from trace_lib.envs.registry import open_environment

    transcript = []
    with open_environment(args.name, db=args.db) as env:
        env.reset(args.seed)
        transcript.append({"role": "user", "content": env.messages[-1]["content"]})
        actions = [json.loads(a) for a in args.action or []]
        i = 0
        while not env.done and (args.reference or i < len(actions)):
            action = env.reference_action() if args.reference else actions[i]
            i += 1
            obs = env.step(action)
            transcript.append({"action": action, "observation": obs})
        summary = env.summary()
    result = {"name": args.name, "seed": args.seed, "transcript": transcript,
              "summary": summary}
    text = "\n".join(
        [f"user: {transcript[0]['content']}"]
        + [f"> {json.dumps(t['action'])}\n{t['observation'][:500]}" for t in transcript[1:]]
        + [f"reward {summary['reward']} passed {summary['passed']}"]
        + [f"  - {r}" for r in summary.get("reasons", [])]
    )
    return _out(args, result, text)


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add `env` and its verbs to the CLI."""
    env = sub.add_parser("env", help="capability environments: list, sample, validate, "
                         "calibrate, generate, approve, reject, play")
    verbs = env.add_subparsers(dest="env_verb", metavar="VERB")
    verbs.required = True

    def verb(name: str, func: Any, help_text: str) -> argparse.ArgumentParser:
        p = verbs.add_parser(name, parents=[common], help=help_text)
        p.add_argument("--json", action="store_true", help="print one JSON document")
        p.set_defaults(func=func)
        return p

    verb("list", cmd_list, "every environment with its status")

    p = verb("sample", cmd_sample, "one instance: prompt, tools, messages, ground truth")
    p.add_argument("name")
    p.add_argument("--seed", type=int, default=0)

    p = verb("validate", cmd_validate, "determinism, schema fidelity, reference/trivial "
             "policies, diversity; records the report (exit 2 if rejected)")
    p.add_argument("target", metavar="NAME|PATH")
    p.add_argument("--seeds", type=int, default=50)

    p = verb("calibrate", cmd_calibrate, "reward distribution of a policy against the band")
    p.add_argument("name")
    p.add_argument("--policy", default="epsilon:0.5",
                   help="reference | null | random | epsilon:P | openai:MODEL@URL | URL#MODEL")
    p.add_argument("--seeds", type=int, default=100)
    p.add_argument("--group", type=int, default=16)
    p.add_argument("--seed-offset", type=int, default=10_000)

    p = verb("generate", cmd_generate, "write an environment module for a capability, "
             "validate it in the sandbox, retry with the errors (exit 2 if rejected)")
    p.add_argument("capability")
    p.add_argument("--domain", default="airline")
    p.add_argument("--generator", default="template", choices=["template", "llm"])
    p.add_argument("--provider", default="anthropic", help="llm provider: anthropic | openai")
    p.add_argument("--model", default=None)
    p.add_argument("--base-url", default=None, help="OpenAI-compatible server URL")
    p.add_argument("--attempts", type=int, default=3)
    p.add_argument("--difficulty", type=int, default=2, choices=[1, 2, 3])
    p.add_argument("--description", default="")
    p.add_argument("--seeds", type=int, default=50, help="validation seeds per attempt")

    p = verb("approve", lambda a: _review(a, "approved"), "allow training on it")
    p.add_argument("name")
    p.add_argument("--note", default="")
    p.add_argument("--force", action="store_true", help="approve without a passing validation")

    p = verb("reject", lambda a: _review(a, "rejected"), "forbid training on it")
    p.add_argument("name")
    p.add_argument("--note", default="")

    p = verb("play", cmd_play, "play an instance with given actions or the reference policy")
    p.add_argument("name")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--action", action="append", help='JSON: {"name":..,"arguments":{..}} or '
                   '{"content": ".."}; repeat for several')
    p.add_argument("--reference", action="store_true", help="play the reference policy")
