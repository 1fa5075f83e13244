"""The one way to read trajectories from the store into `data_model.Trajectory`.

    with store.connect(db, read_only=True) as con:
        st = load_trajectory(con, "t_0123abcd")        # StoredTrajectory
    st.trajectory.messages[0].content; st.expected_actions; chat_messages(st.trajectory)

Design decisions
- One loader, set-based: `load_trajectories(con, ids)` reads any number of trajectories
  with four queries (heads, messages, tool calls, expected actions), not four per id, so
  labelers over thousands of trajectories and a page opening one use the same code.
- One reading of the rows (`store.trajectories.read_rows`, the SQL), two shapes built from it: the pydantic
  `Trajectory` (`load_trajectories`, for replay and prompts) and the `Transcript` the
  labelers and the viewer read (`load_transcripts`, no pydantic objects: labeling reads
  thousands). No other module queries messages or tool calls to rebuild a trajectory.
- What the store knows beyond the file's record (the row id, the dataset, the benchmark's
  expected actions) travels beside the pydantic `Trajectory` in `StoredTrajectory`, so the
  model stays the importers' normalised shape.
- An id may be the store id or the id in the imported file (`source_id`), as everywhere
  else; an unknown id is a `UserInputError` naming it and the database.
- Views for a purpose (OpenAI chat messages for a replay, a short text excerpt for a
  prompt) are pure functions over the model, here beside the loader.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trace_lib.data_model import ExpectedAction, Message, ToolCall, Trajectory, outcome_of
from trace_lib.errors import UserInputError
from trace_lib.store.trajectories import read_rows, resolve_ids
from trace_lib.transcript_model import Call, Transcript, pair_results


@dataclass
class StoredTrajectory:
    id: str
    dataset_id: str
    trajectory: Trajectory
    expected_actions: list[ExpectedAction] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        """success | failure | unknown | error (a run the harness crashed on)."""
        return self.trajectory.outcome or outcome_of(self.trajectory.success)


def _missing_error(missing: list[str]) -> UserInputError:
    if len(missing) == 1:
        return UserInputError(f"trajectory {missing[0]!r}: not in the store")
    return UserInputError(f"trajectory id(s) not in the store: {', '.join(missing[:5])}")


def load_trajectories(con: Any, ids: list[str]) -> list[StoredTrajectory]:
    """The trajectories `ids` (store or source ids), in that order."""
    if not ids:
        return []
    mapping = resolve_ids(con, list(ids))
    missing = [i for i in ids if i not in mapping]
    if missing:
        raise _missing_error(missing)
    rows = read_rows(con, list(mapping.values()))
    loaded: dict[str, StoredTrajectory] = {}
    for tid, h in rows.heads.items():
        calls_at: dict[int, list[ToolCall]] = {}
        for c in rows.calls[tid]:
            calls_at.setdefault(c["message_idx"], []).append(ToolCall(
                name=c["name"], arguments=c["arguments"], call_id=c["call_id"],
                requestor=c["requestor"], error=c["error"]))
        messages = [Message(role=m["role"], content=m["content"],
                            tool_calls=calls_at.get(m["idx"], []),
                            tool_call_id=m["tool_call_id"], name=m["name"],
                            turn_idx=m["turn_idx"]) for m in rows.messages[tid]]
        traj = Trajectory(source_id=h["source_id"], task_id=h["task_id"], trial=h["trial"],
                          agent_model=h["agent_model"], domain=h["domain"], reward=h["reward"],
                          success=h["success"],
                          outcome=h.get("outcome") or outcome_of(h["success"]),
                          termination=h["termination"], messages=messages, meta=h["meta"])
        loaded[tid] = StoredTrajectory(tid, h["dataset_id"], traj, [
            ExpectedAction(**e) for e in rows.expected[tid]])
    return [loaded[mapping[i]] for i in ids]


def load_transcripts(con: Any, store_ids: list[str]) -> list[Transcript]:
    """`Transcript`s (the labelers' and the viewer's model) for store ids, in that order:
    the same rows as `load_trajectories`, without building pydantic objects (labeling reads
    thousands), each call paired with the tool message answering it."""
    if not store_ids:
        return []
    rows = read_rows(con, list(store_ids))
    missing = [i for i in store_ids if i not in rows.heads]
    if missing:
        raise _missing_error(missing)
    out: dict[str, Transcript] = {}
    for tid, head in rows.heads.items():
        t = Transcript(trajectory=head, messages=rows.messages[tid],
                       calls=[Call(**c) for c in rows.calls[tid]],
                       expected=[Call(**e) for e in rows.expected[tid]])
        contents = {m["idx"]: m["content"] for m in t.messages}
        for i, idx in pair_results(t.messages, t.calls).items():
            t.calls[i].result_idx, t.calls[i].result = idx, contents[idx]
        out[tid] = t
    return [out[i] for i in store_ids]


def load_trajectory(con: Any, trajectory_id: str) -> StoredTrajectory:
    return load_trajectories(con, [trajectory_id])[0]


# ------------------------------------------------------------------------------ views


def chat_messages(traj: Trajectory) -> list[dict[str, Any]]:
    """The trajectory as OpenAI chat messages (what a model replays it as)."""
    out: list[dict[str, Any]] = []
    for m in traj.messages:
        msg: dict[str, Any] = {"role": m.role, "content": m.content or ""}
        if m.role == "assistant" and m.tool_calls:
            msg["tool_calls"] = [{"id": c.call_id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}}
                                 for c in m.tool_calls]
        if m.role == "tool":
            msg["tool_call_id"] = m.tool_call_id
            msg["name"] = m.name
        out.append(msg)
    return out


def excerpt(traj: Trajectory, max_line: int = 400) -> str:
    """`role: content` lines, each cut to `max_line` characters (a prompt's example)."""
    return "\n".join(f"{m.role}: {m.content or ''}"[:max_line] for m in traj.messages)
