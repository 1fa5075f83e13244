"""The OpenAI-messages import's DuckDB route (`store/bulk_openai.py`, `ingest/bulk_route.py`)
against the Python importer, its reference.

One file mixes plain records (which DuckDB takes) with every unusual shape the Python
route knows (which it must decline), duplicates across the two routes in both orders,
a source id reused with other content, and bad records: imported with the bulk route
and without it, every table must be the same row for row (content hashes, derived rows
and the search index included), and so must the import report; an error in an unusual
record must be worded as before, with nothing imported.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import duckdb
import pytest

from tests.ingest.test_openai_fast import DECLINED, HARD, rec
from trace_lib import store
from trace_lib.errors import UserInputError
from trace_lib.ingest import ingest_paths
from trace_lib.store import bulk_openai

TABLES = {
    "trajectories": "id", "messages": "trajectory_id, idx",
    "tool_calls": "trajectory_id, message_idx, call_idx", "tool_schemas": "domain, name",
    "datasets": "id", "expected_actions": "dataset_id, task_id, idx",
    "trajectory_derived": "trajectory_id",
}  # fmt: skip


def synth(i: int) -> dict:
    """A bench-like record (bench/ingest.py's shape): what the bulk route is for."""
    call = {"id": f"call_{i}", "type": "function", "function": {
        "name": ("lookup", "refund")[i % 2],
        "arguments": json.dumps({"user_id": f"user_{i % 7}", "n": i % 5, "ok": i % 3 == 0,
                                 "note": None if i % 4 else "é 東京 🙂"},
                                ensure_ascii=False)}}
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": f"Où est ma commande {i} ? \"quoted\" \\ back\nslash"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"call_{i}",
         "content": f"Error: order {i} not found" if i % 5 == 0 else "{\"status\": \"ok\"}"},
    ]
    if i % 2:
        messages.append({"role": "assistant", "content": f"Done {i}."})
    out = {"id": f"s{i}", "task_id": f"task_{i % 4}", "trial": i % 3, "agent_model": "m",
           "domain": ("airline", "retail")[i % 2], "messages": messages}
    if i % 6 == 0:
        out["success"] = i % 12 == 0
    elif i % 6 != 1:
        out["reward"] = (1.0, 0.0, 0.25, 1, 0.1)[i % 5]
    if i % 9 == 0:
        out["termination"] = "max_turns"
    return out


def mixed_lines() -> list[str]:
    lines = ["\ufeff" + json.dumps(synth(0))]  # a BOM before the first record
    lines += [json.dumps(synth(i)) for i in range(1, 40)]
    lines += [json.dumps(r) for r in HARD.values()]
    lines += [json.dumps(r) for r in DECLINED.values()]
    lines += [
        "",  # blank lines are not records
        json.dumps(synth(3)),  # a plain duplicate of a plain record
        json.dumps({**synth(5), "meta": {"k": 1}}),  # unusual, same content as a plain one
        json.dumps({**synth(50), "meta": {"first": True}}),  # unusual first ...
        json.dumps(synth(50)),  # ... then its plain twin (a duplicate: the first wins)
        json.dumps({**synth(7), "reward": 0.5}),  # source id s7 again, other content
        json.dumps(rec(messages=[{"role": "user", "content": "go"}, {
            "role": "assistant", "tool_calls": [{"id": "a", "function": {
                "name": "f", "arguments": json.dumps({"x": "é"})}}]}])),  # Python: "é"
        "{\"id\": \"dup-key\", \"id\": \"x\", \"messages\": [{\"role\": \"user\", "
        "\"content\": \"a\"}]}",  # duplicate keys: Python keeps the last
        "{\"messages\": [{\"role\": \"user\", \"content\": \"a\", \"content\": \"b\"}]}",
        json.dumps(rec(messages=[{"role": "user", "content": "go"}, {
            "role": "assistant", "tool_calls": [{"id": "a", "function": {
                "name": "f", "arguments": "{\"x\":1}"}}]}])),  # not Python's text
        json.dumps(rec(reward=1e-05)),  # repr and DuckDB write it differently
        "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"reward\": NaN}",
        "not json at all",
        # What DuckDB's reader takes and Python's refuses: the Python route decides.
        '{"messages": [{"role": "user", "content": "x"}], "extra": [1, 2, ]}',
        '{"messages": [{"role": "user", "content": "x"}], "extra": nan}',
        '{"messages": [{"role": "user", "content": "x"}], "extra": ' + "1" * 5000 + "}",
        '{"messages": [{"role": "user", "content": "x"}], "extra": ' + "[" * 3000
        + "]" * 3000 + "}",
        '{"messages": [{"role": "user", "content": "x"}], "extra": ' + "[" * 300
        + "]" * 300 + "}",  # accepted by both, read by Python
        json.dumps({**synth(90), "id": 12345678901234567890123}),  # a big integer id
        json.dumps(synth(60))[:-5],  # truncated
    ]
    lines += [json.dumps(synth(i)) for i in range(61, 80)]
    return lines


def tables(db: Path) -> dict[str, list[tuple]]:
    out = {}
    with store.connect(db, read_only=True) as con:
        for table, key in TABLES.items():
            cols = [d[0] for d in con.execute(f"SELECT * FROM {table} LIMIT 0").description
                    if d[0] != "imported_at"]
            out[table] = con.execute(
                f"SELECT {', '.join(cols)} FROM {table} ORDER BY {key}").fetchall()
    index = sqlite3.connect(str(db) + ".search.sqlite")
    # Every posting (trajectory, term, column, offset) of the full-text index.
    index.execute("CREATE VIRTUAL TABLE temp.v USING fts5vocab(main, fts, 'instance')")
    out["search"] = index.execute(
        "SELECT d.trajectory_id, v.term, v.col, v.offset FROM temp.v v "
        "JOIN docs d ON d.rowid = v.doc ORDER BY 1, 2, 3, 4").fetchall()
    index.close()
    return out


@pytest.mark.parametrize("overrides", [{}, {"domain": "other", "agent_model": "m2"}])
def test_bulk_route_gives_the_python_routes_tables(tmp_path: Path, overrides: dict) -> None:
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(mixed_lines()) + "\n", encoding="utf-8")
    # A small batch, so runs of plain records alternate with the Python route's batches.
    reports = {}
    for bulk in (False, True):
        db = tmp_path / f"bulk_{bulk}.duckdb"
        reports[bulk] = ingest_paths([path], db=db, skip_invalid=True, batch_size=7, bulk=bulk,
                                     **overrides)
    assert reports[True].to_json() == reports[False].to_json()
    report = reports[True]
    assert report.skipped and report.duplicates >= 3
    assert any("'s7'" in w for w in report.warnings)
    python, bulk = tables(tmp_path / "bulk_False.duckdb"), tables(tmp_path / "bulk_True.duckdb")
    for table in python:
        assert bulk[table] == python[table], table
    assert len(python["trajectories"]) > 80


def test_the_bulk_route_takes_plain_records_only() -> None:
    lines = [line.lstrip("\ufeff") for line in mixed_lines() if line]
    con = duckdb.connect()
    plain = bulk_openai.stage(con, list(range(len(lines))), lines, reward_range=(0.0, 1.0),
                              require_outcome=False, domain=None, agent_model=None)
    taken = {lines[i] for i in plain}
    # Every bench-like record, and nothing with a shape DuckDB cannot prove plain.
    for i in list(range(40)) + list(range(61, 80)):
        assert json.dumps(synth(i)) in taken
    assert not taken & {json.dumps(r) for r in DECLINED.values()}
    for line in taken:
        raw = json.loads(line)
        assert raw.get("meta") is raw.get("tools") is raw.get("outcome") is None
    assert not any("dup-key" in line or "NaN" in line or "1e-05" in line for line in taken)


@pytest.mark.parametrize("bad", [
    {"messages": [{"role": "robot", "content": "x"}], "id": "bad"},
    {"messages": [], "id": "bad"},
    {"messages": [{"role": "user", "content": "x"}], "reward": "high"},
])
def test_an_unusual_records_error_is_worded_as_before(tmp_path: Path, bad: dict) -> None:
    path = tmp_path / "one_bad.jsonl"
    path.write_text("\n".join([json.dumps(synth(i)) for i in range(30)] + [json.dumps(bad)]
                              + [json.dumps(synth(i)) for i in range(30, 40)]) + "\n")
    errors = {}
    for bulk in (False, True):
        db = tmp_path / f"e_{bulk}.duckdb"
        with pytest.raises(UserInputError) as exc:
            ingest_paths([path], db=db, bulk=bulk)
        errors[bulk] = str(exc.value)
        assert not db.exists()  # all or nothing: the store this import created is gone
    assert errors[True] == errors[False]
    assert "record 30 (line 31)" in errors[True] and "nothing was imported" in errors[True]
