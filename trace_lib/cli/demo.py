"""CLI verbs of the demos: `demo build` (the data set), `demo adapters` (the routing demo).

Design decisions
- The generation lives in `trace_lib.demo`; this verb only parses and prints the report
  of the data use case `trace_lib.workbench.data.build_demo`; `demo adapters` prints
  `trace_lib.workbench.routing_demo.build`'s.
"""

from __future__ import annotations

import argparse

from trace_lib.cli.output import print_json
from trace_lib.workbench.data import DEMO_DIR, DEMO_FILE


def _cmd_build(args: argparse.Namespace) -> int:
    from trace_lib.workbench import data

    report = data.build_demo(args.out, n=args.n, seed=args.seed, db=args.db,
                        if_absent=args.if_absent, import_into_store=not args.no_import,
                        progress=not args.json)
    if args.json:
        print_json(report)
    elif report["skipped"]:
        print(f"demo already imported ({DEMO_FILE}); nothing to do")
    else:
        print(f"wrote {report['trajectories']} trajectories over {report['tasks']} tasks to "
              f"{report['file']} (success rate {report['success_rate']:.0%})")
        for agent, rate in report["success_rate_by_agent"].items():
            print(f"  {agent:18s} success {rate:.0%}")
        print("  planted deficits: " + ", ".join(
            f"{k} {v}" for k, v in report["planted_deficits"].items()))
        if "ingest" in report:
            ing = report["ingest"]
            print(f"imported {ing['trajectories']} trajectories "
                  f"({ing['duplicates']} already there)")
    return 0


def _cmd_adapters(args: argparse.Namespace) -> int:
    from trace_lib.workbench import routing_demo

    overrides = {"examples": args.examples, "sft_steps": args.sft_steps,
                 "torch_threads": args.threads}
    report = routing_demo.build(args.db, args.model, background=args.background,
                                progress=True, out=args.out, **overrides)
    if args.json:
        print_json(report)
        return 0
    state = report["state"]
    if state == "built" and report["skipped"]:
        print(f"routing demo already built in {report['path']}; nothing to do")
        print(report.get("what_you_see", ""))
    elif state == "running":
        print(f"a build of the routing demo is running: job {report['job']} "
              f"(python -m trace_lib job status {report['job']})")
    elif state == "submitted":
        print(f"started job {report['job']} -> {report['run_dir']}; follow it with "
              f"`python -m trace_lib job logs {report['job']} --follow`")
    else:
        print(f"routing demo built in {report['path']} "
              f"({report['cpu_s']['total_this_run']:.0f} CPU-s)")
        print(report["what_you_see"])
    return 0


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add the `demo` verb to the CLI."""
    demo = sub.add_parser("demo", help="the project's demo data set")
    demo_sub = demo.add_subparsers(dest="demo_verb", metavar="ACTION")
    demo_sub.required = True
    build = demo_sub.add_parser(
        "build", parents=[common],
        help="generate the airline demo trajectories and import them",
        description="Deterministically generate scripted airline trajectories with planted "
                    "deficits, write them as OpenAI-messages JSONL and import them.")
    build.add_argument("--out", default=str(DEMO_DIR), help="folder for airline_demo.jsonl")
    build.add_argument("--n", type=int, default=300, help="number of trajectories")
    build.add_argument("--seed", type=int, default=0)
    build.add_argument("--if-absent", action="store_true",
                       help="do nothing if the store already holds the demo dataset")
    build.add_argument("--no-import", action="store_true", help="only write the JSONL file")
    build.add_argument("--json", action="store_true", help="print the report as JSON")
    build.set_defaults(func=_cmd_build)
    adapters = demo_sub.add_parser(
        "adapters", parents=[common],
        help="build the routing demo: two conflicting skills, their router, the replies",
        description="SFT two conflicting capability adapters, compose them, warm-start the "
                    "gates from a small reward table, export the per-request router, and "
                    "roll out held-out example requests with base, each adapter, the linear "
                    "merge and the composed model (the Routing page's demo). Kept under the "
                    "models folder: a second run finds it and does nothing; an interrupted "
                    "one continues.")
    adapters.add_argument("--model", default="smollm2-135m",
                          help="base model (smollm2-135m; tiny: seconds, learns nothing)")
    adapters.add_argument("--background", action="store_true",
                          help="run as a job (see `job status`)")
    adapters.add_argument("--out", default=None,
                          help="demo folder (default: <models folder>/routing-demo/MODEL)")
    adapters.add_argument("--examples", type=int, default=None,
                          help="held-out example requests per environment (default 5)")
    adapters.add_argument("--sft-steps", type=int, default=None,
                          help="SFT steps per adapter (default 16)")
    adapters.add_argument("--threads", type=int, default=None,
                          help="torch threads (default 1)")
    adapters.add_argument("--json", action="store_true", help="print the report as JSON")
    adapters.set_defaults(func=_cmd_adapters)
