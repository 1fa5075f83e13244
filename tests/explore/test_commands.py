"""`python -m trace_lib explore ...` through the real CLI entry point."""

from __future__ import annotations

import json

from trace_lib.cli import main


def run_json(capsys, *argv):
    capsys.readouterr()
    assert main(["explore", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_explore_verbs(known_db, capsys):
    db = ["--db", str(known_db)]
    over = {r["item"]: r["n"] for r in run_json(capsys, "overview", *db)}
    assert over["trajectories"] == 6 and over["composed models"] == 0
    stats = run_json(capsys, "stats", *db, "--outcome", "failure", "--domain", "airline")
    assert stats["summary"][0]["n_trajectories"] == 3
    rows = run_json(capsys, "list", *db, "--tool-error")
    assert {r["id"] for r in rows} == {"t_f2", "t_f4"}
    rows = run_json(capsys, "list", *db, "--no-tool-error", "--text", "HELP")
    assert {r["id"] for r in rows} == {"t_ok1", "t_f1", "t_f3", "t_u1"}
    sigs = run_json(capsys, "signatures", *db)
    assert sum(s["n"] for s in sigs) == 4
    members = run_json(capsys, "signatures", *db, "--members", "too_many_errors/get_user")
    assert [m["trajectory_id"] for m in members] == ["t_f2"]
    shown = run_json(capsys, "show", "t_f2", *db)
    assert shown["trajectory"]["id"] == "t_f2"
    assert [r["status"] for r in shown["expected_vs_actual"]] == ["only right", "same",
                                                                  "only left"]
    cmp_ = run_json(capsys, "compare", "t_f2", *db)
    assert (cmp_["passed"], cmp_["failed"]) == ("t_ok1", "t_f2")


def test_explore_text_output_and_errors(known_db, capsys):
    db = ["--db", str(known_db)]
    assert main(["explore", "show", "t_f4", *db]) == 0
    out = capsys.readouterr().out
    assert "<script>window.__xss=1</script>" in out  # plain text on a terminal: as written
    assert "# expected vs actual" in out
    assert main(["explore", "show", "missing", *db]) == 1
    assert "trajectory 'missing': not in the store" in capsys.readouterr().err
    assert main(["explore", "compare", "t_f4", *db]) == 1
    assert "no passed and failed trial" in capsys.readouterr().err


def test_explore_embed_then_semantic(known_db, capsys):
    db = ["--db", str(known_db)]
    rep = run_json(capsys, "embed", *db)
    assert (rep["computed"], rep["cached"]) == (4, 0)
    assert run_json(capsys, "embed", *db)["computed"] == 0
    sem = run_json(capsys, "semantic", *db, "--k", "2")
    assert sem["k"] == 2 and len(sem["points"]) == 4


def test_explore_reindex_and_text_modes(known_db, capsys):
    # the fixture store is written with plain SQL: nothing derived or indexed yet
    db = ["--db", str(known_db)]
    before = {r["id"] for r in run_json(capsys, "list", *db, "--text", "cancel ord")}
    assert before == {"t_f4"}
    out = run_json(capsys, "reindex", *db)
    assert out == {"derived": 6, "indexed": 6}
    from trace_lib import store
    from trace_lib.store import search

    with store.connect(known_db, read_only=True) as con:
        assert search.index_state(con).fresh
        assert search.hits(con, "cancel ord").source == "index"
    assert {r["id"] for r in run_json(capsys, "list", *db, "--text", "cancel ord")} == before
    # "ZFA04Y" sits inside a tool error, "FA04" inside a token: substring mode finds it
    assert {r["id"] for r in run_json(capsys, "list", *db, "--text", "FA04")} == set()
    assert {r["id"] for r in run_json(capsys, "list", *db, "--text", "FA04",
                                      "--text-mode", "substring")} == {"t_f4"}
    sigs = run_json(capsys, "signatures", *db)
    assert sum(s["n"] for s in sigs) == 4


def test_explore_text_system_adds_the_system_prompt(tmp_path, capsys):
    """`--text` reads the conversation; `--text-system` adds the system prompt (issue 34)."""
    from trace_lib.ingest import ingest_paths

    records = [{"id": f"r{i}", "task_id": str(i), "domain": "airline", "agent_model": "m",
                "reward": 1.0, "messages": [
                    {"role": "system", "content": "Policy: refunds need a reason."},
                    {"role": "user", "content": text},
                    {"role": "assistant", "content": "ok"}]}
               for i, text in enumerate(["a refund please", "change my seat", "refundable?"])]
    src = tmp_path / "sys.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    db = ["--db", str(tmp_path / "s.duckdb")]
    ingest_paths([src], db=tmp_path / "s.duckdb")
    for mode in ("words", "substring"):
        talk = run_json(capsys, "list", *db, "--text", "refund", "--text-mode", mode)
        every = run_json(capsys, "list", *db, "--text", "refund", "--text-mode", mode,
                         "--text-system")
        assert {r["task_id"] for r in talk} == {"0", "2"}, mode
        assert {r["task_id"] for r in every} == {"0", "1", "2"}, mode
