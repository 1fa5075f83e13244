"""Offline provider: answers recorded from a real provider, replayed without a network.

Design decisions
- A recording is a JSONL file, one line per call: the sha256 of (system, user, schema,
  temperature, seed) and the validated answer. `RecordingProvider` wraps any provider
  and appends to it; `ReplayProvider` serves it and fails loudly on a prompt it has
  not seen (no made-up answers).
- This is what makes LLM-labeled runs reproducible in CI and on a laptop without a
  key: record once against Claude or vLLM, replay forever.
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any

from trace_lib.llm.protocol import (
    JSONOptions,
    JSONResult,
    LLMError,
    LLMProvider,
    Usage,
    validate_json,
)


def call_key(system: str, user: str, schema: dict[str, Any], temperature: float,
             seed: int | None) -> str:
    blob = json.dumps([system, user, schema, temperature, seed], sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class ReplayProvider:
    name = "replay"

    def __init__(self, path: str | Path, model: str = "replay") -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise LLMError(f"{self.path}: no recording here (record one with RecordingProvider)")
        self.model = model
        self._answers: dict[str, dict[str, Any]] = {}
        for n, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                self._answers[rec["key"]] = rec["data"]
            except (json.JSONDecodeError, KeyError) as exc:
                raise LLMError(f"{self.path}:{n}: not a recording line ({exc})") from exc

    def complete_json(self, system: str, user: str, schema: dict[str, Any],
                      **options: Any) -> JSONResult:
        opts = JSONOptions(**options)
        key = call_key(system, user, schema, opts.temperature, opts.seed)
        if key not in self._answers:
            raise LLMError(f"{self.path}: no recorded answer for this prompt (key {key[:12]})")
        data = self._answers[key]
        error = validate_json(data, schema)
        if error:
            raise LLMError(f"{self.path}: recorded answer {key[:12]} no longer validates: {error}")
        return JSONResult(data=data, usage=Usage(), model=self.model, attempts=1)


class RecordingProvider:
    """Wraps a provider; every validated answer is appended to `path` for replay."""

    name = "recording"

    def __init__(self, inner: LLMProvider, path: str | Path) -> None:
        self.inner = inner
        self.model = inner.model
        self.path = Path(path)
        self._lock = threading.Lock()

    def complete_json(self, system: str, user: str, schema: dict[str, Any], **kw: Any) -> JSONResult:
        result = self.inner.complete_json(system, user, schema, **kw)
        opts = JSONOptions(**kw)
        key = call_key(system, user, schema, opts.temperature, opts.seed)
        with self._lock, self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"key": key, "data": result.data}) + "\n")
        return result
