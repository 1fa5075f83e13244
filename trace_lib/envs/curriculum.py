"""The curriculum: one schedule of (difficulty, tools, policy) from today's easiest
capability environment to instances that ARE target tasks (issue 29, item 4).

    for level in CURRICULUM.levels:
        env = make_capability_env("airline", "precondition_verification", **level.options)
    # training: --env airline/precondition_verification --difficulty 5 --tools all --policy full

Design decisions
- The schedule lives here and nowhere else: a frozen dataclass of levels, each the three
  build options a built-in already takes (`make_capability_env(difficulty=, tools=,
  policy=)`, `TrainConfig.difficulty/tools/policy`, `--difficulty/--tools/--policy`), so a
  level is reachable by every path that builds a built-in, and nothing new has to be
  threaded through training, jobs or the pages.
- Between today's difficulty 3 and the target-shaped level the schedule moves one axis at
  a time: tools capability -> all, then policy excerpt -> full, then the task source
  (capability builders -> the target-task generator over training databases, values still
  told: difficulty 4), then values told -> read (difficulty 5). The task-source step cannot
  be split further without rewriting the builders: it is where request templates, several
  operations per request, and reads before the first write arrive together.
- Difficulty 4 and 5 exist for airline only: retail's target tasks are its capability
  builders' own instances (`evaluate.tasks.retail_task_set`), so difficulty 2 already is
  its target shape. `TARGET_SHAPED_DOMAINS` says so, and an airline-only level on retail is
  a clear error.
- The distances between levels are measured, not assumed (`evaluate.env_distance`,
  `bench/env_distance.py`, bench/README): a test holds that each move after difficulty 3
  brings a level's mean relative gap to the dev target tasks strictly down, and that today's
  1 -> 2 -> 3 never raises it by more than 0.05 (those move within the capability
  builders' task family, which was not designed toward the target tasks).
- This module imports nothing heavy at import time: training's config and the CLI read
  `DIFFICULTIES` from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DIFFICULTIES: tuple[int, ...] = (1, 2, 3, 4, 5)
DIFFICULTY_NAMES: dict[int, str] = {
    1: "capability, easy", 2: "capability", 3: "capability, hard",
    4: "target-shaped, values told", 5: "target-shaped",
}
TARGET_SHAPED_DOMAINS: tuple[str, ...] = ("airline",)
# The longest target-shaped reference: the user read, then two operations of (reservation
# read, two flight reads, the write), then the reply. Training with fewer turns would cut
# the reference (and SFT on it) before its last write, so TrainConfig refuses that.
TARGET_SHAPED_MAX_TURNS = 10


@dataclass(frozen=True)
class Level:
    """One rung: the build options of a built-in capability environment."""

    difficulty: int
    tools: str = "all"  # "capability" | "all"
    policy: str = "full"  # "excerpt" | "full"

    @property
    def name(self) -> str:
        return f"d{self.difficulty}/{self.tools}/{self.policy}"

    @property
    def options(self) -> dict[str, Any]:
        """What `make_capability_env`, `registry.build_env(options=)` and TrainConfig take."""
        return {"difficulty": self.difficulty, "tools": self.tools, "policy": self.policy}


@dataclass(frozen=True)
class Curriculum:
    levels: tuple[Level, ...]

    def for_domain(self, domain: str) -> tuple[Level, ...]:
        """The levels that exist on `domain` (the target-shaped ones on airline only)."""
        return tuple(lv for lv in self.levels
                     if lv.difficulty <= 3 or domain in TARGET_SHAPED_DOMAINS)

    def as_list(self) -> list[tuple[int, str, str]]:
        return [(lv.difficulty, lv.tools, lv.policy) for lv in self.levels]


CURRICULUM = Curriculum(levels=(
    Level(1, "capability", "excerpt"),  # today's easiest: one template, values told
    Level(2, "capability", "excerpt"),
    Level(3, "capability", "excerpt"),
    Level(3, "all", "excerpt"),  # tools: every domain tool, as the target tasks show
    Level(3, "all", "full"),  # policy: the whole policy, as the target tasks show
    Level(4, "all", "full"),  # task source: target tasks over training databases, told
    Level(5, "all", "full"),  # values read: the target shape itself
))
