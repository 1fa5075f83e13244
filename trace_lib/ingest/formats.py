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
- A file that matches nothing gets an error that says, for every format, what it tried
  and why the file did not fit (`why_not`), so a near miss reads as one.
- `.eval` files (Inspect AI logs, a zip archive) go to the Inspect importer by suffix;
  a `.json` Inspect log is detected by its `eval`/`version` keys.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from trace_lib.errors import UserInputError
from trace_lib.ingest.normalise import DEFAULT_REWARD_RANGE, ParsedFile, SuccessMap
from trace_lib.ingest.source import (
    DocumentJSONError,
    IngestLimits,
    ProgressBytes,
    Source,
    check_not_empty,
    read_document,
)
from trace_lib.registry import ENTRY_POINT_GROUPS, Registry


@dataclass
class ParseContext:
    """What an importer needs besides the file."""

    limits: IngestLimits = field(default_factory=IngestLimits)
    skip_invalid: bool = False
    success: SuccessMap | None = None  # SWE-agent: instance id -> resolved
    progress: ProgressBytes | None = None
    reward_range: tuple[float, float] = DEFAULT_REWARD_RANGE
    require_outcome: bool = False  # OpenAI JSONL: refuse records without reward/success
    domain: str | None = None  # overrides what the file says or the name suggests
    agent_model: str | None = None


class Importer(Protocol):
    name: str
    description: str
    streaming: bool  # True: parse() reads the source itself (doc is None)

    def matches(self, doc: Any) -> bool:
        """Whether a parsed whole document has this format's shape."""
        ...

    def why_not(self, doc: Any) -> str:
        """Why `doc` does not have this format's shape (for the detection error)."""
        ...

    def parse(self, src: Source, doc: Any, sha256: str | None, ctx: ParseContext) -> ParsedFile:
        """Normalise the file. `doc`/`sha256` are given when detection already parsed it."""
        ...


# The built-in importer modules register themselves when `_ensure_builtin` imports them;
# third parties name an Importer object in the `trace_workbench.importers` entry-point group.
IMPORTERS: Registry[Importer] = Registry("format", group=ENTRY_POINT_GROUPS["importers"])


def register_importer(importer: Importer) -> Importer:
    IMPORTERS.register(importer.name, importer, replace=True)
    return importer


def _ensure_builtin() -> None:
    # Imported here (not at module top) so the importer modules can import this one;
    # importing registers them (a no-op after the first time).
    from trace_lib.ingest import inspect_logs, openai_jsonl, swe_agent, tau2, taubench  # noqa: F401


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


# Most specific shape first: a bare list of tau2 simulations also has `messages` in its
# first item, so tau2 must be asked before the generic OpenAI-messages importer.
_DETECTION_ORDER = ("tau2", "tau_bench", "swe_agent", "inspect", "openai_jsonl")


def _detection_order() -> list[Importer]:
    known = [IMPORTERS[n] for n in _DETECTION_ORDER if n in IMPORTERS]
    return known + [i for n, i in IMPORTERS.items() if n not in _DETECTION_ORDER]


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
    if src.suffix == ".eval":
        return IMPORTERS["inspect"], None, None
    check_not_empty(src)
    if src.suffix == ".jsonl" or _first_line_is_record(src):
        return IMPORTERS["openai_jsonl"], None, None
    try:
        doc, sha = read_document(src, ctx.limits, ctx.progress)
    except DocumentJSONError as exc:
        if exc.extra_data:  # several JSON values one after another: JSONL
            return IMPORTERS["openai_jsonl"], None, None
        raise
    for importer in _detection_order():
        if importer.matches(doc):
            return importer, doc, sha
    tried = "; ".join(f"{i.name} (expects {i.description}): {i.why_not(doc)}"
                      for i in _detection_order())
    raise UserInputError(
        f"{src.name}: could not detect the format (got {describe(doc)}). Tried — {tried}. "
        f"Pass --format to choose one"
    )


def describe(doc: Any) -> str:
    """A short description of a parsed document's shape, for error messages."""
    if isinstance(doc, dict):
        return f"an object with keys {sorted(doc)[:8]}"
    if isinstance(doc, list):
        if not doc:
            return "an empty list"
        first = doc[0]
        inner = f"objects with keys {sorted(first)[:8]}" if isinstance(first, dict) else (
            type(first).__name__)
        return f"a list of {len(doc)} {inner}"
    return type(doc).__name__


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
                f"{src.name}: does not look like {importer.name} ({importer.description}): "
                f"{importer.why_not(doc)}"
            )
    return importer.parse(src, doc, sha, ctx)
