"""A typed client for a policy server: our CPU server and vLLM look the same through it.

Design decisions
- One client family for training, composition and benchmarks (issue 11 merged the rollout
  loop's former `ChatClient`/`OpenAIChatClient` into this): `PolicyClient` is the Protocol
  (chat, load/unload adapter); `OpenAIPolicyClient` implements it over the `openai` SDK
  for chat and httpx for vLLM's LoRA endpoints, so the rollout loop is written once
  against any OpenAI-compatible server with vLLM's extensions. In-process clients
  (compose's `LocalMoEClient`) implement the same `chat` and return `Completion`s.
- Training needs the exact sampled tokens, not text: every chat call asks for
  `return_token_ids` (vLLM >= 0.10.2 and our server) and `return_tokens_as_token_ids`
  with `logprobs`, and reads token ids from `choices[i].token_ids`, falling back to the
  `token_id:<id>` logprob tokens when a server only supports the latter.
- Results are small dataclasses (`Completion`) holding the OpenAI assistant message (ready
  to append to the conversation), the token ids, their logprobs, the finish reason and the
  prompt's token ids.
- API keys come only from the environment (`OPENAI_API_KEY`, default "EMPTY" as vLLM
  expects when it runs without `--api-key`); they are never stored.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


class PolicyServerError(RuntimeError):
    """The server refused a request; the message is the server's own."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


@dataclass
class Completion:
    message: dict[str, Any]  # {"role": "assistant", "content": ..., "tool_calls"?: [...]}
    finish_reason: str
    token_ids: list[int]
    logprobs: list[float]
    prompt_token_ids: list[int] = field(default_factory=list)

    @property
    def content(self) -> str | None:
        return self.message.get("content")

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return self.message.get("tool_calls") or []


@runtime_checkable
class ChatPolicy(Protocol):
    """The part of a policy client a rollout needs: in-process clients implement only this."""

    def chat(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
             model: str | None = None, n: int = 1, temperature: float = 1.0, top_p: float = 1.0,
             max_tokens: int = 256, seed: int | None = None) -> list[Completion]: ...


@runtime_checkable
class PolicyClient(ChatPolicy, Protocol):
    """A policy server: chat plus listing models and hot-swapping LoRA adapters."""

    base_url: str

    def models(self) -> list[str]: ...

    def chat(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
             model: str | None = None, n: int = 1, temperature: float = 1.0, top_p: float = 1.0,
             max_tokens: int = 256, seed: int | None = None) -> list[Completion]: ...

    def load_adapter(self, name: str, path: str, load_inplace: bool = False) -> None: ...

    def unload_adapter(self, name: str) -> None: ...


def _token_id(token: str) -> int:
    if not token.startswith("token_id:"):
        raise PolicyServerError(
            "server returned neither token_ids nor token_id:<id> logprob tokens; it must "
            "support vLLM's return_token_ids or return_tokens_as_token_ids")
    return int(token.split(":", 1)[1])


class OpenAIPolicyClient:
    """`PolicyClient` over an OpenAI-compatible base URL (`http://host:port/v1`)."""

    def __init__(self, base_url: str, model: str | None = None, timeout: float = 600.0,
                 api_key: str | None = None):
        import httpx
        import openai

        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):  # a server root works too
            self.base_url += "/v1"
        self.root_url = self.base_url[:-3] if self.base_url.endswith("/v1") else self.base_url
        key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self._openai = openai.OpenAI(base_url=self.base_url, api_key=key, timeout=timeout,
                                     max_retries=0)
        self._http = httpx.Client(timeout=timeout, headers={"Authorization": f"Bearer {key}"})
        self._model = model

    def close(self) -> None:
        self._http.close()
        self._openai.close()

    def __enter__(self) -> OpenAIPolicyClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def wait_until_ready(self, timeout: float = 300.0, process: Any = None) -> float:
        """Poll `/health` until the server answers; return the seconds waited.

        `process` (a `subprocess.Popen`) makes a server that died fail fast."""
        import httpx

        start = time.monotonic()
        while True:
            if process is not None and process.poll() is not None:
                raise PolicyServerError(f"server process exited with code {process.returncode}")
            try:
                if self._http.get(self.root_url + "/health", timeout=5).status_code == 200:
                    return time.monotonic() - start
            except httpx.TransportError:
                pass
            if time.monotonic() - start > timeout:
                raise PolicyServerError(f"server at {self.root_url} not ready after {timeout}s")
            time.sleep(0.5)

    def models(self) -> list[str]:
        return [m.id for m in self._openai.models.list().data]

    @property
    def model(self) -> str:
        if self._model is None:
            self._model = self.models()[0]
        return self._model

    def chat(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
             model: str | None = None, n: int = 1, temperature: float = 1.0, top_p: float = 1.0,
             max_tokens: int = 256, seed: int | None = None) -> list[Completion]:
        """`n` choices for `messages`, each with its sampled token ids and their log-probs."""
        import openai

        kwargs: dict[str, Any] = {}
        if tools:
            kwargs["tools"] = tools
        if seed is not None:
            kwargs["seed"] = seed
        try:
            resp = self._openai.chat.completions.create(
                model=model or self.model, messages=messages, n=n, temperature=temperature,
                top_p=top_p, max_tokens=max_tokens, logprobs=True,
                extra_body={"return_token_ids": True, "return_tokens_as_token_ids": True},
                **kwargs)
        except openai.APIStatusError as exc:
            raise PolicyServerError(f"chat completion failed ({exc.status_code}): "
                                    f"{exc.message}", exc.status_code) from exc
        extra = resp.model_extra or {}
        prompt_ids = list(extra.get("prompt_token_ids") or [])
        out = []
        for choice in sorted(resp.choices, key=lambda c: c.index):
            lp = choice.logprobs.content if choice.logprobs and choice.logprobs.content else []
            ids = (choice.model_extra or {}).get("token_ids")
            if ids is None:
                ids = [_token_id(e.token) for e in lp]
            if lp and len(lp) != len(ids):
                raise PolicyServerError(f"{self.base_url}: {len(ids)} token ids but {len(lp)} "
                                        "logprobs in a choice (a server bug; the trainer "
                                        "cannot score tokens it has no log-prob for)")
            msg: dict[str, Any] = {"role": "assistant", "content": choice.message.content}
            calls = [c.model_dump(exclude_none=True) for c in (choice.message.tool_calls or [])]
            if calls:
                msg["tool_calls"] = calls
            out.append(Completion(message=msg, finish_reason=choice.finish_reason or "stop",
                                  token_ids=list(ids), logprobs=[e.logprob for e in lp],
                                  prompt_token_ids=prompt_ids))
        return out

    def _post(self, route: str, payload: dict[str, Any]) -> str:
        resp = self._http.post(self.root_url + route, json=payload)
        if resp.status_code != 200:
            try:
                err = resp.json().get("error", resp.json())
                message = err.get("message", resp.text) if isinstance(err, dict) else str(err)
            except ValueError:
                message = resp.text
            raise PolicyServerError(f"{route} failed ({resp.status_code}): {message}",
                                    resp.status_code)
        return resp.text

    def load_adapter(self, name: str, path: str, load_inplace: bool = False) -> None:
        """vLLM's `/v1/load_lora_adapter`; `load_inplace` replaces an adapter's weights."""
        self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path),
                                             "load_inplace": load_inplace})

    def unload_adapter(self, name: str) -> None:
        self._post("/v1/unload_lora_adapter", {"lora_name": name})
