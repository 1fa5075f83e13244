"""The one way to read trajectories from the store into `data_model.Trajectory`.

    with store.connect(db, read_only=True) as con:
        st = load_trajectory(con, "t_0123abcd")        # StoredTrajectory
    st.trajectory.messages[0].content; st.expected_actions; chat_messages(st.trajectory)

Design decisions
- This module sits beside the store and takes a duck-typed connection: it imports
  neither `trace_lib.store` nor DuckDB, because the label job loads transcripts through
  it (import contract). So its four queries live here, not in `store.trajectories`.
- One loader, set-based: `load_trajectories(con, ids)` reads any number of trajectories
  with four queries (heads, messages, tool calls, expected actions), not four per id, so
  labelers over thousands of trajectories and a page opening one use the same code.
- One reading of the rows (`read_rows`), two shapes built from it: the pydantic
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

import json
from dataclasses import dataclass, field
from typing import Any

from trace_lib.data_model import ExpectedAction, Message, ToolCall, Trajectory, outcome_of
from trace_lib.errors import UserInputError
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


def json_value(value: Any) -> Any:
    """A stored JSON column as DuckDB returns it, parsed: JSON text parsed; anything else (a
    parsed value, text that is not JSON) as it is. `store` reads its JSON columns with it
    too (this module may not import the store: the label job loads through it)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def json_object(value: Any) -> dict[str, Any]:
    value = json_value(value)
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


@dataclass
class TrajectoryRows:
    """The store's rows of some trajectories, keyed by store id: what every loader builds on."""

    heads: dict[str, dict[str, Any]]  # every trajectories column, `meta` parsed, + `dataset`
    # idx, role, content, tool_call_id, name, turn_idx, meta (a dict, or None: not measured)
    messages: dict[str, list[dict[str, Any]]]
    calls: dict[str, list[dict[str, Any]]]  # message_idx, call_idx, call_id, name, arguments, ...
    expected: dict[str, list[dict[str, Any]]]  # name, arguments, requestor (file order)


def read_rows(con: Any, store_ids: list[str]) -> TrajectoryRows:
    """The four set-based queries (heads, messages, tool calls, expected actions) for
    `store_ids`; unknown ids are simply absent from `heads`."""
    wanted = sorted(set(store_ids))
    cur = con.execute(
        "SELECT t.*, d.name AS dataset FROM trajectories t "
        "JOIN (SELECT unnest(?::VARCHAR[]) AS id) w USING (id) "
        "LEFT JOIN datasets d ON d.id = t.dataset_id", [wanted])
    cols = [c[0] for c in cur.description]
    heads = {}
    for row in cur.fetchall():
        head = dict(zip(cols, row, strict=True))
        head["meta"] = json_object(head.get("meta"))
        heads[head["id"]] = head
    # A store opened read-only is not migrated: older files lack later columns.
    have = {(t, c) for t, c in con.execute(
        "SELECT table_name, column_name FROM information_schema.columns WHERE "
        "(table_name, column_name) IN (('expected_actions', 'requestor'), ('messages', 'meta'))"
    ).fetchall()}
    meta_col = "m.meta" if ("messages", "meta") in have else "NULL"
    msgs: dict[str, list[dict[str, Any]]] = {tid: [] for tid in heads}
    for tid, idx, role, content, tcid, name, turn, meta in con.execute(
            "SELECT m.trajectory_id, m.idx, m.role, m.content, m.tool_call_id, m.name, "
            f"m.turn_idx, {meta_col} FROM messages m JOIN (SELECT unnest(?::VARCHAR[]) AS id) w "
            "ON w.id = m.trajectory_id ORDER BY m.trajectory_id, m.idx", [wanted]).fetchall():
        msgs[tid].append({"idx": idx, "role": role, "content": content, "tool_call_id": tcid,
                          "name": name, "turn_idx": turn,
                          "meta": None if meta is None else json_object(meta) or None})
    calls: dict[str, list[dict[str, Any]]] = {tid: [] for tid in heads}
    for tid, midx, cidx, cid, name, args, req, err in con.execute(
            "SELECT c.trajectory_id, c.message_idx, c.call_idx, c.call_id, c.name, c.arguments, "
            "c.requestor, c.error FROM tool_calls c JOIN (SELECT unnest(?::VARCHAR[]) AS id) w "
            "ON w.id = c.trajectory_id ORDER BY c.trajectory_id, c.message_idx, c.call_idx",
            [wanted]).fetchall():
        calls[tid].append({"message_idx": midx, "call_idx": cidx, "call_id": cid, "name": name,
                           "arguments": json_object(args), "requestor": req, "error": err})
    req_col = "e.requestor" if ("expected_actions", "requestor") in have else "NULL"
    expected: dict[str, list[dict[str, Any]]] = {tid: [] for tid in heads}
    for tid, name, args, requestor in con.execute(
            f"SELECT t.id, e.name, e.arguments, {req_col} FROM trajectories t "
            "JOIN (SELECT unnest(?::VARCHAR[]) AS id) w USING (id) "
            "JOIN expected_actions e ON e.dataset_id = t.dataset_id AND e.task_id = t.task_id "
            "ORDER BY t.id, e.idx", [wanted]).fetchall():
        expected[tid].append({"name": name, "arguments": json_object(args), "requestor": requestor})
    return TrajectoryRows(heads, msgs, calls, expected)


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
                            turn_idx=m["turn_idx"], meta=m["meta"])
                    for m in rows.messages[tid]]
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


def load_transcript(con: Any, trajectory_id: str) -> Transcript:
    return load_transcripts(con, [trajectory_id])[0]


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
