"""What every verb prints: one JSON document on stdout, and the shared `--db` parent parser.

Design decisions
- `--json` verbs print exactly one JSON object or list on stdout through `print_json`;
  progress bars and messages go to stderr, so stdout stays machine-readable. `main` runs a
  `--json` verb inside `json_document()`: anything else printed to stdout meanwhile (the
  trainer's `[train] ...` lines, a library's print) goes to stderr, so `verb --json | jq`
  holds for every verb without each one policing what the stages print.
- `common_parser()` is the one place `--db` is defined; every verb lists it in `parents=`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from typing import Any, TextIO

_document: list[TextIO] = []  # the real stdout while a --json verb runs


@contextlib.contextmanager
def json_document() -> Iterator[None]:
    """Run a `--json` verb: stdout is the JSON document's alone (`print_json` writes to
    it); every other write to stdout goes to stderr meanwhile."""
    _document.append(sys.stdout)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _document.pop()


def print_json(obj: Any) -> None:
    """The one JSON document a `--json` verb prints on stdout."""
    out = _document[-1] if _document else sys.stdout
    out.write(json.dumps(obj, indent=2, default=str, ensure_ascii=False) + "\n")
    out.flush()


def common_parser() -> argparse.ArgumentParser:
    """The parent parser every verb takes: `--db PATH`."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--db", default=None,
        help="the store's database file (default: $TRACE_DB, else the one under data/)"
    )
    return common


def csv_list(text: str | None) -> list[str] | None:
    """`a,b , c` -> ['a', 'b', 'c']; empty or None -> None."""
    return [x.strip() for x in text.split(",") if x.strip()] if text else None
