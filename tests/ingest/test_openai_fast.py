"""The OpenAI-messages importer's fast route (`fast_rows`) against its reference (`parse_record`).

Every record the fast route takes must give the rows (hence the content hash) the full
route gives; every record it does not take as is must go to the full route, which accepts
it or refuses it with its own error (file, record, field, expected).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest

from trace_lib import store
from trace_lib.errors import UserInputError
from trace_lib.ingest import ingest_bytes, ingest_paths, openai_jsonl
from trace_lib.ingest.importer import ParseContext
from trace_lib.ingest.openai_jsonl import fast_rows, parse_record
from trace_lib.ingest.rows import TrajectoryRows
from trace_lib.ingest.source import RecordError
from trace_lib.ingest.writer import _digest

CALL = {"id": "c1", "type": "function",
        "function": {"name": "lookup", "arguments": "{\"order_id\": \"A1\", \"n\": 2}"}}


def rec(**extra) -> dict:
    r = {
        "id": "r1", "task_id": "t1", "trial": 0, "agent_model": "m", "domain": "shop",
        "reward": 1.0,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Où est ma commande ? 📦"},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": "{\"status\": \"shipped\"}"},
            {"role": "assistant", "content": "Expédiée."},
        ],
    }  # fmt: skip
    r.update(extra)
    return r


def msgs(*extra: dict) -> list[dict]:
    return rec()["messages"][:3] + list(extra)


# Records the fast route must take, each with something the full route handles specially.
HARD = {
    "plain": rec(),
    "unicode and control characters": rec(messages=[
        {"role": "user", "content": "naïve 東京 \u0000 \u2028 e\u0301 🙂"},
        {"role": "assistant", "content": "ok\r\n\ttab"}]),
    "only messages (an SFT line)": {"messages": [{"role": "user", "content": "hi"},
                                                  {"role": "assistant", "content": "hello"}]},
    "nulls everywhere": rec(id=None, task_id=None, trial=None, agent_model=None, domain=None,
                            reward=None, success=None, termination=None, meta=None, tools=None,
                            expected_actions=None),
    "integer ids and reward": rec(id=17, task_id=3, reward=1),
    "success without reward": rec(reward=None, success=False),
    "reward below the top": rec(reward=0.5),
    "success overrides reward": rec(reward=1.0, success=False),
    "tool error as a string": rec(messages=msgs(
        {"role": "tool", "tool_call_id": "c1", "content": "boom", "error": "timeout"})),
    "tool error true": rec(messages=msgs(
        {"role": "tool", "tool_call_id": "c1", "content": "bad id", "error": True})),
    "tool error true, no content": rec(messages=msgs(
        {"role": "tool", "tool_call_id": "c1", "content": None, "error": True})),
    "Error: prefix": rec(messages=msgs(
        {"role": "tool", "tool_call_id": "c1", "content": "Error: not found"})),
    "error false beats the prefix": rec(messages=msgs(
        {"role": "tool", "tool_call_id": "c1", "content": "Error: x", "error": False})),
    "error 0 and empty": rec(messages=msgs(
        {"role": "tool", "tool_call_id": "c1", "content": "x", "error": 0},
        {"role": "tool", "content": "y", "error": ""})),
    "flat call, dict arguments, requestor": rec(messages=[
        {"role": "user", "content": "go"},
        {"role": "assistant", "tool_calls": [
            {"id": "a", "name": "f", "arguments": {"x": [1, 2.5, None], "y": {"z": "é"}}},
            {"id": "b", "name": "g", "arguments": None, "requestor": "user"},
            {"name": "h", "arguments": "", "requestor": ""}]},
        {"role": "tool", "content": "1"}, {"role": "tool", "content": "2"},
        {"role": "tool", "content": "3"}]),
    "unparseable arguments": rec(messages=[
        {"role": "user", "content": "go"},
        {"role": "assistant", "tool_calls": [
            {"id": "a", "function": {"name": "f", "arguments": "{not json"}},
            {"id": "b", "function": {"name": "g", "arguments": "[1, 2]"}},
            {"id": "c", "function": {"name": "k"}}]}]),
    "reused call ids (tau-bench)": rec(messages=[
        {"role": "user", "content": "a"},
        {"role": "assistant", "tool_calls": [{"id": "x", "name": "f", "arguments": {}}]},
        {"role": "tool", "tool_call_id": "x", "content": "Error: 1"},
        {"role": "assistant", "tool_calls": [{"id": "x", "name": "g", "arguments": {}}]},
        {"role": "tool", "tool_call_id": "x", "content": "ok"},
        {"role": "tool", "tool_call_id": "x", "content": "Error: again"}]),
    "unknown call id, tool name given": rec(messages=msgs(
        {"role": "tool", "tool_call_id": "nope", "name": "other", "content": "r"})),
    "developer and function roles": rec(messages=[
        {"role": "developer", "content": "sys"}, {"role": "user", "content": "u"},
        {"role": "function", "name": "f", "content": "Error: legacy"}]),
    "content parts": rec(messages=[
        {"role": "user", "content": [{"type": "text", "text": "a"}, "b",
                                     {"type": "image_url", "image_url": {"url": "x"}}]},
        {"role": "assistant", "content": []}]),
    "termination given, empty": rec(termination=""),
    "termination given": rec(termination="max_turns"),
    "ends on a user message": rec(messages=[{"role": "user", "content": "bye"}]),
    "ends on a system message": rec(messages=[{"role": "system", "content": "s"}]),
    "meta, tools, expected actions": rec(
        meta={"seed": 7, "source_format": "mine", "nan": None},
        tools=[{"type": "function", "function": {"name": "lookup"}}],
        expected_actions=[{"name": "lookup", "arguments": "{\"order_id\": \"A1\"}"},
                          {"name": "refund"}]),
    "empty tool_calls list": rec(messages=[{"role": "assistant", "content": "x",
                                            "tool_calls": []}]),
    "lone surrogate (written as U+FFFD by the writer)": rec(messages=[
        {"role": "user", "content": "bad \ud800 here"}]),
}


@pytest.mark.parametrize("name", list(HARD))
def test_fast_route_gives_the_full_routes_rows(name: str) -> None:
    raw = json.loads(json.dumps(HARD[name]))
    before = json.dumps(raw, sort_keys=True)
    ctx = ParseContext()
    fast = fast_rows(raw, 3, ctx)
    assert fast is not None, f"{name}: the fast route should take this record"
    traj, expected, tools = parse_record(raw, 3, ctx)
    rows, fast_expected, fast_tools = fast
    assert rows == TrajectoryRows.from_trajectory(traj)
    assert (fast_expected, fast_tools) == (expected, tools)
    if "surrogate" not in name:
        assert _digest(rows) == _digest(TrajectoryRows.from_trajectory(traj))
    assert rows.to_trajectory() == traj
    assert json.dumps(raw, sort_keys=True) == before  # neither route changes the record


# Records invalid (or unusual) in a field the fast route reads: it must decline them.
DECLINED = {
    "role not a string": rec(messages=[{"role": 5, "content": "x"}]),
    "unknown role": rec(messages=[{"role": "bot", "content": "x"}]),
    "message not an object": rec(messages=["hello"]),
    "content a number": rec(messages=[{"role": "user", "content": 5}]),
    "content part a number": rec(messages=[{"role": "user", "content": [5]}]),
    "tool_call_id a number": rec(messages=msgs({"role": "tool", "tool_call_id": 7,
                                                "content": "x"})),
    "name a number": rec(messages=[{"role": "tool", "name": 3, "content": "x"}]),
    "tool_calls a string": rec(messages=[{"role": "assistant", "tool_calls": "x"}]),
    "tool_calls an empty object": rec(messages=[{"role": "assistant", "tool_calls": {}}]),
    "function a string": rec(messages=[{"role": "assistant", "tool_calls": [
        {"id": "a", "function": "f"}]}]),
    "call name missing": rec(messages=[{"role": "assistant", "tool_calls": [
        {"id": "a", "function": {"arguments": "{}"}}]}]),
    "arguments a number": rec(messages=[{"role": "assistant", "tool_calls": [
        {"id": "a", "name": "f", "arguments": 5}]}]),
    "call id a number": rec(messages=[{"role": "assistant", "tool_calls": [
        {"id": 1, "name": "f", "arguments": {}}]}]),
    "tool error a number": rec(messages=msgs({"role": "tool", "content": "x", "error": 3})),
    "messages empty": rec(messages=[]),
    "messages missing": {"id": "x", "reward": 1.0},
    "record a list": [1, 2],
    "reward out of range": rec(reward=7),
    "reward a boolean": rec(reward=True),
    "reward a string": rec(reward="1"),
    "huge integer reward": rec(reward=10**400),
    "success a string": rec(success="yes"),
    "trial over 32 bits": rec(trial=2**40),
    "trial a boolean": rec(trial=True),
    "id a boolean": rec(id=True),
    "id too long": rec(id="x" * 1001),
    "domain a number": rec(domain=4),
    "agent_model a list": rec(agent_model=["m"]),
    "termination a number": rec(termination=1),
    "meta a list": rec(meta=[1]),
    "tools not function tools": rec(tools=[{"type": "function"}]),
    "expected actions without task": rec(task_id=None, expected_actions=[{"name": "a"}]),
    "declared outcome disagreeing": rec(outcome="failure"),
    "declared error outcome (valid)": rec(outcome="error", reward=0.0,
                                          meta={"error": "connection reset"}),
}


@pytest.mark.parametrize("name", list(DECLINED))
def test_fast_route_declines_and_the_full_route_decides(name: str, tmp_path: Path,
                                                        db_path: Path) -> None:
    raw = json.loads(json.dumps(DECLINED[name]))
    ctx = ParseContext()
    assert fast_rows(raw, 0, ctx) is None
    try:
        parse_record(raw, 0, ctx)
        expected_error = None
    except RecordError as exc:
        expected_error = f"record 0 (line 1): {exc}".replace("record 0: ", "")
    data = (json.dumps(raw) + "\n").encode()
    if expected_error is None:
        assert ingest_bytes("ok.jsonl", data, db=db_path).trajectories == 1
    else:
        with pytest.raises(UserInputError) as err:
            ingest_bytes("bad.jsonl", data, db=db_path)
        assert str(err.value) == f"bad.jsonl: {expected_error}; nothing was imported"
        assert not db_path.exists()


def test_require_outcome_is_left_to_the_full_route() -> None:
    ctx = ParseContext(require_outcome=True)
    bare = {"messages": [{"role": "user", "content": "hi"}]}
    assert fast_rows(bare, 0, ctx) is None
    with pytest.raises(RecordError, match="missing outcome"):
        parse_record(bare, 0, ctx)
    assert fast_rows(rec(), 0, ctx) is not None  # a record with an outcome still goes fast


def test_own_reward_range_on_the_fast_route() -> None:
    ctx = ParseContext(reward_range=(0.0, 10.0))
    rows, _, _ = fast_rows(rec(reward=7), 0, ctx)
    traj, _, _ = parse_record(rec(reward=7), 0, ctx)
    assert rows == TrajectoryRows.from_trajectory(traj)
    assert (rows.reward, rows.success, rows.outcome) == (7.0, False, "failure")


def _tables(db: Path) -> dict[str, str]:
    """A hash of every table an import writes (imported_at aside), and the search index."""
    out = {}
    with store.connect(db, read_only=True) as con:
        for table, order in (("trajectories", "id"), ("messages", "trajectory_id, idx"),
                             ("tool_calls", "trajectory_id, message_idx, call_idx"),
                             ("expected_actions", "ALL"), ("tool_schemas", "domain, name"),
                             ("datasets", "id"), ("trajectory_derived", "trajectory_id")):
            cols = [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]
            # error_kinds: `list(DISTINCT ...)` gives no order (the same rows can come out
            # as [a, b] or [b, a] from one run to the next): compared as a set.
            keep = ", ".join("list_sort(error_kinds)" if c == "error_kinds" else c
                             for c in cols if c != "imported_at")
            rows = con.execute(f"SELECT {keep} FROM {table} ORDER BY {order}").fetchall()
            out[table] = hashlib.sha256(repr(rows).encode()).hexdigest()
    lite = sqlite3.connect(str(db) + ".search.sqlite")
    lite.execute("CREATE VIRTUAL TABLE temp.v USING fts5vocab(main, fts, instance)")
    rows = sorted(lite.execute("SELECT d.trajectory_id, v.term, v.offset FROM temp.v v "
                               "JOIN docs d ON d.rowid = v.doc").fetchall())
    lite.close()
    out["search"] = hashlib.sha256(repr(rows).encode()).hexdigest()
    return out


def test_store_is_the_same_with_the_fast_route_off(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    records = [dict(r, id=f"{name}") for name, r in HARD.items()]
    records += [rec(id=f"n{i}", reward=float(i % 2)) for i in range(30)]
    path = tmp_path / "hard.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    fast_db, full_db = tmp_path / "fast.duckdb", tmp_path / "full.duckdb"
    fast_report = ingest_paths([path], db=fast_db, batch_size=7).to_json()
    monkeypatch.setattr(openai_jsonl, "fast_rows", lambda raw, record, ctx: None)
    full_report = ingest_paths([path], db=full_db, batch_size=7).to_json()
    assert fast_report == full_report
    assert fast_report["trajectories"] == len(records)
    assert any("surrogate" in w for w in fast_report["warnings"])
    assert _tables(fast_db) == _tables(full_db)
