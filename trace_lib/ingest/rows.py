"""`TrajectoryRows`: one trajectory as the writer stores it, plain tuples instead of models.

Design decisions
- The writer needs each trajectory's fields, its messages and its calls as row values, and
  hashes exactly those values (writer.py `_digest`). Importers may hand it either a
  validated `Trajectory` (pydantic, data_model.py) or a `TrajectoryRows`; the writer turns
  the first into the second (`from_trajectory`) and from then on walks tuples only, once
  for the hash and once for the rows.
- Why a second shape at all: building the pydantic objects (1 Trajectory + ~3.5 Message +
  ~1 ToolCall per record) was ~1 s of CPU per 100k records, and nothing after the
  importer needs objects. An importer whose records are checked field by field anyway
  (openai_jsonl.py's fast path) builds these rows directly and skips the models. Plain
  Python objects in their place did not help (measured before: 16.7-17.9 us against
  pydantic's 15-16 us per trajectory): the saving is in not building per-message objects.
- Tuples, not objects, per message, lists per call, in the order the content hash reads
  them: message `(role, content, tool_call_id, name, turn_idx, calls)`, call `[name,
  arguments, call_id, requestor, error]` (a list: its error is set when the tool message
  answering it is read, after the call).
- The record-level fields keep `Trajectory`'s names, so code that reads or overrides
  them (`pipeline._overridden` sets `domain` / `agent_model`) works on both shapes.
- What a source measured of a message (tokens, cost, latency: `Message.meta`) is kept
  beside the tuples, by message index (`message_meta`), not in them: most formats have
  none, and the tuples are what the content hash reads (the measurements are not part of
  a trajectory's identity).
- `to_trajectory` is the way back (one validation), for the rare records the writer must
  rewrite (lone surrogates, NaN in arguments) and for callers that want models.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trace_lib.data_model import Trajectory

# [name, arguments, call_id, requestor, error]: a list, because the tool message that
# answers the call comes later and sets its error.
CallRow = list[Any]
# (role, content, tool_call_id, name, turn_idx, calls)
MessageRow = tuple[str, str | None, str | None, str | None, int | None, list[CallRow]]


@dataclass(slots=True)
class TrajectoryRows:
    """A trajectory as row values (see the module docstring); `outcome` is always set."""

    source_id: str | None
    task_id: str | None
    trial: int | None
    agent_model: str | None
    domain: str | None
    reward: float | None
    success: bool | None
    outcome: str
    termination: str | None
    meta: dict[str, Any]
    messages: list[MessageRow] = field(default_factory=list)
    message_meta: dict[int, dict[str, int | float]] = field(default_factory=dict)  # idx -> meta

    @classmethod
    def from_trajectory(cls, t: Trajectory) -> TrajectoryRows:
        return cls(
            t.source_id, t.task_id, t.trial, t.agent_model, t.domain, t.reward, t.success,
            t.outcome or "unknown", t.termination, t.meta,
            [(m.role, m.content, m.tool_call_id, m.name, m.turn_idx,
              [[c.name, c.arguments, c.call_id, c.requestor, c.error] for c in m.tool_calls])
             for m in t.messages],
            {i: m.meta for i, m in enumerate(t.messages) if m.meta},
        )  # fmt: skip

    def to_trajectory(self) -> Trajectory:
        """The same trajectory as a validated model (the writer's rewrite paths use it)."""
        return Trajectory.model_validate({
            "source_id": self.source_id, "task_id": self.task_id, "trial": self.trial,
            "agent_model": self.agent_model, "domain": self.domain, "reward": self.reward,
            "success": self.success, "outcome": self.outcome,
            "termination": self.termination, "meta": self.meta,
            "messages": [
                {"role": role, "content": content, "tool_call_id": tool_call_id, "name": name,
                 "turn_idx": turn_idx, "meta": self.message_meta.get(idx),
                 "tool_calls": [{"name": n, "arguments": a, "call_id": i, "requestor": r,
                                 "error": e} for n, a, i, r, e in calls]}
                for idx, (role, content, tool_call_id, name, turn_idx, calls)
                in enumerate(self.messages)
            ],
        })  # fmt: skip


def as_rows(record: Trajectory | TrajectoryRows) -> TrajectoryRows:
    """What an importer yielded, as rows (models are converted; rows pass through)."""
    return record if type(record) is TrajectoryRows else TrajectoryRows.from_trajectory(record)
