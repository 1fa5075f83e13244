"""The one way to read trajectories from the store into `data_model.Trajectory`.

    with store.connect(db, read_only=True) as con:
        st = load_trajectory(con, "t_0123abcd")        # StoredTrajectory
    st.trajectory.messages[0].content; st.expected_actions; chat_messages(st.trajectory)

Design decisions
- One loader, set-based: `load_trajectories(con, ids)` reads any number of trajectories
  with four queries (heads, messages, tool calls, expected actions), not four per id, so
  labelers over thousands of trajectories and a page opening one use the same code.
- What the store knows beyond the file's record (the row id, the dataset, the benchmark's
  expected actions) travels beside the pydantic `Trajectory` in `StoredTrajectory`, so the
  model stays the importers' normalised shape.
- An id may be the store id or the id in the imported file (`source_id`), as everywhere
  else; an unknown id is a `UserInputError` naming it and the database.
- Views for a purpose (OpenAI chat messages for a replay, a short text excerpt for a
  prompt) are pure functions over the model, here beside the loader.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from trace_lib.data_model import ExpectedAction, Message, ToolCall, Trajectory, outcome_of
from trace_lib.errors import UserInputError


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


def _loads(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _as_dict(value: Any) -> dict[str, Any]:
    value = _loads(value)
    return value if isinstance(value, dict) else {}


def resolve_ids(con: Any, ids: list[str]) -> dict[str, str]:
    """Map each given id (store id or source id) to the store id; unknown ids are left out."""
    rows = con.execute(
        "SELECT w.id, t.id FROM (SELECT unnest(?::VARCHAR[]) AS id) w "
        "JOIN trajectories t ON t.id = w.id OR t.source_id = w.id", [ids]).fetchall()
    out: dict[str, str] = {}
    for given, tid in rows:
        out.setdefault(given, tid)  # the store id wins over another row's source_id
        if given == tid:
            out[given] = tid
    return out


def load_trajectories(con: Any, ids: list[str]) -> list[StoredTrajectory]:
    """The trajectories `ids` (store or source ids), in that order."""
    if not ids:
        return []
    mapping = resolve_ids(con, list(ids))
    missing = [i for i in ids if i not in mapping]
    if missing:
        raise UserInputError(f"trajectory id(s) not in the store: {', '.join(missing[:5])}")
    wanted = sorted(set(mapping.values()))
    heads = con.execute(
        "SELECT t.id, t.dataset_id, t.source_id, t.task_id, t.trial, t.agent_model, t.domain, "
        "t.reward, t.success, t.outcome, t.termination, t.meta "
        "FROM trajectories t JOIN (SELECT unnest(?::VARCHAR[]) AS id) w USING (id)",
        [wanted]).fetchall()
    msgs: dict[str, list[dict[str, Any]]] = {h[0]: [] for h in heads}
    for tid, idx, role, content, tcid, name, turn in con.execute(
            "SELECT m.trajectory_id, m.idx, m.role, m.content, m.tool_call_id, m.name, "
            "m.turn_idx FROM messages m JOIN (SELECT unnest(?::VARCHAR[]) AS id) w "
            "ON w.id = m.trajectory_id ORDER BY m.trajectory_id, m.idx", [wanted]).fetchall():
        msgs[tid].append({"idx": idx, "role": role, "content": content, "tool_call_id": tcid,
                          "name": name, "turn_idx": turn, "tool_calls": []})
    by_idx = {tid: {m["idx"]: m for m in ms} for tid, ms in msgs.items()}
    for tid, midx, cid, name, args, req, err in con.execute(
            "SELECT c.trajectory_id, c.message_idx, c.call_id, c.name, c.arguments, "
            "c.requestor, c.error FROM tool_calls c JOIN (SELECT unnest(?::VARCHAR[]) AS id) w "
            "ON w.id = c.trajectory_id ORDER BY c.trajectory_id, c.message_idx, c.call_idx",
            [wanted]).fetchall():
        msg = by_idx[tid].get(midx)
        if msg is not None:
            msg["tool_calls"].append(ToolCall(name=name, arguments=_as_dict(args), call_id=cid,
                                              requestor=req, error=err))
    expected: dict[str, list[ExpectedAction]] = {h[0]: [] for h in heads}
    for tid, name, args, requestor in con.execute(
            "SELECT t.id, e.name, e.arguments, e.requestor FROM trajectories t "
            "JOIN (SELECT unnest(?::VARCHAR[]) AS id) w USING (id) "
            "JOIN expected_actions e ON e.dataset_id = t.dataset_id AND e.task_id = t.task_id "
            "ORDER BY t.id, e.idx", [wanted]).fetchall():
        expected[tid].append(ExpectedAction(name=name, arguments=_as_dict(args),
                                            requestor=requestor))
    loaded: dict[str, StoredTrajectory] = {}
    for tid, dsid, sid, task, trial, agent, domain, reward, success, outcome, term, meta in heads:
        messages = [Message(role=m["role"], content=m["content"], tool_calls=m["tool_calls"],
                            tool_call_id=m["tool_call_id"], name=m["name"],
                            turn_idx=m["turn_idx"]) for m in msgs[tid]]
        traj = Trajectory(source_id=sid, task_id=task, trial=trial, agent_model=agent,
                          domain=domain, reward=reward, success=success,
                          outcome=outcome or outcome_of(success), termination=term,
                          messages=messages, meta=_as_dict(meta))
        loaded[tid] = StoredTrajectory(tid, dsid, traj, expected[tid])
    return [loaded[mapping[i]] for i in ids]


def load_trajectory(con: Any, trajectory_id: str) -> StoredTrajectory:
    return load_trajectories(con, [trajectory_id])[0]


def domain_tool_schemas(con: Any, domain: str | None) -> list[dict[str, Any]]:
    """The tool schemas the store keeps for `domain` (given or inferred), by name."""
    if not domain:
        return []
    rows = con.execute("SELECT schema FROM tool_schemas WHERE domain = ? ORDER BY name",
                       [domain]).fetchall()
    return [_loads(r[0]) for r in rows]


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
