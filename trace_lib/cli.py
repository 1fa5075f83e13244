"""The `python -m trace_lib` / `tracewb` command line.

Design decisions
- Each stage owns its verbs in a `commands.py` beside its code and exposes
  `register(subparsers, common)`; this file only assembles them. Registration imports
  nothing heavy (torch, transformers, streamlit): handlers import what they need when
  they run, so `--help` and quick verbs stay fast.
- Every verb takes `--db PATH` (else `TRACE_DB`, else `data/trace.duckdb`) through the
  shared `common` parent parser.
- Errors the user can act on (`StoreError`, `UserInputError`) print one message on
  stderr and exit 1; `--json` output is exactly one JSON object or list on stdout.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from typing import Any

from trace_lib.errors import UserInputError
from trace_lib.store import StoreError

# Modules that contribute verbs, in the order `--help` lists them.
COMMAND_MODULES: tuple[str, ...] = (
    "trace_lib.ingest.commands",
    "trace_lib.demo",
    "trace_lib.explore.commands",
    "trace_lib.diagnose.commands",
    "trace_lib.envs.commands",
    "trace_lib.train.commands",
    "trace_lib.train.serve_commands",
    "trace_lib.compose.commands",
)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--db", default=None, help="DuckDB file (default: $TRACE_DB or data/trace.duckdb)"
    )
    parser = argparse.ArgumentParser(
        prog="python -m trace_lib",
        description="TRACE Workbench: diagnose, environments, train, compose.",
    )
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub, common)
    return parser


def print_json(obj: Any) -> None:
    """The one JSON document a `--json` verb prints on stdout."""
    sys.stdout.write(json.dumps(obj, indent=2, default=str, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (StoreError, UserInputError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
