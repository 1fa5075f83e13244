"""The project's CPU policy server: the slice of vLLM's OpenAI API that training uses.

Design decisions
- Same wire format as vLLM, so the rollout client, the trainer and the tests cannot tell
  the two apart: `/v1/models`, `/v1/chat/completions` (tools, tool_calls, n, temperature,
  top_p, max_tokens / max_completion_tokens, seed, logprobs + top_logprobs), vLLM's
  extensions `return_token_ids` (top-level `prompt_token_ids`, per-choice `token_ids`) and
  `return_tokens_as_token_ids` (logprob tokens spelled `token_id:<id>`), and vLLM's runtime
  LoRA endpoints `/v1/load_lora_adapter` {lora_name, lora_path, load_inplace} and
  `/v1/unload_lora_adapter` {lora_name}, answering with vLLM's texts and status codes. An
  adapter is chosen with `model=<lora_name>`, the base with its served name.
- Prompts are rendered by the model folder's chat template (our one tool-call convention,
  `chat_format`) and generations parsed back by `chat_format.parse_assistant`, like vLLM
  with `--tool-call-parser hermes`: with tools and `tool_choice` "auto", a generation with
  calls comes back as `tool_calls` with `finish_reason` "tool_calls".
- Errors are OpenAI-shaped JSON `{"error": {"message", "type", "param", "code"}}` with the
  HTTP status; a bad request never reaches the model. Unsupported options (streaming,
  `stop` strings, forced tool choice) are refused with a message saying so, not ignored.
- starlette + uvicorn on 127.0.0.1 only. `PolicyServer` runs it in a background thread of
  the calling process (a training job or a test) with start()/stop() and a context manager;
  `python -m trace_lib serve` runs it in the foreground. Generation runs on the engine's
  worker thread, so the event loop stays free for `/health` and `/v1/models`.
- Abuse limits, each a clear OpenAI-shaped error: `max_tokens` past the context is a 400
  (vLLM's rule and text; without `max_tokens` the default is cut to the room left), `n` is
  capped (`max_n`), a body larger than `max_body_bytes` is a 413 (read in chunks, never
  whole), and POST endpoints take only `Content-Type: application/json` (415 otherwise):
  a web page can send `text/plain` cross-site without a preflight, never JSON.
- A client that goes away cancels its request: the handler polls for the disconnect while
  it waits and cancels the engine's future, and the engine drops those rows at its next
  step. The engine interleaves decode steps across requests (continuous batching), so one
  long request slows short ones by a step per token instead of blocking them.
- The socket is bound before the model loads and before anything says "serving": a port in
  use is a one-line error (exit 1 from the CLI), and the bound socket is what uvicorn
  serves, so nothing can take the port in between.
- This is the "ours" kind of `server_kinds.SERVER_KINDS` (`server_for`); the real vLLM,
  launched in its own process, is the "vllm" kind (`vllm_server.py`). Both are a
  `ServerHandle`, so a job can swap one server for the other.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from trace_lib.errors import UserInputError
from trace_lib.runtime.chat_format import normalize_messages, parse_assistant
from trace_lib.runtime.policy_engine import EngineError, PolicyEngine, Sample, SamplingParams
from trace_lib.runtime.server_kinds import ServerHandle, ServerRequest


@dataclass
class ServerConfig:
    model: str = "tiny"  # registry name, HF folder or hub name (see models.resolve_model)
    host: str = "127.0.0.1"
    port: int = 0  # 0: pick a free port
    served_model_name: str | None = None  # default: `model` as given
    max_model_len: int | None = None  # default: the model's max_position_embeddings
    default_max_tokens: int = 256
    torch_threads: int | None = None
    max_n: int = 32  # choices per request (GRPO groups are 4-16)
    max_body_bytes: int = 4 << 20  # request bodies; 16 tool schemas + a long episode ~100 KB
    kv_cache_mb: int = 1024  # prefix/turn KV cache (0: off); LRU by bytes


DISCONNECT_POLL_S = 0.1  # how often a waiting handler checks that its client is still there


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening-ready socket on host:port (0: a free port), or a clear UserInputError."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # As uvicorn does: a port left in TIME_WAIT is free, one with a listener is not.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UserInputError(
            f"cannot serve on {host}:{port}: {exc.strerror or exc} (is another server "
            "running there? pass another --port, or --port 0 for a free one)") from exc
    return sock


def _error(message: str, status: int = 400, type_: str = "BadRequestError",
           param: str | None = None):
    from starlette.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": type_, "param": param,
                                   "code": status}}, status_code=status)


class _BadField(Exception):
    def __init__(self, param: str, message: str, status: int = 400,
                 type_: str = "BadRequestError"):
        super().__init__(message)
        self.param = param
        self.status = status
        self.type = type_


def _number(body: dict, key: str, default: float, lo: float, hi: float) -> float:
    val = body.get(key)
    if val is None:
        return default
    if isinstance(val, bool) or not isinstance(val, int | float) or not lo <= val <= hi:
        raise _BadField(key, f"{key}: expected a number in [{lo}, {hi}], got {val!r}")
    return float(val)


def _integer(body: dict, key: str, default: int | None, lo: int, hi: int) -> int | None:
    val = body.get(key)
    if val is None:
        return default
    if isinstance(val, bool) or not isinstance(val, int) or not lo <= val <= hi:
        raise _BadField(key, f"{key}: expected an integer in [{lo}, {hi}], got {val!r}")
    return val


class ChatService:
    """Request parsing and response shaping around a `PolicyEngine`."""

    def __init__(self, config: ServerConfig, model: Any = None, tokenizer: Any = None):
        """`model`/`tokenizer` inject an already-loaded pair (the compose server's composed
        model); without them the model comes from the registry by `config.model`."""
        import torch

        from trace_lib.runtime.base_models import load_model

        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        if model is None:
            model, tok = load_model(config.model)
        else:
            tok = tokenizer
        self.tokenizer = tok
        self.served_name = config.served_model_name or config.model
        self.model_path = str(getattr(model, "name_or_path", config.model))
        self.max_model_len = config.max_model_len or int(
            getattr(model.config, "max_position_embeddings", 2048))
        eos = model.generation_config.eos_token_id
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        eos_ids = eos_ids or [tok.eos_token_id]
        self.engine = PolicyEngine(model, tok, eos_ids, self.max_model_len,
                                   kv_cache_bytes=config.kv_cache_mb << 20)
        self.default_max_tokens = config.default_max_tokens
        self.max_n = config.max_n
        self.max_body_bytes = config.max_body_bytes
        self.created = int(time.time())

    def model_cards(self) -> dict[str, Any]:
        base = {"id": self.served_name, "object": "model", "created": self.created,
                "owned_by": "trace", "root": self.model_path, "parent": None,
                "max_model_len": self.max_model_len}
        cards = [base] + [
            {"id": name, "object": "model", "created": self.created, "owned_by": "trace",
             "root": path, "parent": self.served_name}
            for name, path in self.engine.adapters.items()]
        return {"object": "list", "data": cards}

    def parse_request(self, body: dict[str, Any]) -> tuple[list[int], int, SamplingParams,
                                                             str | None, dict[str, Any]]:
        if not isinstance(body, dict):
            raise _BadField("body", "request body: expected a JSON object")
        if body.get("stream"):
            raise _BadField("stream", "stream: streaming is not supported by the CPU server")
        if body.get("stop"):
            raise _BadField("stop", "stop: stop strings are not supported by the CPU server")
        model = body.get("model") or self.served_name
        adapter = None if model == self.served_name else model
        if adapter is not None and adapter not in self.engine.adapters:
            raise EngineError(f"The model `{model}` does not exist.", 404, "NotFoundError")
        tools = body.get("tools") or None
        if tools is not None:
            if not isinstance(tools, list) or not all(
                    isinstance(t, dict) and isinstance(t.get("function"), dict)
                    and isinstance(t["function"].get("name"), str) for t in tools):
                raise _BadField("tools", "tools: expected a list of {'type': 'function', "
                                         "'function': {'name': ..., 'parameters': ...}}")
        tool_choice = body.get("tool_choice", "auto" if tools else "none")
        if tool_choice not in ("auto", "none"):
            raise _BadField("tool_choice", "tool_choice: only 'auto' and 'none' are supported "
                                           "by the CPU server (no guided decoding)")
        logprobs = bool(body.get("logprobs", False))
        top = _integer(body, "top_logprobs", 0, 0, 20) or 0
        if top and not logprobs:
            raise _BadField("top_logprobs", "top_logprobs: requires logprobs=true")
        max_param = "max_tokens" if body.get("max_tokens") is not None \
            else "max_completion_tokens"
        asked = _integer(body, max_param, None, 1, 1 << 62)
        if asked is not None and asked > self.max_model_len:  # vLLM's check and text
            raise _BadField(max_param, f"{max_param}={asked} cannot be greater than "
                                       f"max_model_len={self.max_model_len}. Please request "
                                       "fewer output tokens.")
        ignore_eos = body.get("ignore_eos", False)
        if not isinstance(ignore_eos, bool):
            raise _BadField("ignore_eos", f"ignore_eos: expected true or false, got "
                                          f"{ignore_eos!r}")
        params = SamplingParams(
            temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
            top_p=_number(body, "top_p", 1.0, 1e-6, 1.0),
            max_tokens=asked or self.default_max_tokens,
            top_logprobs=top,
            seed=_integer(body, "seed", None, -(1 << 63), (1 << 63) - 1),
            ignore_eos=ignore_eos,
        )
        n = _integer(body, "n", 1, 1, self.max_n) or 1
        if n > 1 and params.temperature == 0:  # vLLM's rule and message
            raise _BadField("n", f"n must be 1 when using greedy sampling, got {n}.")
        try:
            messages = normalize_messages(body.get("messages"))
        except UserInputError as exc:
            raise _BadField("messages", str(exc)) from exc
        try:
            prompt_ids = self.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=True,
                return_dict=True)["input_ids"]
        except Exception as exc:  # jinja errors on malformed messages
            raise _BadField("messages", f"messages: cannot be rendered by the chat "
                                        f"template: {exc}") from exc
        if asked is not None and len(prompt_ids) + asked > self.max_model_len:
            total = len(prompt_ids) + asked
            raise _BadField(max_param, (
                f"This model's maximum context length is {self.max_model_len} tokens. "
                f"However, you requested {total} tokens ({len(prompt_ids)} in the messages, "
                f"{asked} in the completion). Please reduce the length of the messages or "
                "completion."))
        opts = {"logprobs": logprobs, "parse_tools": bool(tools) and tool_choice == "auto",
                "return_token_ids": bool(body.get("return_token_ids", False)),
                "as_ids": bool(body.get("return_tokens_as_token_ids", False)),
                "model": model}
        return list(prompt_ids), n, params, adapter, opts

    def _token_text(self, tid: int, as_ids: bool) -> str:
        return f"token_id:{tid}" if as_ids else self.tokenizer.decode([tid])

    def _logprobs(self, s: Sample, as_ids: bool) -> dict[str, Any]:
        # Outside a top-p nucleus a token's log-prob is -inf, which JSON cannot carry:
        # clamped to -9999.0, as vLLM does.
        content = []
        for k, (tid, lp) in enumerate(zip(s.token_ids, s.logprobs, strict=True)):
            text = self._token_text(tid, as_ids)
            tops = [{"token": self._token_text(t, as_ids), "logprob": max(v, -9999.0),
                     "bytes": list(self._token_text(t, False).encode("utf-8"))}
                    for t, v in (s.top_logprobs[k] if s.top_logprobs else [])]
            content.append({"token": text, "logprob": max(lp, -9999.0),
                            "bytes": list(self.tokenizer.decode([tid]).encode("utf-8")),
                            "top_logprobs": tops})
        return {"content": content}

    def response(self, prompt_ids: list[int], samples: list[Sample],
                 opts: dict[str, Any]) -> dict[str, Any]:
        choices = []
        for i, s in enumerate(samples):
            text = self.tokenizer.decode(s.token_ids, skip_special_tokens=True)
            parsed = parse_assistant(text, parse_tools=opts["parse_tools"])
            finish = "tool_calls" if parsed.tool_calls else s.finish_reason
            message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
            if opts["parse_tools"]:
                message["tool_calls"] = parsed.tool_calls
            choice: dict[str, Any] = {
                "index": i, "message": message,
                "logprobs": self._logprobs(s, opts["as_ids"]) if opts["logprobs"] else None,
                "finish_reason": finish, "stop_reason": None}
            if opts["return_token_ids"]:
                choice["token_ids"] = s.token_ids
            choices.append(choice)
        completion = sum(len(s.token_ids) for s in samples)
        out: dict[str, Any] = {
            "id": "chatcmpl-" + uuid.uuid4().hex, "object": "chat.completion",
            "created": int(time.time()), "model": opts["model"], "choices": choices,
            "system_fingerprint": "trace-cpu",
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": completion,
                      "total_tokens": len(prompt_ids) + completion}}
        if opts["return_token_ids"]:
            out["prompt_token_ids"] = prompt_ids
        return out


def build_app(service: ChatService):
    """The starlette app exposing `service` with vLLM's routes."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse, Response
    from starlette.routing import Route

    async def body_of(request: Request) -> dict[str, Any]:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != "application/json":
            raise _BadField("content-type", f"Unsupported Media Type: expected Content-Type "
                                            f"application/json, got {ctype or 'none'!r}", 415,
                            "UnsupportedMediaTypeError")
        cap = service.max_body_bytes
        too_big = _BadField("body", f"request body is larger than {cap} bytes", 413,
                            "PayloadTooLargeError")
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > cap:
            raise too_big  # refused before a byte of it is read
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > cap:
                raise too_big
            chunks.append(chunk)
        try:
            body = json.loads(b"".join(chunks))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise _BadField("body", f"request body is not valid JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise _BadField("body", "request body: expected a JSON object")
        return body

    def guarded(handler):
        async def wrapped(request: Request) -> Response:
            try:
                return await handler(request)
            except _BadField as exc:
                return _error(str(exc), exc.status, exc.type, exc.param)
            except EngineError as exc:
                return _error(str(exc), exc.status, exc.type)
            except Exception as exc:  # a bug, not the client's fault: say so in OpenAI shape
                return _error(f"internal error: {type(exc).__name__}: {exc}", 500,
                              "InternalServerError")
        return wrapped

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def models(request: Request) -> Response:
        return JSONResponse(service.model_cards())

    async def chat(request: Request) -> Response:
        body = await body_of(request)
        prompt_ids, n, params, adapter, opts = service.parse_request(body)
        future = service.engine.submit(prompt_ids, n, params, adapter)
        waiter = asyncio.wrap_future(future)  # cancelling the handler cancels the request
        while not (await asyncio.wait({waiter}, timeout=DISCONNECT_POLL_S))[0]:
            if await request.is_disconnected():
                future.cancel()  # the engine drops its rows at the next step
                waiter.cancel()
                return Response(status_code=499)  # nobody reads it; nginx's "client closed"
        return JSONResponse(service.response(prompt_ids, waiter.result(), opts))

    async def load_lora(request: Request) -> Response:
        body = await body_of(request)
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not isinstance(path, str) or not name or not path:
            raise _BadField("lora_name", "Both 'lora_name' and 'lora_path' must be provided.")
        if name == service.served_name:
            raise _BadField("lora_name",
                            f"The lora adapter '{name}' conflicts with a served base model.")
        fut = service.engine.load_adapter(name, path, bool(body.get("load_inplace", False)))
        return PlainTextResponse(await asyncio.wrap_future(fut))

    async def unload_lora(request: Request) -> Response:
        body = await body_of(request)
        name = body.get("lora_name")
        if not isinstance(name, str) or not name:
            raise _BadField("lora_name",
                            "'lora_name' needs to be provided to unload a LoRA adapter.")
        fut = service.engine.unload_adapter(name)
        return PlainTextResponse(await asyncio.wrap_future(fut))

    return Starlette(routes=[
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/chat/completions", guarded(chat), methods=["POST"]),
        Route("/v1/load_lora_adapter", guarded(load_lora), methods=["POST"]),
        Route("/v1/unload_lora_adapter", guarded(unload_lora), methods=["POST"]),
    ])


class PolicyServer(ServerHandle):
    """Our CPU policy server in a background thread: `with PolicyServer(cfg) as srv: ...`."""

    thread_name = "policy-server"

    def __init__(self, config: ServerConfig | None = None, **overrides: Any):
        self.config = config or ServerConfig(**overrides)
        self.service: ChatService | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.config.port

    def make_service(self) -> ChatService:
        """The service to serve; subclasses override it to load their model another way."""
        return ChatService(self.config)

    def start(self, timeout: float = 120.0) -> PolicyServer:
        import uvicorn

        sock = bind_socket(self.config.host, self.config.port)  # a port in use fails here
        self.config.port = sock.getsockname()[1]
        try:
            self.service = self.make_service()
        except BaseException:
            sock.close()
            raise
        cfg = uvicorn.Config(build_app(self.service), host=self.config.host,
                             port=self.config.port, log_level="warning", access_log=False,
                             lifespan="off")
        self._server = uvicorn.Server(cfg)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name=self.thread_name, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"policy server did not start on {self.url}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.service is not None:
            self.service.engine.close()
        self._server = self._thread = self.service = None


def serve(config: ServerConfig) -> None:
    """Run the server in the foreground until interrupted (the `serve` CLI verb)."""
    import uvicorn

    sock = bind_socket(config.host, config.port)  # before the model loads: fail fast
    config.port = sock.getsockname()[1]
    try:
        service = ChatService(config)
        server = uvicorn.Server(uvicorn.Config(build_app(service), host=config.host,
                                               port=config.port, log_level="info",
                                               lifespan="off"))
        sock.listen(2048)  # connections queue from here on: "serving" is true when printed
        print(f"serving {service.served_name} on http://{config.host}:{config.port}/v1 "
              f"(n <= {config.max_n}, bodies <= {config.max_body_bytes} bytes, KV cache "
              f"{config.kv_cache_mb} MB)", flush=True)
        try:
            server.run(sockets=[sock])
        finally:
            service.engine.close()
    finally:
        sock.close()


def server_for(request: ServerRequest) -> PolicyServer:
    """Our server for a training job, not started (the "ours" kind of `SERVER_KINDS`)."""
    return PolicyServer(ServerConfig(model=request.model,
                                     served_model_name=request.served_model_name))
