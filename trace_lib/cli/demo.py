"""CLI verb of the demo data set: `demo build`.

Design decisions
- The generation lives in `trace_lib.demo`; this verb only parses and prints the report
  of the data use case `trace_lib.workbench.data.build_demo`.
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
