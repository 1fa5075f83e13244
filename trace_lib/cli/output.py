"""What every verb prints: one JSON document on stdout, and the shared `--db` parent parser.

Design decisions
- `--json` verbs print exactly one JSON object or list on stdout through `print_json`;
  progress bars and messages go to stderr, so stdout stays machine-readable.
- `common_parser()` is the one place `--db` is defined; every verb lists it in `parents=`.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def print_json(obj: Any) -> None:
    """The one JSON document a `--json` verb prints on stdout."""
    sys.stdout.write(json.dumps(obj, indent=2, default=str, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def common_parser() -> argparse.ArgumentParser:
    """The parent parser every verb takes: `--db PATH`."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--db", default=None, help="DuckDB file (default: $TRACE_DB or data/trace.duckdb)"
    )
    return common


def csv_list(text: str | None) -> list[str] | None:
    """`a,b , c` -> ['a', 'b', 'c']; empty or None -> None."""
    return [x.strip() for x in text.split(",") if x.strip()] if text else None
