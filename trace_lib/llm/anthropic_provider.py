"""Claude through the official `anthropic` SDK, structured by forced tool use.

Design decisions
- Structured output = one tool whose `input_schema` is the caller's schema and
  `tool_choice` forcing it; the tool input is validated again here with jsonschema
  because the API does not guarantee it (`strict` is not assumed).
- The system prompt is sent as a text block with `cache_control: ephemeral`, so the
  fixed part (instructions + capability menu) is written to the cache once and read
  at a tenth of the price by every later call of a labeling run. Callers put
  everything that varies (the transcript) in the user turn.
- Repair keeps the conversation valid for the Messages API: the bad `tool_use` block
  is answered by a `tool_result` with `is_error: true` that quotes the validation
  error, and the tool is forced again.
- Backoff on 429/5xx/timeouts is the SDK's own (exponential, jitter, `retry-after`);
  `max_retries` and `timeout` are configurable.
- Message Batches (`complete_json_batch`) for large sets: half price, no repair round
  inside a batch; invalid answers come back as `MalformedOutputError` so the caller
  can repair them with ordinary calls.
- No `temperature`: this SDK's Messages API no longer takes sampling parameters, and
  its default sampling already makes N labeling runs independent samples. The
  argument is accepted for interface parity and ignored.
- The key is read from `ANTHROPIC_API_KEY` by default (or passed in); never stored.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from trace_lib.llm.protocol import (
    JSONOptions,
    JSONResult,
    LLMError,
    MalformedOutputError,
    Usage,
    validate_json,
)

DEFAULT_MODEL = "claude-sonnet-4-5"
ENV_MODEL = "TRACE_ANTHROPIC_MODEL"


class AnthropicProvider:
    name = "anthropic"

    def __init__(self, model: str | None = None, api_key: str | None = None,
                 base_url: str | None = None, max_retries: int = 4,
                 timeout: float = 120.0) -> None:
        import anthropic

        key = api_key or os.environ.get("ANTHROPIC_API_KEY")
        if not key:
            raise LLMError(
                "the anthropic provider needs ANTHROPIC_API_KEY in the environment "
                "(or use the offline `heuristic` labeler)"
            )
        self.model = model or os.environ.get(ENV_MODEL, DEFAULT_MODEL)
        self._client = anthropic.Anthropic(
            api_key=key,
            base_url=base_url or os.environ.get("ANTHROPIC_BASE_URL") or None,
            max_retries=max_retries,
            timeout=timeout,
        )
        self._sdk = anthropic

    # ------------------------------------------------------------------ requests

    def _params(
        self, system: str, messages: list[dict[str, Any]], schema: dict[str, Any],
        schema_name: str, temperature: float, max_tokens: int, cache_system: bool,
    ) -> dict[str, Any]:
        block: dict[str, Any] = {"type": "text", "text": system}
        if cache_system:
            block["cache_control"] = {"type": "ephemeral"}
        return {
            "model": self.model,
            "max_tokens": max_tokens,
            "system": [block],
            "tools": [{
                "name": schema_name,
                "description": "Record the answer. Call this exactly once.",
                "input_schema": schema,
            }],
            "tool_choice": {"type": "tool", "name": schema_name},
            "messages": messages,
        }

    @staticmethod
    def _usage(message: Any) -> Usage:
        u = getattr(message, "usage", None)
        if u is None:
            return Usage(requests=1)
        return Usage(
            input_tokens=int(getattr(u, "input_tokens", 0) or 0),
            output_tokens=int(getattr(u, "output_tokens", 0) or 0),
            cache_read_tokens=int(getattr(u, "cache_read_input_tokens", 0) or 0),
            cache_write_tokens=int(getattr(u, "cache_creation_input_tokens", 0) or 0),
            requests=1,
        )

    @staticmethod
    def _extract(message: Any, schema: dict[str, Any], schema_name: str) -> tuple[Any, str | None]:
        """(tool_use block or None, error text or None)."""
        for block in getattr(message, "content", None) or []:
            if getattr(block, "type", None) == "tool_use" and block.name == schema_name:
                error = validate_json(block.input, schema)
                return block, error
        texts = [getattr(b, "text", "") for b in getattr(message, "content", None) or []]
        return None, f"no `{schema_name}` tool call in the answer (text: {' '.join(texts)[:200]!r})"

    def complete_json(self, system: str, user: str, schema: dict[str, Any],
                      **options: Any) -> JSONResult:
        opts = JSONOptions(**options)  # the Messages API has no seed
        schema_name = opts.schema_name
        messages: list[dict[str, Any]] = [{"role": "user", "content": user}]
        usage = Usage()
        raw = None
        for attempt in range(opts.max_repairs + 1):
            params = self._params(system, messages, schema, schema_name, opts.temperature,
                                  opts.max_tokens, opts.cache_system)
            try:
                message = self._client.messages.create(**params)
            except self._sdk.APIError as exc:
                raise LLMError(f"anthropic {self.model}: {type(exc).__name__}: {exc}") from exc
            usage.add(self._usage(message))
            block, error = self._extract(message, schema, schema_name)
            raw = json.dumps(block.input) if block is not None else str(error)
            if error is None:
                return JSONResult(data=block.input, usage=usage, model=self.model,
                                  attempts=attempt + 1)
            if attempt == opts.max_repairs:
                raise MalformedOutputError(f"invalid answer after {attempt + 1} attempts: {error}",
                                           raw=raw, usage=usage)
            if block is not None:
                messages.append({"role": "assistant", "content": [{
                    "type": "tool_use", "id": block.id, "name": block.name, "input": block.input,
                }]})
                messages.append({"role": "user", "content": [{
                    "type": "tool_result", "tool_use_id": block.id, "is_error": True,
                    "content": f"Invalid input: {error}. Call `{schema_name}` again with "
                               "input that satisfies the schema.",
                }]})
            else:
                messages.append({"role": "assistant", "content": raw or "(no answer)"})
                messages.append({"role": "user", "content": (
                    f"{error}. Answer by calling the `{schema_name}` tool.")})
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------- batches

    def complete_json_batch(
        self,
        items: list[tuple[str, str, str]],
        schema: dict[str, Any],
        *,
        schema_name: str = "answer",
        temperature: float = 0.0,
        max_tokens: int = 4096,
        cache_system: bool = True,
        poll_s: float = 10.0,
        max_wait_s: float = 24 * 3600.0,
    ) -> dict[str, JSONResult | MalformedOutputError | LLMError]:
        """Submit (custom_id, system, user) items as one Message Batch and wait for it.

        Returns custom_id -> result; a request the API errored on maps to `LLMError`,
        an answer that does not validate to `MalformedOutputError`.
        """
        requests = [
            {"custom_id": cid, "params": self._params(
                system, [{"role": "user", "content": user}], schema, schema_name,
                temperature, max_tokens, cache_system)}
            for cid, system, user in items
        ]
        try:
            batch = self._client.messages.batches.create(requests=requests)
            deadline = time.monotonic() + max_wait_s
            while batch.processing_status != "ended":
                if time.monotonic() > deadline:
                    raise LLMError(f"message batch {batch.id} did not end in {max_wait_s:.0f}s")
                time.sleep(poll_s)
                batch = self._client.messages.batches.retrieve(batch.id)
            entries = list(self._client.messages.batches.results(batch.id))
        except self._sdk.APIError as exc:
            raise LLMError(f"anthropic batch: {type(exc).__name__}: {exc}") from exc
        out: dict[str, JSONResult | MalformedOutputError | LLMError] = {}
        for entry in entries:
            result = entry.result
            if result.type != "succeeded":
                detail = getattr(getattr(result, "error", None), "error", None)
                out[entry.custom_id] = LLMError(f"batch request {result.type}: {detail}")
                continue
            usage = self._usage(result.message)
            block, error = self._extract(result.message, schema, schema_name)
            if error is None:
                out[entry.custom_id] = JSONResult(block.input, usage, self.model, 1)
            else:
                raw = json.dumps(block.input) if block is not None else None
                out[entry.custom_id] = MalformedOutputError(error, raw=raw, usage=usage)
        for cid, _, _ in items:
            out.setdefault(cid, LLMError("batch returned no result for this request"))
        return out
