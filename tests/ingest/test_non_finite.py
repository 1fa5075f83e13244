"""NaN / Infinity inside `meta` or tool arguments are not JSON: they are stored as null and the
import's summary says so, per record (issue 16 §5). The DuckDB JSON columns stay parseable."""

from __future__ import annotations

import json
from pathlib import Path

from trace_lib import store
from trace_lib.ingest import ingest_paths


def _record(i: int, meta_value: str, arg_value: str) -> str:
    # Python's json writes NaN/Infinity bare, as some harnesses do: build the line by hand.
    call = ('{"id": "c1", "type": "function", "function": {"name": "get_user", '
            f'"arguments": {{"user_id": "u1", "score": {arg_value}}}}}}}')
    return (f'{{"id": "t{i}", "reward": 1.0, "meta": {{"latency": {meta_value}}}, "messages": ['
            '{"role": "user", "content": "hi"}, '
            f'{{"role": "assistant", "content": null, "tool_calls": [{call}]}}, '
            '{"role": "tool", "tool_call_id": "c1", "content": "{}"}, '
            '{"role": "assistant", "content": "done"}]}')


def test_nan_and_infinity_are_stored_as_null_and_reported(tmp_path: Path):
    src = tmp_path / "runs.jsonl"
    src.write_text("\n".join([_record(0, "NaN", "Infinity"), _record(1, "1.5", "-Infinity"),
                              _record(2, "2.0", "3.0")]) + "\n")
    db = tmp_path / "trace.duckdb"
    report = ingest_paths([src], db=db, fmt="openai_jsonl")
    assert report.trajectories == 3
    said = [w for w in report.warnings if "NaN/Infinity" in w]
    assert len(said) == 2 and "record t0" in said[0] and "record t1" in said[1], said
    with store.connect(db, read_only=True) as con:
        metas = dict(con.execute(
            "SELECT source_id, meta::VARCHAR FROM trajectories ORDER BY source_id").fetchall())
        args = con.execute("SELECT arguments::VARCHAR FROM tool_calls t JOIN trajectories j "
                           "ON j.id = t.trajectory_id ORDER BY j.source_id").fetchall()
    assert json.loads(metas["t0"])["latency"] is None
    assert json.loads(metas["t1"])["latency"] == 1.5
    assert [json.loads(a)["score"] for (a,) in args] == [None, None, 3.0]
