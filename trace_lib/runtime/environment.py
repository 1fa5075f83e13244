"""The Environment protocol every environment implements and the rollout loop runs against.

Design decisions
- It lives in the runtime layer because the rollout loop (`runtime.rollout`), which both
  training and composition stand on, runs against it; `trace_lib.envs.protocol` re-exports
  it for the stages (one definition, imported from either place).
- It is a pure `typing.Protocol`: no store, no stage logic, nothing to import but typing.
- It follows the reference TRACE protocol: `reset(seed)` builds the whole instance
  (database state, the user's request written out in full, the hidden ground truth)
  from the seed alone, so no LLM user is needed and the same seed gives the same
  instance anywhere, including inside the sandbox subprocess.
- `step(action)` takes ONE action, as a JSON string or dict:
    {"name": TOOL, "arguments": {...}}      a tool call  -> the tool's observation text
    {"type": "function", "function": {"name": TOOL, "arguments": "<json>"}}
                                             the same call in OpenAI's tool_call shape
    {"content": TEXT}                        a final answer to the user -> ends the episode
  The rollout loop turns each assistant `tool_calls` entry into one step and an
  assistant message without tool calls into a final answer. Observations are strings
  (JSON for structured results; "Error: ..." for tool errors), as in tau2-bench.
  `envs.protocol.parse_action` is the one decoder of these shapes.
- Rewards come only from code: `summary()` compares the database state and the final
  answer with the instance's ground truth; `reasons` says why credit was given or not.
- `tool_schemas` are the original domain's OpenAI function schemas, unchanged, so a
  policy trained here sees the tools it will see on the benchmark.
- `hint` is optional text added to a share of each group's rollouts; the trainer strips
  it before the gradient step.
- Two optional members serve validation and inspection, not training: `ground_truth`
  (the hidden answer, JSON-serialisable) and `reference_action()` (the next action of a
  policy that solves the instance). Validation requires them; `ValidatedEnvironment`
  names the full shape. Before the first `reset`, properties return empty values
  (so `isinstance(env, Environment)` works on a fresh object); `step`/`summary` raise.
- The same protocol is served across the sandbox boundary (`SandboxedEnvironment`), so a
  caller never knows whether an environment runs in-process or in a confined child.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Environment(Protocol):
    name: str  # registry key, e.g. "airline/precondition_verification"
    capability: str
    domain: str
    version: int

    def reset(self, seed: int) -> None:
        """Build the instance for `seed`; clears any previous episode."""
        ...

    @property
    def system_prompt(self) -> str:
        """The agent's system prompt: the domain policy plus task framing."""
        ...

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        """OpenAI-format function tools, identical to the original domain's."""
        ...

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The opening conversation: the system message and the user's full request."""
        ...

    @property
    def hint(self) -> str | None:
        """Optional hint text for hinted rollouts (never part of the reward)."""
        ...

    def step(self, action: str | dict[str, Any]) -> str:
        """Apply one tool call or final answer; return the observation text."""
        ...

    @property
    def done(self) -> bool: ...

    def summary(self) -> dict[str, Any]:
        """{"reward": float in [0, 1], "passed": bool, "steps": int, "reasons": [str, ...]}."""
        ...


@runtime_checkable
class ValidatedEnvironment(Environment, Protocol):
    """An Environment that also exposes its ground truth and a reference policy."""

    @property
    def ground_truth(self) -> Any:
        """The instance's hidden answer (shown behind a toggle; never sent to the agent)."""
        ...

    def reference_action(self) -> dict[str, Any] | None:
        """The next action of the reference policy; None once the episode is done."""
        ...
