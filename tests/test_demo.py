"""The demo data set: deterministic, a realistic mix, importable, the committed file fresh."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trace_lib.cli import main
from trace_lib.demo import (
    DEMO_DIR,
    DEMO_FILE,
    DemoConfig,
    build_demo,
    build_records,
    demo_present,
    summarize,
    write_jsonl,
)
from trace_lib.envs.domains.airline.scripted_agent import DEFICITS
from trace_lib.store import connect

FIELDS = ["id", "task_id", "trial", "agent_model", "domain", "reward", "success", "termination",
          "messages", "tools", "expected_actions", "meta"]


@pytest.fixture(scope="module")
def default_file(tmp_path_factory) -> Path:
    """The demo exactly as `demo build` makes it by default (n=300, seed=0)."""
    out = tmp_path_factory.mktemp("demo")
    return write_jsonl(build_records(DemoConfig()), out / DEMO_FILE)


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_same_seed_gives_a_byte_identical_file(tmp_path: Path):
    a = write_jsonl(build_records(DemoConfig(n=24, seed=5)), tmp_path / "a.jsonl")
    b = write_jsonl(build_records(DemoConfig(n=24, seed=5)), tmp_path / "b.jsonl")
    c = write_jsonl(build_records(DemoConfig(n=24, seed=6)), tmp_path / "c.jsonl")
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()
    assert len(_records(a)) == 24


def test_bytes_do_not_depend_on_the_process_hash_seed(tmp_path: Path):
    """Set iteration order changes with PYTHONHASHSEED; nothing in the output may follow it."""
    import os
    import subprocess
    import sys

    code = ("import sys; from pathlib import Path; from trace_lib.demo import DemoConfig, "
            "build_records, write_jsonl; write_jsonl(build_records(DemoConfig(n=12, seed=4)), "
            "Path(sys.argv[1]))")
    outs = []
    for hash_seed in ("1", "2"):
        out = tmp_path / f"h{hash_seed}.jsonl"
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        subprocess.run([sys.executable, "-c", code, str(out)], check=True, env=env,
                       cwd=Path(__file__).resolve().parent.parent, timeout=300)
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]


def test_committed_demo_file_is_what_the_generator_makes(default_file: Path):
    committed = DEMO_DIR / DEMO_FILE
    assert committed.exists(), "run `python -m trace_lib demo build --no-import`"
    assert committed.read_bytes() == default_file.read_bytes(), (
        "data/demo is stale: regenerate with `python -m trace_lib demo build --no-import`")
    assert committed.stat().st_size < 5_000_000


def test_realistic_mix(default_file: Path):
    recs = _records(default_file)
    s = summarize(recs)
    assert s["trajectories"] == 300 and s["tasks"] == 50
    assert 0.35 <= s["success_rate"] <= 0.60
    by_agent = s["success_rate_by_agent"]
    assert set(by_agent) == {"scripted-careful", "scripted-hasty", "scripted-sloppy"}
    assert by_agent["scripted-careful"] > by_agent["scripted-hasty"] + 0.2
    assert by_agent["scripted-careful"] > by_agent["scripted-sloppy"] + 0.2
    assert set(s["planted_deficits"]) == set(DEFICITS)
    assert all(v >= 15 for v in s["planted_deficits"].values())
    assert {r["trial"] for r in recs} == {0, 1}
    # Every failure is explained by a planted deficit; rewards are binary and match success.
    for r in recs:
        assert r["reward"] in (0.0, 1.0) and r["success"] == (r["reward"] == 1.0)
        if not r["success"]:
            assert r["meta"]["planted_deficits"], r["id"]
        assert set(r["meta"]["planted_deficits"]) <= set(r["meta"]["armed_deficits"])


def test_jsonl_shape(default_file: Path):
    recs = _records(default_file)
    assert list(recs[0]) == FIELDS
    assert [t["function"]["name"] for t in recs[0]["tools"]][:3] == [
        "book_reservation", "calculate", "cancel_reservation"]
    ids = set()
    for r in recs:
        assert [k for k in FIELDS if k in r] == list(r) and "tools" not in r or r is recs[0]
        assert r["domain"] == "airline" and r["termination"] == "agent_stop"
        assert r["id"] not in ids
        ids.add(r["id"])
        assert [m["role"] for m in r["messages"][:2]] == ["system", "user"]
        assert r["messages"][-1]["role"] == "assistant"
        assert r["expected_actions"][0]["name"] == "get_user_details"
        for m in r["messages"]:
            for tc in m.get("tool_calls") or []:
                assert isinstance(json.loads(tc["function"]["arguments"]), dict)


def test_build_demo_imports_into_the_store(db_path: Path, tmp_path: Path):
    assert not demo_present(db_path)
    report = build_demo(tmp_path / "demo", n=30, seed=2, db=db_path)
    assert report["ingest"]["trajectories"] == 30
    with connect(db_path, read_only=True) as con:
        n, n_ok = con.execute("SELECT count(*), count(*) FILTER (WHERE success) "
                              "FROM trajectories").fetchone()
        assert n == 30 and n_ok == round(report["success_rate"] * 30)
        assert con.execute("SELECT count(DISTINCT task_id) FROM expected_actions").fetchone()[
            0] == report["tasks"]
        tools = {r[0] for r in con.execute(
            "SELECT name FROM tool_schemas WHERE domain = 'airline'").fetchall()}
        assert {"cancel_reservation", "book_reservation", "think"} <= tools
        planted = con.execute(
            "SELECT json_extract(meta, '$.planted_deficits') FROM trajectories "
            "WHERE NOT success LIMIT 1").fetchone()[0]
        assert set(json.loads(planted)) <= set(DEFICITS) and json.loads(planted)
    assert demo_present(db_path)
    assert build_demo(tmp_path / "demo", n=30, seed=2, db=db_path, if_absent=True) == {
        "skipped": True, "reason": f"{DEMO_FILE} is already in the store"}


def test_cli_verb(db_path: Path, tmp_path: Path, capsys):
    out = tmp_path / "cli"
    assert main(["demo", "build", "--out", str(out), "--n", "12", "--db", str(db_path),
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["trajectories"] == 12 and (out / DEMO_FILE).exists()
    assert main(["demo", "build", "--out", str(out), "--db", str(db_path), "--if-absent"]) == 0
    assert "already imported" in capsys.readouterr().out
    assert main(["demo", "build", "--out", str(out), "--n", "0", "--db", str(db_path)]) == 1
    assert "--n: expected at least 1" in capsys.readouterr().err
