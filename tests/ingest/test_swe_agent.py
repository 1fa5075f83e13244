"""SWE-agent .traj importer: function-calling and thought-action runs, success files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trace_lib import store
from trace_lib.errors import UserInputError
from trace_lib.ingest import ingest_paths
from trace_lib.ingest.swe_agent import load_success_file, termination_from_exit


def function_calling_run(exit_status: str = "submitted") -> dict:
    return {
        "trajectory": [
            {
                "action": "ls",
                "observation": "a.py",
                "response": "Let me look.",
                "thought": "Let me look.",
                "state": {},
            }
        ],
        "history": [
            {
                "role": "system",
                "content": "SETTING: you are in a repo",
                "agent": "main",
                "message_type": "system_prompt",
            },
            {
                "role": "user",
                "content": [{"type": "text", "text": "<issue>fix the bug</issue>"}],
                "agent": "main",
                "message_type": "observation",
            },
            {
                "role": "assistant",
                "content": "Let me look.",
                "thought": "Let me look.",
                "action": "ls",
                "agent": "main",
                "message_type": "action",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"command": "ls"}'},
                    }
                ],
            },
            {
                "role": "tool",
                "content": [{"type": "text", "text": "OBSERVATION:\na.py"}],
                "agent": "main",
                "message_type": "observation",
                "tool_call_ids": ["call_1"],
            },
            {
                "role": "assistant",
                "content": "Done.",
                "thought": "Done.",
                "action": "submit",
                "agent": "main",
                "message_type": "action",
                "tool_calls": [
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "submit", "arguments": "{}"},
                    }
                ],
            },
            {
                "role": "tool",
                "content": "diff --git a/a.py b/a.py",
                "agent": "main",
                "message_type": "observation",
                "tool_call_ids": ["call_2"],
            },
        ],
        "info": {
            "exit_status": exit_status,
            "submission": "diff --git a/a.py b/a.py",
            "model_stats": {"instance_cost": 0.1, "api_calls": 2},
        },
        "replay_config": json.dumps({"agent": {"model": {"name": "claude-sonnet"}}}),
        "environment": "main",
    }


def thought_action_run() -> dict:
    return {
        "trajectory": [],
        "history": [
            {"role": "system", "content": "You are an autonomous programmer.", "agent": "primary"},
            {"role": "user", "content": "demo issue", "agent": "primary", "is_demo": True},
            {"role": "assistant", "content": "demo answer", "agent": "primary", "is_demo": True},
            {
                "role": "user",
                "content": "We're solving this issue: crash on empty input",
                "agent": "primary",
            },
            {
                "role": "assistant",
                "content": "Open the file.\n```\nopen src/app.py 10\n```",
                "thought": "Open the file.",
                "action": "open src/app.py 10\n",
                "agent": "primary",
            },
            {
                "role": "user",
                "content": "[File: src/app.py (40 lines total)]",
                "agent": "primary",
                "message_type": "observation",
            },
            {
                "role": "assistant",
                "content": "Submit.\n```\nsubmit\n```",
                "action": "submit\n",
                "agent": "primary",
            },
            {
                "role": "user",
                "content": "(Open file: src/app.py)",
                "agent": "primary",
                "message_type": "observation",
            },
        ],
        "info": {"exit_status": "exit_cost"},
    }


def write(tmp_path: Path, name: str, doc: dict) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def test_function_calling_run(tmp_path: Path, db_path: Path) -> None:
    path = write(tmp_path, "django__django-11099.traj", function_calling_run())
    report = ingest_paths([path], db=db_path)
    assert report.formats == {str(path): "swe_agent"} and report.unknown == 1
    with store.connect(db_path, read_only=True) as con:
        t = con.execute(
            "SELECT task_id, agent_model, success, termination, n_messages, n_tool_calls, meta "
            "FROM trajectories"
        ).fetchone()
        msgs = con.execute(
            "SELECT role, content, tool_call_id, name FROM messages ORDER BY idx"
        ).fetchall()
        calls = con.execute(
            "SELECT name, arguments, call_id FROM tool_calls ORDER BY message_idx"
        ).fetchall()
    assert t[:6] == ("django__django-11099", "claude-sonnet", None, "agent_stop", 6, 2)
    assert json.loads(t[6])["exit_status"] == "submitted"
    assert msgs[1] == ("user", "<issue>fix the bug</issue>", None, None)
    assert msgs[3] == ("tool", "OBSERVATION:\na.py", "call_1", "bash")
    assert [(n, json.loads(a), c) for n, a, c in calls] == [
        ("bash", {"command": "ls"}, "call_1"),
        ("submit", {}, "call_2"),
    ]


def test_thought_action_run_turns_commands_into_calls(tmp_path: Path, db_path: Path) -> None:
    path = write(tmp_path, "astropy__astropy-12907.traj", thought_action_run())
    ingest_paths([path], db=db_path)
    with store.connect(db_path, read_only=True) as con:
        t = con.execute("SELECT termination, n_messages, meta FROM trajectories").fetchone()
        msgs = con.execute("SELECT role, name FROM messages ORDER BY idx").fetchall()
        calls = con.execute(
            "SELECT name, arguments FROM tool_calls ORDER BY message_idx"
        ).fetchall()
    assert t[0] == "max_steps" and json.loads(t[2])["n_demo_messages"] == 2
    assert msgs == [
        ("system", None),
        ("user", None),
        ("assistant", None),
        ("tool", "open"),
        ("assistant", None),
        ("tool", "submit"),
    ]
    assert [(n, json.loads(a)) for n, a in calls] == [
        ("open", {"command": "open src/app.py 10"}),
        ("submit", {"command": "submit"}),
    ]


def test_success_file_forms(tmp_path: Path, db_path: Path) -> None:
    a = write(tmp_path, "a__a-1.traj", function_calling_run())
    b = write(tmp_path, "b__b-2.traj", function_calling_run("submitted (exit_cost)"))
    c = write(tmp_path, "c__c-3.traj", thought_action_run())
    listed = write(tmp_path, "resolved.json", ["a__a-1"])  # type: ignore[arg-type]
    report = ingest_paths([a, b, c], db=db_path, success_file=listed)
    assert (report.successes, report.failures, report.unknown) == (1, 2, 0)
    partial = load_success_file(write(tmp_path, "m.json", {"a__a-1": False}))
    assert (partial.lookup("a__a-1"), partial.lookup("b__b-2")) == (False, None)
    swebench = load_success_file(
        write(tmp_path, "r.json", {"resolved_ids": ["b__b-2"], "unresolved_ids": ["a__a-1"]})
    )
    assert (swebench.lookup("a__a-1"), swebench.lookup("b__b-2"), swebench.lookup("c")) == (
        False,
        True,
        None,
    )
    with pytest.raises(UserInputError, match=r"instance 'x': expected true/false"):
        load_success_file(write(tmp_path, "bad.json", {"x": "yes"}))


def test_exit_status_mapping() -> None:
    assert termination_from_exit("submitted (exit_context)") == "agent_stop"
    assert termination_from_exit("exit_total_execution_time") == "max_steps"
    assert termination_from_exit("exit_format") == "error"
    assert termination_from_exit(None) is None


def test_steps_are_used_when_the_history_is_empty(tmp_path: Path, db_path: Path) -> None:
    doc = {
        "trajectory": [
            {"thought": "List files.", "action": "ls -la\n", "observation": "a.py\nb.py"},
            {"response": "Done.", "action": "submit", "observation": "diff --git a/a.py"},
        ],
        "history": [],
        "info": {"exit_status": "exit_format"},
    }
    ingest_paths([write(tmp_path, "x__y-1.traj", doc)], db=db_path)
    with store.connect(db_path, read_only=True) as con:
        term = con.execute("SELECT termination FROM trajectories").fetchone()[0]
        msgs = con.execute("SELECT role, content, name FROM messages ORDER BY idx").fetchall()
        calls = con.execute(
            "SELECT name, arguments FROM tool_calls ORDER BY message_idx"
        ).fetchall()
    assert term == "error"
    assert msgs == [
        ("assistant", "List files.", None),
        ("tool", "a.py\nb.py", "ls"),
        ("assistant", "Done.", None),
        ("tool", "diff --git a/a.py", "submit"),
    ]
    assert [(n, json.loads(a)) for n, a in calls] == [
        ("ls", {"command": "ls -la"}),
        ("submit", {"command": "submit"}),
    ]


def test_a_bad_traj_file_is_skipped_whole_with_skip_invalid(tmp_path: Path, db_path: Path) -> None:
    good = write(tmp_path, "g__g-1.traj", function_calling_run())
    bad_doc = function_calling_run()
    bad_doc["history"][2]["tool_calls"][0]["function"]["name"] = 5
    bad = write(tmp_path, "b__b-1.traj", bad_doc)
    with pytest.raises(
        UserInputError,
        match=r"b__b-1.traj: record 0: field 'history\[2\].tool_calls\[0\].function.name'",
    ):
        ingest_paths([good, bad], db=db_path)
    report = ingest_paths([good, bad], db=db_path, skip_invalid=True)
    assert report.trajectories == 1 and [(s.file, s.record) for s in report.skipped] == [
        (str(bad), 0)
    ]
