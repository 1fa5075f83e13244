"""The batch writer: duplicates across batches and against the store (16 bytes a record,
`KeyRuns`), an id taken by other content refused, batches that do not outlive their
INSERT, and the orjson fast path reading exactly what `json` reads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from trace_lib import store
from trace_lib.errors import UserInputError
from trace_lib.ingest import ingest_paths
from trace_lib.ingest.formats import load
from trace_lib.ingest.importer import ParseContext
from trace_lib.ingest.key_runs import KeyRuns
from trace_lib.ingest.source import Source, fast_loads
from trace_lib.ingest.writer import Writer


def rec(i: int, source_id: str | None = None, tool: bool = False) -> dict:
    messages = [{"role": "user", "content": f"question {i} " + "x" * 200}]
    if tool:
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": f"c{i}", "type": "function",
                "function": {"name": "lookup", "arguments": json.dumps({"k": i})}}]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": "ok"},
        ]
    messages.append({"role": "assistant", "content": f"answer {i}"})
    return {"id": source_id or f"r{i}", "reward": 1.0, "messages": messages}


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_repeats_inside_one_import_are_duplicates_in_any_batch(
    tmp_path: Path, db_path: Path
) -> None:
    # Record 0 again at 3 (same batch of 7) and at 10 and 20 (later batches): the later
    # ones are found among the contents the writer added in earlier batches.
    records = [rec(i) for i in range(25)]
    for at in (3, 10, 20):
        records[at] = rec(0)
    report = ingest_paths([write_jsonl(tmp_path / "rep.jsonl", records)], db=db_path,
                          batch_size=7)
    assert (report.trajectories, report.duplicates) == (22, 3)
    with store.connect(db_path, read_only=True) as con:
        assert con.execute("SELECT count(*) FROM trajectories").fetchone()[0] == 22
    assert not report.warnings  # same id, same content: a duplicate, not a conflict


def test_same_source_id_with_other_content_across_batches_is_warned(
    tmp_path: Path, db_path: Path
) -> None:
    records = [rec(i) for i in range(20)]
    records[15] = rec(15, source_id="r2")  # r2 again, other content, two batches later
    report = ingest_paths([write_jsonl(tmp_path / "ids.jsonl", records)], db=db_path,
                          batch_size=5)
    assert report.trajectories == 20
    assert len(report.warnings) == 1 and "1 source id(s)" in report.warnings[0]
    assert "'r2'" in report.warnings[0]


def test_an_id_already_taken_by_other_content_stops_the_import_whole(
    tmp_path: Path, db_path: Path
) -> None:
    # No key refuses a second row with an id (schema 15): the writer does. Two SHA-256
    # digests that agree in their first 64 bits cannot be made on purpose, so the store
    # gets a row whose content hash shares the first 64 bits of record 3's and differs
    # after them, as another trajectory's would.
    path = write_jsonl(tmp_path / "a.jsonl", [rec(i) for i in range(6)])
    probe = tmp_path / "probe.duckdb"
    ingest_paths([path], db=probe)
    with store.connect(probe, read_only=True) as con:
        tid, sha = con.execute("SELECT id, content_sha256 FROM trajectories "
                               "WHERE source_id = 'r3'").fetchone()
    other = sha[:16] + ("0" if sha[16] != "0" else "1") + sha[17:]
    ingest_paths([write_jsonl(tmp_path / "b.jsonl", [rec(100)])], db=db_path)
    with store.connect(db_path) as con:
        con.execute("INSERT INTO trajectories (id, dataset_id, content_sha256) VALUES "
                    "(?, 'd_other', ?)", [tid, other])
        before = store.table_counts(con)
    with pytest.raises(UserInputError, match=rf"a.jsonl: record r3: its id {tid} is already "
                                             r"the id of a trajectory with other content"):
        ingest_paths([path], db=db_path, batch_size=2)
    with store.connect(db_path, read_only=True) as con:
        assert store.table_counts(con) == before


def test_a_stored_hash_that_is_not_hex_does_not_stop_an_import(tmp_path: Path,
                                                                db_path: Path) -> None:
    # Rows written by hand (fixtures, plain SQL) may carry any text as their hash.
    with store.connect(db_path) as con:
        con.execute("INSERT INTO trajectories (id, dataset_id, content_sha256) VALUES "
                    "('t_x', 'd_x', 'sha-x'), ('t_y', 'd_x', '')")
    report = ingest_paths([write_jsonl(tmp_path / "a.jsonl", [rec(i) for i in range(3)])],
                          db=db_path)
    assert (report.trajectories, report.duplicates) == (3, 0)


@pytest.mark.parametrize("seed", [0, 1])
def test_key_runs_answer_as_a_dict_would(seed: int) -> None:
    # Batches of uneven sizes, so runs merge at every depth; keys across the whole range.
    rng = np.random.default_rng(seed)
    runs, truth = KeyRuns(), {}
    for size in rng.integers(0, 300, 40):
        keys = rng.integers(0, 2**64, int(size), dtype=np.uint64)
        keys = np.unique(np.concatenate([keys, np.array([0, 2**64 - 1], np.uint64)]))
        probe = np.concatenate([keys, rng.choice(np.array(list(truth) or [5], np.uint64), 50)])
        found, values = runs.get(probe)
        for k, f, v in zip(probe.tolist(), found.tolist(), values.tolist(), strict=True):
            assert f == (k in truth) and (not f or v == truth[k])
        new = keys[~runs.get(keys)[0]]
        vals = rng.integers(0, 2**64, len(new), dtype=np.uint64)
        runs.add(new, vals)
        truth.update(zip(new.tolist(), vals.tolist(), strict=True))
    assert len(runs) == len(truth) and runs.nbytes == 16 * len(truth)
    assert len(runs._runs) <= int(np.log2(max(2, len(truth)))) + 1


def test_batches_are_not_held_until_commit(tmp_path: Path, db_path: Path) -> None:
    # With `con.register`, DuckDB kept every batch's Arrow table until COMMIT: Arrow's
    # allocation grew by a batch per batch. Now each batch is gone once inserted.
    path = write_jsonl(tmp_path / "many.jsonl", [rec(i, tool=True) for i in range(400)])
    parsed = load(Source.from_path(path), "auto", ParseContext())
    parsed.sha256 = "0" * 64
    base = pa.total_allocated_bytes()
    held: list[int] = []
    with store.connect(db_path) as con, store.transaction(con):
        writer = Writer(lambda: con, {parsed.name: parsed.name}, batch_size=50)
        writer.write_file(parsed, on_batch=lambda: held.append(pa.total_allocated_bytes() - base))
        writer.finish()
        assert con.execute("SELECT count(*) FROM trajectories").fetchone()[0] == 400
    assert len(held) == 8 and max(held) == 0, held


@pytest.mark.parametrize("text", [
    '{"a": 1, "b": [1.5, -0.0, 1e300, "x"], "c": {"d": null, "e": true}}',
    '{"big": 123456789012345678901234567890}',  # past 64 bits: orjson would give a float
    '{"edge": 18446744073709551616, "neg": -9223372036854775809}',
    '{"id": "12345678901234567890123"}',  # a long digit run in a string: slow path, same
    '{"n": NaN, "i": -Infinity}',  # not JSON, but json.loads reads it (and the writer
    '{"s": "\\ud800 lone"}',  # reports it), as it reads a lone surrogate
    '{"a": 1, "a": 2}',
    '"\u00e9t\u00e9 \\u00e9"',
])
def test_fast_loads_reads_what_json_reads(text: str) -> None:
    want = json.loads(text)
    for raw in (text, text.encode("utf-8")):
        got = fast_loads(raw)
        assert json.dumps(got) == json.dumps(want) and type(got) is type(want)


def test_fast_loads_errors_are_json_errors() -> None:
    with pytest.raises(json.JSONDecodeError, match="Expecting"):
        fast_loads(b'{"a": }')
    with pytest.raises(RecursionError):
        fast_loads("[" * 100_000 + "]" * 100_000)


def test_dumps_writes_what_the_json_encoder_writes():
    """The writer's `_dumps` reuses one C encoder; its text must stay `JSONEncoder.encode`'s
    (content hashes cover it), also after a call that failed half-way."""
    import datetime

    from trace_lib.ingest import writer

    reference = json.JSONEncoder(ensure_ascii=False, default=str, allow_nan=False).encode
    shared = {"k": [1, 2]}
    values = ["plain", "é\n\"\\\u2028😀", {"a": 1, "b": [1.5, None, True, "x"], "c": {}},
              [], {}, 3, -0.0, 1e300, None, False, {"d": datetime.date(2026, 12, 3)},
              {"one": shared, "two": shared}, [shared, shared], {"\ud800": "\udfff"}]
    for value in values:
        assert writer._dumps(value) == reference(value)
    loop: dict = {}
    loop["self"] = loop
    for bad in ({"x": [float("nan")]}, loop, {"y": {"z": float("inf")}}):
        with pytest.raises(ValueError):
            writer._dumps(bad)
        with pytest.raises(ValueError):
            reference(bad)
        for value in values:  # a failed call leaves nothing behind
            assert writer._dumps(value) == reference(value)


def _sim(i: int, measured: bool) -> dict:
    """A bare tau2 simulation: a user turn and the agent's answer, with tau2's per-message
    cost, usage and timestamps when `measured`."""
    def m(role: str, text: str, second: int, cost: float, tokens: tuple[int, int]) -> dict:
        out = {"role": role, "content": text, "turn_idx": second}
        if measured:
            out.update(cost=cost, usage={"prompt_tokens": tokens[0],
                                         "completion_tokens": tokens[1]},
                       timestamp=f"2025-08-01T16:20:{10 + second:02d}.000000")
        return out
    return {"id": f"sim{i}", "task_id": str(i), "termination_reason": "user_stop",
            "reward_info": {"reward": 1.0},
            "messages": [m("user", f"hello {i}", 0, 0.001, (40, 5)),
                         m("assistant", f"answer {i}", 3, 0.002, (900, 12))]}


def test_message_meta_lands_beside_its_message_and_is_not_hashed(tmp_path: Path,
                                                                 db_path: Path) -> None:
    """A batch mixing unmeasured and measured trajectories keeps every measurement on its
    own message; the same conversation with or without measurements is one trajectory."""
    sims = [_sim(0, False), _sim(1, True), _sim(2, False), _sim(3, True)]
    report = ingest_paths([_write_json(tmp_path / "a.json", sims)], db=db_path)
    assert report.trajectories == 4
    with store.connect(db_path, read_only=True) as con:
        got = con.execute("SELECT t.source_id, m.idx, m.meta FROM messages m JOIN trajectories "
                          "t ON t.id = m.trajectory_id ORDER BY 1, 2").fetchall()
    by = {(s, i): (json.loads(meta) if meta else None) for s, i, meta in got}
    assert by[("sim0", 0)] is None and by[("sim2", 1)] is None
    assert by[("sim1", 0)] == {"input_tokens": 40, "output_tokens": 5, "cost": 0.001}
    assert by[("sim3", 1)] == {"input_tokens": 900, "output_tokens": 12, "cost": 0.002,
                               "latency_s": 3.0}
    # the one store reader gives it back on both shapes
    from trace_lib.trajectories import load_trajectories, load_transcripts

    with store.connect(db_path, read_only=True) as con:
        [st] = load_trajectories(con, ["sim3"])
        [t] = load_transcripts(con, [st.id])
    assert st.trajectory.messages[1].meta == by[("sim3", 1)]
    assert t.messages[1]["meta"] == by[("sim3", 1)] and t.messages[0]["meta"]["cost"] == 0.001
    # the unmeasured twin of sim1 (same id, same messages) is a duplicate: meta is not hashed
    again = ingest_paths([_write_json(tmp_path / "b.json", [_sim(1, False)])], db=db_path)
    assert (again.trajectories, again.duplicates) == (0, 1)


def _write_json(path: Path, sims: list[dict]) -> Path:
    path.write_text(json.dumps(sims))
    return path
