"""OpenTelemetry traces (OTLP JSON) as trajectories: one trace, or one session, each.

Reads what Phoenix, Langfuse, LangSmith or any OTLP backend receives from an instrumented
agent: `otel_spans.py` decodes the file (opentelemetry-proto's classes), groups its spans
and checks them; this module turns a group's spans into one trajectory.

Design decisions
- Two attribute vocabularies, read side by side on every span:
  OpenInference (Phoenix): `openinference.span.kind` LLM/TOOL, flattened
  `llm.input_messages.N.message.{role,content,contents.K.message_content.text,name,
  tool_call_id,tool_calls.K.tool_call.{id,function.name,function.arguments}}`, the same
  under `llm.output_messages`, `llm.tools.N.tool.json_schema`, and on tool spans
  `tool.name`, `tool.description`, `tool.parameters`, `tool_call.id`, `input.value`
  (arguments), `output.value` (result).
  OpenTelemetry GenAI semantic conventions: `gen_ai.operation.name` chat (and the other
  inference operations) / execute_tool; `gen_ai.input.messages`, `gen_ai.output.messages`
  (role + parts: text, tool_call, tool_call_response), `gen_ai.system_instructions`,
  `gen_ai.tool.definitions`, given as span attributes or on a span event (the
  `gen_ai.client.inference.operation.details` event); the older flattened
  `gen_ai.prompt.N.*` / `gen_ai.completion.N.*`; tool spans' `gen_ai.tool.name`,
  `gen_ai.tool.call.id`, `gen_ai.tool.call.arguments`, `gen_ai.tool.call.result`.
- Spans are read in start-time order. Every LLM span re-sends the conversation so far, so
  the transcript is rebuilt rather than concatenated: an LLM span's input messages add
  what the transcript does not have yet (when the transcript is a prefix of them, exactly
  the rest; when they diverge, e.g. a sub-agent's own context or a trimmed history, the
  messages not seen before), then its output messages follow. Messages are matched by
  role and content, tool calls and results by call id.
- A tool span gives the result of the call it executes (by `tool_call.id` /
  `gen_ai.tool.call.id`, else the oldest unanswered call of that tool name) and, when its
  status is ERROR (or it records `error.type` or an exception event), the call's error:
  the status message, else the exception's type and message. A result the next LLM span
  also sends is one message, not two.
- Spans that are neither LLM nor tool spans (agent, chain, HTTP) give metadata only. A
  group without any LLM or tool span (other traffic the collector exported with the
  agent's) is left out, and the import's notes count them.
- Outcome: a user-chosen attribute (`OtelImporter(outcome_attribute=...)`), else
  `trace_workbench.reward` (number) / `trace_workbench.success` (boolean), else a span
  event named `feedback`, `annotation`, `evaluation` or `score` (how annotation tools
  attach a verdict) with a `score`, `value` or `label` attribute; the last verdict on a
  root span wins (a session's latest turn), else the last one in start order. A number
  is a reward (success = the top of the reward range), a boolean is success, a label
  reads success/pass/correct/true or failure/fail/incorrect/false (`error`: the run
  crashed). None of these: `unknown`.
- Ids: source_id = the trace id (or the session id), task_id = `trace_workbench.task_id`
  or `task.id` of the root span when given, agent_model = the first LLM span's model,
  domain = the root span's `service.name` (not the SDK's `unknown_service` default).
  `meta` keeps the trace ids, session, root span name, span counts and token usage.
- Termination is inferred from the last message (normalise.infer_termination); a root
  span with status ERROR makes it `error`.
- Grouping: `otel` gives one trajectory per trace; `otel_session` one per session id
  (`session.id` / `gen_ai.conversation.id`), for agents that start a trace per turn.
  The importer API has no per-format options, so other choices (an outcome attribute, a
  span limit) are an `OtelImporter(...)` registered under a name of one's own
  (`IMPORTERS.register`, or a `trace_workbench.importers` entry point).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from trace_lib.data_model import ToolSchema, Trajectory
from trace_lib.errors import UserInputError
from trace_lib.ingest.importer import ParseContext
from trace_lib.ingest.normalise import (
    ParsedFile,
    RawMessage,
    Skipped,
    assemble,
    error_outcome,
    infer_termination,
    outcome_fields,
    parse_arguments,
    type_name,
)
from trace_lib.ingest.otel_spans import (
    MAX_SPANS_PER_TRAJECTORY,
    Span,
    SpanGroup,
    TraceError,
    check_group,
    read_groups,
)
from trace_lib.ingest.source import RecordError, Source

_ROLE_ALIASES = {"developer": "system", "function": "tool", "model": "assistant",
                 "human": "user", "ai": "assistant"}
_ROLES = ("system", "user", "assistant", "tool")
_INFERENCE_OPS = {"chat", "text_completion", "generate_content"}
_OI_MESSAGE = re.compile(r"^llm\.(input|output)_messages\.(\d+)\.message\.(.+)$")
_OI_TOOL = re.compile(r"^llm\.tools\.(\d+)\.tool\.json_schema$")
_LEGACY = re.compile(r"^gen_ai\.(prompt|completion)\.(\d+)\.(.+)$")
_CALL_PART = re.compile(r"^tool_calls\.(\d+)\.(?:tool_call\.)?(.+)$")
_CONTENT_PART = re.compile(r"^contents\.(\d+)\.message_content\.(.+)$")
_FEEDBACK_EVENTS = {"feedback", "annotation", "evaluation", "score"}
_TRUE = {"success", "pass", "passed", "correct", "true", "yes", "resolved"}
_FALSE = {"failure", "fail", "failed", "incorrect", "false", "no", "unresolved"}
# An OTLP sniff: the request's one key opens the file (one request per line, or pretty).
_OTLP_HEAD = re.compile(rb'^\s*\{\s*"resource_?[sS]pans"\s*:')


def _text(span: Span, key: str, value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise TraceError(span.trace_id, span.span_id,
                     f"expected a string, got {type_name(value)}", field=key, line=span.line)


def _json(span: Span, key: str, value: Any) -> Any:
    """A structured attribute: OTLP arrays/kvlists as they are, or a JSON string of one."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except (json.JSONDecodeError, RecursionError):
        raise TraceError(span.trace_id, span.span_id, "expected JSON text (a list or an "
                         "object), got text that is not JSON", field=key,
                         line=span.line) from None


def _role(span: Span, key: str, value: Any) -> str:
    role = _text(span, key, value)
    role = _ROLE_ALIASES.get(role or "", role)
    if role not in _ROLES:
        raise TraceError(span.trace_id, span.span_id,
                         f"expected one of {'/'.join(_ROLES)}, got {role!r}", field=key,
                         line=span.line)
    return role


def _arguments(span: Span, key: str, value: Any) -> dict[str, Any]:
    try:
        return parse_arguments(value, 0, key)
    except RecordError as exc:
        raise TraceError(span.trace_id, span.span_id, exc.problem, field=key,
                         line=span.line) from None


def _call(name: Any, arguments: Any, call_id: Any, span: Span, key: str) -> dict[str, Any]:
    return {"name": _text(span, f"{key}.name", name) or "",
            "arguments": _arguments(span, f"{key}.arguments", arguments),
            "call_id": _text(span, f"{key}.id", call_id) or None, "requestor": "assistant"}


def _indexed(attrs: dict[str, Any], pattern: re.Pattern[str], kind: str
             ) -> dict[int, dict[str, tuple[str, Any]]]:
    """Flattened message attributes of one kind, by message index: rest -> (key, value)."""
    out: dict[int, dict[str, tuple[str, Any]]] = {}
    for key, value in attrs.items():
        m = pattern.match(key)
        if m and m.group(1) == kind:
            out.setdefault(int(m.group(2)), {})[m.group(3)] = (key, value)
    return out


def _flat_messages(span: Span, attrs: dict[str, Any], pattern: re.Pattern[str], kind: str
                   ) -> list[RawMessage]:
    """OpenInference (`llm.*_messages.N.message.*`) or legacy GenAI (`gen_ai.prompt.N.*`)."""
    out = []
    for _, fields in sorted(_indexed(attrs, pattern, kind).items()):
        role_key, role = fields.get("role", ("role", None))
        msg = RawMessage(role=_role(span, role_key, role or "assistant"))
        texts = []
        calls: dict[int, dict[str, tuple[str, Any]]] = {}
        parts: dict[int, dict[str, tuple[str, Any]]] = {}
        for rest, (key, value) in fields.items():
            if rest == "content":
                texts.insert(0, _text(span, key, value))
            elif rest in ("name", "tool_call_id"):
                setattr(msg, rest, _text(span, key, value))
            elif m := _CALL_PART.match(rest):
                calls.setdefault(int(m.group(1)), {})[m.group(2)] = (key, value)
            elif m := _CONTENT_PART.match(rest):
                parts.setdefault(int(m.group(1)), {})[m.group(2)] = (key, value)
        for _, part in sorted(parts.items()):
            key, value = part.get("text", ("", None))
            texts.append(_text(span, key, value))
        msg.content = "\n".join(t for t in texts if t is not None) if any(
            t is not None for t in texts) else None
        for _, c in sorted(calls.items()):
            name = c.get("function.name", c.get("name", ("", None)))
            args = c.get("function.arguments", c.get("arguments", ("", None)))
            call_id = c.get("id", ("", None))
            base = name[0].rsplit(".", 1)[0] if name[0] else f"{role_key}.tool_calls"
            msg.tool_calls.append(_call(name[1], args[1], call_id[1], span, base))
        out.append(msg)
    return out


def _parts_text(span: Span, key: str, parts: Any) -> str | None:
    if not isinstance(parts, list):
        raise TraceError(span.trace_id, span.span_id,
                         f"expected a list of parts, got {type_name(parts)}", field=key,
                         line=span.line)
    texts = [p.get("content") for p in parts if isinstance(p, dict) and p.get("type") == "text"]
    return "\n".join(str(t) for t in texts if t is not None) if texts else None


def _genai_messages(span: Span, key: str, value: Any) -> list[RawMessage]:
    """`gen_ai.input.messages` / `gen_ai.output.messages`: role + typed parts."""
    doc = _json(span, key, value)
    if not isinstance(doc, list):
        raise TraceError(span.trace_id, span.span_id,
                         f"expected a list of messages, got {type_name(doc)}", field=key,
                         line=span.line)
    out = []
    for i, m in enumerate(doc):
        path = f"{key}[{i}]"
        if not isinstance(m, dict):
            raise TraceError(span.trace_id, span.span_id,
                             f"expected a message object, got {type_name(m)}", field=path,
                             line=span.line)
        role = _role(span, f"{path}.role", m.get("role"))
        parts = m.get("parts", [])
        text = _parts_text(span, f"{path}.parts", parts)
        calls = [_call(p.get("name"), p.get("arguments"), p.get("id"), span, f"{path}.parts[{j}]")
                 for j, p in enumerate(parts)
                 if isinstance(p, dict) and p.get("type") == "tool_call"]
        responses = [p for p in parts
                     if isinstance(p, dict) and p.get("type") == "tool_call_response"]
        if responses:  # one tool message per response (a message may answer several calls)
            for j, p in enumerate(responses):
                result = p.get("response", p.get("result"))
                out.append(RawMessage(
                    role="tool", content=result if isinstance(result, str | None)
                    else json.dumps(result, sort_keys=True),
                    tool_call_id=_text(span, f"{path}.parts[{j}].id", p.get("id")) or None))
            continue
        out.append(RawMessage(role=role, content=text, tool_calls=calls,
                              name=m.get("name") if isinstance(m.get("name"), str) else None))
    return out


def _message_attrs(span: Span) -> dict[str, Any]:
    """The span's attributes with those of its events that carry GenAI messages."""
    attrs = span.attributes
    carried = [e.attributes for e in span.events if any(
        k.startswith(("gen_ai.input.", "gen_ai.output.", "gen_ai.system_instructions"))
        for k in e.attributes)]
    return {k: v for a in carried for k, v in a.items()} | attrs if carried else attrs


def llm_messages(span: Span) -> tuple[list[RawMessage], list[RawMessage]]:
    """(input, output) messages of an LLM span, in whichever vocabulary it uses."""
    attrs = _message_attrs(span)
    if any(_OI_MESSAGE.match(k) for k in attrs):
        return (_flat_messages(span, attrs, _OI_MESSAGE, "input"),
                _flat_messages(span, attrs, _OI_MESSAGE, "output"))
    inputs: list[RawMessage] = []
    outputs: list[RawMessage] = []
    if "gen_ai.system_instructions" in attrs:
        key = "gen_ai.system_instructions"
        doc = _json(span, key, attrs[key])
        text = _parts_text(span, key, doc if isinstance(doc, list) else [doc])
        inputs.append(RawMessage(role="system", content=text))
    if "gen_ai.input.messages" in attrs or "gen_ai.output.messages" in attrs:
        for key, into in (("gen_ai.input.messages", inputs), ("gen_ai.output.messages", outputs)):
            if key in attrs:
                into.extend(_genai_messages(span, key, attrs[key]))
        return inputs, outputs
    return (_flat_messages(span, attrs, _LEGACY, "prompt"),
            _flat_messages(span, attrs, _LEGACY, "completion"))


def span_kind(span: Span) -> str:
    """"llm", "tool" or "other"."""
    attrs = span.attributes
    oi = attrs.get("openinference.span.kind")
    if oi is not None:
        kind = (_text(span, "openinference.span.kind", oi) or "").upper()
        if kind in ("LLM", "TOOL"):
            return kind.lower()
    op = attrs.get("gen_ai.operation.name")
    if op == "execute_tool":
        return "tool"
    if op in _INFERENCE_OPS or any(k.startswith(("llm.input_messages.", "llm.output_messages.",
                                                 "gen_ai.prompt.", "gen_ai.completion."))
                                   for k in attrs):
        return "llm"
    return "other"


def _key(m: RawMessage) -> tuple[Any, ...]:
    if m.role == "tool":
        return ("tool", m.tool_call_id or m.content)
    if m.tool_calls:
        return ("assistant", tuple(c["call_id"] or (c["name"], json.dumps(
            c["arguments"], sort_keys=True)) for c in m.tool_calls))
    return (m.role, m.content)


class Transcript:
    """The conversation rebuilt from LLM and tool spans (see the module docstring)."""

    def __init__(self) -> None:
        self.messages: list[RawMessage] = []
        self.keys: list[tuple[Any, ...]] = []
        self.seen: set[tuple[Any, ...]] = set()
        self.calls: list[dict[str, Any]] = []  # every call, in order
        self.answered: dict[int, RawMessage] = {}  # id(call) -> the tool message answering it
        self.unmatched_tools = 0

    def _append(self, m: RawMessage) -> None:
        if m.role == "tool":
            call = self._find(m.tool_call_id, m.name)
            if call is not None:
                if id(call) in self.answered:
                    return  # already answered by a tool span
                m.tool_call_id = m.tool_call_id or call["call_id"]
                self.answered[id(call)] = m
        self.calls.extend(m.tool_calls)
        self.messages.append(m)
        key = _key(m)
        self.keys.append(key)
        self.seen.add(key)

    def _find(self, call_id: str | None, name: str | None) -> dict[str, Any] | None:
        if call_id:
            return next((c for c in reversed(self.calls) if c["call_id"] == call_id), None)
        return next((c for c in self.calls if id(c) not in self.answered
                     and (name is None or c["name"] == name)), None)

    def add_llm(self, inputs: list[RawMessage], outputs: list[RawMessage]) -> None:
        n = len(self.keys)
        if len(inputs) >= n and [_key(m) for m in inputs[:n]] == self.keys:
            new = inputs[n:]
            for have, sent in zip(self.messages, inputs, strict=False):
                if have.content is None and sent.content is not None:
                    have.content = sent.content  # a failed tool span's result, as sent
        else:
            new = [m for m in inputs if _key(m) not in self.seen]
        for m in new + outputs:
            self._append(m)

    def add_tool(self, name: str | None, call_id: str | None, result: str | None,
                 error: str | None) -> None:
        call = self._find(call_id, name)
        if call is not None and id(call) in self.answered:
            answer = self.answered[id(call)]
            answer.error = answer.error or error
            return
        if call is None:
            self.unmatched_tools += 1
        self._append(RawMessage(role="tool", content=result, name=name, error=error,
                                tool_call_id=call_id or (call["call_id"] if call else None)))


def _tool_result(span: Span) -> tuple[str | None, str | None, str | None, str | None]:
    """(name, call id, result, error) of a tool span."""
    a = span.attributes
    name = _text(span, "gen_ai.tool.name", a.get("gen_ai.tool.name")) or _text(
        span, "tool.name", a.get("tool.name")) or span.name
    call_id = None
    for key in ("gen_ai.tool.call.id", "tool_call.id", "tool.id"):
        call_id = call_id or _text(span, key, a.get(key))
    result = a.get("gen_ai.tool.call.result", a.get("output.value"))
    if result is not None and not isinstance(result, str):
        result = json.dumps(result, sort_keys=True, default=str)
    error = span.error
    if error is not None or a.get("error.type") is not None:
        exc = next((e.attributes for e in span.events if e.name == "exception"), {})
        detail = ": ".join(str(exc[k]) for k in ("exception.type", "exception.message")
                           if exc.get(k))
        error = (error if error not in (None, "error") else None) or detail or str(
            a.get("error.type") or "error")
    return name, call_id, result, error


def _add_schema(out: dict[tuple[str, str], ToolSchema], domain: str, fn: dict[str, Any]
                ) -> None:
    out.setdefault((domain, fn["name"]), ToolSchema(
        domain=domain, name=fn["name"], schema={"type": "function", "function": fn},
        source="given"))


def _schemas(span: Span, domain: str, out: dict[tuple[str, str], ToolSchema]) -> None:
    """Tool definitions an LLM or tool span gives, as OpenAI function tools; the first
    definition of a name in a domain wins."""
    attrs = span.attributes
    defs: list[Any] = []
    for key, value in attrs.items():
        if _OI_TOOL.match(key):  # OpenInference: one OpenAI tool per attribute
            defs.append(_json(span, key, value))
    if "gen_ai.tool.definitions" in attrs:  # GenAI: a list of {type, name, parameters}
        given = _json(span, "gen_ai.tool.definitions", attrs["gen_ai.tool.definitions"])
        defs.extend(given if isinstance(given, list) else [])
    for d in defs:
        fn = d.get("function", d) if isinstance(d, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            _add_schema(out, domain, {k: fn[k] for k in ("name", "description", "parameters")
                                      if k in fn})
    if isinstance(attrs.get("tool.name"), str) and "tool.parameters" in attrs:
        fn = {"name": attrs["tool.name"],
              "parameters": _json(span, "tool.parameters", attrs["tool.parameters"])}
        if isinstance(attrs.get("tool.description"), str):
            fn["description"] = attrs["tool.description"]
        _add_schema(out, domain, fn)


def _verdict(span: Span, key: str, value: Any) -> tuple[float | None, bool | None, bool]:
    """(reward, success, crashed) from one outcome value."""
    if isinstance(value, bool):
        return None, value, False
    if isinstance(value, int | float):
        return float(value), None, False
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE | {"error"}:
        word = value.strip().lower()
        return None, (word in _TRUE) if word != "error" else None, word == "error"
    raise TraceError(span.trace_id, span.span_id,
                     f"expected a number, a boolean or a label (success/failure/pass/fail/"
                     f"correct/incorrect/error) for the outcome, got {value!r}"[:300],
                     field=key, line=span.line)


def _outcome_sources(span: Span, attribute: str | None
                     ) -> Iterator[tuple[str, Any]]:
    keys = (attribute,) if attribute else ("trace_workbench.reward", "trace_workbench.success")
    for key in keys:
        if key in span.attributes:
            yield key, span.attributes[key]
    for e in span.events:
        if attribute and attribute in e.attributes:
            yield f"events[{e.name}].{attribute}", e.attributes[attribute]
        elif not attribute and (e.name.lower() in _FEEDBACK_EVENTS
                                or e.name.lower().split(".")[0] in _FEEDBACK_EVENTS):
            for k in ("score", "value", "label"):
                if k in e.attributes:
                    yield f"events[{e.name}].{k}", e.attributes[k]
                    break


def _outcome(spans: list[Span], attribute: str | None, record: int, ctx: ParseContext,
             meta: dict[str, Any]) -> dict[str, Any]:
    found: tuple[Span, str, Any] | None = None
    for span in spans:  # in start order: the last verdict on a root span, else the last
        for key, value in _outcome_sources(span, attribute):
            if found is None or span.parent_id is None or found[0].parent_id is not None:
                found = (span, key, value)
    if found is None:
        return {"reward": None, "success": None}
    span, key, value = found
    reward, success, crashed = _verdict(span, key, value)
    meta["outcome_from"] = key
    if crashed:
        return error_outcome(meta, f"{key} = {value!r}")
    try:
        return outcome_fields(reward, success, record, ctx.reward_range, key)
    except RecordError as exc:
        raise TraceError(span.trace_id, span.span_id, exc.problem, field=key,
                         line=span.line) from None


def _first_text(spans: list[Span], keys: tuple[str, ...]) -> str | None:
    for span in spans:
        for key in keys:
            value = span.attributes.get(key)
            if isinstance(value, str) and value:
                return value
    return None


def group_trajectory(group: SpanGroup, record: int, ctx: ParseContext,
                     outcome_attribute: str | None, schemas: dict[tuple[str, str], ToolSchema]
                     ) -> Trajectory | None:
    """One checked group as a trajectory; None when it holds no LLM or tool span."""
    spans = group.spans
    roots = [s for s in spans if s.parent_id is None]
    root = roots[0] if roots else spans[0]
    service = root.resource.get("service.name")
    domain = ctx.domain or (service if isinstance(service, str) and service
                            and not service.startswith("unknown_service") else None)
    transcript = Transcript()
    llm = [s for s in spans if span_kind(s) == "llm"]
    tools = [s for s in spans if span_kind(s) == "tool"]
    if not llm and not tools:
        return None
    usage = {"input_tokens": 0, "output_tokens": 0}
    for span in spans:
        kind = "llm" if span in llm else "tool" if span in tools else "other"
        if kind == "llm":
            transcript.add_llm(*llm_messages(span))
            for name, keys in (("input_tokens", ("gen_ai.usage.input_tokens",
                                                 "llm.token_count.prompt")),
                               ("output_tokens", ("gen_ai.usage.output_tokens",
                                                  "llm.token_count.completion"))):
                value = next((span.attributes[k] for k in keys if k in span.attributes), 0)
                usage[name] += value if isinstance(value, int) else 0
        elif kind == "tool":
            transcript.add_tool(*_tool_result(span))
        if kind != "other":
            _schemas(span, domain or "default", schemas)
    if not transcript.messages:
        raise TraceError(root.trace_id, root.span_id, "its LLM and tool spans carry no "
                         "messages; expected message content (turn content capture on: "
                         "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT, or "
                         "OpenInference's default)")
    meta: dict[str, Any] = {
        "source_format": "otel", "trace_ids": group.trace_ids[:50],
        "session_id": group.session, "root_span": root.name, "n_spans": len(spans),
        "n_llm_spans": len(llm), "n_tool_spans": len(tools), "service": service,
        "instrumentation": sorted({s.scope for s in llm + tools if s.scope}),
        "started_unix_nano": root.start_ns,
        "duration_s": round((max(s.end_ns for s in spans) - min(s.start_ns for s in spans))
                            / 1e9, 6),
        **usage,
    }
    if transcript.unmatched_tools:
        meta["unmatched_tool_spans"] = transcript.unmatched_tools
    outcome = _outcome(spans, outcome_attribute, record, ctx, meta)
    termination = "error" if root.error else infer_termination(transcript.messages)
    if root.error:
        meta["root_error"] = root.error
    try:
        return assemble(
            transcript.messages, record, source_id=group.key,
            task_id=_first_text([root], ("trace_workbench.task_id", "task.id")),
            agent_model=_first_text(llm, ("llm.model_name", "gen_ai.response.model",
                                          "gen_ai.request.model")),
            domain=domain, termination=termination, meta=meta, **outcome)
    except RecordError as exc:
        raise TraceError(root.trace_id, None, f"{exc.field or ''} {exc.problem}".strip(),
                         line=root.line) from None


class OtelImporter:
    description = ("OpenTelemetry traces: OTLP JSON (one ExportTraceServiceRequest per line, "
                   "or one document) with OpenInference or GenAI attributes")
    streaming = True

    def __init__(self, name: str = "otel", *, by_session: bool = False,
                 outcome_attribute: str | None = None,
                 max_spans: int = MAX_SPANS_PER_TRAJECTORY) -> None:
        self.name = name
        self.by_session = by_session
        self.outcome_attribute = outcome_attribute
        self.max_spans = max_spans

    def sniff(self, head: bytes) -> bool:
        """Whether a file's first bytes open an OTLP request (`formats.detect` asks)."""
        return bool(_OTLP_HEAD.match(head.removeprefix(b"\xef\xbb\xbf")))

    def matches(self, doc: Any) -> bool:
        first = doc[0] if isinstance(doc, list) and doc else doc
        return isinstance(first, dict) and ("resourceSpans" in first or "resource_spans" in first)

    def why_not(self, doc: Any) -> str:
        return "no 'resourceSpans' key (not an OTLP ExportTraceServiceRequest)"

    def parse(self, src: Source, doc: Any, sha256: str | None, ctx: ParseContext) -> ParsedFile:
        out = ParsedFile(name=src.name, format=self.name, sha256=sha256 or "")
        schemas: dict[tuple[str, str], ToolSchema] = {}

        def fail(exc: TraceError) -> UserInputError:
            return UserInputError(f"{src.name}: {exc.describe()}; nothing was imported")

        def records() -> Iterator[Trajectory]:
            empty = 0  # groups without LLM or tool spans: not records
            try:
                groups = read_groups(src, ctx.limits, by_session=self.by_session,
                                     max_spans=self.max_spans, progress=ctx.progress, doc=doc)
                for i, group in enumerate(groups):
                    try:
                        traj = group_trajectory(check_group(group), i, ctx,
                                                self.outcome_attribute, schemas)
                    except TraceError as exc:
                        if not ctx.skip_invalid:
                            raise fail(exc) from None
                        out.n_records += 1
                        out.skipped.append(Skipped(src.name, i, exc.describe()))
                        continue
                    if traj is None:
                        empty += 1
                        continue
                    out.n_records += 1
                    yield traj
            except TraceError as exc:  # the file itself (a line, the span limit)
                raise fail(exc) from None
            out.given_schemas.extend(schemas.values())
            if empty:
                out.notes.append(f"{src.name}: {empty} trace(s) without LLM or tool spans "
                                 f"(other traffic) were left out")
            if out.n_records == 0 and not empty:
                raise UserInputError(f"{src.name}: no spans; expected OTLP "
                                     f"ExportTraceServiceRequest JSON with resourceSpans")
            if out.n_records == 0:
                raise UserInputError(
                    f"{src.name}: none of its {empty} trace(s) has an LLM or tool span; "
                    f"expected OpenInference (openinference.span.kind LLM/TOOL, llm.*) or "
                    f"GenAI (gen_ai.operation.name chat/execute_tool, gen_ai.*) attributes")

        out.records = records()
        return out


IMPORTER = OtelImporter()  # IMPORTERS (formats.py) names it
SESSION_IMPORTER = OtelImporter("otel_session", by_session=True)  # one trajectory per session
