"""The provider protocol, its result types, the registry and JSON-schema validation.

Design decisions
- One call shape for every provider: `complete_json(system, user, schema, **options)`
  returns a dict that validates against `schema`; the options and their defaults are
  `JSONOptions`, written once. Structured output is the only output the
  workbench asks an LLM for (labels, capability proposals, environment specs), so
  free-text completion is not part of the interface.
- A malformed answer is retried with the validation error shown to the model
  (`max_repairs`, default 1); if it is still bad, `MalformedOutputError` carries the
  reason and the raw text so the caller can record the failure instead of guessing.
- Transport retries (429, 5xx, timeouts) are the official SDKs' own exponential
  backoff with jitter (they honour `retry-after`); we only set `max_retries`/`timeout`.
- Usage is counted per call, cache reads/writes separately, so a labeling run can
  store tokens and cost in `label_runs.cost`. Prices are per million tokens and only
  for models we know; unknown models report tokens with cost `None`, never a guess.
- Keys come only from the environment (or an explicit argument), never from the DB.
- Providers register by name; `get_provider(name, **cfg)` imports lazily so that the
  CLI and the app do not pay for SDK imports they do not use (jsonschema too: it is
  imported by `validate_json`, its only user).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

from trace_lib.registry import ENTRY_POINT_GROUPS, Registry


class LLMError(RuntimeError):
    """The provider could not produce an answer (transport failure after retries, config)."""


class MalformedOutputError(LLMError):
    """The model's answer did not validate against the schema, even after repair."""

    def __init__(self, reason: str, raw: str | None = None, usage: Usage | None = None):
        super().__init__(reason)
        self.reason = reason
        self.raw = raw
        self.usage = usage or Usage()


# USD per million tokens: input, output, cache read, cache write (5-minute TTL).
PRICES_PER_MTOK: dict[str, tuple[float, float, float, float]] = {
    "claude-opus-4-1": (15.0, 75.0, 1.5, 18.75),
    "claude-opus-4-5": (5.0, 25.0, 0.5, 6.25),
    "claude-sonnet-4-5": (3.0, 15.0, 0.3, 3.75),
    "claude-sonnet-4": (3.0, 15.0, 0.3, 3.75),
    "claude-haiku-4-5": (1.0, 5.0, 0.1, 1.25),
    "gpt-4.1": (2.0, 8.0, 0.5, 2.0),
    "gpt-4.1-mini": (0.4, 1.6, 0.1, 0.4),
}


@dataclass
class Usage:
    input_tokens: int = 0  # uncached input
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    requests: int = 0

    def add(self, other: Usage) -> Usage:
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cache_read_tokens += other.cache_read_tokens
        self.cache_write_tokens += other.cache_write_tokens
        self.requests += other.requests
        return self

    def cost_usd(self, model: str) -> float | None:
        price = _price_for(model)
        if price is None:
            return None
        p_in, p_out, p_read, p_write = price
        return (
            self.input_tokens * p_in
            + self.output_tokens * p_out
            + self.cache_read_tokens * p_read
            + self.cache_write_tokens * p_write
        ) / 1e6

    def to_dict(self, model: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = asdict(self)
        if model is not None:
            out["model"] = model
            out["cost_usd"] = self.cost_usd(model)
        return out


def _price_for(model: str) -> tuple[float, float, float, float] | None:
    # Dated snapshots ("claude-sonnet-4-5-20250929") price like their family name.
    for name in sorted(PRICES_PER_MTOK, key=len, reverse=True):
        if model == name or model.startswith(name + "-"):
            return PRICES_PER_MTOK[name]
    return None


@dataclass
class JSONResult:
    data: dict[str, Any]
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    attempts: int = 1  # 1 + number of repair rounds


@dataclass(frozen=True)
class JSONOptions:
    """The keyword options of `complete_json` and their defaults, in one place for every
    provider (`JSONOptions(**options)`: an unknown option is a TypeError)."""

    schema_name: str = "answer"
    temperature: float = 0.0
    max_tokens: int = 4096
    seed: int | None = None  # a provider without seeds varies by temperature only
    cache_system: bool = True  # cache the system prompt where the provider can
    max_repairs: int = 1  # rounds that show the model its validation error


@runtime_checkable
class LLMProvider(Protocol):
    name: str
    model: str

    def complete_json(self, system: str, user: str, schema: dict[str, Any],
                      **options: Any) -> JSONResult:
        """Ask for one JSON object that validates against `schema`; `options` are
        `JSONOptions`' fields."""
        ...


def validate_json(data: Any, schema: dict[str, Any]) -> str | None:
    """None if `data` validates, else a short message naming the failing path."""
    # Imported here: jsonschema's import compiles an RFC 3987 grammar (~0.8 s), which
    # every page and CLI verb that merely imports the labelers would otherwise pay.
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    parts = []
    for err in errors[:5]:
        path = "/".join(str(p) for p in err.absolute_path) or "(root)"
        parts.append(f"at {path}: {err.message}")
    more = f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""
    return "; ".join(parts) + more


# --------------------------------------------------------------------------- registry

ProviderFactory = Callable[..., LLMProvider]
# name -> "module:factory" (imported on first use) or a factory; third parties add theirs
# through the `trace_workbench.llm_providers` entry-point group.
PROVIDERS: Registry[ProviderFactory] = Registry(
    "LLM provider", group=ENTRY_POINT_GROUPS["llm_providers"], error=LLMError, builtins={
        "anthropic": "trace_lib.llm.anthropic_provider:AnthropicProvider",
        "openai": "trace_lib.llm.openai_provider:OpenAIProvider",
        "replay": "trace_lib.llm.replay:ReplayProvider",
    })


def register_provider(name: str, factory: ProviderFactory) -> None:
    """Add a provider (a class or function taking keyword config) under `name`."""
    PROVIDERS.register(name, factory, replace=True)


def get_provider(name: str, **cfg: Any) -> LLMProvider:
    """Build the provider `name` with keyword config (model, base_url, api_key, ...)."""
    return build_lazily(PROVIDERS.get(name), cfg)


def build_lazily(target: str | Callable[..., Any], cfg: dict[str, Any]) -> Any:
    """Call a registry entry with the config that is set: a "module:factory" string is
    imported first (registries of labelers use the same convention)."""
    if isinstance(target, str):
        module, attr = target.split(":")
        target = getattr(importlib.import_module(module), attr)
    return target(**{k: v for k, v in cfg.items() if v is not None})
