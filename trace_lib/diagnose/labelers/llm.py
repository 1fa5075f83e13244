"""LLM labelers (Claude, any OpenAI-compatible server): one structured call per trajectory.

Design decisions
- One call labels every capability of a trajectory. The schema is an object with one
  required property per capability ({value, evidence[{message_idx, text}], confidence}),
  so completeness is checked by the schema itself and a missing capability triggers
  the repair round like any other validation error.
- The fixed part (instructions + capability menu) is the system prompt: identical for
  every trajectory of a run, so Anthropic's prompt cache (and vLLM's prefix cache)
  serve it after the first call. Only the transcript varies (the user turn).
- The outcome (reward, pass/fail) is NOT shown: a labeler that knows the trajectory
  failed finds "lacking" more often there, which would inflate Delta by construction.
- A trajectory whose answer is still malformed after repair, or whose call failed after
  the SDK's retries, yields one failed PairLabel per capability with the reason.
- Fail fast: `preflight()` opens one TCP connection to the provider's base URL before
  the first call (no SDK retries), and a call whose transport error is a refused
  connection raises `LabelerUnavailable` rather than a failed pair, so a labeler pointed
  at a port where nothing listens stops within a second instead of retrying every
  trajectory for minutes. Other failures (timeouts, 5xx after retries, bad answers)
  stay per-trajectory failed pairs; the runner stops when the first ones all fail.
- Runs vary by seed (OpenAI-compatible servers honour it) and by sampling temperature
  (default 0.0 for a single run, 0.7 when the runner asks for several independent runs).
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from trace_lib.capabilities import capability_block, prompt_sha256
from trace_lib.data_model import LABEL_VALUES, Capability
from trace_lib.diagnose.labelers.protocol import LabelerUnavailable, PairLabel, TrajectoryLabels
from trace_lib.diagnose.transcript_prompt import render_transcript
from trace_lib.llm import LLMError, LLMProvider, MalformedOutputError, Usage, get_provider
from trace_lib.transcript_model import Transcript

PROMPTS = Path(__file__).resolve().parent.parent.parent / "prompts"


def label_schema(capabilities: list[Capability], *, evidence_max_items: int | None = None,
                 evidence_max_chars: int | None = None) -> dict[str, Any]:
    """The answer's JSON schema. The evidence bounds are for small local models under
    guided decoding (a 135M model can fill a quote until max_tokens); leave them None for
    hosted APIs whose strict mode may not accept `maxLength`."""
    text: dict[str, Any] = {"type": "string"}
    if evidence_max_chars:
        text["maxLength"] = int(evidence_max_chars)
    entry = {
        "type": "object",
        "properties": {
            "value": {"type": "string", "enum": list(LABEL_VALUES)},
            "evidence": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"message_idx": {"type": "integer", "minimum": 0},
                                   "text": text},
                    "required": ["message_idx", "text"],
                    "additionalProperties": False,
                },
            },
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": ["value", "evidence", "confidence"],
        "additionalProperties": False,
    }
    if evidence_max_items:
        entry["properties"]["evidence"]["maxItems"] = int(evidence_max_items)
    return {
        "type": "object",
        "properties": {c.name: entry for c in capabilities},
        "required": [c.name for c in capabilities],
        "additionalProperties": False,
    }


def system_prompt(capabilities: list[Capability], template: str = "label_trajectory.md") -> str:
    text = (PROMPTS / template).read_text(encoding="utf-8")
    return text.replace("{capabilities}", capability_block(capabilities))


def user_prompt(t: Transcript, max_chars: int = 60_000) -> str:
    head = [f"Trajectory {t.id}", f"Domain: {t.domain or 'unknown'}",
            f"Task id: {t.task_id or 'unknown'}"]
    return "\n".join(head) + "\n\nTranscript:\n" + render_transcript(t, max_chars=max_chars)


class LLMLabeler:
    def __init__(self, provider: LLMProvider, *, name: str, concurrency: int = 8,
                 temperature: float | None = None, max_chars: int = 60_000,
                 max_repairs: int = 1, batch: bool = False, batch_poll_s: float = 10.0,
                 max_tokens: int | None = None, evidence_max_items: int | None = None,
                 evidence_max_chars: int | None = None) -> None:
        self.provider = provider
        self.name = name
        self.model = provider.model
        self.concurrency = concurrency
        self.temperature = temperature
        self.max_chars = max_chars
        self.max_repairs = max_repairs
        self.batch = batch
        self.batch_poll_s = batch_poll_s
        self.max_tokens = max_tokens  # None: the provider's default (small models need less)
        self.evidence_bounds = {"evidence_max_items": evidence_max_items,
                                "evidence_max_chars": evidence_max_chars}

    def prompt_sha256(self, capabilities: list[Capability]) -> str:
        return prompt_sha256(system_prompt(capabilities))

    @property
    def base_url(self) -> str | None:
        client = getattr(self.provider, "_client", None)
        url = getattr(client, "base_url", None) or getattr(self.provider, "base_url", None)
        return str(url) if url else None

    def preflight(self, timeout_s: float = 5.0) -> None:
        """Raise LabelerUnavailable unless something accepts connections at the base URL."""
        url = self.base_url
        if not url:
            return
        parts = urlsplit(url)
        host = parts.hostname or "localhost"
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                pass
        except OSError as exc:
            why = "connection refused" if isinstance(exc, ConnectionRefusedError) else str(exc)
            raise LabelerUnavailable(f"no {self.name} server at {url} ({why})") from None

    def _temperature(self, n_runs: int) -> float:
        if self.temperature is not None:
            return self.temperature
        return 0.0 if n_runs <= 1 else 0.7

    def label(self, t: Transcript, capabilities: list[Capability], *, seed: int = 0,
              n_runs: int = 1) -> TrajectoryLabels:
        schema = label_schema(capabilities, **self.evidence_bounds)
        try:
            res = self.provider.complete_json(
                system_prompt(capabilities), user_prompt(t, self.max_chars), schema,
                schema_name="record_labels", temperature=self._temperature(n_runs), seed=seed,
                max_repairs=self.max_repairs,
                **({"max_tokens": self.max_tokens} if self.max_tokens else {}))
        except MalformedOutputError as exc:
            return _failed(t.id, capabilities, f"malformed answer: {exc.reason}", exc.usage)
        except LLMError as exc:
            if _refused(exc):
                raise LabelerUnavailable(f"no {self.name} server at {self.base_url} "
                                         "(connection refused)") from None
            return _failed(t.id, capabilities, f"call failed: {exc}", Usage())
        return _parse(t.id, capabilities, res.data, res.usage)

    def label_many(self, ts: list[Transcript], capabilities: list[Capability], *, seed: int = 0,
                   n_runs: int = 1) -> list[TrajectoryLabels]:
        """Message Batches (Anthropic) for large sets; invalid answers get a repair call."""
        batch_fn = getattr(self.provider, "complete_json_batch", None)
        if not (self.batch and batch_fn):
            return [self.label(t, capabilities, seed=seed, n_runs=n_runs) for t in ts]
        system, schema = system_prompt(capabilities), label_schema(capabilities)
        results = batch_fn([(t.id, system, user_prompt(t, self.max_chars)) for t in ts], schema,
                           schema_name="record_labels", temperature=self._temperature(n_runs),
                           poll_s=self.batch_poll_s)
        out = []
        for t in ts:
            r = results[t.id]
            if isinstance(r, MalformedOutputError):
                relabeled = self.label(t, capabilities, seed=seed, n_runs=n_runs)
                relabeled.usage.add(r.usage)
                out.append(relabeled)
            elif isinstance(r, LLMError):
                out.append(_failed(t.id, capabilities, f"batch request failed: {r}", Usage()))
            else:
                out.append(_parse(t.id, capabilities, r.data, r.usage))
        return out


def _refused(exc: BaseException) -> bool:
    """True if a refused connection is anywhere in the exception's chain."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ConnectionRefusedError) or "Connection refused" in str(cur):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def _failed(tid: str, capabilities: list[Capability], reason: str, usage: Usage
            ) -> TrajectoryLabels:
    return TrajectoryLabels(tid, [PairLabel(c.name, None, [], None, reason[:2000])
                                  for c in capabilities], usage)


def _parse(tid: str, capabilities: list[Capability], data: dict[str, Any], usage: Usage
           ) -> TrajectoryLabels:
    labels = []
    for c in capabilities:
        d = data[c.name]
        labels.append(PairLabel(c.name, d["value"], [
            {"message_idx": int(e["message_idx"]), "text": str(e["text"])[:500]}
            for e in d.get("evidence", [])], float(d["confidence"])))
    return TrajectoryLabels(tid, labels, usage)


def anthropic_labeler(model: str | None = None, api_key: str | None = None,
                      base_url: str | None = None, concurrency: int = 8,
                      temperature: float | None = None, batch: bool = False,
                      max_retries: int = 4, timeout: float = 120.0,
                      batch_poll_s: float = 10.0) -> LLMLabeler:
    provider = get_provider("anthropic", model=model, api_key=api_key, base_url=base_url,
                            max_retries=max_retries, timeout=timeout)
    return LLMLabeler(provider, name="anthropic", concurrency=concurrency,
                      temperature=temperature, batch=batch, batch_poll_s=batch_poll_s)


def openai_labeler(model: str | None = None, base_url: str | None = None,
                   api_key: str | None = None, concurrency: int = 8,
                   temperature: float | None = None, max_retries: int = 4,
                   timeout: float = 120.0, batch: bool = False, max_chars: int = 60_000,
                   max_tokens: int | None = None, evidence_max_items: int | None = None,
                   evidence_max_chars: int | None = None) -> LLMLabeler:
    provider = get_provider("openai", model=model, base_url=base_url, api_key=api_key,
                            max_retries=max_retries, timeout=timeout)
    return LLMLabeler(provider, name="openai", concurrency=concurrency, temperature=temperature,
                      max_chars=max_chars, max_tokens=max_tokens,
                      evidence_max_items=evidence_max_items,
                      evidence_max_chars=evidence_max_chars)
