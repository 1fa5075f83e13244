"""Built-in capability environments: one task builder per (capability, domain).

    env = make_capability_env("airline", "precondition_verification", difficulty=2)
    env.reset(7); env.messages; env.step({...}); env.summary()

Design decisions
- A capability module holds only task builders, one per domain, registered with
  `@task_builder(capability, domain)`; `TaskEnvironment` (task_env.py) supplies the
  protocol, the replayed ground truth and the verifier, identically for all of them. So a
  new domain needs four builders, not four environments, and nothing is airline-specific.
- The catalog of capability descriptions lives here (the four capabilities the reference
  work found on tau2-bench); the generation agent and the page read it.
- A built-in's name is "DOMAIN/CAPABILITY"; generated ones get "DOMAIN/CAPABILITY/genN".
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from trace_lib.envs.capabilities.task_env import EnvConfig, Task, TaskBuilder, TaskEnvironment


@dataclass
class CapabilitySpec:
    name: str
    description: str
    builders: dict[str, TaskBuilder] = field(default_factory=dict)  # domain -> builder
    notes: dict[str, str] = field(default_factory=dict)  # domain -> what the tasks are


CAPABILITIES: dict[str, CapabilitySpec] = {
    "structured_data_reasoning": CapabilitySpec(
        "structured_data_reasoning",
        "Reads nested records returned by tools (reservations, orders, payments) and "
        "computes the right figure or entity from them: sums, counts, maxima, allowances.",
    ),
    "multi_step_task_completion": CapabilitySpec(
        "multi_step_task_completion",
        "Carries a request with several parts through to the end: every requested change "
        "is made, in a workable order, without stopping after the first one.",
    ),
    "precondition_verification": CapabilitySpec(
        "precondition_verification",
        "Checks the records against the policy's conditions before any write, and refuses "
        "(without writing) when a condition does not hold.",
    ),
    "tool_calling_precision": CapabilitySpec(
        "tool_calling_precision",
        "Calls the right tool with exactly the right arguments: ids, nested objects, "
        "enums, counts and amounts as the request and the records give them.",
    ),
}

# Databases sized for episodes: big enough for every task kind to find its records, small
# enough that building, copying and hashing one takes milliseconds (an episode does each).
EPISODE_DB_SIZE: dict[str, dict[str, Any]] = {
    "airline": {"n_airports": 10, "n_route_pairs": 14, "n_days": 24, "n_users": 24},
    "retail": {"n_users": 24},
}

CAPABILITY_MODULES = tuple(f"trace_lib.envs.capabilities.{c}" for c in CAPABILITIES)


def task_builder(capability: str, domain: str, note: str = ""):
    """Register a task builder `(db, rng, difficulty) -> Task` for a capability on a domain."""

    def register(fn: TaskBuilder) -> TaskBuilder:
        spec = CAPABILITIES[capability]
        spec.builders[domain] = fn
        if note:
            spec.notes[domain] = note
        return fn

    return register


def _load() -> None:
    for module in CAPABILITY_MODULES:
        importlib.import_module(module)


def builtin_pairs() -> list[tuple[str, str]]:
    """(domain, capability) of every built-in environment whose domain is importable."""
    from trace_lib.envs.domains import get_domain

    _load()
    pairs = []
    for cap, spec in CAPABILITIES.items():
        for domain in sorted(spec.builders):
            try:
                get_domain(domain)
            except (KeyError, ImportError):
                continue  # a domain package that is not there (yet)
            pairs.append((domain, cap))
    return sorted(pairs)


def make_capability_env(
    domain: str,
    capability: str,
    difficulty: int = 2,
    name: str | None = None,
    version: int = 1,
    max_steps: int = 30,
    **db_size: Any,
) -> TaskEnvironment:
    """A built-in capability environment, optionally re-parameterised (used by templates)."""
    _load()
    if capability not in CAPABILITIES:
        raise KeyError(f"unknown capability {capability!r}; known: {', '.join(CAPABILITIES)}")
    spec = CAPABILITIES[capability]
    if domain not in spec.builders:
        raise KeyError(f"capability {capability!r} has no task builder for domain {domain!r}; "
                       f"it has: {', '.join(sorted(spec.builders))}")
    if not 1 <= int(difficulty) <= 3:
        raise ValueError(f"difficulty must be 1, 2 or 3, got {difficulty}")
    size = {**EPISODE_DB_SIZE.get(domain, {}), **db_size}
    config = EnvConfig(difficulty=int(difficulty), max_steps=max_steps, db_size=size)
    return TaskEnvironment(
        name=name or f"{domain}/{capability}",
        capability=capability,
        domain=domain,
        builder=spec.builders[domain],
        config=config,
        version=version,
        description=spec.description,
    )


__all__ = [
    "CAPABILITIES",
    "CapabilitySpec",
    "EnvConfig",
    "Task",
    "TaskEnvironment",
    "builtin_pairs",
    "make_capability_env",
    "task_builder",
]
