"""OTLP trace files read into spans, grouped into traces (or sessions) and checked.

This module knows OTLP and nothing about agents; `otel.py` turns a group of spans into a
trajectory.

Design decisions
- Spans are decoded with opentelemetry-proto's classes: each request is parsed by
  `google.protobuf.json_format.ParseDict` into an `ExportTraceServiceRequest`, never by a
  hand-written schema, so every OTLP field has the type the protocol gives it (an
  `intValue` that is not an integer is the protocol's error, not ours). Unknown fields are
  ignored, as OTLP receivers must. When a request fails to parse, its spans are parsed one
  by one to say which trace and span broke it.
- Trace and span ids: OTLP/JSON (what the collector's file exporter and OTLP/HTTP write)
  spells them in hex; protobuf's own JSON mapping (`json_format.MessageToJson` of the same
  message) in base64. A hex id is also valid base64 (of other bytes), so ParseDict would
  misread it silently: the length decides (32/16 hex digits against 24/12 base64
  characters) and hex ids are rewritten to base64 before parsing. Ids are hex from here on.
- Two shapes of file: one `ExportTraceServiceRequest` per line (the collector's file
  exporter writes `.json` files shaped so, and `.jsonl`), or one whole JSON document (the
  JSON mapping pretty-printed). The first line decides: a whole JSON object on it means
  lines.
- Bounded memory for line files, in two passes. A trajectory needs all of its spans, and
  the spans of one trace arrive in several export batches (a parent ends, and is
  exported, after its children). The first pass reads each line as plain JSON and keeps
  a few numbers per trace (span count, last line, session id); the second decodes the
  spans and hands a group over as soon as the line holding its last span is read, then
  forgets it. Memory is the spans of groups still open, plus one line, plus those numbers.
  The span limit is checked in the first pass, so a trace of 10^6 spans is refused before
  any of them is held. A whole-document file is in memory anyway (bounded by
  `IngestLimits.max_document_bytes`) and is grouped in one go.
- A group is one trace, or (`by_session`) every trace sharing a session id: the first of
  `session.id` (OpenInference) or `gen_ai.conversation.id` (GenAI) found on its spans; a
  trace without one stays a group of its own.
- Checks, each naming the file, trace and span: more spans than the limit; a span id used
  twice with different content (an identical copy, which a retried export writes, is
  dropped); a parent span missing from the file (a partial export: the trajectory would
  be missing what the parent saw); a cycle of parent links.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from trace_lib.errors import UserInputError
from trace_lib.ingest.source import (
    IngestLimits,
    ProgressBytes,
    Source,
    iter_jsonl,
    loads_checked,
    read_document,
)

# A trajectory of more spans than this is refused (a runaway loop, or a whole service's
# traffic under one trace id); the importer takes another limit as an argument.
MAX_SPANS_PER_TRAJECTORY = 100_000
SESSION_KEYS = ("session.id", "gen_ai.conversation.id")
_HEX = frozenset("0123456789abcdefABCDEF")
_ID_FIELDS = ("traceId", "trace_id", "spanId", "span_id", "parentSpanId", "parent_span_id")


class TraceError(ValueError):
    """Something wrong with one trace; `span` and `field` say where, when known."""

    def __init__(self, trace: str | None, span: str | None, problem: str,
                 field: str | None = None, line: int | None = None):
        self.trace, self.span, self.problem, self.field, self.line = (
            trace, span, problem, field, line)
        super().__init__(self.describe())

    def describe(self) -> str:
        where = ", ".join(p for p in (
            f"trace {self.trace}" if self.trace else "",
            f"span {self.span}" if self.span else "",
            f"line {self.line}" if self.line else "",
        ) if p)
        what = f"attribute '{self.field}': " if self.field else ""
        return f"{where or 'the file'}: {what}{self.problem}"


@dataclass(slots=True)
class SpanEvent:
    name: str
    time_ns: int
    attributes: dict[str, Any]


@dataclass(slots=True)
class Span:
    """One decoded span; ids in hex, attribute values as Python values (see `any_value`)."""

    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    start_ns: int
    end_ns: int
    error: str | None  # status ERROR: its message (or "error" when it gives none)
    attributes: dict[str, Any]
    events: list[SpanEvent]
    resource: dict[str, Any]  # shared by the spans of one resource
    scope: str
    line: int | None  # 1-based line of a line file
    order: int = 0  # position in the file: ties of start time keep the file's order


@dataclass
class SpanGroup:
    """The spans of one trajectory, checked and ordered by start time."""

    key: str  # trace id, or session id
    session: str | None
    spans: list[Span] = field(default_factory=list)

    @property
    def trace_ids(self) -> list[str]:
        return list(dict.fromkeys(s.trace_id for s in self.spans))


def any_value(value: Any) -> Any:
    """An OTLP `AnyValue` as Python: scalars as they are, arrays as lists, kvlists as dicts."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind)


def _attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in kvs}


def id_hex(raw: Any) -> str | None:
    """A raw JSON id (hex or base64) as lowercase hex; None when it is neither."""
    if not isinstance(raw, str) or not raw:
        return None
    if len(raw) in (32, 16) and set(raw) <= _HEX:
        return raw.lower()
    try:
        return base64.b64decode(raw, validate=True).hex()
    except (binascii.Error, ValueError):
        return None


def _to_base64(span: dict[str, Any]) -> None:
    """Rewrite a raw span's hex ids as base64, what ParseDict reads (module docstring)."""
    for key in _ID_FIELDS:
        raw = span.get(key)
        if isinstance(raw, str) and len(raw) in (32, 16) and set(raw) <= _HEX:
            span[key] = base64.b64encode(bytes.fromhex(raw)).decode()
    for link in span.get("links") or ():
        if isinstance(link, dict):
            _to_base64(link)


def _raw_spans(request: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The span objects of a raw (JSON) request, skipping anything not shaped like one
    (ParseDict reports those)."""
    for rs in _list(request, "resourceSpans", "resource_spans"):
        for ss in _list(rs, "scopeSpans", "scope_spans"):
            for span in _list(ss, "spans"):
                if isinstance(span, dict):
                    yield span


def _list(obj: Any, *keys: str) -> list[Any]:
    if not isinstance(obj, dict):
        return []
    for key in keys:
        value = obj.get(key)
        if isinstance(value, list):
            return value
    return []


def _raw_session(span: dict[str, Any]) -> str | None:
    for kv in span.get("attributes") or ():
        if isinstance(kv, dict) and kv.get("key") in SESSION_KEYS:
            value = kv.get("value")
            text = value.get("stringValue", value.get("string_value")) if isinstance(
                value, dict) else None
            if isinstance(text, str) and text:
                return text
    return None


def decode_request(raw: Any, line: int | None, order: int = 0) -> list[Span]:
    """The spans of one raw ExportTraceServiceRequest (a parsed JSON object)."""
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    if not isinstance(raw, dict):
        raise TraceError(None, None, f"expected an ExportTraceServiceRequest object "
                         f"{{\"resourceSpans\": [...]}}, got {type(raw).__name__}", line=line)
    for span in _raw_spans(raw):
        _to_base64(span)
    request = ExportTraceServiceRequest()
    try:
        json_format.ParseDict(raw, request, ignore_unknown_fields=True)
    except (json_format.ParseError, TypeError, ValueError) as exc:
        raise _locate(raw, exc, line) from None
    out: list[Span] = []
    for rs in request.resource_spans:
        resource = _attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                trace, span_id = s.trace_id.hex(), s.span_id.hex()
                if len(s.trace_id) != 16 or len(s.span_id) != 8:
                    raise TraceError(trace or None, span_id or None,
                                     "expected a 16-byte trace id and an 8-byte span id "
                                     "(32 and 16 hex digits)", line=line)
                error = None
                if s.status.code == s.status.STATUS_CODE_ERROR:
                    error = s.status.message or "error"
                out.append(Span(
                    trace_id=trace, span_id=span_id,
                    parent_id=s.parent_span_id.hex() or None, name=s.name,
                    start_ns=s.start_time_unix_nano, end_ns=s.end_time_unix_nano,
                    error=error, attributes=_attributes(s.attributes),
                    events=[SpanEvent(e.name, e.time_unix_nano, _attributes(e.attributes))
                            for e in s.events],
                    resource=resource, scope=ss.scope.name, line=line,
                    order=order + len(out),
                ))
    return out


def _locate(raw: dict[str, Any], exc: Exception, line: int | None) -> TraceError:
    """The span a failed request's error comes from (each is parsed alone to find it)."""
    from google.protobuf import json_format
    from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanProto

    for span in _raw_spans(raw):
        try:
            json_format.ParseDict(span, SpanProto(), ignore_unknown_fields=True)
        except (json_format.ParseError, TypeError, ValueError) as inner:
            return TraceError(id_hex(span.get("traceId", span.get("trace_id"))),
                              id_hex(span.get("spanId", span.get("span_id"))),
                              f"not a valid OTLP span ({inner})", line=line)
    return TraceError(None, None, f"not a valid OTLP ExportTraceServiceRequest ({exc})",
                      line=line)


def check_group(group: SpanGroup) -> SpanGroup:
    """Drop re-exported copies, refuse missing parents and cycles, order by start time."""
    by_id: dict[tuple[str, str], Span] = {}
    kept: list[Span] = []
    for s in group.spans:
        key = (s.trace_id, s.span_id)
        seen = by_id.get(key)
        if seen is None:
            by_id[key] = s
            kept.append(s)
        elif (seen.name, seen.start_ns, seen.end_ns, seen.attributes) != (
                s.name, s.start_ns, s.end_ns, s.attributes):
            raise TraceError(s.trace_id, s.span_id, "the span id appears twice with different "
                             "content; expected each span once (a retried export repeats it "
                             "unchanged)", line=s.line)
    for s in kept:
        if s.parent_id is not None and (s.trace_id, s.parent_id) not in by_id:
            raise TraceError(s.trace_id, s.span_id,
                             f"its parent span {s.parent_id} is not in the file; expected "
                             f"every span of a trace (export the whole trace, or wait until "
                             f"its root span has ended)", line=s.line)
    done: set[tuple[str, str]] = set()  # spans known to lead to a root
    for s in kept:
        path: list[tuple[str, str]] = []
        on_path: set[tuple[str, str]] = set()
        node: Span | None = s
        while node is not None and (node.trace_id, node.span_id) not in done:
            key = (node.trace_id, node.span_id)
            if key in on_path:
                cycle = " -> ".join(k[1] for k in path[path.index(key):] + [key])
                raise TraceError(node.trace_id, node.span_id,
                                 f"the parent links form a cycle ({cycle}); expected a tree "
                                 f"of spans under a root span", line=node.line)
            path.append(key)
            on_path.add(key)
            node = by_id.get((node.trace_id, node.parent_id)) if node.parent_id else None
        done.update(path)
    kept.sort(key=lambda s: (s.start_ns, s.order))
    group.spans = kept
    return group


def _too_many(key: str, span: str | None, n: int, limit: int, line: int | None) -> TraceError:
    return TraceError(key, span, f"more than {limit:,} spans in one trajectory ({n:,} so far); "
                      f"expected at most {limit:,} (a runaway loop, or unrelated work under "
                      f"one trace id)", line=line)


@dataclass
class _TraceIndex:
    spans: int = 0
    last_line: int = 0
    session: str | None = None


def first_line_is_request(src: Source) -> bool:
    """Whether the file holds one JSON request per line (else one whole document)."""
    head = src.head().removeprefix(b"\xef\xbb\xbf").lstrip()
    nl = head.find(b"\n")
    if nl < 0:
        return len(head) >= 1 << 20  # a first line longer than the sniff: lines
    try:
        first = loads_checked(src, head[:nl].decode("utf-8", errors="replace"))
    except UserInputError:
        return False
    return isinstance(first, dict)


def read_groups(src: Source, limits: IngestLimits, *, by_session: bool, max_spans: int,
                progress: ProgressBytes | None = None, doc: Any = None
                ) -> Iterator[SpanGroup]:
    """Every group of the file, in the order their last span appears; `check_group` each
    (the caller decides whether a bad group stops the import or is skipped)."""
    if doc is None and first_line_is_request(src):
        yield from _line_groups(src, limits, by_session, max_spans, progress)
        return
    if doc is None:
        doc, _ = read_document(src, limits, progress)
    requests = doc if isinstance(doc, list) else [doc]
    spans: list[Span] = []
    for raw in requests:
        spans.extend(decode_request(raw, None, len(spans)))
    sessions: dict[str, str] = {}
    for s in spans:
        session = next((s.attributes[k] for k in SESSION_KEYS
                        if isinstance(s.attributes.get(k), str) and s.attributes[k]), None)
        if session is not None:
            sessions.setdefault(s.trace_id, session)
    groups: dict[str, SpanGroup] = {}
    for s in spans:
        session = sessions.get(s.trace_id) if by_session else None
        key = session or s.trace_id
        group = groups.setdefault(key, SpanGroup(key, sessions.get(s.trace_id)))
        group.spans.append(s)
        if len(group.spans) > max_spans:
            raise _too_many(key, s.span_id, len(group.spans), max_spans, None)
    yield from groups.values()


def _line_error(src: Source, line: Any) -> UserInputError:
    return UserInputError(f"{src.name}: {line.error}; expected one OTLP "
                          f"ExportTraceServiceRequest per line; nothing was imported")


def _line_groups(src: Source, limits: IngestLimits, by_session: bool, max_spans: int,
                 progress: ProgressBytes | None) -> Iterator[SpanGroup]:
    # Pass 1: a few numbers per trace (see the module docstring).
    traces: dict[str, _TraceIndex] = {}
    for line in iter_jsonl(src, limits, hashlib.sha256()):
        if line.error is not None:
            raise _line_error(src, line)
        for span in _raw_spans(line.value if isinstance(line.value, dict) else {}):
            trace = id_hex(span.get("traceId", span.get("trace_id"))) or ""
            info = traces.setdefault(trace, _TraceIndex())
            info.spans += 1
            info.last_line = line.record
            if info.session is None:
                info.session = _raw_session(span)
            if info.spans > max_spans:
                raise _too_many(trace, id_hex(span.get("spanId", span.get("span_id"))),
                                info.spans, max_spans, line.record + 1)
    key_of = {t: (i.session if by_session and i.session else t) for t, i in traces.items()}
    sizes: dict[str, int] = {}
    ends: dict[str, int] = {}
    for trace, info in traces.items():
        key = key_of[trace]
        sizes[key] = sizes.get(key, 0) + info.spans
        ends[key] = max(ends.get(key, 0), info.last_line)
        if sizes[key] > max_spans:
            raise _too_many(key, None, sizes[key], max_spans, None)
    closing: dict[int, list[str]] = {}
    for key, last in ends.items():
        closing.setdefault(last, []).append(key)
    del sizes, ends
    # Pass 2: decode, hold each group until its last line, hand it over.
    open_groups: dict[str, SpanGroup] = {}
    order = 0
    for line in iter_jsonl(src, limits, hashlib.sha256(), progress):
        if line.error is not None:
            raise _line_error(src, line)
        spans = decode_request(line.value, line.record + 1, order)
        order += len(spans)
        for s in spans:
            key = key_of.get(s.trace_id, s.trace_id)
            group = open_groups.get(key)
            if group is None:
                group = open_groups[key] = SpanGroup(key, traces[s.trace_id].session
                                                     if s.trace_id in traces else None)
            group.spans.append(s)
        for key in closing.pop(line.record, ()):
            group = open_groups.pop(key, None)
            if group is not None:
                yield group
    yield from open_groups.values()  # only if the file changed between the passes
