"""Any OpenAI-compatible Chat Completions server (OpenAI, vLLM, llama.cpp, ...).

Design decisions
- Structured output through `response_format: {"type": "json_schema", ...}`, which
  vLLM enforces with guided decoding and OpenAI with strict mode; the answer is still
  parsed and validated here because not every server enforces it.
- Base URL and model from arguments, else `TRACE_OPENAI_BASE_URL`/`OPENAI_BASE_URL`
  and `TRACE_OPENAI_MODEL`. A local server needs no key: we send "EMPTY" when
  `OPENAI_API_KEY` is unset, as vLLM's docs do.
- `seed` and `temperature` are passed through so that N labeling runs are N
  independent samples that can each be reproduced.
- Repair: the invalid answer goes back as the assistant turn, the validation error as
  the next user turn.
- Cached prompt tokens (`prompt_tokens_details.cached_tokens`) are counted as cache
  reads; servers cache prefixes on their own, so there is nothing to mark.
- `served_model()` reads the model's card from `/v1/models` once, with no retries and a
  short timeout: vLLM and the project's policy server put the context (`max_model_len`)
  and the model's folder (`root`) there, which the labeler sizes its prompts by. A
  server without the list (or not listing the model) is not an error: None.
"""

from __future__ import annotations

import json
import os
from typing import Any

from trace_lib.llm.protocol import (
    JSONOptions,
    JSONResult,
    LLMError,
    MalformedOutputError,
    Usage,
    validate_json,
)


class OpenAIProvider:
    name = "openai"

    def __init__(self, model: str | None = None, base_url: str | None = None,
                 api_key: str | None = None, max_retries: int = 4,
                 timeout: float = 120.0) -> None:
        import openai

        self.base_url = (base_url or os.environ.get("TRACE_OPENAI_BASE_URL")
                         or os.environ.get("OPENAI_BASE_URL"))
        self.model = model or os.environ.get("TRACE_OPENAI_MODEL") or ""
        if not self.model:
            raise LLMError("the openai provider needs a model (--model or TRACE_OPENAI_MODEL)")
        self._client = openai.OpenAI(
            api_key=api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY",
            base_url=self.base_url or None,
            max_retries=max_retries,
            timeout=timeout,
        )
        self._sdk = openai

    def served_model(self, timeout: float = 10.0) -> dict[str, Any] | None:
        """This model's card in the server's `/v1/models` (every field the server sent),
        None when the server has no such list or does not list the model."""
        try:
            page = self._client.with_options(max_retries=0, timeout=timeout).models.list()
            cards = [m.model_dump() for m in page.data]
        except (self._sdk.APIError, ValueError, TypeError, AttributeError):
            return None  # no list (404), an odd one, or nothing listening: sized without it
        return next((c for c in cards if c.get("id") == self.model), None)

    def complete_json(self, system: str, user: str, schema: dict[str, Any],
                      **options: Any) -> JSONResult:
        opts = JSONOptions(**options)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": system},
            {"role": "user", "content": user},
        ]
        usage = Usage()
        raw: str | None = None
        for attempt in range(opts.max_repairs + 1):
            kwargs: dict[str, Any] = {
                "model": self.model,
                "messages": messages,
                "temperature": opts.temperature,
                "max_tokens": opts.max_tokens,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": opts.schema_name, "schema": schema,
                                    "strict": True},
                },
            }
            if opts.seed is not None:
                kwargs["seed"] = opts.seed
            try:
                completion = self._client.chat.completions.create(**kwargs)
            except self._sdk.APIError as exc:
                raise LLMError(f"openai-compatible {self.base_url or 'api.openai.com'} "
                               f"{self.model}: {type(exc).__name__}: {exc}") from exc
            usage.add(_usage(completion))
            raw, data, error = _parse(completion, schema)
            if error is None:
                return JSONResult(data=data, usage=usage, model=self.model, attempts=attempt + 1)
            if attempt == opts.max_repairs:
                raise MalformedOutputError(f"invalid answer after {attempt + 1} attempts: {error}",
                                           raw=raw, usage=usage)
            messages.append({"role": "assistant", "content": raw or ""})
            messages.append({"role": "user", "content": (
                f"Your answer was invalid: {error}. Reply again with one JSON object "
                "that satisfies the schema, and nothing else.")})
        raise AssertionError("unreachable")


def _usage(completion: Any) -> Usage:
    u = getattr(completion, "usage", None)
    if u is None:
        return Usage(requests=1)
    details = getattr(u, "prompt_tokens_details", None)
    cached = int(getattr(details, "cached_tokens", 0) or 0) if details is not None else 0
    return Usage(
        input_tokens=int(u.prompt_tokens or 0) - cached,
        output_tokens=int(u.completion_tokens or 0),
        cache_read_tokens=cached,
        requests=1,
    )


def _parse(completion: Any, schema: dict[str, Any]) -> tuple[str | None, Any, str | None]:
    """(raw text, parsed data, error or None)."""
    choices = getattr(completion, "choices", None) or []
    if not choices:
        return None, None, "the response has no choices"
    raw = choices[0].message.content
    if not raw:
        return raw, None, "the answer is empty"
    text = raw.strip()
    if text.startswith("```"):  # some servers wrap JSON in a fence despite the format
        text = text.strip("`").removeprefix("json").strip()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return raw, None, f"not valid JSON ({exc.msg} at char {exc.pos})"
    return raw, data, validate_json(data, schema)
