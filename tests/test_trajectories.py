"""The one store -> `Trajectory` loader, on a real DuckDB file filled by the real importer."""

from __future__ import annotations

import json

import pytest

from trace_lib import store
from trace_lib.data_model import Trajectory
from trace_lib.errors import UserInputError
from trace_lib.store.trajectories import domain_tool_schemas
from trace_lib.trajectories import (
    chat_messages,
    excerpt,
    load_trajectories,
    load_trajectory,
    load_transcripts,
)
from trace_lib.workbench import data

RECORD = {
    "id": "run-7", "task_id": "t1", "reward": 0.0, "domain": "shop",
    "messages": [
        {"role": "system", "content": "be careful"},
        {"role": "user", "content": "refund order 12"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_order", "arguments": json.dumps({"id": 12})}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "get_order", "content": "not found"},
        {"role": "assistant", "content": "I could not find it."},
    ],
    "expected_actions": [{"name": "get_order", "arguments": {"id": 12}},
                         {"name": "refund", "arguments": {"id": 12}}],
}


@pytest.fixture
def stored(db_path, tmp_path) -> str:
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps(RECORD) + "\n")
    data.import_files([path], db=db_path, fmt="openai_jsonl")
    with store.connect(db_path, read_only=True) as con:
        return con.execute("SELECT id FROM trajectories").fetchone()[0]


def test_one_trajectory_round_trips_into_the_model(db_path, stored):
    with store.connect(db_path, read_only=True) as con:
        st = load_trajectory(con, stored)
        by_source = load_trajectory(con, "run-7")  # the file's own id works too
        tools = domain_tool_schemas(con, "shop")
    t = st.trajectory
    assert isinstance(t, Trajectory) and st.id == stored == by_source.id
    assert [m.role for m in t.messages] == ["system", "user", "assistant", "tool", "assistant"]
    call = t.messages[2].tool_calls[0]
    assert (call.name, call.arguments, call.call_id) == ("get_order", {"id": 12}, "c1")
    assert t.task_id == "t1" and t.success is False and st.outcome == "failure"
    assert [a.name for a in st.expected_actions] == ["get_order", "refund"]
    assert [s["function"]["name"] for s in tools] == ["get_order"]  # inferred from the call


def test_views_for_a_replay_and_a_prompt(db_path, stored):
    with store.connect(db_path, read_only=True) as con:
        t = load_trajectory(con, stored).trajectory
    msgs = chat_messages(t)
    assert msgs[2]["tool_calls"][0]["function"] == {"name": "get_order", "arguments": {"id": 12}}
    assert msgs[3] == {"role": "tool", "content": "not found", "tool_call_id": "c1",
                       "name": "get_order"}
    assert excerpt(t, max_line=12).splitlines()[1] == "user: refund"


def test_many_at_once_in_order_and_unknown_ids_named(db_path, stored):
    with store.connect(db_path, read_only=True) as con:
        assert [s.id for s in load_trajectories(con, [stored, stored])] == [stored, stored]
        assert load_trajectories(con, []) == []
        with pytest.raises(UserInputError, match="nope"):
            load_trajectories(con, [stored, "nope"])


def test_transcripts_and_trajectories_are_one_reading_of_the_rows(db_path, stored):
    """The labelers' and the viewer's `Transcript` and the pydantic `Trajectory` come from
    the same rows: same messages, calls (paired with their answers) and expected actions."""
    from trace_lib.explore.transcript_loading import load_transcript as viewer_transcript
    from trace_lib.trajectories import load_transcript as labeler_transcript

    with store.connect(db_path, read_only=True) as con:
        st = load_trajectory(con, stored)
        (t,) = load_transcripts(con, [stored])
        labeler, viewer = labeler_transcript(con, stored), viewer_transcript(con, stored)
        with pytest.raises(UserInputError, match="'nope': not in the store"):
            load_transcripts(con, ["nope"])
    for tr in (t, labeler, viewer):
        assert tr.id == stored and tr.trajectory["dataset"] and tr.task_id == "t1"
        assert [m["role"] for m in tr.messages] == [m.role for m in st.trajectory.messages]
        assert [m["content"] for m in tr.messages] == [m.content for m in st.trajectory.messages]
        assert [(c.name, c.arguments, c.call_id, c.result) for c in tr.calls] == [
            ("get_order", {"id": 12}, "c1", "not found")]
        assert [(e.name, e.arguments) for e in tr.expected] == [
            (a.name, a.arguments) for a in st.expected_actions]
    # the viewer's extras sit on top of the same messages
    assert [len(m["tool_calls"]) for m in viewer.messages] == [0, 0, 1, 0, 0]
    assert viewer.messages[2]["tool_calls"][0] is viewer.calls[0]
