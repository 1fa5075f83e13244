"""How a capability module declares its task builders: `@task_builder` and `CapabilitySpec`.

    @task_builder("precondition_verification", "airline", note="...", tools=(...),
                  policy_sections=("Cancelling",))
    def airline_cancel(db, rng, difficulty) -> Task: ...

    CAPABILITY = CapabilitySpec.of("precondition_verification", airline_cancel, retail_cancel)

Design decisions
- Declaring is not registering. `@task_builder` wraps the function in a `DomainBuilder`
  (the function plus what its tasks need) and puts it nowhere; the module's `CAPABILITY`
  lists its builders, and `CAPABILITIES` (the package's registry) names that constant as
  a lazy "module:CAPABILITY" string. So importing a capability module changes no table,
  and a capability is exactly what its module says, whoever imported what first.
- A builder stays callable as the plain function it wraps (`builder(db, rng, difficulty)`),
  and `CapabilitySpec.builders` holds the plain functions, so `TaskEnvironment` and the
  task sets call a builder the same way as before.
- `CapabilitySpec.of` refuses a builder declared for another capability or a domain given
  twice: a copy-pasted decorator cannot silently file tasks under the wrong name.
- The description comes from the one capability catalog (`trace_lib.capabilities`), the
  text diagnose labels against; a plugin's capability (not in the catalog) passes its own.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trace_lib.capabilities import description as catalog_description
from trace_lib.envs.capabilities.task_env import Task, TaskBuilder

# The tools a builder's tasks need: one tuple, or {difficulty: tuple} when the kinds differ.
NeededTools = tuple[str, ...] | dict[int, tuple[str, ...]]


@dataclass(frozen=True)
class DomainBuilder:
    """One capability's task builder `(db, rng, difficulty) -> Task` on one domain."""

    capability: str
    domain: str
    build: TaskBuilder
    note: str = ""  # what the tasks are, in a line
    tools: NeededTools = ()
    policy_sections: tuple[str, ...] = ()  # the policy's "## " sections the tasks exercise

    def __call__(self, db: Any, rng: random.Random, difficulty: int) -> Task:
        return self.build(db, rng, difficulty)


def task_builder(capability: str, domain: str, note: str = "", *,
                 tools: NeededTools = (),
                 policy_sections: tuple[str, ...] = ()) -> Callable[[TaskBuilder], DomainBuilder]:
    """Declare a task builder `(db, rng, difficulty) -> Task` for a capability on a domain.

    `tools`: the domain tools its tasks need; `policy_sections`: the policy's "## " sections
    its tasks exercise (the excerpt). List the result in the module's `CapabilitySpec.of`."""

    def declare(fn: TaskBuilder) -> DomainBuilder:
        return DomainBuilder(capability, domain, fn, note,
                             dict(tools) if isinstance(tools, dict) else tuple(tools),
                             tuple(policy_sections))

    return declare


@dataclass
class CapabilitySpec:
    """A capability's built-in environments: its description and one builder per domain."""

    name: str
    description: str
    builders: dict[str, TaskBuilder] = field(default_factory=dict)  # domain -> builder
    notes: dict[str, str] = field(default_factory=dict)  # domain -> what the tasks are
    tools: dict[str, NeededTools] = field(default_factory=dict)  # domain -> tools needed
    policy_sections: dict[str, tuple[str, ...]] = field(default_factory=dict)  # domain -> ##s

    @classmethod
    def of(cls, name: str, *builders: DomainBuilder,
           description: str | None = None) -> CapabilitySpec:
        """The capability `name` built by `builders` (description: the catalog's text)."""
        spec = cls(name, catalog_description(name) if description is None else description)
        for b in builders:
            if b.capability != name:
                raise ValueError(f"capability {name!r}: builder {b.build.__name__!r} is "
                                 f"declared for capability {b.capability!r}")
            if b.domain in spec.builders:
                raise ValueError(f"capability {name!r}: two builders for domain {b.domain!r}")
            spec.builders[b.domain] = b.build
            spec.tools[b.domain] = b.tools
            spec.policy_sections[b.domain] = b.policy_sections
            if b.note:
                spec.notes[b.domain] = b.note
        return spec
