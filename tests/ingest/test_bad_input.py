"""Bad input: each gets a clear error naming file/record/field, and the store stays as it was."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from trace_lib import store
from trace_lib.errors import UserInputError
from trace_lib.ingest import IngestLimits, ingest_bytes, ingest_paths

MiB = 1 << 20


def rec(i: int, **extra) -> dict:
    r = {
        "id": f"r{i}",
        "reward": 1.0,
        "messages": [
            {"role": "user", "content": f"hi {i}"},
            {"role": "assistant", "content": "hello"},
        ],
    }
    r.update(extra)
    return r


def jsonl(path: Path, lines: list) -> Path:
    with open(path, "wb") as fh:
        for line in lines:
            fh.write(line if isinstance(line, bytes) else json.dumps(line).encode())
            fh.write(b"\n")
    return path


@pytest.fixture
def seeded(tmp_path: Path, db_path: Path) -> dict[str, int]:
    """A store that already holds something, and its table counts."""
    ingest_paths([jsonl(tmp_path / "seed.jsonl", [rec(100), rec(101)])], db=db_path)
    with store.connect(db_path, read_only=True) as con:
        return store.table_counts(con)


def unchanged(db_path: Path, before: dict[str, int]) -> bool:
    with store.connect(db_path, read_only=True) as con:
        return store.table_counts(con) == before


def test_truncated_json_document(tmp_path: Path, db_path: Path, seeded, shared_data: Path) -> None:
    data = (shared_data / "tau-bench/historical_trajectories/gpt-4o-airline.json").read_bytes()
    path = tmp_path / "gpt-4o-airline.json"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(
        UserInputError, match=r"gpt-4o-airline.json: truncated JSON .* at line \d+ column \d+"
    ):
        ingest_paths([path], db=db_path)
    with pytest.raises(UserInputError, match="truncated JSON"):  # not a record problem: no skipping
        ingest_paths([path], db=db_path, skip_invalid=True)
    assert unchanged(db_path, seeded)


def test_truncated_jsonl_line(tmp_path: Path, db_path: Path, seeded) -> None:
    line = json.dumps(rec(1)).encode()
    path = jsonl(tmp_path / "t.jsonl", [rec(0), line[: len(line) // 2]])
    with pytest.raises(UserInputError, match=r"t.jsonl: record 1 \(line 2\): truncated JSON"):
        ingest_paths([path], db=db_path)
    assert unchanged(db_path, seeded)


def test_wrong_types_name_the_field(
    tmp_path: Path, db_path: Path, seeded, shared_data: Path
) -> None:
    episodes = json.loads(
        (shared_data / "tau-bench/historical_trajectories/gpt-4o-airline.json").read_text()
    )[:5]
    episodes[3]["reward"] = "1.0"
    path = tmp_path / "gpt-4o-airline.json"
    path.write_text(json.dumps(episodes))
    with pytest.raises(
        UserInputError,
        match=r"gpt-4o-airline.json: record 3: field 'reward': expected a number, got a string",
    ):
        ingest_paths([path], db=db_path)
    episodes[3]["reward"] = 1.0
    episodes[4]["traj"][2]["role"] = "bot"
    path.write_text(json.dumps(episodes))
    with pytest.raises(
        UserInputError,
        match=r"record 4: field 'traj\[2\].role': expected one of system/user/assistant/tool, got 'bot'",
    ):
        ingest_paths([path], db=db_path)
    bad_calls = jsonl(
        tmp_path / "c.jsonl", [rec(0, messages=[{"role": "assistant", "tool_calls": "lookup"}])]
    )
    with pytest.raises(
        UserInputError, match=r"field 'messages\[0\].tool_calls': expected a list, got a string"
    ):
        ingest_paths([bad_calls], db=db_path)
    assert unchanged(db_path, seeded)


def test_missing_outcome_is_refused_only_with_require_outcome(
    tmp_path: Path, db_path: Path, seeded
) -> None:
    no_outcome = rec(1)
    del no_outcome["reward"]
    path = jsonl(tmp_path / "o.jsonl", [rec(0), no_outcome])
    with pytest.raises(
        UserInputError, match=r"o.jsonl: record 1 \(line 2\): field 'reward': missing outcome"
    ):
        ingest_paths([path], db=db_path, require_outcome=True)
    assert unchanged(db_path, seeded)
    report = ingest_paths([path], db=db_path)  # SFT files / raw rollouts: outcome unknown
    assert (report.trajectories, report.successes, report.unknown) == (2, 1, 1)


def test_missing_outcome_in_tau2(tmp_path: Path, db_path: Path, seeded, shared_data: Path) -> None:
    src = (
        shared_data / "tau2-bench/results/feature-gym/gpt-4.1_airline_default_gpt-4.1_1trials.json"
    )
    doc = json.loads(src.read_text())
    del doc["simulations"][7]["reward_info"]
    path = tmp_path / src.name
    path.write_text(json.dumps(doc))
    with pytest.raises(
        UserInputError,
        match=r"simulations record 7: field 'reward_info': missing; expected an object",
    ):
        ingest_paths([path], db=db_path)
    assert unchanged(db_path, seeded)
    report = ingest_paths([path], db=db_path, skip_invalid=True)
    assert report.trajectories == 19 and [s.record for s in report.skipped] == [7]


def test_non_utf8_bytes(tmp_path: Path, db_path: Path, seeded) -> None:
    line = json.dumps(rec(2)).encode().replace(b"hi 2", b"caf\xe9")
    path = jsonl(tmp_path / "l1.jsonl", [rec(0), rec(1), line])
    with pytest.raises(
        UserInputError, match=r"l1.jsonl: record 2 \(line 3\): not valid UTF-8 at byte \d+"
    ):
        ingest_paths([path], db=db_path)
    doc = tmp_path / "doc.json"
    doc.write_bytes(
        json.dumps({"info": {}, "tasks": [], "simulations": []})
        .encode()
        .replace(b"info", b"inf\xff")
    )
    with pytest.raises(UserInputError, match=r"doc.json: not valid UTF-8 at byte 5 \(line 1\)"):
        ingest_paths([doc], db=db_path)
    assert unchanged(db_path, seeded)


def test_empty_file_and_directory(tmp_path: Path, db_path: Path, seeded) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    with pytest.raises(UserInputError, match="empty.jsonl: empty file"):
        ingest_paths([empty], db=db_path)
    blank = tmp_path / "blank.json"
    blank.write_bytes(b"\n  \n")
    with pytest.raises(UserInputError, match="blank.json: only whitespace"):
        ingest_paths([blank], db=db_path)
    with pytest.raises(UserInputError, match=r"is a directory; expected a file"):
        ingest_paths([tmp_path], db=db_path)
    with pytest.raises(UserInputError, match="no such file"):
        ingest_paths([tmp_path / "missing.json"], db=db_path)
    with pytest.raises(UserInputError, match="empty file"):
        ingest_bytes("upload.jsonl", b"", db=db_path)
    assert unchanged(db_path, seeded)


def test_unknown_shape_and_wrong_forced_format(tmp_path: Path, db_path: Path, seeded) -> None:
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"rows": [1, 2]}))
    with pytest.raises(
        UserInputError,
        match=r"could not detect the format .*tau2 \(expects an object \{info, tasks, simulations\}",
    ):
        ingest_paths([other], db=db_path)
    with pytest.raises(UserInputError, match="does not look like tau_bench"):
        ingest_paths([other], db=db_path, fmt="tau_bench")
    with pytest.raises(UserInputError, match="unknown format 'csv'"):
        ingest_paths([other], db=db_path, fmt="csv")
    assert unchanged(db_path, seeded)


def test_oversized_line_with_a_small_limit(tmp_path: Path, db_path: Path, seeded) -> None:
    big = rec(1, meta={"blob": "x" * 5000})
    path = jsonl(tmp_path / "big.jsonl", [rec(0), big, rec(2)])
    limits = IngestLimits(max_record_bytes=1024)
    with pytest.raises(
        UserInputError,
        match=r"big.jsonl: record 1 \(line 2\): line of 5.0 KiB is over the 1.0 KiB record limit",
    ):
        ingest_paths([path], db=db_path, limits=limits)
    assert unchanged(db_path, seeded)
    report = ingest_paths([path], db=db_path, limits=limits, skip_invalid=True)
    assert report.trajectories == 2
    assert [(s.record, "record limit" in s.reason) for s in report.skipped] == [(1, True)]


def test_a_real_200_mb_line_is_streamed_not_loaded(tmp_path: Path, db_path: Path, seeded) -> None:
    path = tmp_path / "huge.jsonl"
    with open(path, "wb") as fh:
        fh.write(json.dumps(rec(0)).encode() + b"\n")
        fh.write(b'{"id": "huge", "reward": 1, "messages": [{"role": "user", "content": "')
        block = b"a" * MiB
        for _ in range(200):
            fh.write(block)
        fh.write(b'"}]}\n')
        fh.write(json.dumps(rec(2)).encode() + b"\n")
    tracemalloc.start()
    try:
        with pytest.raises(
            UserInputError,
            match=r"huge.jsonl: record 1 \(line 2\): line of 200.0 MiB is over the 64.0 MiB record limit",
        ):
            ingest_paths([path], db=db_path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        assert unchanged(db_path, seeded)
    # Held at most the 64 MiB limit plus a chunk, never the 200 MB line.
    assert peak < 100 * MiB
    report = ingest_paths([path], db=db_path, skip_invalid=True)
    path.unlink()
    assert report.trajectories == 2 and [s.record for s in report.skipped] == [1]


def test_skip_invalid_lists_every_skipped_record(tmp_path: Path, db_path: Path) -> None:
    no_outcome = rec(3)
    del no_outcome["reward"]
    path = jsonl(
        tmp_path / "mixed.jsonl",
        [
            rec(0),
            b'{"id": "r1", "reward": ',
            rec(2, reward="high"),
            no_outcome,
            json.dumps(rec(4)).encode().replace(b"hi", b"h\xff"),
            rec(5),
        ],
    )
    report = ingest_paths([path], db=db_path, skip_invalid=True, require_outcome=True)
    assert report.trajectories == 2
    out = report.to_json()["skipped"]
    assert [s["record"] for s in out] == [1, 2, 3, 4] and {s["file"] for s in out} == {str(path)}
    reasons = [s["reason"] for s in out]
    assert "truncated JSON" in reasons[0]
    assert "field 'reward': expected a number, got a string" in reasons[1]
    assert "missing outcome" in reasons[2]
    assert "not valid UTF-8" in reasons[3]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            b'{"id": "a", "reward": NaN, "messages": [{"role": "user", "content": "x"}]}',
            r"field 'reward': expected a finite number, got nan",
        ),
        (
            b'{"id": "a", "reward": true, "messages": [{"role": "user", "content": "x"}]}',
            r"field 'reward': expected a number, got a boolean",
        ),
        (
            b'{"id": "a", "reward": 1, "messages": [{"role": "user", "content": 7}]}',
            r"field 'messages\[0\].content': expected a string, a list of content parts or null, got an integer",
        ),
        (
            b'{"id": "a", "reward": 1, "messages": [{"role": "tool", "content": "x", "tool_call_id": 5}]}',
            r"field 'messages\[0\].tool_call_id': input should be a valid string, got an integer",
        ),
        (
            b'{"id": "a", "reward": 1, "messages": [{"content": "x"}]}',
            r"field 'messages\[0\].role': missing; expected a string",
        ),
        (
            b'{"id": "a", "reward": 1, "messages": "hello"}',
            r"field 'messages': expected a list, got a string",
        ),
        (
            b'["not", "an", "object"]',
            r"record 0 \(line 1\): field '\(record\)': expected an object, got a list",
        ),
    ],
)
def test_each_wrong_type_is_named(
    tmp_path: Path, db_path: Path, line: bytes, expected: str
) -> None:
    path = tmp_path / "w.jsonl"
    path.write_bytes(line + b"\n")
    with pytest.raises(UserInputError, match=expected):
        ingest_paths([path], db=db_path, fmt="openai_jsonl")
    assert not db_path.exists()
