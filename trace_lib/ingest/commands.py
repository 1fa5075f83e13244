"""CLI verbs of the ingest stage: `ingest` and `stats`.

Design decisions
- `ingest PATH...` is all or nothing over every path; `--json` prints exactly the
  IngestReport object on stdout, the tqdm bar and messages go to stderr.
- `stats` prints store-wide counts with the same outcome keys as an ingest report.
- Heavy imports (pyarrow, duckdb) happen inside the handlers.
"""

from __future__ import annotations

import argparse
import sys

FORMATS = ("auto", "tau_bench", "tau2", "openai_jsonl", "swe_agent")


def _ingest(args: argparse.Namespace) -> int:
    from trace_lib.cli import print_json
    from trace_lib.ingest import ingest_paths

    report = ingest_paths(
        args.paths,
        db=args.db,
        fmt=args.format,
        skip_invalid=args.skip_invalid,
        success_file=args.success_file,
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
    from trace_lib.cli import print_json
    from trace_lib.ingest import store_stats

    stats = store_stats(args.db)
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
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(func=_ingest)

    s = sub.add_parser("stats", parents=[common], help="counts over the whole store")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=_stats)
