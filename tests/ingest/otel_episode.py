"""A real instrumented agent episode, traced to an OTLP JSON file (run as a script).

`python tests/ingest/otel_episode.py KIND OUT [--hex-ids]` runs two turns of a tool-using
conversation through the OpenAI SDK against a scripted OpenAI-compatible HTTP server on
127.0.0.1, with the OpenAI SDK instrumented by KIND:
    openinference   openinference-instrumentation-openai (Phoenix's)
    genai           opentelemetry-instrumentation-openai-v2 (the official GenAI one)
    openllmetry     opentelemetry-instrumentation-openai (Traceloop's)
The agent's own code makes the tool spans, as agent frameworks do (OpenInference TOOL
spans for openinference, GenAI execute_tool spans for the others), and one tool fails.
The OpenTelemetry SDK exports every span as it ends to OUT, one ExportTraceServiceRequest
per line, encoded by opentelemetry-exporter-otlp-proto-common and written with
protobuf's JSON mapping (base64 ids), or with `--hex-ids` as the collector's file
exporter writes them. It prints what the episode did as one JSON object: the messages of
the conversation and the tool errors, for the test to compare with the import.

A subprocess per instrumentation: instrumentors patch the SDK and read their environment
variables once per process.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MODEL = "scripted-agent"
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_rate", "description": "Exchange rate of a currency to EUR",
        "parameters": {"type": "object", "properties": {"currency": {"type": "string"}},
                       "required": ["currency"]}}},
]


class ScriptedServer:
    """OpenAI chat completions: after each user message, call both tools, then answer."""

    def __init__(self) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                data = json.dumps(outer.answer(body)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        msgs = body["messages"]
        turn = sum(1 for m in msgs if m["role"] == "user")
        last_user = max(i for i, m in enumerate(msgs) if m["role"] == "user")
        if not any(m["role"] == "tool" for m in msgs[last_user:]):
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{turn}_a", "type": "function", "function": {
                    "name": "get_weather", "arguments": json.dumps({"city": "Paris"})}},
                {"id": f"call_{turn}_b", "type": "function", "function": {
                    "name": "get_rate", "arguments": json.dumps({"currency": "XXX"})}},
            ]}
            finish = "tool_calls"
        else:
            message, finish = {"role": "assistant", "content": f"Answer {turn}: sunny."}, "stop"
        return {"id": f"chatcmpl-{turn}", "object": "chat.completion", "created": 1,
                "model": body["model"], "choices": [
                    {"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27}}


def run_tool(name: str, args: dict[str, Any]) -> str:
    if name == "get_rate":
        raise ValueError(f"unknown currency {args['currency']}")
    return f"sunny, 21C in {args['city']}"


class OtlpJsonLinesExporter:
    """A SpanExporter writing one OTLP ExportTraceServiceRequest per line."""

    def __init__(self, path: Path, hex_ids: bool) -> None:
        self.path, self.hex_ids = path, hex_ids

    def export(self, spans: Sequence[Any]) -> Any:
        import base64

        from google.protobuf import json_format
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
        from opentelemetry.sdk.trace.export import SpanExportResult

        doc = json_format.MessageToDict(encode_spans(spans))
        if self.hex_ids:  # what the collector's file exporter writes (OTLP/JSON)
            for rs in doc["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for s in ss["spans"]:
                        for k in ("traceId", "spanId", "parentSpanId"):
                            if k in s:
                                s[k] = base64.b64decode(s[k]).hex()
        with self.path.open("a") as fh:
            fh.write(json.dumps(doc) + "\n")
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def main(kind: str, out: Path, hex_ids: bool) -> dict[str, Any]:
    if kind != "openinference":
        os.environ["OTEL_SEMCONV_STABILITY_OPT_IN"] = "gen_ai_latest_experimental"
        os.environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = (
            "SPAN_ONLY" if kind == "genai" else "true")
    import openai
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace import Status, StatusCode

    provider = TracerProvider(resource=Resource.create({"service.name": "weather-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(OtlpJsonLinesExporter(out, hex_ids)))
    if kind == "openinference":
        from openinference.instrumentation import OITracer, TraceConfig, using_session
        from openinference.instrumentation.openai import OpenAIInstrumentor

        OpenAIInstrumentor().instrument(tracer_provider=provider)
        tracer: Any = OITracer(provider.get_tracer("weather-agent"), TraceConfig())
    elif kind == "genai":
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

        OpenAIInstrumentor().instrument(tracer_provider=provider)
        tracer = provider.get_tracer("weather-agent")
    else:
        from opentelemetry.instrumentation.openai import OpenAIInstrumentor

        OpenAIInstrumentor().instrument(tracer_provider=provider)
        tracer = provider.get_tracer("weather-agent")

    server = ScriptedServer()
    client = openai.OpenAI(base_url=server.url, api_key="not-needed", max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You answer briefly."}]
    errors: list[str] = []
    session = "session-weather-1"
    for turn, question in enumerate(("Weather in Paris, and the XXX rate?", "And tomorrow?")):
        root_attrs = {"gen_ai.conversation.id": session} if kind != "openinference" else {}
        if turn == 0:  # the verdict an evaluator attached to the first episode
            root_attrs["trace_workbench.success"] = True
        ctx = using_session(session) if kind == "openinference" else _nothing()
        with ctx, tracer.start_as_current_span(f"agent turn {turn + 1}",
                                               attributes=root_attrs) as root:
            messages.append({"role": "user", "content": question})
            while True:
                reply = client.chat.completions.create(model=MODEL, messages=messages,
                                                       tools=TOOLS)
                msg = reply.choices[0].message
                messages.append(msg.model_dump(exclude_none=True))
                if not msg.tool_calls:
                    break
                for tc in msg.tool_calls:
                    args = json.loads(tc.function.arguments)
                    content = _traced_tool(kind, tracer, tc, args, errors, Status, StatusCode)
                    messages.append({"role": "tool", "tool_call_id": tc.id, "content": content})
            if turn == 1:
                root.add_event("feedback", {"label": "incorrect", "annotator": "human"})
    provider.shutdown()
    return {"messages": messages, "errors": errors}


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def _traced_tool(kind: str, tracer: Any, tc: Any, args: dict[str, Any], errors: list[str],
                 status: Any, code: Any) -> str:
    """Run one tool call under a tool span of the instrumentation's vocabulary."""
    name = tc.function.name
    if kind == "openinference":
        span_cm = tracer.start_as_current_span(f"tool {name}", openinference_span_kind="tool",
                                               attributes={"tool_call.id": tc.id})
    else:
        span_cm = tracer.start_as_current_span(f"execute_tool {name}", attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": tc.id, "gen_ai.tool.call.arguments": tc.function.arguments})
    with span_cm as span:
        if kind == "openinference":
            spec = next(t["function"] for t in TOOLS if t["function"]["name"] == name)
            span.set_tool(name=name, description=spec["description"],
                          parameters=spec["parameters"])
            span.set_input(tc.function.arguments, mime_type="application/json")
        try:
            result = run_tool(name, args)
        except ValueError as exc:
            span.record_exception(exc)
            span.set_status(status(code.ERROR, str(exc)))
            errors.append(str(exc))
            return f"Error: {exc}"
        if kind == "openinference":
            span.set_output(result)
        else:
            span.set_attribute("gen_ai.tool.call.result", result)
        return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], Path(sys.argv[2]), "--hex-ids" in sys.argv[3:])))
