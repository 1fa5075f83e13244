"""A tiny real Environment for gate-training tests: short prompts, a graded reward.

The reward is the share of the answer's characters that are vowels, so a random tiny
model sampling at temperature 1 gets different rewards within a group (GRPO has signal)
and the test runs in seconds instead of the minutes a full airline prompt takes.
"""

from __future__ import annotations

from typing import Any

from trace_lib.envs.protocol import parse_action


class VowelEnv:
    name = "toy/vowels"
    capability = "vowels"
    domain = "toy"
    version = 1

    def __init__(self) -> None:
        self._seed = 0
        self._answer: str | None = None
        self._steps = 0

    def reset(self, seed: int) -> None:
        self._seed, self._answer, self._steps = seed, None, 0

    @property
    def system_prompt(self) -> str:
        return "Answer briefly."

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        return []

    @property
    def messages(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": self.system_prompt},
                {"role": "user", "content": f"Say vowels #{self._seed}"}]

    @property
    def hint(self) -> str | None:
        return None

    def step(self, action: str | dict[str, Any]) -> str:
        act = parse_action(action)
        self._steps += 1
        self._answer = str(act.get("content", ""))
        return "ok"

    @property
    def done(self) -> bool:
        return self._answer is not None

    def summary(self) -> dict[str, Any]:
        text = self._answer or ""
        reward = sum(c in "aeiouAEIOU" for c in text) / max(len(text), 1)
        return {"reward": reward, "passed": reward > 0.3, "steps": self._steps, "reasons": []}


class ReferenceVowelEnv(VowelEnv):
    """VowelEnv with a reference answer (what `reference_episode` replays): its one turn
    is `REFERENCE` tokens long, so a run with no `max_tokens` derives its budget from it."""

    name = "toy/reference_vowels"
    REFERENCE = "a e i o u " * 12

    def reference_action(self) -> dict[str, Any] | None:
        return None if self.done else {"content": self.REFERENCE}
