"""The one transcript model: a stored trajectory as the stages read it (viewer, labelers).

    t.id, t.task_id, t.success, t.trajectory["dataset"]    # the stored row
    t.messages[i]["idx"], ["role"], ["content"]            # messages as stored
    t.calls, t.agent_calls(), t.user_calls()               # every tool call, in order
    t.expected_agent, t.expected_user                      # the benchmark's expected actions

Design decisions
- One `Call` and one `Transcript` for every stage, read from the store by the one reader
  (`trace_lib.trajectories.load_transcripts`, the same four queries that build the pydantic
  `Trajectory`). Stages add only their extras (`explore.transcript_loading` puts each message's
  `tool_calls` and `is_error` on for the viewer) and their rendering (plain text for
  prompts, escaped HTML for the page); so a labeler's evidence and the page's view speak
  of the same calls.
- `trajectory` is the stored row as a dict (whatever columns the loader read), and the
  header fields are properties over it, so a loader that reads more columns needs no new
  field here.
- Expected actions carry their `requestor`: the agent's and the user's (tau2 telecom's
  device actions) are kept in one list in file order and split by the two properties, so
  a user-side miss is never read as the agent lacking a capability, nor hidden.
- A call's identity for comparisons is `key`: its name plus the canonical JSON of its
  arguments (sorted keys, compact), so key order never makes two equal calls differ.
- A call is paired with the tool message that answers it (`pair_results`): by call id
  when the file has ids, else by position inside the run of tool messages that directly
  follows the calling message (the k-th unanswered call of a name takes the next tool
  message of that name or of no name). A result is never guessed across a later turn, so
  a call that got no answer stays unpaired and its stray tool message shows on its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

AGENT_REQUESTORS = (None, "assistant", "agent")


def canonical_json(value: Any) -> str:
    """Sorted-key compact JSON (a JSON string is parsed first; other text stays as it is)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass
class Call:
    name: str
    arguments: Any = None
    error: str | None = None
    message_idx: int | None = None
    requestor: str | None = None  # assistant | user | None (unknown: counted as the agent's)
    call_idx: int = 0
    call_id: str | None = None
    result: str | None = None  # the tool message that answers it, when the loader matched one
    result_idx: int | None = None  # that tool message's idx (the viewer pairs the two)

    @property
    def key(self) -> str:
        return f"{self.name}({canonical_json(self.arguments)})"

    @property
    def by_agent(self) -> bool:
        return self.requestor in AGENT_REQUESTORS


@dataclass
class Transcript:
    trajectory: dict[str, Any]  # the stored row: id, dataset_id, task_id, success, meta, ...
    messages: list[dict[str, Any]]  # idx, role, content, name, tool_call_id (+ loader extras)
    calls: list[Call] = field(default_factory=list)  # every tool call, in message order
    expected: list[Call] = field(default_factory=list)  # expected actions, both sides

    @property
    def id(self) -> str:
        return str(self.trajectory["id"])

    @property
    def dataset_id(self) -> str | None:
        return self.trajectory.get("dataset_id")

    @property
    def source_id(self) -> str | None:
        return self.trajectory.get("source_id")

    @property
    def task_id(self) -> str | None:
        return self.trajectory.get("task_id")

    @property
    def domain(self) -> str | None:
        return self.trajectory.get("domain")

    @property
    def success(self) -> bool | None:
        return self.trajectory.get("success")

    @property
    def reward(self) -> float | None:
        return self.trajectory.get("reward")

    @property
    def termination(self) -> str | None:
        return self.trajectory.get("termination")

    @property
    def meta(self) -> dict[str, Any]:
        meta = self.trajectory.get("meta")
        if isinstance(meta, str):
            try:
                meta = json.loads(meta)
            except ValueError:
                meta = None
        return meta if isinstance(meta, dict) else {}

    @property
    def expected_agent(self) -> list[Call]:
        return [c for c in self.expected if c.by_agent]

    @property
    def expected_user(self) -> list[Call]:
        return [c for c in self.expected if c.requestor == "user"]

    def agent_calls(self) -> list[Call]:
        return [c for c in self.calls if c.by_agent]

    def user_calls(self) -> list[Call]:
        return [c for c in self.calls if c.requestor == "user"]


def pair_results(messages: list[dict[str, Any]], calls: list[Call]) -> dict[int, int]:
    """Position in `calls` -> idx of the tool message answering that call (see above)."""
    tools = [m for m in messages if m.get("role") == "tool"]
    by_id: dict[str, int] = {}
    for m in tools:
        if m.get("tool_call_id"):
            by_id.setdefault(str(m["tool_call_id"]), m["idx"])
    used: set[int] = set()
    out: dict[int, int] = {}
    for i, c in enumerate(calls):
        hit = by_id.get(str(c.call_id)) if c.call_id else None
        if hit is not None and hit not in used:
            out[i] = hit
            used.add(hit)
    claimed = {str(c.call_id) for c in calls if c.call_id}
    order = [m["idx"] for m in messages]
    pos = {idx: k for k, idx in enumerate(order)}
    role_at = {m["idx"]: m for m in messages}
    for i, c in enumerate(calls):
        if i in out or c.message_idx is None or c.message_idx not in role_at:
            continue
        # the contiguous tool messages right after the calling message
        for idx in order[pos[c.message_idx] + 1:]:
            m = role_at[idx]
            if m.get("role") != "tool":
                break
            if idx in used or (m.get("tool_call_id") and str(m["tool_call_id"]) in claimed):
                continue
            if m.get("name") in (None, "", c.name):
                out[i] = idx
                used.add(idx)
                break
    return out
