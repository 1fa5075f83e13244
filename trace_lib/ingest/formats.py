"""The importer protocol, the registry of formats, and `--format auto` detection.

Design decisions
- An importer is a small object with a `name`, a one-line `description`, `matches(doc)`
  for whole-document detection and `parse(src, doc, ctx)`. New formats register with
  `register_importer`; nothing else changes (the CLI's `--format` choices come from here).
- Detection reads as little as it can: a `.jsonl` suffix means JSONL, `.traj` means
  SWE-agent; otherwise the first line is sniffed (a JSON object with `messages` on the
  first line is JSONL). Anything else is parsed once as a document and offered to each
  whole-document importer in turn; the parsed document is handed to the chosen importer,
  so no file is parsed twice.
- A file that matches nothing gets an error listing the shapes each format expects.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from trace_lib.errors import UserInputError
from trace_lib.ingest.records import ParsedFile, SuccessMap
from trace_lib.ingest.source import (
    DocumentJSONError,
    IngestLimits,
    ProgressBytes,
    Source,
    check_not_empty,
    read_document,
)


@dataclass
class ParseContext:
    """What an importer needs besides the file."""

    limits: IngestLimits = field(default_factory=IngestLimits)
    skip_invalid: bool = False
    success: SuccessMap | None = None  # SWE-agent: instance id -> resolved
    progress: ProgressBytes | None = None


class Importer(Protocol):
    name: str
    description: str
    streaming: bool  # True: parse() reads the source itself (doc is None)

    def matches(self, doc: Any) -> bool:
        """Whether a parsed whole document has this format's shape."""
        ...

    def parse(self, src: Source, doc: Any, sha256: str | None, ctx: ParseContext) -> ParsedFile:
        """Normalise the file. `doc`/`sha256` are given when detection already parsed it."""
        ...


IMPORTERS: dict[str, Importer] = {}


def register_importer(importer: Importer) -> Importer:
    IMPORTERS[importer.name] = importer
    return importer


def _ensure_builtin() -> None:
    # Imported here (not at module top) so the importer modules can import this one;
    # importing registers them (a no-op after the first time).
    from trace_lib.ingest import openai_jsonl, swe_agent, tau2, taubench  # noqa: F401


def format_names() -> list[str]:
    _ensure_builtin()
    return list(IMPORTERS)


def get_importer(name: str) -> Importer:
    _ensure_builtin()
    if name not in IMPORTERS:
        raise UserInputError(
            f"unknown format {name!r}; expected one of: auto, {', '.join(IMPORTERS)}"
        )
    return IMPORTERS[name]


def _first_line_is_record(src: Source) -> bool:
    head = src.head().lstrip(b"\xef\xbb\xbf").lstrip()
    nl = head.find(b"\n")
    if not head.startswith(b"{") or nl < 0:
        return False
    try:
        first = json.loads(head[:nl])
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    rest = head[nl:].lstrip()
    # A pretty-printed document never has a whole object on its first line followed by more.
    return isinstance(first, dict) and "messages" in first and (not rest or rest.startswith(b"{"))


def detect(src: Source, ctx: ParseContext) -> tuple[Importer, Any, str | None]:
    """Choose the importer for `src`; returns (importer, parsed document or None, sha256)."""
    _ensure_builtin()
    check_not_empty(src)
    if src.suffix == ".jsonl" or _first_line_is_record(src):
        return IMPORTERS["openai_jsonl"], None, None
    try:
        doc, sha = read_document(src, ctx.limits, ctx.progress)
    except DocumentJSONError as exc:
        if exc.extra_data:  # several JSON values one after another: JSONL
            return IMPORTERS["openai_jsonl"], None, None
        raise
    for importer in IMPORTERS.values():
        if importer.matches(doc):
            return importer, doc, sha
    shapes = "; ".join(f"{i.name}: {i.description}" for i in IMPORTERS.values())
    got = (
        type(doc).__name__
        if not isinstance(doc, dict)
        else f"an object with keys {sorted(doc)[:8]}"
    )
    raise UserInputError(
        f"{src.name}: could not detect the format (got {got}). Expected one of — {shapes}. "
        f"Pass --format to choose one"
    )


def load(src: Source, fmt: str, ctx: ParseContext) -> ParsedFile:
    """Parse one source with format `fmt` ('auto' detects)."""
    if fmt == "auto":
        importer, doc, sha = detect(src, ctx)
    else:
        importer = get_importer(fmt)
        check_not_empty(src)
        doc, sha = (
            (None, None) if importer.streaming else read_document(src, ctx.limits, ctx.progress)
        )
        if doc is not None and not importer.matches(doc):
            raise UserInputError(
                f"{src.name}: does not look like {importer.name} ({importer.description})"
            )
    return importer.parse(src, doc, sha, ctx)
