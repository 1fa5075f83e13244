"""Generic OpenAI-messages JSONL importer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trace_lib import store
from trace_lib.errors import UserInputError
from trace_lib.ingest import ingest_paths

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Find an order.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
            },
        },
    }
]


def record(i: int, **extra) -> dict:
    rec = {
        "id": f"r{i}",
        "task_id": f"task{i % 2}",
        "trial": i,
        "agent_model": "m",
        "domain": "shop",
        "reward": float(i % 2),
        "messages": [
            {"role": "system", "content": "You are a shop agent."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "where is"},
                    {"type": "text", "text": "my order?"},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": json.dumps({"order_id": "A1"})},
                    },
                    {
                        "id": "c2",
                        "name": "refund",
                        "arguments": {"order_id": "A1", "amount": i + 0.5},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": '{"status": "shipped"}'},
            {"role": "tool", "tool_call_id": "c2", "content": "Error: refund not allowed"},
            {"role": "assistant", "content": "It has shipped."},
        ],
    }
    rec.update(extra)
    return rec


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_records_normalise_to_the_store(tmp_path: Path, db_path: Path) -> None:
    recs = [
        record(
            0, tools=TOOLS, expected_actions=[{"name": "lookup", "arguments": {"order_id": "A1"}}]
        ),
        record(1),
        record(2, success=False, meta={"seed": 7}),
    ]
    report = ingest_paths([write_jsonl(tmp_path / "runs.jsonl", recs)], db=db_path)
    assert report.to_json()["formats"] == {str(tmp_path / "runs.jsonl"): "openai_jsonl"}
    assert (report.trajectories, report.successes, report.failures) == (3, 1, 2)
    with store.connect(db_path, read_only=True) as con:
        t = con.execute(
            "SELECT task_id, trial, reward, success, termination, n_messages, n_tool_calls, "
            "n_tool_errors, meta FROM trajectories WHERE source_id = 'r2'"
        ).fetchone()
        assert t[:8] == ("task0", 2, 0.0, False, "agent_stop", 6, 2, 1)
        assert json.loads(t[8]) == {"source_format": "openai_jsonl", "seed": 7}
        msgs = con.execute(
            "SELECT role, content, name, turn_idx FROM messages m JOIN trajectories t "
            "ON t.id = m.trajectory_id WHERE t.source_id = 'r0' ORDER BY idx"
        ).fetchall()
        assert msgs[1] == ("user", "where is\nmy order?", None, 1)
        assert msgs[3] == ("tool", '{"status": "shipped"}', "lookup", 1)
        calls = con.execute(
            "SELECT name, arguments, error FROM tool_calls c JOIN trajectories t "
            "ON t.id = c.trajectory_id WHERE t.source_id = 'r0' ORDER BY call_idx"
        ).fetchall()
        assert [(n, json.loads(a), e) for n, a, e in calls] == [
            ("lookup", {"order_id": "A1"}, None),
            ("refund", {"order_id": "A1", "amount": 0.5}, "Error: refund not allowed"),
        ]
        ea = con.execute("SELECT task_id, idx, name, arguments FROM expected_actions").fetchall()
        assert [(a, b, c, json.loads(d)) for a, b, c, d in ea] == [
            ("task0", 0, "lookup", {"order_id": "A1"})
        ]
        schemas = {
            n: (json.loads(s), src)
            for n, s, src in con.execute(
                "SELECT name, schema, source FROM tool_schemas WHERE domain = 'shop'"
            ).fetchall()
        }
    assert schemas["lookup"] == (TOOLS[0], "given")
    refund, source = schemas["refund"]
    assert source == "inferred"
    assert refund["function"]["parameters"] == {
        "type": "object",
        "properties": {"amount": {"type": "number"}, "order_id": {"type": "string"}},
        "required": ["amount", "order_id"],
    }


def test_termination_is_inferred_from_the_last_message(tmp_path: Path, db_path: Path) -> None:
    base = record(0)["messages"]
    recs = [
        {"id": "a", "reward": 1, "messages": base},  # assistant answers last
        {"id": "u", "reward": 0, "messages": base + [{"role": "user", "content": "bye"}]},
        {"id": "m", "reward": 0, "messages": base[:3]},  # cut off with calls pending
        {"id": "e", "reward": 0, "messages": base[:5]},  # a failed tool result last
        {"id": "x", "reward": 0, "termination": "max_turns", "messages": base},
    ]
    ingest_paths([write_jsonl(tmp_path / "t.jsonl", recs)], db=db_path)
    with store.connect(db_path, read_only=True) as con:
        got = dict(con.execute("SELECT source_id, termination FROM trajectories").fetchall())
    assert got == {
        "a": "agent_stop",
        "u": "user_stop",
        "m": "max_steps",
        "e": "error",
        "x": "max_turns",
    }


def test_developer_and_function_roles(tmp_path: Path, db_path: Path) -> None:
    rec = {
        "id": "legacy",
        "success": True,
        "messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": "2+2?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c",
                        "type": "function",
                        "function": {"name": "calc", "arguments": '{"expr": "2+2"}'},
                    }
                ],
            },
            {"role": "function", "name": "calc", "content": "4"},
            {"role": "assistant", "content": "4"},
        ],
    }
    ingest_paths([write_jsonl(tmp_path / "l.jsonl", [rec])], db=db_path)
    with store.connect(db_path, read_only=True) as con:
        roles = [r[0] for r in con.execute("SELECT role FROM messages ORDER BY idx").fetchall()]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]


def test_json_array_and_unparsable_arguments(tmp_path: Path, db_path: Path) -> None:
    rec = record(0)
    rec["messages"][2]["tool_calls"][0]["function"]["arguments"] = (
        '{"order_id": '  # the model's own bad JSON
    )
    path = tmp_path / "runs.json"
    path.write_text(json.dumps([rec]), encoding="utf-8")
    report = ingest_paths([path], db=db_path)
    assert report.formats[str(path)] == "openai_jsonl" and report.trajectories == 1
    with store.connect(db_path, read_only=True) as con:
        args = con.execute("SELECT arguments FROM tool_calls WHERE name = 'lookup'").fetchone()[0]
    assert json.loads(args) == {"_unparsed": '{"order_id": '}


def test_conflicting_expected_actions_for_one_task_are_refused(
    tmp_path: Path, db_path: Path
) -> None:
    recs = [
        record(0, expected_actions=[{"name": "lookup", "arguments": {}}]),
        record(2, expected_actions=[{"name": "refund", "arguments": {}}]),
    ]
    with pytest.raises(
        UserInputError, match=r"record 1 \(line 2\): field 'expected_actions': differ"
    ):
        ingest_paths([write_jsonl(tmp_path / "c.jsonl", recs)], db=db_path)
