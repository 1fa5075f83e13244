"""Built-in capability environments: one task builder per (capability, domain).

    env = make_capability_env("airline", "precondition_verification", difficulty=2)
    env.reset(7); env.messages; env.step({...}); env.summary()

Design decisions
- A capability module holds only task builders, one per domain, declared with
  `@task_builder(capability, domain)` and listed in its `CAPABILITY = CapabilitySpec.of(...)`
  (builders.py); `CAPABILITIES` is the registry of those specs, built-ins as lazy
  "module:CAPABILITY" strings, so nothing registers itself on import. `TaskEnvironment`
  (task_env.py) supplies the protocol, the replayed ground truth and the verifier,
  identically for all of them. So a new domain needs four builders, not four
  environments, and nothing is airline-specific.
- The capability descriptions come from the one catalog, `trace_lib.capabilities` (the
  four capabilities the reference work found on tau2-bench have built-in environments).
- A built-in's name is "DOMAIN/CAPABILITY"; generated ones get "DOMAIN/CAPABILITY/genN".
- Prompt budget: each builder declares the tools its tasks need and the policy sections
  they exercise. `tools="capability"` shows those tools plus `distractors` others of the
  domain (schemas byte-identical to the domain's own, a strict subset of `tools="all"`);
  `policy="excerpt"` shows the policy's opening, "How to work" and those sections, cut
  verbatim from the full policy. A test checks every reference action and required read
  uses a declared tool, so an excerpt can never hide a tool the task needs.
"""

from __future__ import annotations

from typing import Any

from trace_lib.capabilities import CORE as CORE_CAPABILITIES
from trace_lib.envs.capabilities.builders import CapabilitySpec, DomainBuilder, task_builder
from trace_lib.envs.capabilities.task_env import EnvConfig, Task, TaskEnvironment

# Imported here, not in make_capability_env: the sandbox loads this package before its
# import policy is on, and refuses any import after (a generated module calls
# make_capability_env at difficulty 1-3; the target-shaped levels are not sandboxed).
from trace_lib.envs.curriculum import DIFFICULTIES, TARGET_SHAPED_DOMAINS
from trace_lib.registry import ENTRY_POINT_GROUPS, Registry

# One module per capability of the catalog's core, each defining `CAPABILITY` (imported on
# first use); a plugin names a CapabilitySpec in the `trace_workbench.capabilities` group.
CAPABILITIES: Registry[CapabilitySpec] = Registry(
    "capability", group=ENTRY_POINT_GROUPS["capabilities"], builtins={
        name: f"trace_lib.envs.capabilities.{name}:CAPABILITY" for name in CORE_CAPABILITIES})

# Databases sized for episodes: big enough for every task kind to find its records, small
# enough that building, copying and hashing one takes milliseconds (an episode does each).
EPISODE_DB_SIZE: dict[str, dict[str, Any]] = {
    "airline": {"n_airports": 10, "n_route_pairs": 14, "n_days": 24, "n_users": 24},
    "retail": {"n_users": 24},
}


def builtin_pairs() -> list[tuple[str, str]]:
    """(domain, capability) of every built-in environment whose domain is importable."""
    from trace_lib.envs.domains import get_domain

    pairs = []
    for cap, spec in CAPABILITIES.items():
        for domain in sorted(spec.builders):
            try:
                get_domain(domain)
            except (KeyError, ImportError):
                continue  # a domain package that is not there (yet)
            pairs.append((domain, cap))
    return sorted(pairs)


def needed_tools(capability: str, domain: str, difficulty: int) -> tuple[str, ...]:
    """The tools a built-in's tasks at `difficulty` need, as its builder declared them."""
    declared = CAPABILITIES[capability].tools.get(domain, ())
    if isinstance(declared, dict):
        return tuple(declared.get(difficulty, ()))
    return tuple(declared)


def make_capability_env(
    domain: str,
    capability: str,
    difficulty: int = 2,
    name: str | None = None,
    version: int = 1,
    max_steps: int = 30,
    tools: str = "all",
    policy: str = "full",
    distractors: int = 2,
    **db_size: Any,
) -> TaskEnvironment:
    """A built-in capability environment, optionally re-parameterised (used by templates).

    `tools`: "all" (the domain's every tool) or "capability" (what the tasks need plus
    `distractors` others); `policy`: "full" or "excerpt" (see the module docstring).
    `difficulty` 4 and 5 (airline) are the target-shaped levels (`target_shaped`); the
    curriculum over all five is `trace_lib.envs.curriculum`. `db_size` does not apply there
    (the target tasks' database size)."""
    if capability not in CAPABILITIES:
        raise KeyError(f"unknown capability {capability!r}; known: {', '.join(CAPABILITIES)}")
    spec = CAPABILITIES[capability]
    if domain not in spec.builders:
        raise KeyError(f"capability {capability!r} has no task builder for domain {domain!r}; "
                       f"it has: {', '.join(sorted(spec.builders))}")
    if int(difficulty) not in DIFFICULTIES:
        raise ValueError(f"difficulty must be one of {DIFFICULTIES}, got {difficulty}")
    if int(difficulty) >= 4:  # the target-shaped levels: the target-task generator's tasks
        if domain not in TARGET_SHAPED_DOMAINS:
            raise ValueError(f"difficulty {difficulty} (target-shaped) exists for "
                             f"{', '.join(TARGET_SHAPED_DOMAINS)} only, not {domain!r}")
        from trace_lib.envs.capabilities import target_shaped as ts

        config = EnvConfig(difficulty=int(difficulty), max_steps=max_steps, tools=tools,
                           policy=policy, distractors=distractors,
                           needed_tools=ts.needed_tools(capability),
                           policy_sections=ts.policy_sections(capability))
        return ts.TargetShapedEnvironment(capability, config, name=name, version=version,
                                          description=spec.description)
    size = {**EPISODE_DB_SIZE.get(domain, {}), **db_size}
    config = EnvConfig(difficulty=int(difficulty), max_steps=max_steps, db_size=size,
                       tools=tools, policy=policy, distractors=distractors,
                       needed_tools=needed_tools(capability, domain, int(difficulty)),
                       policy_sections=spec.policy_sections.get(domain, ()))
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
    "DomainBuilder",
    "EnvConfig",
    "Task",
    "TaskEnvironment",
    "builtin_pairs",
    "make_capability_env",
    "needed_tools",
    "task_builder",
]
