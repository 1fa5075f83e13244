"""The Environment protocol as the stages see it, and the one decoder of an action.

Design decisions
- The protocol itself (`Environment`, `ValidatedEnvironment`) is defined once, in
  `trace_lib.runtime.environment`, because the rollout loop in the runtime layer runs
  against it; it is re-exported here so every stage keeps importing `envs.protocol`.
- An action reaches `step` in one of three shapes (see the protocol's docstring): our
  `{"name", "arguments"}`, OpenAI's tool_call `{"type": "function", "function": {"name",
  "arguments": "<json string>"}}` as an OpenAI-compatible endpoint returns it, or a final
  answer `{"content"}`. `parse_action` turns all of them into the first or the last, and
  `tool_arguments` decodes the arguments (a JSON string is OpenAI's wire form), so no
  environment repeats either.
- A malformed action is an error observation the environment reports ("Error: ..."), the
  policy's mistake to learn from; neither function raises anything but ValueError.
"""

from __future__ import annotations

import json
from typing import Any

from trace_lib.runtime.environment import Environment, ValidatedEnvironment

__all__ = ["Environment", "ValidatedEnvironment", "parse_action", "tool_arguments"]


def parse_action(action: str | dict[str, Any]) -> dict[str, Any]:
    """Normalise an action to a dict: `{"name", "arguments"}` for a tool call (OpenAI's
    function shape unwrapped), else the object as given. A malformed one raises ValueError,
    which the environment reports as an error observation."""
    if isinstance(action, dict):
        parsed: Any = action
    else:
        try:
            parsed = json.loads(action)
        except (TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"action is not valid JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise ValueError(f"action must be a JSON object, got {type(parsed).__name__}")
    fn = parsed.get("function")
    if isinstance(fn, dict) and not parsed.get("name"):  # OpenAI's tool_call shape
        return {"name": fn.get("name"), "arguments": fn.get("arguments")}
    return parsed


def tool_arguments(act: dict[str, Any]) -> Any:
    """The `arguments` of a tool action (either shape): a dict, or a JSON string of one
    decoded (OpenAI's wire form). A string that is not JSON is returned as it is, so that
    the tool's own argument check reports it as the observation instead of the env
    raising."""
    fn = act.get("function")
    if isinstance(fn, dict) and "arguments" not in act:
        act = fn
    arguments = act.get("arguments") or {}
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            pass
    return arguments
