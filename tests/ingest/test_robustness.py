"""Hostile or unusual input (issue 10's robustness list): each gets a clear error naming the
file, record and field, stores nothing, and never shows a traceback; compressed input and
bounded batches work."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trace_lib import store
from trace_lib.errors import UserInputError
from trace_lib.ingest import IngestLimits, ingest_bytes, ingest_paths
from trace_lib.store import REPO_ROOT

MiB = 1 << 20


def rec(i: int, **extra) -> dict:
    r = {"id": f"r{i}", "reward": 1.0, "trial": 0,
         "messages": [{"role": "user", "content": f"hi {i}"},
                      {"role": "assistant", "content": "hello"}]}
    r.update(extra)
    return r


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n"
                            for r in records))
    return path


@pytest.fixture
def seeded(tmp_path: Path, db_path: Path) -> dict[str, int]:
    ingest_paths([write_jsonl(tmp_path / "seed.jsonl", [rec(100)])], db=db_path)
    with store.connect(db_path, read_only=True) as con:
        return store.table_counts(con)


def unchanged(db_path: Path, before: dict[str, int]) -> bool:
    with store.connect(db_path, read_only=True) as con:
        return store.table_counts(con) == before


def test_json_nested_100000_deep(tmp_path: Path, db_path: Path, seeded) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    line = json.dumps(rec(1)).replace('"trial": 0', f'"trial": 0, "extra": {deep}')
    jsonl = write_jsonl(tmp_path / "deep.jsonl", [line])
    with pytest.raises(UserInputError, match=r"deep.jsonl: record 0 \(line 1\): JSON nested too"):
        ingest_paths([jsonl], db=db_path)
    doc = tmp_path / "deep.json"
    doc.write_text(f'[{{"task_id": 1, "reward": 1, "traj": [], "x": {deep}}}]')
    with pytest.raises(UserInputError, match=r"deep.json: JSON nested too deeply"):
        ingest_paths([doc], db=db_path)
    assert unchanged(db_path, seeded)


def test_lone_surrogate_is_replaced_and_said(tmp_path: Path, db_path: Path, seeded) -> None:
    line = json.dumps(rec(1)).replace("hi 1", "bad \\ud800 text")
    assert "\\ud800" in line
    report = ingest_paths([write_jsonl(tmp_path / "s.jsonl", [line, rec(2)])], db=db_path)
    assert report.trajectories == 2
    assert any("record r1: lone UTF-16 surrogate(s) replaced with U+FFFD" in w
               for w in report.warnings)
    with store.connect(db_path, read_only=True) as con:
        assert con.execute("SELECT content FROM messages WHERE content LIKE 'bad%'"
                           ).fetchone()[0] == "bad \ufffd text"


@pytest.mark.parametrize(
    ("line", "match"),
    [
        (json.dumps(rec(1, trial=2**40)),
         r"record 0 \(line 1\): field 'trial': expected an integer within 32 bits, "
         r"got 1099511627776"),
        ('{"id": ' + "9" * 5000 + ', "reward": 1, "messages": []}',
         r"record 0 \(line 1\): a number is too large to read"),
        (json.dumps(rec(1, id=int("9" * 2000))),
         r"field 'id': expected an id of at most 1000 characters, got 2000"),
        (json.dumps(rec(1, reward=10**400)),
         r"field 'reward': expected a number within the float range"),
    ],
)
def test_integers_too_large(tmp_path: Path, db_path: Path, seeded, line: str, match: str) -> None:
    with pytest.raises(UserInputError, match=match):
        ingest_paths([write_jsonl(tmp_path / "big.jsonl", [line])], db=db_path)
    assert unchanged(db_path, seeded)


def test_reward_outside_range_unless_declared(tmp_path: Path, db_path: Path, seeded) -> None:
    path = write_jsonl(tmp_path / "scale.jsonl", [rec(1, reward=7), rec(2, reward=10),
                                                   rec(3, reward=0)])
    with pytest.raises(UserInputError, match=r"record 0 \(line 1\): field 'reward': expected a "
                       r"reward within \[0, 1\], got 7; pass --reward-range LO,HI"):
        ingest_paths([path], db=db_path)
    assert unchanged(db_path, seeded)
    report = ingest_paths([path], db=db_path, reward_range="0,10")
    assert (report.successes, report.failures) == (1, 2)  # success = the top of the scale
    with pytest.raises(UserInputError, match="--reward-range 'x': expected two numbers"):
        ingest_paths([path], db=db_path, reward_range="x")


def test_record_limit_applies_to_json_documents(tmp_path: Path, db_path: Path, seeded) -> None:
    big = {"task_id": 1, "reward": 1.0, "trial": 0, "info": {},
           "traj": [{"role": "user", "content": "x" * (2 * MiB)}]}
    small = {**big, "task_id": 0, "traj": [{"role": "user", "content": "hi"}]}
    path = tmp_path / "gpt-4o-retail.json"
    path.write_text(json.dumps([small, big]))
    with pytest.raises(UserInputError, match=r"gpt-4o-retail.json: record 1 \(bytes \d+-\d+\) is "
                       r"2.0 MiB, over the 1.0 MiB record limit"):
        ingest_paths([path], db=db_path, limits=IngestLimits(max_record_bytes=MiB))
    assert unchanged(db_path, seeded)
    assert ingest_paths([path], db=db_path).trajectories == 2  # the default 64 MiB is fine


@pytest.mark.parametrize("name", ["runs.jsonl.gz", "gpt-4o-retail.json.gz", "runs.gz"])
def test_gzip_is_read_transparently(tmp_path: Path, db_path: Path, name: str) -> None:
    if "retail" in name:
        body = json.dumps([{"task_id": i, "reward": 1.0, "trial": 0, "info": {},
                            "traj": [{"role": "user", "content": f"hi {i}"}]} for i in range(3)])
    else:
        body = "".join(json.dumps(rec(i)) + "\n" for i in range(3))
    path = tmp_path / name
    path.write_bytes(gzip.compress(body.encode()))
    report = ingest_paths([path], db=db_path)
    assert report.trajectories == 3
    # The same content uncompressed is the same dataset and the same trajectories.
    plain = tmp_path / name.removesuffix(".gz")
    plain.write_text(body)
    if plain.suffix == "":
        plain = plain.rename(plain.with_suffix(".jsonl"))
    again = ingest_paths([plain], db=db_path)
    assert (again.trajectories, again.duplicates) == (0, 3)
    assert again.datasets[0]["id"] == report.datasets[0]["id"]
    upload = ingest_bytes(name, path.read_bytes(), db=db_path)
    assert upload.duplicates == 3


def test_corrupt_gzip_and_symlink_loop(tmp_path: Path, db_path: Path) -> None:
    bad = tmp_path / "x.jsonl.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(UserInputError, match="x.jsonl.gz: not a readable gzip file"):
        ingest_paths([bad], db=db_path)
    loop = tmp_path / "loop.json"
    os.symlink(tmp_path / "loop2.json", loop)
    os.symlink(loop, tmp_path / "loop2.json")
    with pytest.raises(UserInputError, match="loop.json: symbolic link loop"):
        ingest_paths([loop], db=db_path)
    dangling = tmp_path / "gone.json"
    os.symlink(tmp_path / "nowhere.json", dangling)
    with pytest.raises(UserInputError, match="gone.json: broken symbolic link"):
        ingest_paths([dangling], db=db_path)
    assert not db_path.exists()


def test_batches_stream_inside_one_transaction(tmp_path: Path, db_path: Path) -> None:
    good = write_jsonl(tmp_path / "many.jsonl", [rec(i) for i in range(50)])
    report = ingest_paths([good], db=db_path, batch_size=7)  # 8 batches
    assert report.trajectories == 50
    with store.connect(db_path, read_only=True) as con:
        before = store.table_counts(con)
        assert before["messages"] == 100
    # A bad record after several batches were written rolls all of them back.
    bad = write_jsonl(tmp_path / "late.jsonl",
                      [rec(1000 + i) for i in range(40)] + [rec(9999, reward="x")])
    with pytest.raises(UserInputError, match=r"record 40 \(line 41\): field 'reward'"):
        ingest_paths([bad], db=db_path, batch_size=7)
    assert unchanged(db_path, before)
    # Duplicates are found across batches and against the store.
    again = ingest_paths([good, good], db=db_path, batch_size=7)
    assert (again.trajectories, again.duplicates) == (0, 100)


def test_failed_import_into_a_new_store_leaves_no_file(tmp_path: Path, db_path: Path) -> None:
    bad = write_jsonl(tmp_path / "late.jsonl", [rec(i) for i in range(20)] + [rec(99, trial="x")])
    with pytest.raises(UserInputError):
        ingest_paths([bad], db=db_path, batch_size=5)  # fails after 4 batches were written
    assert not db_path.exists()


def test_cli_bad_input_exit_code_one_without_traceback(tmp_path: Path, db_path: Path) -> None:
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"id": 1, "reward": 1, "messages": ' + "[" * 50_000 + "]" * 50_000 + "}\n")
    scale = write_jsonl(tmp_path / "scale.jsonl", [rec(1, reward=7)])
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for path, extra, want in [
        (deep, [], "JSON nested too deeply"),
        (scale, [], "expected a reward within [0, 1], got 7"),
        (scale, ["--reward-range", "0,10", "--domain", "d", "--agent-model", "m"], None),
    ]:
        out = subprocess.run([sys.executable, "-m", "trace_lib", "ingest", str(path), "--json",
                              "--db", str(db_path), *extra], cwd=REPO_ROOT, env=env,
                             capture_output=True, text=True, timeout=120)
        assert "Traceback" not in out.stderr
        if want is None:
            assert out.returncode == 0, out.stderr
            assert json.loads(out.stdout)["failures"] == 1
        else:
            assert out.returncode == 1 and want in out.stderr and out.stdout == ""
    with store.connect(db_path, read_only=True) as con:
        assert con.execute("SELECT agent_model, domain FROM trajectories").fetchall() == [
            ("m", "d")]


def test_cli_negative_reward_range_in_the_space_form(tmp_path: Path, db_path: Path) -> None:
    # A scale below zero (-1000..0): the error names a range that works, and the space
    # form the error shows (`--reward-range -1000,0`) parses although its value starts
    # with "-" (argparse would read it as another option).
    scores = write_jsonl(tmp_path / "neg.jsonl", [rec(1, reward=-37), rec(2, reward=0)])
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}

    def run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "trace_lib", "ingest", str(scores),
                               "--json", "--db", str(db_path), *extra], cwd=REPO_ROOT, env=env,
                              capture_output=True, text=True, timeout=120)

    refused = run()
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "--reward-range -37,1" in refused.stderr
    for form in (["--reward-range", "-1000,0"], ["--reward-range=-1000,0"]):
        out = run(*form, "--domain", "d", "--agent-model", "m")
        assert out.returncode == 0, out.stderr
    with store.connect(db_path, read_only=True) as con:
        got = con.execute("SELECT reward, success FROM trajectories ORDER BY reward").fetchall()
    assert got == [(-37.0, False), (0.0, True)]  # success = the top of the scale


def test_range_values_are_joined_to_their_flag() -> None:
    from trace_lib.cli import join_range_values

    assert join_range_values(["ingest", "f", "--reward-range", "-1e3,0", "--json"]) == [
        "ingest", "f", "--reward-range=-1e3,0", "--json"]
    assert join_range_values(["--reward-range", "0,10"]) == ["--reward-range", "0,10"]
    assert join_range_values(["--reward-range", "--json"]) == ["--reward-range", "--json"]
