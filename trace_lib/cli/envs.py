"""CLI verbs of the environments stage: `python -m trace_lib env VERB ...`.

    env list | sample NAME --seed S | validate NAME|PATH | calibrate NAME --policy P
    env generate CAPABILITY --domain D [--generator template|llm] | approve NAME | reject NAME
    env play NAME --seed S (--action JSON ... | --reference)

Design decisions
- Thin: each handler parses, calls one use case of `trace_lib.workbench.environments`, prints (text or one JSON document
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

from trace_lib.cli.output import print_json
from trace_lib.cli.train import DIFFICULTIES


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
    if args.json:
        print_json(obj)
    else:
        print(text)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from trace_lib.workbench import environments

    rows = environments.list_environments(db=args.db)
    lines = [f"{r['name']:<52} {r['status']:<10} {r['source']:<9} v{r['version']}" for r in rows]
    return _out(args, rows, "\n".join(lines) or "(no environments)")


def _build_options(args: argparse.Namespace) -> dict[str, Any]:
    """--tools / --policy (--policy-text on calibrate) / --difficulty / --distractors for a
    built-in."""
    text = getattr(args, "policy_text", None) or getattr(args, "policy_kind", None)
    return {k: v for k, v in (("tools", args.tools), ("policy", text),
                              ("difficulty", args.difficulty),
                              ("distractors", args.distractors)) if v is not None}


def _option_flags(p: argparse.ArgumentParser, policy_flag: str = "--policy") -> None:
    p.add_argument("--tools", choices=("capability", "all"), default=None,
                   help="built-ins: the capability's tools (+ distractors) or all of the "
                   "domain's (default: all)")
    p.add_argument(policy_flag, dest="policy_text" if policy_flag != "--policy" else
                   "policy_kind", choices=("excerpt", "full"), default=None,
                   help="built-ins: the policy excerpt for the capability or the full policy "
                   "(default: full)")
    p.add_argument("--difficulty", type=int, choices=DIFFICULTIES, default=None,
                   help="built-ins: task difficulty (default: 2); 4 and 5 are the "
                   "target-shaped levels (airline)")
    p.add_argument("--distractors", type=int, default=None,
                   help="built-ins with --tools capability: other domain tools shown "
                   "(default: 2)")


def cmd_sample(args: argparse.Namespace) -> int:
    from trace_lib.workbench import environments

    sample = environments.sample(args.name, args.seed, db=args.db, options=_build_options(args),
                                 model=args.model)
    text = (f"# {sample['name']} seed {args.seed}\n\n## user\n{sample['messages'][-1]['content']}"
            f"\n\n## ground truth\n{json.dumps(sample['ground_truth'], indent=2, default=str)}")
    if "prompt_tokens" in sample:
        text += f"\n\nprompt: {sample['prompt_tokens']['total']} tokens of {args.model}"
    return _out(args, sample, text)


def cmd_validate(args: argparse.Namespace) -> int:
    from trace_lib.workbench import environments

    report = environments.validate(args.target, n_seeds=args.seeds, db=args.db,
                                   progress=_progress(f"validate {args.target}"),
                                   options=_build_options(args))
    name = report.get("name") or args.target
    lines = [f"{name}: {report['status']}"]
    lines += [f"  {k:<20} {v}" for k, v in report.get("figures", {}).items()]
    lines += [f"  ! {e}" for e in report.get("errors", [])]
    _out(args, report, "\n".join(lines))
    return 0 if report["status"] == "validated" else 2


def cmd_calibrate(args: argparse.Namespace) -> int:
    from trace_lib.workbench import environments

    result = environments.calibrate(args.name, args.policy, seeds=args.seeds, group=args.group,
                                    seed_offset=args.seed_offset, db=args.db,
                                    progress=_progress(f"calibrate {args.name}"),
                                    options=_build_options(args))
    keys = ("mean_reward", "all_success_share", "all_fail_share", "informative_share",
            "pass@1", "pass@4", "pass@8", "pass@16", "in_band")
    lines = [f"{args.name} with {args.policy}:"]
    lines += [f"  {k:<18} {result[k]:.3f}" if isinstance(result[k], float)
              else f"  {k:<18} {result[k]}" for k in keys if k in result]
    lines += [f"  ! {m}" for m in result["band_misses"]]
    return _out(args, result, "\n".join(lines))


def cmd_generate(args: argparse.Namespace) -> int:
    from trace_lib.workbench import environments

    result = environments.generate(
        args.capability, args.domain, generator=args.generator, provider=args.provider,
        model=args.model, base_url=args.base_url, attempts=args.attempts,
        difficulty=args.difficulty, seeds=args.seeds, description=args.description,
        db=args.db, progress=lambda m: print(m, file=sys.stderr))
    lines = [f"{result['name']}: {result['status']} after {result['attempts']} attempt(s)"]
    for h in result["history"]:
        lines.append(f"  attempt {h['attempt']}: {h['status']}")
        lines += [f"    ! {e}" for e in h["errors"]]
    _out(args, result, "\n".join(lines))
    return 0 if result["status"] == "validated" else 2


def cmd_approve(args: argparse.Namespace) -> int:
    from trace_lib.workbench import environments

    out = environments.approve(args.name, note=args.note or "", force=args.force, db=args.db)
    return _out(args, out, f"{out['name']}: {out['status']}")


def cmd_reject(args: argparse.Namespace) -> int:
    from trace_lib.workbench import environments

    out = environments.reject(args.name, note=args.note or "", db=args.db)
    return _out(args, out, f"{out['name']}: {out['status']}")


def cmd_play(args: argparse.Namespace) -> int:
    from trace_lib.workbench import environments

    actions = [json.loads(a) for a in args.action or []]
    result = environments.play(args.name, args.seed, actions, reference=args.reference,
                               db=args.db)
    transcript, summary = result["transcript"], result["summary"]
    text = "\n".join(
        [f"user: {transcript[0]['content']}"]
        + [f"> {json.dumps(t['action'])}\n{t['observation'][:500]}" for t in transcript[1:]]
        + [f"reward {summary['reward']} passed {summary['passed']}"]
        + [f"  - {r}" for r in summary.get("reasons", [])]
    )
    return _out(args, result, text)


def _with_sandbox_choice(func: Any) -> Any:
    """Apply --unsafe-local-sandbox (explicit only) before the verb runs generated code."""
    def run(args: argparse.Namespace) -> int:
        if getattr(args, "unsafe_local_sandbox", False):
            from trace_lib.workbench.environments import allow_unsafe_local_sandbox

            allow_unsafe_local_sandbox()
        return func(args)
    return run


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add `env` and its verbs to the CLI."""
    env = sub.add_parser("env", help="capability environments: list, sample, validate, "
                         "calibrate, generate, approve, reject, play")
    verbs = env.add_subparsers(dest="env_verb", metavar="VERB")
    verbs.required = True

    def verb(name: str, func: Any, help_text: str) -> argparse.ArgumentParser:
        p = verbs.add_parser(name, parents=[common], help=help_text)
        p.add_argument("--json", action="store_true", help="print one JSON document")
        p.add_argument("--unsafe-local-sandbox", action="store_true",
                       help="run generated code without bubblewrap (audit hook only: NOT a "
                       "security boundary)")
        p.set_defaults(func=_with_sandbox_choice(func))
        return p

    verb("list", cmd_list, "every environment with its status")

    p = verb("sample", cmd_sample, "one instance: prompt, tools, messages, ground truth")
    p.add_argument("name")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default=None,
                   help="also count the prompt's tokens for this model (e.g. smollm2-135m)")
    _option_flags(p)

    p = verb("validate", cmd_validate, "determinism, schema fidelity, reference/trivial "
             "policies, diversity; records the report (exit 2 if rejected)")
    p.add_argument("target", metavar="NAME|PATH")
    p.add_argument("--seeds", type=int, default=50)
    _option_flags(p)

    p = verb("calibrate", cmd_calibrate, "reward distribution of a policy against the band")
    p.add_argument("name")
    p.add_argument("--policy", default="epsilon:0.5",
                   help="reference | null | random | epsilon:P | openai:MODEL@URL | URL#MODEL")
    p.add_argument("--seeds", type=int, default=100)
    p.add_argument("--group", type=int, default=16)
    p.add_argument("--seed-offset", type=int, default=10_000)
    _option_flags(p, "--policy-text")  # --policy is the acting policy here

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

    p = verb("approve", cmd_approve, "allow training on it")
    p.add_argument("name")
    p.add_argument("--note", default="")
    p.add_argument("--force", action="store_true", help="approve without a passing validation")

    p = verb("reject", cmd_reject, "forbid training on it")
    p.add_argument("name")
    p.add_argument("--note", default="")

    p = verb("play", cmd_play, "play an instance with given actions or the reference policy")
    p.add_argument("name")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--action", action="append", help='JSON: {"name":..,"arguments":{..}} or '
                   '{"content": ".."}; repeat for several')
    p.add_argument("--reference", action="store_true", help="play the reference policy")
