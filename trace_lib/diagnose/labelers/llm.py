"""LLM labelers (Claude, any OpenAI-compatible server): one structured call per trajectory.

Design decisions
- One call labels every capability of a trajectory. The schema is an object with one
  required property per capability ({value, evidence[{message_idx, text}], confidence}),
  so completeness is checked by the schema itself and a missing capability triggers
  the repair round like any other validation error.
- The prompt (`label_prompt`): the fixed part (instructions, how the transcript is
  written, capability definitions, the answer's format) is the system prompt, identical
  for every trajectory of a run, so Anthropic's prompt cache (and vLLM's prefix cache)
  serve it after the first call. The transcript is the user turn, fenced by a tag keyed
  per request (HMAC under the labeler's `fence_key`, drawn per labeler unless given), and
  everything from the trajectory stays inside the fence; the same key, trajectory,
  capabilities and seed give byte-identical prompts (`label_prompt`).
- Context-aware cutting: the labeler learns its model's context once (`--max-context`,
  else the served model's card in `/v1/models`, else a documented or assumed window:
  `context_budget`), counts tokens with the served model's tokenizer where it is on this
  machine (else characters / 4), and cuts a transcript that does not fit by the rule of
  `transcript_cut`. It asks for exactly the answer room it reserved. Where the context
  and the count came from are the run's notes (`notes`); how much each trajectory lost
  is on its label rows (`cut_messages`, `cut_tokens`).
- Evidence is checked (`evidence_check`): an item that does not quote the message it
  names is dropped and counted, and a lacking/present label left without evidence is
  marked unsupported.
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
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from trace_lib.capabilities import prompt_sha256
from trace_lib.data_model import LABEL_VALUES, Capability
from trace_lib.diagnose.context_budget import Budget, ContextWindow, context_window
from trace_lib.diagnose.evidence_check import check_evidence, is_unsupported, message_texts
from trace_lib.diagnose.label_prompt import (
    fence_nonce,
    fixed_text,
    new_fence_key,
    system_prompt,
    transcript_header,
    user_prompt,
    user_template,
)
from trace_lib.diagnose.labelers.protocol import LabelerUnavailable, PairLabel, TrajectoryLabels
from trace_lib.diagnose.transcript_cut import FittedTranscript, fit_transcript
from trace_lib.llm import LLMError, LLMProvider, MalformedOutputError, Usage, get_provider
from trace_lib.transcript_model import Transcript

EVIDENCE_TEXT_MAX = 500  # characters of a verified quote kept in the label row


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


@dataclass
class Prompt:
    """One request's two messages, what the transcript lost, and the budget it fit."""

    system: str
    user: str
    fitted: FittedTranscript
    budget: Budget


class LLMLabeler:
    def __init__(self, provider: LLMProvider, *, name: str, concurrency: int = 8,
                 temperature: float | None = None, max_repairs: int = 1, batch: bool = False,
                 batch_poll_s: float = 10.0, max_tokens: int | None = None,
                 evidence_max_items: int | None = None, evidence_max_chars: int | None = None,
                 max_context: int | None = None, tokenizer: str | None = None,
                 fence_key: str | None = None) -> None:
        self.provider = provider
        self.name = name
        self.model = provider.model
        self.concurrency = concurrency
        self.temperature = temperature
        self.max_repairs = max_repairs
        self.batch = batch
        self.batch_poll_s = batch_poll_s
        self.max_tokens = max_tokens  # None: sized by the capability count (context_budget)
        self.evidence_bounds = {"evidence_max_items": evidence_max_items,
                                "evidence_max_chars": evidence_max_chars}
        self.max_context = max_context  # None: ask the server (`context_budget`)
        self.tokenizer = tokenizer  # None: the served model's, where it is on this machine
        # The fence's key: a run records it (its params, a job's spec) to send the same bytes
        # again; drawn here when not given, after the trajectories were written.
        self.fence_key = fence_key or new_fence_key()
        self._window: ContextWindow | None = None
        self._budgets: dict[tuple[str, ...], Budget] = {}
        self._lock = threading.Lock()  # the pool's first calls resolve the window once

    def prompt_sha256(self, capabilities: list[Capability]) -> str:
        return prompt_sha256(system_prompt(capabilities), user_template())

    @property
    def base_url(self) -> str | None:
        client = getattr(self.provider, "_client", None)
        url = getattr(client, "base_url", None) or getattr(self.provider, "base_url", None)
        return str(url) if url else None

    @property
    def notes(self) -> list[str]:
        """Where the context and the token count came from (empty until resolved)."""
        return list(self._window.notes) if self._window is not None else []

    def window(self) -> ContextWindow:
        """The model's context and token counter, resolved on first use."""
        with self._lock:
            if self._window is None:
                served = None
                ask = getattr(self.provider, "served_model", None)
                if callable(ask) and not (self.max_context and self.tokenizer):
                    served = ask()
                self._window = context_window(self.model, max_context=self.max_context,
                                              served=served, tokenizer=self.tokenizer)
            return self._window

    def budget(self, capabilities: list[Capability]) -> Budget:
        """The transcript's token budget with this capability menu's instructions."""
        key = tuple(c.name for c in capabilities)
        if key not in self._budgets:
            window = self.window()
            fixed = (window.counter.count(system_prompt(capabilities))
                     + window.counter.count(fixed_text()))
            self._budgets[key] = window.budget(fixed, self.max_tokens,
                                               n_capabilities=len(capabilities),
                                               repairs=self.max_repairs)
        return self._budgets[key]

    def prompt(self, t: Transcript, capabilities: list[Capability], *, seed: int = 0
               ) -> Prompt:
        """The request for one trajectory and seed: the transcript cut to fit, then fenced
        with the tag keyed by (trajectory, capabilities, seed)."""
        budget = self.budget(capabilities)
        count = self.window().counter.count
        header = transcript_header(t)
        fitted = fit_transcript(t, max(0, budget.transcript_tokens - count(header)), count)
        body = header + fitted.text
        nonce = fence_nonce(self.fence_key, t.id, [c.name for c in capabilities], seed, body)
        user = user_prompt(body, nonce=nonce, cut=fitted.cut)
        return Prompt(system_prompt(capabilities), user, fitted, budget)

    def preflight(self, timeout_s: float = 5.0) -> None:
        """Raise LabelerUnavailable unless something accepts connections at the base URL;
        then learn the model's context (a bad `--max-context` is said here)."""
        self._check_connect(timeout_s)
        self.window()

    def _check_connect(self, timeout_s: float) -> None:
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
        p = self.prompt(t, capabilities, seed=seed)
        try:
            res = self.provider.complete_json(
                p.system, p.user, schema, schema_name="record_labels",
                temperature=self._temperature(n_runs), seed=seed,
                max_repairs=self.max_repairs, max_tokens=p.budget.answer_tokens)
        except MalformedOutputError as exc:
            return _failed(t.id, capabilities, f"malformed answer: {exc.reason}", exc.usage,
                           p.fitted)
        except LLMError as exc:
            if _refused(exc):
                raise LabelerUnavailable(f"no {self.name} server at {self.base_url} "
                                         "(connection refused)") from None
            return _failed(t.id, capabilities, f"call failed: {exc}", Usage(), p.fitted)
        return _parse(t, capabilities, res.data, res.usage, p.fitted)

    def label_many(self, ts: list[Transcript], capabilities: list[Capability], *, seed: int = 0,
                   n_runs: int = 1) -> list[TrajectoryLabels]:
        """Message Batches (Anthropic) for large sets; invalid answers get a repair call."""
        batch_fn = getattr(self.provider, "complete_json_batch", None)
        if not (self.batch and batch_fn):
            return [self.label(t, capabilities, seed=seed, n_runs=n_runs) for t in ts]
        schema = label_schema(capabilities)
        prompts = {t.id: self.prompt(t, capabilities, seed=seed) for t in ts}
        results = batch_fn([(t.id, prompts[t.id].system, prompts[t.id].user) for t in ts],
                           schema, schema_name="record_labels",
                           temperature=self._temperature(n_runs),
                           max_tokens=self.budget(capabilities).answer_tokens,
                           poll_s=self.batch_poll_s)
        out = []
        for t in ts:
            r, fitted = results[t.id], prompts[t.id].fitted
            if isinstance(r, MalformedOutputError):
                relabeled = self.label(t, capabilities, seed=seed, n_runs=n_runs)
                relabeled.usage.add(r.usage)
                out.append(relabeled)
            elif isinstance(r, LLMError):
                out.append(_failed(t.id, capabilities, f"batch request failed: {r}", Usage(),
                                   fitted))
            else:
                out.append(_parse(t, capabilities, r.data, r.usage, fitted))
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


def _failed(tid: str, capabilities: list[Capability], reason: str, usage: Usage,
            fitted: FittedTranscript) -> TrajectoryLabels:
    return TrajectoryLabels(tid, [PairLabel(c.name, None, [], None, reason[:2000])
                                  for c in capabilities], usage,
                            fitted.cut_messages, fitted.cut_tokens)


def _parse(t: Transcript, capabilities: list[Capability], data: dict[str, Any], usage: Usage,
           fitted: FittedTranscript) -> TrajectoryLabels:
    """The answer as labels, each with its verified evidence only."""
    texts = message_texts(t)
    labels = []
    for c in capabilities:
        d = data[c.name]
        items = [{"message_idx": int(e["message_idx"]), "text": str(e["text"])}
                 for e in d.get("evidence", [])]
        kept, dropped = check_evidence(t, items, texts)
        kept = [{**e, "text": e["text"][:EVIDENCE_TEXT_MAX]} for e in kept]
        labels.append(PairLabel(c.name, d["value"], kept, float(d["confidence"]),
                                unsupported=is_unsupported(d["value"], kept),
                                evidence_dropped=dropped))
    return TrajectoryLabels(t.id, labels, usage, fitted.cut_messages, fitted.cut_tokens)


def anthropic_labeler(model: str | None = None, api_key: str | None = None,
                      base_url: str | None = None, concurrency: int = 8,
                      temperature: float | None = None, batch: bool = False,
                      max_retries: int = 4, timeout: float = 120.0,
                      batch_poll_s: float = 10.0, max_tokens: int | None = None,
                      max_context: int | None = None, tokenizer: str | None = None,
                      fence_key: str | None = None) -> LLMLabeler:
    provider = get_provider("anthropic", model=model, api_key=api_key, base_url=base_url,
                            max_retries=max_retries, timeout=timeout)
    return LLMLabeler(provider, name="anthropic", concurrency=concurrency,
                      temperature=temperature, batch=batch, batch_poll_s=batch_poll_s,
                      max_tokens=max_tokens, max_context=max_context, tokenizer=tokenizer,
                      fence_key=fence_key)


def openai_labeler(model: str | None = None, base_url: str | None = None,
                   api_key: str | None = None, concurrency: int = 8,
                   temperature: float | None = None, max_retries: int = 4,
                   timeout: float = 120.0, batch: bool = False,
                   max_tokens: int | None = None, evidence_max_items: int | None = None,
                   evidence_max_chars: int | None = None, max_context: int | None = None,
                   tokenizer: str | None = None, fence_key: str | None = None) -> LLMLabeler:
    provider = get_provider("openai", model=model, base_url=base_url, api_key=api_key,
                            max_retries=max_retries, timeout=timeout)
    return LLMLabeler(provider, name="openai", concurrency=concurrency, temperature=temperature,
                      max_tokens=max_tokens, evidence_max_items=evidence_max_items,
                      evidence_max_chars=evidence_max_chars, max_context=max_context,
                      tokenizer=tokenizer, fence_key=fence_key)
