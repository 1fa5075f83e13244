"""The evaluation's chat client: plain OpenAI `/v1/chat/completions`, no token ids; and the
project's own server's settings when the evaluation has no `--server-url`.

Design decisions
- Plain OpenAI only (no `logprobs`, no vLLM `return_token_ids`): evaluation needs the
  transcript and the reward, not token ids, and hosted providers refuse unknown fields.
  The rollout loop runs with `token_ids=False` over it.
- Every failure is a `UserInputError` that names the endpoint and what it answered (a
  timeout says which limit to raise), never an httpx traceback.
"""

from __future__ import annotations

import os
from typing import Any

import httpx

from trace_lib.errors import UserInputError


class EvalChatClient:
    """The rollout loop's `ChatClient` over plain OpenAI `/v1/chat/completions`."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 600.0):
        url = base_url.rstrip("/")
        self.base_url = url[: -len("/v1")] if url.endswith("/v1") else url
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout_s = timeout_s
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def load_adapter(self, name: str, path: str, what: str) -> None:
        """Hot-load a PEFT adapter as model `name` (`/v1/load_lora_adapter`, as vLLM does);
        `what` names it in the error (the flag the user gave)."""
        resp = self._http.post("/v1/load_lora_adapter",
                               json={"lora_name": name, "lora_path": path})
        if resp.status_code != 200:
            raise UserInputError(f"{what}: the policy server could not load it: "
                                 f"{resp.text[:400]}")

    def model_ids(self) -> set[str] | None:
        """The endpoint's `/v1/models` ids, or None when it has no such list."""
        try:
            resp = self._http.get("/v1/models")
            if resp.status_code != 200:
                return None
            return {m.get("id") for m in resp.json().get("data", [])} - {None}
        except (httpx.HTTPError, ValueError, AttributeError):
            return None

    def chat(self, messages: list[dict[str, Any]], *,
             tools: list[dict[str, Any]] | None = None, model: str | None = None, n: int = 1,
             temperature: float = 0.0, top_p: float = 1.0, max_tokens: int = 128,
             seed: int | None = None) -> list[Any]:
        from trace_lib.runtime.policy_client import Completion

        body: dict[str, Any] = {"model": model, "messages": messages, "n": n,
                                "max_tokens": max_tokens, "temperature": temperature}
        if top_p != 1.0:
            body["top_p"] = top_p
        if tools:
            body["tools"] = tools
        if seed is not None:
            body["seed"] = seed
        try:
            resp = self._http.post("/v1/chat/completions", json=body)
        except httpx.TimeoutException as exc:
            raise UserInputError(
                f"{self.base_url}: the policy server did not answer within "
                f"{self.timeout_s:.0f} s (raise request_timeout_s, or lower concurrency)") \
                from exc
        except httpx.HTTPError as exc:
            raise UserInputError(f"{self.base_url}: cannot reach the policy server ({exc})") \
                from exc
        if resp.status_code != 200:
            raise UserInputError(f"{self.base_url}/v1/chat/completions answered "
                                 f"{resp.status_code}: {resp.text[:400]}")
        out = []
        for choice in resp.json().get("choices", []):
            msg = choice.get("message") or {}
            calls = msg.get("tool_calls") or []
            message = {"role": "assistant", "content": msg.get("content"),
                       **({"tool_calls": calls} if calls else {})}
            out.append(Completion(message=message, token_ids=[], logprobs=[],
                                  finish_reason=choice.get("finish_reason") or "stop"))
        if not out:
            raise UserInputError(f"{self.base_url}: the response has no choices")
        return out


def local_server_config(cfg: Any, model: str) -> Any:
    """The project's own policy server for an evaluation without `--server-url`: the
    evaluation's context and token limits, torch threads from OMP_NUM_THREADS."""
    from trace_lib.runtime.policy_server import ServerConfig

    threads = int(os.environ.get("OMP_NUM_THREADS", "0") or 0) or None
    return ServerConfig(model=model, max_model_len=cfg.max_model_len,
                        default_max_tokens=cfg.max_tokens, torch_threads=threads)
