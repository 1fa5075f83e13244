"""Fixtures of the environment tests: a scripted LLM server on 127.0.0.1 speaking the real
Chat Completions and Messages wire formats (what the openai/anthropic SDKs talk to)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


class ScriptedLLM:
    """Replies in order from `script`; each entry is a dict the handler turns into a
    chat message ({"content": str} or {"tool_calls": [...]}) or a Messages tool_use input."""

    def __init__(self) -> None:
        self.script: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.lock = threading.Lock()
        self.url = ""

    def next_reply(self) -> dict[str, Any]:
        with self.lock:
            if not self.script:
                return {"content": ""}
            return self.script.pop(0) if len(self.script) > 1 else self.script[0]


def _handler(llm: ScriptedLLM) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # keep pytest output clean
            pass

        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with llm.lock:
                llm.requests.append(body)
                llm.paths.append(self.path)
            reply = llm.next_reply()
            if self.path.endswith("/chat/completions"):
                message: dict[str, Any] = {"role": "assistant",
                                           "content": reply.get("content")}
                if reply.get("tool_calls"):
                    message["tool_calls"] = reply["tool_calls"]
                out = {"id": "chatcmpl-1", "object": "chat.completion", "created": 0,
                       "model": body.get("model", "m"),
                       "choices": [{"index": 0, "message": message,
                                    "finish_reason": "tool_calls" if reply.get("tool_calls")
                                    else "stop"}],
                       "usage": {"prompt_tokens": 10, "completion_tokens": 5,
                                 "total_tokens": 15}}
            elif self.path.endswith("/messages"):
                tool = body["tools"][0]["name"]
                out = {"id": "msg_1", "type": "message", "role": "assistant",
                       "model": body.get("model", "m"),
                       "content": [{"type": "tool_use", "id": "toolu_1", "name": tool,
                                    "input": json.loads(reply["content"])}],
                       "stop_reason": "tool_use", "stop_sequence": None,
                       "usage": {"input_tokens": 10, "output_tokens": 5}}
            else:
                self.send_response(404)
                self.end_headers()
                return
            data = json.dumps(out).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


@pytest.fixture
def scripted_llm() -> Iterator[ScriptedLLM]:
    llm = ScriptedLLM()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(llm))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    llm.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield llm
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
