"""The registry of formats, and `--format auto` detection.

Design decisions
- An importer (the protocol, and the `ParseContext` it is handed, are in `importer.py`)
  is one entry of `IMPORTERS`: built-ins are lazy "module:IMPORTER" strings, so this
  module imports no importer (none imports it either: no circle) and an importer is
  loaded only when its format is used or detection asks it. A new format is one module
  and one line here, or a plugin's entry point; nothing else changes (the CLI's
  `--format` choices come from here).
- Detection reads as little as it can: a `.jsonl` suffix means JSONL, `.traj` means
  SWE-agent; otherwise the first line is sniffed (a JSON object with `messages` on the
  first line is JSONL). Anything else is parsed once as a document and offered to each
  whole-document importer in turn; the parsed document is handed to the chosen importer,
  so no file is parsed twice.
- A file that matches nothing gets an error that says, for every format, what it tried
  and why the file did not fit (`why_not`), so a near miss reads as one.
- `.eval` files (Inspect AI logs, a zip archive) go to the Inspect importer by suffix;
  a `.json` Inspect log is detected by its `eval`/`version` keys.
- OpenTelemetry (OTLP JSON) files are recognised by their first bytes (`otel`'s `sniff`:
  a request's `resourceSpans` key), before the suffix rules: the collector writes one
  request per line under `.json` or `.jsonl`.
"""

from __future__ import annotations

import json
from typing import Any

from trace_lib.errors import UserInputError
from trace_lib.ingest.importer import Importer, ParseContext
from trace_lib.ingest.normalise import ParsedFile
from trace_lib.ingest.source import DocumentJSONError, Source, check_not_empty, read_document
from trace_lib.registry import ENTRY_POINT_GROUPS, Registry

# The built-in importers, imported on first use; third parties name an Importer object in
# the `trace_workbench.importers` entry-point group, or `IMPORTERS.register(name, obj)`.
# Listed in the order `--format` has always shown them (SWE-agent first).
IMPORTERS: Registry[Importer] = Registry(
    "format", group=ENTRY_POINT_GROUPS["importers"], builtins={
        "swe_agent": "trace_lib.ingest.swe_agent:IMPORTER",
        "inspect": "trace_lib.ingest.inspect_logs:IMPORTER",
        "openai_jsonl": "trace_lib.ingest.openai_jsonl:IMPORTER",
        "tau2": "trace_lib.ingest.tau2:IMPORTER",
        "tau_bench": "trace_lib.ingest.taubench:IMPORTER",
        "otel": "trace_lib.ingest.otel:IMPORTER",
        "otel_session": "trace_lib.ingest.otel:SESSION_IMPORTER",
    })


def format_names() -> list[str]:
    return list(IMPORTERS)


def get_importer(name: str) -> Importer:
    if name not in IMPORTERS:
        raise UserInputError(
            f"unknown format {name!r}; expected one of: auto, {', '.join(IMPORTERS)}"
        )
    return IMPORTERS[name]


# Most specific shape first: a bare list of tau2 simulations also has `messages` in its
# first item, so tau2 must be asked before the generic OpenAI-messages importer.
_DETECTION_ORDER = ("tau2", "tau_bench", "swe_agent", "inspect", "otel", "openai_jsonl")


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
    if src.suffix == ".eval":
        return IMPORTERS["inspect"], None, None
    check_not_empty(src)
    # OTLP requests open with their one key, one per line under any suffix (the collector
    # writes `.json`): asked before the `.jsonl` rule, which would read them as messages.
    if "otel" in IMPORTERS and IMPORTERS["otel"].sniff(src.head()):
        return IMPORTERS["otel"], None, None
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
