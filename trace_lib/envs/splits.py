"""The named splits of a domain's target tasks: which task-set seeds are dev, test and demo.

Design decisions
- A split is a task-set seed and a size, the same for every domain: the seed picks the
  domain database and the task draw over it (`evaluate.tasks`). `demo` (seed 0, 50 tasks)
  is what the demo's scripted agents played; `dev` (seed 1, 100) is where a person or the
  loop diagnoses and chooses; `test` (seed 2, 150) is held out.
- It lives with the environments, not with evaluation, because both sides need it: the
  evaluation draws its tasks from a split, and every training environment built from the
  same generator (the target-shaped levels, `envs.capabilities.target_shaped`) must keep
  away from every split's database. One table, read by both, so a new split is held out
  of training the moment it exists.
"""

from __future__ import annotations

from dataclasses import dataclass

from trace_lib.errors import UserInputError

# trace_lib.demo builds ceil(300 trajectories / (3 agents x 2 trials)) = 50 tasks; the
# constant is repeated here because a job must not import the demo module (it imports the
# store). tests/evaluate checks that the two agree.
DEMO_TASKS = 50


@dataclass(frozen=True)
class Split:
    """A named slice of a domain's target tasks: the task-set seed and how many tasks."""

    name: str
    seed: int
    size: int
    purpose: str


SPLITS: dict[str, Split] = {s.name: s for s in (
    Split("demo", 0, DEMO_TASKS, "the tasks the demo's scripted agents played"),
    Split("dev", 1, 100, "diagnosis, settings and checkpoints are chosen here"),
    Split("test", 2, 150, "held out: each final configuration runs here once"),
)}
DEFAULT_SPLIT = "demo"


def get_split(name: str) -> Split:
    if name not in SPLITS:
        raise UserInputError(f"--split {name!r}: expected one of {', '.join(SPLITS)}")
    return SPLITS[name]


def split_of(seed: int) -> str:
    """The split a task-set seed belongs to ("custom" for a seed no split uses)."""
    return next((s.name for s in SPLITS.values() if s.seed == seed), "custom")
