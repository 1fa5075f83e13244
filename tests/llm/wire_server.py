"""A real HTTP server on 127.0.0.1 that speaks the Anthropic Messages and OpenAI Chat
Completions wire formats, for tests of the real SDK clients.

A test gives it a `respond(path, body, n)` function (n = how many requests came before)
that returns a `Reply`; helpers build well-formed replies, and `Reply(status=429)`,
`Reply(sleep=2)` or `Reply(raw="{not json")` produce the failures the clients must
survive. Every request body is kept in `server.requests` for assertions.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    body: Any = None  # dict -> JSON; str -> sent as is
    status: int = 200
    sleep: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    raw: str | None = None


Respond = Callable[[str, dict[str, Any], int], Reply]


class WireServer:
    def __init__(self, respond: Respond) -> None:
        self.respond = respond
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep pytest output clean
                pass

            def _handle(self, body: dict[str, Any]) -> None:
                with outer._lock:
                    n = len(outer.requests)
                    outer.requests.append((self.path, body))
                reply = outer.respond(self.path, body, n)
                if reply.sleep:
                    time.sleep(reply.sleep)
                if reply.raw is not None:
                    payload = reply.raw.encode()
                elif isinstance(reply.body, str):
                    payload = reply.body.encode()
                else:
                    payload = json.dumps(reply.body if reply.body is not None else {
                        "type": "error", "error": {"type": "api_error", "message": "scripted"},
                    }).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(payload)))
                    if reply.status in (429, 500, 502, 503, 529):
                        self.send_header("retry-after-ms", "20")
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and went away, as a test wanted

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b"{}"
                self._handle(json.loads(raw or b"{}"))

            def do_GET(self) -> None:
                self._handle({})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> WireServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# ---------------------------------------------------------------- reply builders

def anthropic_batch(status: str, url: str = "") -> dict:
    """A Message Batch object (`msgbatch_1`); with `url`, its results live on that server."""
    return {
        "id": "msgbatch_1", "type": "message_batch", "processing_status": status,
        "request_counts": {"processing": 0, "succeeded": 2, "errored": 0, "canceled": 0,
                           "expired": 0},
        "created_at": "2026-01-01T00:00:00Z", "expires_at": "2026-01-02T00:00:00Z",
        "ended_at": None, "cancel_initiated_at": None, "archived_at": None,
        "results_url": f"{url}/v1/messages/batches/msgbatch_1/results" if url else None,
    }


def anthropic_tool_reply(name: str, tool_input: Any, *, input_tokens: int = 100,
                         output_tokens: int = 20, cache_read: int = 0,
                         cache_write: int = 0) -> Reply:
    return Reply({
        "id": "msg_" + uuid.uuid4().hex[:12], "type": "message", "role": "assistant",
        "model": "claude-test",
        "content": [{"type": "tool_use", "id": "toolu_" + uuid.uuid4().hex[:12],
                     "name": name, "input": tool_input}],
        "stop_reason": "tool_use", "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens,
                  "cache_read_input_tokens": cache_read,
                  "cache_creation_input_tokens": cache_write},
    })


def anthropic_text_reply(text: str) -> Reply:
    return Reply({
        "id": "msg_" + uuid.uuid4().hex[:12], "type": "message", "role": "assistant",
        "model": "claude-test", "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5},
    })


def openai_reply(content: str, *, prompt_tokens: int = 100, completion_tokens: int = 20,
                 cached: int = 0) -> Reply:
    return Reply({
        "id": "chatcmpl-" + uuid.uuid4().hex[:12], "object": "chat.completion",
        "created": int(time.time()), "model": "test-model",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens,
                  "prompt_tokens_details": {"cached_tokens": cached}},
    })


def error_reply(status: int) -> Reply:
    kind = {429: "rate_limit_error", 500: "api_error", 529: "overloaded_error"}.get(status,
                                                                                  "api_error")
    return Reply({"type": "error", "error": {"type": kind, "message": f"scripted {status}"}},
                 status=status)
