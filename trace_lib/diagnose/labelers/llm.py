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
- Runs vary by seed (OpenAI-compatible servers honour it) and by sampling temperature
  (default 0.0 for a single run, 0.7 when the runner asks for several independent runs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trace_lib.data_model import LABEL_VALUES, Capability
from trace_lib.diagnose.capabilities import capability_block, prompt_sha256
from trace_lib.diagnose.labelers.protocol import PairLabel, TrajectoryLabels
from trace_lib.diagnose.transcript import Transcript, render_transcript
from trace_lib.llm import LLMError, LLMProvider, MalformedOutputError, Usage, get_provider

PROMPTS = Path(__file__).resolve().parent.parent.parent / "prompts"


def label_schema(capabilities: list[Capability]) -> dict[str, Any]:
    entry = {
        "type": "object",
        "properties": {
            "value": {"type": "string", "enum": list(LABEL_VALUES)},
            "evidence": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"message_idx": {"type": "integer", "minimum": 0},
                                   "text": {"type": "string"}},
                    "required": ["message_idx", "text"],
                    "additionalProperties": False,
                },
            },
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": ["value", "evidence", "confidence"],
        "additionalProperties": False,
    }
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
                 max_repairs: int = 1, batch: bool = False, batch_poll_s: float = 10.0) -> None:
        self.provider = provider
        self.name = name
        self.model = provider.model
        self.concurrency = concurrency
        self.temperature = temperature
        self.max_chars = max_chars
        self.max_repairs = max_repairs
        self.batch = batch
        self.batch_poll_s = batch_poll_s

    def prompt_sha256(self, capabilities: list[Capability]) -> str:
        return prompt_sha256(system_prompt(capabilities))

    def _temperature(self, n_runs: int) -> float:
        if self.temperature is not None:
            return self.temperature
        return 0.0 if n_runs <= 1 else 0.7

    def label(self, t: Transcript, capabilities: list[Capability], *, seed: int = 0,
              n_runs: int = 1) -> TrajectoryLabels:
        schema = label_schema(capabilities)
        try:
            res = self.provider.complete_json(
                system_prompt(capabilities), user_prompt(t, self.max_chars), schema,
                schema_name="record_labels", temperature=self._temperature(n_runs), seed=seed,
                max_repairs=self.max_repairs)
        except MalformedOutputError as exc:
            return _failed(t.id, capabilities, f"malformed answer: {exc.reason}", exc.usage)
        except LLMError as exc:
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
                   timeout: float = 120.0, batch: bool = False) -> LLMLabeler:
    provider = get_provider("openai", model=model, base_url=base_url, api_key=api_key,
                            max_retries=max_retries, timeout=timeout)
    return LLMLabeler(provider, name="openai", concurrency=concurrency, temperature=temperature)
