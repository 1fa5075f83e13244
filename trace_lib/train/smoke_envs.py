"""Smoke environments: tiny tasks on which the `tiny` model's reward moves in a few steps.

They exist for smoke runs of the trainer (tests, the notebook, a first look at the
Training page) where a built-in domain environment would be too long for the tiny model's
context. They are not capability environments and are not in the environments registry;
train on them with `--env trace_lib.train.smoke_envs:TargetLetterEnv`.

Design decisions
- They implement the real Environment protocol, so they exercise the real rollout loop,
  policy server, GRPO step and jobs; nothing in the trainer knows they are toys.
- `TargetLetterEnv`: the user asks for a short answer; the reward is 1 when the answer
  contains the target letter. With answers of a few tokens a random-init policy passes
  about a third of the time, so most groups are informative, and the signal per token is
  strong (put mass on the tokens that contain the letter). Its `reference_action` (an
  answer of the target letter) is what `sft_steps` warm-starts on in smoke runs.
- `LookupEnv` adds one tool, for multi-turn rollouts: the answer passes when it contains
  the value the `lookup` tool returns for the seed's key.
"""

from __future__ import annotations

import json
from typing import Any

from trace_lib.envs.protocol import parse_action


class TargetLetterEnv:
    name = "toy/target_letter"
    capability = "toy_target_letter"
    domain = "toy"
    version = 1
    target = "a"

    def __init__(self) -> None:
        self._seed = 0
        self._answer: str | None = None
        self._steps = 0

    def reset(self, seed: int) -> None:
        self._seed = seed
        self._answer = None
        self._steps = 0

    @property
    def system_prompt(self) -> str:
        return "You are a helpful assistant."

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        return []

    @property
    def messages(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": self.system_prompt},
                {"role": "user", "content": f"Request {self._seed}: answer with many letters."}]

    @property
    def hint(self) -> str | None:
        return f"use the letter {self.target}"

    def reference_action(self) -> dict[str, Any] | None:
        """A passing answer (the SFT warm start's demonstration), None once answered."""
        return None if self.done else {"content": self.target * 3}

    def step(self, action: str | dict[str, Any]) -> str:
        act = parse_action(action)
        self._steps += 1
        if "content" in act:
            self._answer = str(act["content"] or "")
            return "ok"
        self._answer = ""  # a tool call in a tool-less task ends the episode with nothing
        return "Error: this task has no tools"

    @property
    def done(self) -> bool:
        return self._answer is not None

    def summary(self) -> dict[str, Any]:
        ok = self.target in (self._answer or "").lower()
        return {"reward": float(ok), "passed": ok, "steps": self._steps,
                "reasons": [f"the answer {'contains' if ok else 'lacks'} '{self.target}'"]}


class LookupEnv:
    name = "toy/lookup"
    capability = "toy_lookup"
    domain = "toy"
    version = 1

    def __init__(self) -> None:
        self.reset(0)

    def reset(self, seed: int) -> None:
        self._key = f"k{seed}"
        self._value = f"v{seed * 7 % 11}"
        self._answer: str | None = None
        self._steps = 0

    @property
    def system_prompt(self) -> str:
        return "Use the lookup tool, then answer with the value."

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        return [{"type": "function", "function": {
            "name": "lookup", "description": "value of a key",
            "parameters": {"type": "object", "properties": {"key": {"type": "string"}},
                           "required": ["key"]}}}]

    @property
    def messages(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": self.system_prompt},
                {"role": "user", "content": f"What is the value of {self._key}?"}]

    @property
    def hint(self) -> str | None:
        return "call lookup first"

    def step(self, action: str | dict[str, Any]) -> str:
        act = parse_action(action)
        self._steps += 1
        if "content" in act:
            self._answer = str(act["content"] or "")
            return "ok"
        if act.get("name") != "lookup":
            return f"Error: unknown tool {act.get('name')!r}"
        key = (act.get("arguments") or {}).get("key")
        return json.dumps({"value": self._value if key == self._key else None})

    @property
    def done(self) -> bool:
        return self._answer is not None

    def summary(self) -> dict[str, Any]:
        ok = bool(self._answer) and self._value in (self._answer or "")
        return {"reward": float(ok), "passed": ok, "steps": self._steps,
                "reasons": ["answer has the value" if ok else "answer lacks the value"]}
