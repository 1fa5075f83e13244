"""tau2-bench importer on the 11 real results files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trace_lib import store
from trace_lib.errors import UserInputError
from trace_lib.ingest import ingest_bytes, ingest_paths

# From the data README: file -> (trajectories, successes, agent calls, user calls).
EXPECTED = {
    "gpt-4.1_airline_default_gpt-4.1_1trials.json": (20, 10, 148, 0),
    "gpt-4.1_retail_defautl_gpt-4.1_1trials.json": (40, 34, 299, 0),
    "gpt-4.1_telecom_default_gpt-4.1_1trials.json": (40, 18, 207, 482),
    "gpt-4.1_telecom_no-user_gpt-4.1_1trials.json": (40, 20, 626, 0),
    "ft_gpt-4.1-2025-04-14_sierra_tau2-full-sft_BzrYdMNm_airline_default_gpt-4.1_1trials.json": (
        20,
        13,
        147,
        0,
    ),
    "ft_gpt-4.1-2025-04-14_sierra_tau2-full-sft_BzrYdMNm_retail_default_gpt-4.1_1trials.json": (
        40,
        34,
        292,
        0,
    ),
    "ft_gpt-4.1-2025-04-14_sierra_tau2-full-sft_BzrYdMNm_telecom_default_gpt-4.1_1trials.json": (
        40,
        30,
        656,
        420,
    ),
    "ft_gpt-4.1-2025-04-14_sierra_tau2-full-sft_BzrYdMNm_telecom_no-user_gpt-4.1_1trials.json": (
        40,
        34,
        589,
        0,
    ),
    "qwen2.5_7b_airline_default_gpt-4.1-2025-04-14_1trials.json": (50, 9, 344, 0),
    "toolorchestra_airline_gpt-5_1trial.json": (50, 28, 581, 0),
    "toolorchestra_retail_gpt-5_1trial.json": (114, 96, 873, 0),
}


@pytest.fixture(scope="module")
def files(shared_data: Path) -> list[Path]:
    found = sorted((shared_data / "tau2-bench" / "results").rglob("*.json"))
    assert sorted(p.name for p in found) == sorted(EXPECTED)
    return found


@pytest.fixture(scope="module")
def imported(files: list[Path], tmp_path_factory: pytest.TempPathFactory):
    db = tmp_path_factory.mktemp("tau2") / "t.duckdb"
    return db, ingest_paths(files, db=db)


def test_totals_and_per_file_counts(imported) -> None:
    db, report = imported
    assert (report.trajectories, report.successes, report.failures, report.unknown) == (
        494,
        326,
        168,
        0,
    )
    assert set(report.formats.values()) == {"tau2"}
    with store.connect(db, read_only=True) as con:
        rows = con.execute("""
            SELECT d.name, count(DISTINCT t.id), count(DISTINCT t.id) FILTER (t.success),
                   count(c.name) FILTER (c.requestor = 'assistant'), count(c.name) FILTER (c.requestor = 'user')
            FROM datasets d JOIN trajectories t ON t.dataset_id = d.id
            LEFT JOIN tool_calls c ON c.trajectory_id = t.id GROUP BY 1""").fetchall()
        ends = dict(
            con.execute("SELECT termination, count(*) FROM trajectories GROUP BY 1").fetchall()
        )
    assert {r[0]: tuple(r[1:]) for r in rows} == EXPECTED
    assert ends == {
        "user_stop": 398,
        "agent_stop": 80,
        "agent_error": 9,
        "max_steps": 5,
        "too_many_errors": 2,
    }


def test_simulation_matches_the_source_message_by_message(imported, files: list[Path]) -> None:
    db, _ = imported
    path = next(p for p in files if p.name.startswith("gpt-4.1_telecom_default"))
    doc = json.loads(path.read_text())
    sim = doc["simulations"][3]
    with store.connect(db, read_only=True) as con:
        tid, model, domain, reward, meta = con.execute(
            "SELECT id, agent_model, domain, reward, meta FROM trajectories WHERE source_id = ?",
            [sim["id"]],
        ).fetchone()
        msgs = con.execute(
            "SELECT role, content, tool_call_id FROM messages WHERE trajectory_id = ? ORDER BY idx",
            [tid],
        ).fetchall()
        calls = con.execute(
            "SELECT message_idx, call_id, name, arguments, requestor, error FROM tool_calls "
            "WHERE trajectory_id = ? ORDER BY message_idx, call_idx",
            [tid],
        ).fetchall()
    assert (model, domain, reward) == ("gpt-4.1", "telecom", sim["reward_info"]["reward"])
    meta = json.loads(meta)
    assert (
        meta["reward_info"] == sim["reward_info"]
        and meta["termination_reason"] == sim["termination_reason"]
    )
    # The policy comes first as the system prompt, then the simulation's messages in order.
    assert msgs[0] == ("system", doc["info"]["environment_info"]["policy"], None)
    assert len(msgs) == len(sim["messages"]) + 1
    for (role, content, call_id), m in zip(msgs[1:], sim["messages"], strict=True):
        assert (role, content) == (m["role"], m["content"])
        assert call_id == (m.get("id") if m["role"] == "tool" else None)
    answers = {m["id"]: m for m in sim["messages"] if m["role"] == "tool"}
    expected = [
        (
            i + 1,
            tc["id"],
            tc["name"],
            tc["arguments"],
            tc["requestor"],
            answers[tc["id"]]["content"] if answers[tc["id"]]["error"] else None,
        )
        for i, m in enumerate(sim["messages"])
        if m["role"] != "tool"
        for tc in m["tool_calls"] or []
    ]
    assert [(a, b, c, json.loads(d), e, f) for a, b, c, d, e, f in calls] == expected
    assert any(r == "user" for *_, r, _ in expected)  # the telecom user simulator calls tools


def test_each_message_keeps_its_cost_tokens_and_latency(imported, files: list[Path]) -> None:
    """tau2 records a cost, token usage and a timestamp per message (issue 34): they land in
    `messages.meta`, the latency being the gap since the previous message's timestamp."""
    from datetime import datetime

    db, _ = imported
    path = next(p for p in files if p.name.startswith("gpt-4.1_airline_default"))
    sim = json.loads(path.read_text())["simulations"][0]
    with store.connect(db, read_only=True) as con:
        metas = [r[0] for r in con.execute(
            "SELECT m.meta FROM messages m JOIN trajectories t ON t.id = m.trajectory_id "
            "WHERE t.source_id = ? ORDER BY m.idx", [sim["id"]]).fetchall()]
    assert metas[0] is None  # the policy, put first as the system prompt: not measured
    for i, (stored, m) in enumerate(zip(metas[1:], sim["messages"], strict=True)):
        if m["role"] == "tool":
            assert stored is None
            continue
        usage = m.get("usage") or {}
        if not usage and not m["cost"]:  # the agent's canned greeting: no model call
            assert stored is None
            continue
        got = json.loads(stored)
        assert got.get("cost") == m["cost"]
        assert got.get("input_tokens") == usage.get("prompt_tokens")
        assert got.get("output_tokens") == usage.get("completion_tokens")
        assert isinstance(got.get("input_tokens", 0), int)
        gap = (datetime.fromisoformat(m["timestamp"])
               - datetime.fromisoformat(sim["messages"][i - 1]["timestamp"]))
        assert got["latency_s"] == pytest.approx(gap.total_seconds())


def test_tool_errors_counted_from_the_error_flag(imported, files: list[Path]) -> None:
    db, _ = imported
    flagged = 0
    for p in files:
        for sim in json.loads(p.read_text())["simulations"]:
            for m in sim["messages"]:
                if m["role"] == "tool":
                    flagged += m["error"] if "error" in m else m["content"].startswith("Error:")
    with store.connect(db, read_only=True) as con:
        assert con.execute("SELECT count(error) FROM tool_calls").fetchone()[0] == flagged > 0


def test_expected_actions_and_given_schemas(imported, files: list[Path], shared_data: Path) -> None:
    db, _ = imported
    path = next(p for p in files if p.name.startswith("gpt-4.1_retail"))
    task = json.loads(path.read_text())["tasks"][0]
    given = json.loads((shared_data / "tau2-bench" / "tool_schemas_by_domain.json").read_text())[
        "domains"
    ]
    with store.connect(db, read_only=True) as con:
        ds = con.execute("SELECT id FROM datasets WHERE name = ?", [path.name]).fetchone()[0]
        rows = con.execute(
            "SELECT name, arguments FROM expected_actions WHERE dataset_id = ? AND task_id = ? "
            "ORDER BY idx",
            [ds, task["id"]],
        ).fetchall()
        schemas = {
            (d, n): (json.loads(s), src)
            for d, n, s, src in con.execute(
                "SELECT domain, name, schema, source FROM tool_schemas"
            ).fetchall()
        }
    assert [(n, json.loads(a)) for n, a in rows] == [
        (a["name"], a["arguments"]) for a in task["evaluation_criteria"]["actions"]
    ]
    for domain, tools in given.items():
        for tool in tools:
            assert schemas[(domain, tool["function"]["name"])] == (tool, "given")
    # Telecom device tools are not in the given file: inferred from the calls.
    inferred = {n for (d, n), (_, src) in schemas.items() if d == "telecom" and src == "inferred"}
    assert "toggle_airplane_mode" in inferred


def test_reimport_is_all_duplicates(imported, files: list[Path]) -> None:
    db, _ = imported
    with store.connect(db, read_only=True) as con:
        before = store.table_counts(con)
    again = ingest_paths(files[:3], db=db)
    assert again.trajectories == 0 and again.duplicates == sum(d["records"] for d in again.datasets)
    assert all(not d["new_dataset"] for d in again.datasets)
    with store.connect(db, read_only=True) as con:
        assert store.table_counts(con) == before


def test_upload_finds_given_schemas_through_the_environment(
    db_path: Path, shared_data: Path, files: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = next(p for p in files if p.name.startswith("gpt-4.1_airline"))
    monkeypatch.setenv(
        "TRACE_TAU2_TOOL_SCHEMAS", str(shared_data / "tau2-bench" / "tool_schemas_by_domain.json")
    )
    report = ingest_bytes(path.name, path.read_bytes(), db=db_path)
    assert (report.trajectories, report.successes, report.formats) == (20, 10, {path.name: "tau2"})
    with store.connect(db_path, read_only=True) as con:
        sources = dict(
            con.execute("SELECT source, count(*) FROM tool_schemas GROUP BY 1").fetchall()
        )
    assert sources == {"given": 14}
    monkeypatch.setenv("TRACE_TAU2_TOOL_SCHEMAS", str(shared_data / "nope.json"))
    with pytest.raises(UserInputError, match="TRACE_TAU2_TOOL_SCHEMAS=.*nope.json: no such file"):
        ingest_bytes(path.name, path.read_bytes(), db=db_path)
