"""tau-bench v1 importer on the real historical-trajectories file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trace_lib import store
from trace_lib.ingest import ingest_paths
from trace_lib.ingest.taubench import model_and_domain, termination_from_source

REL = "tau-bench/historical_trajectories/gpt-4o-airline.json"


@pytest.fixture(scope="module")
def imported(shared_data: Path, tmp_path_factory: pytest.TempPathFactory):
    db = tmp_path_factory.mktemp("taubench") / "t.duckdb"
    report = ingest_paths([shared_data / REL], db=db)
    source = json.loads((shared_data / REL).read_text())
    return db, report, source


def test_counts_match_the_readme(imported) -> None:
    db, report, _ = imported
    assert (report.trajectories, report.successes, report.failures, report.unknown) == (
        200,
        84,
        116,
        0,
    )
    assert list(report.formats.values()) == ["tau_bench"]
    with store.connect(db, read_only=True) as con:
        assert con.execute("SELECT count(DISTINCT task_id) FROM trajectories").fetchone()[0] == 50
        assert con.execute("SELECT count(*) FROM tool_calls").fetchone()[0] == 1164
        assert con.execute("SELECT count(*) FROM messages").fetchone()[0] == 5308  # 26.54 * 200
        assert con.execute("SELECT DISTINCT agent_model, domain FROM trajectories").fetchall() == [
            ("gpt-4o", "airline")
        ]
        ends = dict(
            con.execute("SELECT termination, count(*) FROM trajectories GROUP BY 1").fetchall()
        )
    assert ends == {"user_stop": 149, "agent_stop": 48, "max_steps": 3}


def test_trajectories_match_the_source_message_by_message(imported) -> None:
    db, _, source = imported
    with store.connect(db, read_only=True) as con:
        for ep in (source[0], source[57], source[199]):
            tid = con.execute(
                "SELECT id FROM trajectories WHERE task_id = ? AND trial = ?",
                [str(ep["task_id"]), ep["trial"]],
            ).fetchone()[0]
            rows = con.execute(
                "SELECT idx, role, content, tool_call_id, name FROM messages WHERE trajectory_id = ? ORDER BY idx",
                [tid],
            ).fetchall()
            assert len(rows) == len(ep["traj"])
            for i, ((idx, role, content, call_id, name), m) in enumerate(
                zip(rows, ep["traj"], strict=True)
            ):
                assert idx == i
                assert (role, content) == (m["role"], m.get("content"))
                assert call_id == m.get("tool_call_id") and name == m.get("name")
            calls = con.execute(
                "SELECT message_idx, call_id, name, arguments FROM tool_calls WHERE trajectory_id = ? "
                "ORDER BY message_idx, call_idx",
                [tid],
            ).fetchall()
            expected = [
                (i, tc["id"], tc["function"]["name"], json.loads(tc["function"]["arguments"]))
                for i, m in enumerate(ep["traj"])
                for tc in m.get("tool_calls") or []
            ]
            assert [(a, b, c, json.loads(d)) for a, b, c, d in calls] == expected
            reward = con.execute(
                "SELECT reward, success FROM trajectories WHERE id = ?", [tid]
            ).fetchone()
            assert reward == (ep["reward"], ep["reward"] == 1.0)


def test_tool_errors_sit_on_the_calls_they_answer(imported) -> None:
    db, _, source = imported
    n_errors = sum(
        1
        for ep in source
        for m in ep["traj"]
        if m["role"] == "tool" and m["content"].startswith("Error:")
    )
    with store.connect(db, read_only=True) as con:
        assert con.execute("SELECT count(error) FROM tool_calls").fetchone()[0] == n_errors > 0
        assert con.execute("SELECT sum(n_tool_errors) FROM trajectories").fetchone()[0] == n_errors
        # The error text is the tool message that answers the call: in tau-bench each
        # tool-calling message has one call, answered by the next message (ids repeat, so
        # position is the ground truth here).
        bad = con.execute("""
            SELECT count(*) FROM tool_calls c JOIN messages m
              ON m.trajectory_id = c.trajectory_id AND m.idx = c.message_idx + 1
            WHERE coalesce(c.error, '') <> CASE WHEN m.content LIKE 'Error:%' THEN m.content ELSE '' END
        """).fetchone()[0]
        assert bad == 0


def test_expected_actions_and_inferred_schemas(imported) -> None:
    db, _, source = imported
    task0 = next(ep for ep in source if ep["task_id"] == 0)
    with store.connect(db, read_only=True) as con:
        rows = con.execute(
            "SELECT idx, name, arguments FROM expected_actions WHERE task_id = '0' ORDER BY idx"
        ).fetchall()
        assert [(n, json.loads(a)) for _, n, a in rows] == [
            (a["name"], a["kwargs"]) for a in task0["info"]["task"]["actions"]
        ]
        schemas = {
            n: (json.loads(s), src)
            for n, s, src in con.execute(
                "SELECT name, schema, source FROM tool_schemas WHERE domain = 'airline'"
            ).fetchall()
        }
    assert len(schemas) == 14 and all(src == "inferred" for _, src in schemas.values())
    params = schemas["get_user_details"][0]["function"]["parameters"]
    assert params["properties"] == {"user_id": {"type": "string"}} and params["required"] == [
        "user_id"
    ]
    book = schemas["book_reservation"][0]["function"]["parameters"]["properties"]
    assert book["flights"] == {"type": "array", "items": {"type": "object"}}


def test_turn_index_counts_user_turns(imported) -> None:
    db, _, source = imported
    ep = source[0]
    expected, turn = [], 0
    for m in ep["traj"]:
        turn += m["role"] == "user"
        expected.append(turn)
    with store.connect(db, read_only=True) as con:
        got = [
            r[0]
            for r in con.execute(
                "SELECT turn_idx FROM messages m JOIN trajectories t ON t.id = m.trajectory_id "
                "WHERE t.task_id = ? AND t.trial = ? ORDER BY idx",
                [str(ep["task_id"]), ep["trial"]],
            ).fetchall()
        ]
    assert got == expected


def test_file_name_gives_model_and_domain() -> None:
    assert model_and_domain("x/sonnet-35-new-retail.json") == ("sonnet-35-new", "retail")
    assert model_and_domain("episodes.json") == (None, None)
    assert termination_from_source("user") == "user_stop"
    assert termination_from_source("transfer_to_human_agents") == "agent_stop"
    assert termination_from_source("book_reservation") == "max_steps"


def test_every_observed_call_validates_against_its_inferred_schema(imported) -> None:
    from jsonschema import Draft202012Validator

    db, _, _ = imported
    with store.connect(db, read_only=True) as con:
        schemas = {
            n: json.loads(s)
            for n, s in con.execute(
                "SELECT name, schema FROM tool_schemas WHERE domain = 'airline'"
            ).fetchall()
        }
        calls = con.execute("SELECT name, arguments FROM tool_calls").fetchall()
    validators = {}
    for name, schema in schemas.items():
        Draft202012Validator.check_schema(schema["function"]["parameters"])
        validators[name] = Draft202012Validator(schema["function"]["parameters"])
    assert len(calls) == 1164
    for name, args in calls:
        validators[name].validate(json.loads(args))
