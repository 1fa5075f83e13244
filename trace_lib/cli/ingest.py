"""CLI verbs of the data stage: `ingest` and `stats` (over `trace_lib.workbench.data`).

Design decisions
- `ingest PATH...` is all or nothing over every path; `--json` prints exactly the
  IngestReport object on stdout, the tqdm bar and messages go to stderr.
- `stats` prints store-wide counts with the same outcome keys as an ingest report.
- Heavy imports (pyarrow, the store) happen inside the handlers.
"""

from __future__ import annotations

import argparse
import sys

from trace_lib.cli.output import print_json

FORMATS = ("auto", "tau_bench", "tau2", "openai_jsonl", "swe_agent", "inspect", "otel",
           "otel_session")


def _ingest(args: argparse.Namespace) -> int:
    from trace_lib.workbench import data

    report = data.import_files(
        args.paths,
        db=args.db,
        fmt=args.format,
        skip_invalid=args.skip_invalid,
        success_file=args.success_file,
        domain=args.domain,
        agent_model=args.agent_model,
        reward_range=args.reward_range,
        require_outcome=args.require_outcome,
        progress=sys.stderr.isatty() or not args.json,
    )
    if args.json:
        print_json(report.to_json())
    else:
        for name, fmt in report.formats.items():
            print(f"{name}: format {fmt}", file=sys.stderr)
        print(report.summary())
    return 0


def _stats(args: argparse.Namespace) -> int:
    from trace_lib.workbench import data

    stats = data.store_stats(args.db)
    if args.json:
        print_json(stats)
        return 0
    print(
        f"{stats['db']}: {stats['trajectories']} trajectories ({stats['successes']} successes, "
        f"{stats['failures']} failures, {stats['unknown']} unknown), {stats['messages']} messages, "
        f"{stats['tool_calls']} tool calls ({stats['tool_errors']} errors)"
    )
    for d in stats["datasets"]:
        print(
            f"  {d['id']}  {d['name']}  {d['format']}  {d['trajectories']} trajectories, "
            f"{d['successes']} successes"
        )
    return 0


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add this stage's verbs to the CLI."""
    p = sub.add_parser(
        "ingest",
        parents=[common],
        help="import trajectory files (all or nothing)",
        description="Import tau-bench, tau2-bench, OpenAI-messages JSONL or SWE-agent .traj "
        "files. A bad record imports nothing unless --skip-invalid.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="files to import")
    p.add_argument(
        "--format",
        default="auto",
        choices=FORMATS,
        help="source format (default: detect it and say which)",
    )
    p.add_argument(
        "--skip-invalid",
        action="store_true",
        help="import the valid records and list the skipped ones with reasons",
    )
    p.add_argument(
        "--success-file",
        default=None,
        metavar="F",
        help="SWE-agent outcomes: a JSON list of resolved instance ids, an "
        "{id: bool} object, or a SWE-bench report with resolved_ids",
    )
    p.add_argument("--domain", default=None, metavar="D",
                   help="domain of every imported trajectory (overrides the file or inference)")
    p.add_argument("--agent-model", default=None, metavar="M",
                   help="agent model of every imported trajectory (overrides the file)")
    p.add_argument("--reward-range", default=None, metavar="LO,HI",
                   help="the dataset's reward scale (default 0,1); success = reward >= HI")
    p.add_argument("--require-outcome", action="store_true",
                   help="refuse OpenAI-JSONL records without reward/success (default: unknown)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(func=_ingest)

    s = sub.add_parser("stats", parents=[common], help="counts over the whole store")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=_stats)
