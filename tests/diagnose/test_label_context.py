"""Context-aware cutting end to end, against real HTTP servers on 127.0.0.1: a server that
reports its context in `/v1/models` (as vLLM does) and answers with labels computed from
the request, and the project's own policy server serving the tiny model. The long tau2
trajectories come from the shared data (read there, never copied)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from label_wire import fenced, models_reply, quoting_answer
from wire_server import Reply, WireServer

from trace_lib import store
from trace_lib.cli import main
from trace_lib.diagnose.labeling import LabelRunFailed, run_labeling
from trace_lib.diagnose.token_count import local_counter
from trace_lib.diagnose.transcript_prompt import render_message
from trace_lib.ingest import ingest_paths
from trace_lib.trajectories import load_transcripts
from trace_lib.workbench import diagnose as wb

TAU2_AIRLINE = "tau2-bench/results/feature-gym/gpt-4.1_airline_default_gpt-4.1_1trials.json"
CAPS = ["tool_calling_precision", "precondition_verification"]
CONTEXT = 8192


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's folder (its byte-level tokenizer stands for a served model's)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
    from policy_fixtures import private_models_dir

    from trace_lib.runtime import base_models

    with private_models_dir(tmp_path_factory.mktemp("models")):
        yield base_models.ensure_model_dir("tiny")


@pytest.fixture(scope="module")
def tau2_template(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("tau2") / "tau2.duckdb"
    ingest_paths([shared_data / TAU2_AIRLINE], db=db)
    return db


@pytest.fixture
def tau2_db(tau2_template: Path, tmp_path: Path) -> Path:
    db = tmp_path / "tau2.duckdb"
    shutil.copy(tau2_template, db)
    return db


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def _longest(db: Path) -> str:
    with store.connect(db) as con:
        return con.execute("SELECT trajectory_id FROM messages GROUP BY 1 "
                           "ORDER BY sum(length(content)) DESC LIMIT 1").fetchone()[0]


def test_long_tau2_trajectory_is_cut_to_the_served_context(
        tau2_db: Path, tiny_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM-style `/v1/models` (max_model_len + root): the labeler sizes every prompt by it,
    counts with the served model's tokenizer, and the label rows say what was cut."""
    def respond(path: str, body: dict, n: int) -> Reply:
        if path == "/v1/models":
            return models_reply("served", max_model_len=CONTEXT, root=str(tiny_dir))
        return quoting_answer(body)

    db = ["--db", str(tau2_db)]
    with WireServer(respond) as srv:
        runs = _json(capsys, ["label", "--labeler", "openai", "--model", "served",
                              "--base-url", srv.url + "/v1", "--capabilities", ",".join(CAPS),
                              "--run", "ctx", "--concurrency", "2", "--json", *db])
    chats = [b for p, b in srv.requests if p == "/v1/chat/completions"]
    assert sum(p == "/v1/models" for p, _ in srv.requests) == 1  # asked once per run
    [run] = runs
    with store.connect(tau2_db) as con:
        n_traj = con.execute("SELECT count(*) FROM trajectories").fetchone()[0]
        rows = con.execute("SELECT trajectory_id, max(cut_messages), max(cut_tokens) "
                           "FROM labels WHERE run_id = 'ctx' GROUP BY 1").fetchall()
        notes = con.execute("SELECT notes FROM label_runs WHERE id = 'ctx'").fetchone()[0]
        t = load_transcripts(con, [_longest(tau2_db)])[0]
    assert len(chats) == n_traj == run["n_trajectories"] == 20
    assert f"context {CONTEXT} tokens (/v1/models max_model_len)" in notes
    assert f"tokenizer at {tiny_dir}" in notes and run["notes"] == notes.split("; ")

    # Every request fits: prompt (counted by the served model's tokenizer) + the answer
    # it asks for, with a repair round's room to spare.
    counter, _ = local_counter([str(tiny_dir)])
    for body in chats:
        system, user = (m["content"] for m in body["messages"])
        assert counter.count(system) + counter.count(user) + body["max_tokens"] <= CONTEXT
        assert system == chats[0]["messages"][0]["content"]  # the shared prefix

    # The longest trajectory was cut, and its row says by how much.
    cut = {tid: (m, k) for tid, m, k in rows}
    assert cut[t.id][0] > 0 and cut[t.id][1] > 0
    assert run["n_cut"] == sum(1 for m, k in cut.values() if m or k) > 0
    body = next(b for b in chats if f"trajectory: {t.id}\n" in b["messages"][1]["content"])
    nonce, before, inside, after = fenced(body["messages"][1]["content"])
    assert "left out to fit the context" in before  # the prompt says where the gaps are
    assert "[0] system: # Airline Agent Policy" in inside  # the task
    gaps = re.findall(r"^\[\.\.\. (\d+) messages? omitted \.\.\.\]$", inside, re.M)
    assert sum(map(int, gaps)) == cut[t.id][0]  # every left-out message marked
    assert inside.endswith(render_message(t.messages[-1]))  # the last turn, whole
    for c in t.calls:  # every tool call
        assert f"-> call {c.name}(" in inside

    # Evidence: one quote per trajectory verified, the invented ones dropped, and the
    # second capability (only invented evidence) unsupported.
    assert run["n_unsupported"] == n_traj
    assert run["unsupported_rate"] == {CAPS[0]: 0.0, CAPS[1]: 1.0}
    listed = {r["id"]: r for r in _json(capsys, ["labels", "runs", "--json", *db])}
    assert listed["ctx"]["n_cut"] == run["n_cut"]
    assert listed["ctx"]["n_unsupported"] == n_traj
    assert listed["ctx"]["unsupported_rate"] == {CAPS[0]: 0.0, CAPS[1]: 1.0}
    with store.connect(tau2_db) as con:
        kept = con.execute("SELECT evidence, evidence_dropped, unsupported FROM labels "
                           "WHERE run_id = 'ctx' AND trajectory_id = ? AND capability = ?",
                           [t.id, CAPS[0]]).fetchone()
    assert len(json.loads(kept[0])) == 1 and kept[1] == 1 and kept[2] is False

    # The Labels grid (its use case) shows the cut and the unsupported capability.
    grid = wb.label_grid(tau2_db, wb.LabelFilter(capabilities=CAPS)).set_index("trajectory_id")
    assert grid.loc[t.id, "cut_messages"] == cut[t.id][0]
    assert grid.loc[t.id, "cut_tokens"] == cut[t.id][1]
    assert grid.loc[t.id, "unsupported"] == CAPS[1]
    # ...and the review queue lists unsupported pairs first.
    queue = _json(capsys, ["labels", "queue", "--json", *db])
    assert queue and all(q["n_unsupported"] == 1 and q["capability"] == CAPS[1]
                         for q in queue[:n_traj])


def test_max_context_flag_when_the_server_reports_none(
        tau2_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No `/v1/models` card: `--max-context` sizes the prompts and characters / 4 counts
    them, and the run's notes say both."""
    def respond(path: str, body: dict, n: int) -> Reply:
        if path == "/v1/models":
            return Reply(status=404, body={"error": {"message": "not here"}})
        return quoting_answer(body)

    with WireServer(respond) as srv:
        [run] = _json(capsys, ["label", "--labeler", "openai", "--model", "gpt-4.1",
                               "--base-url", srv.url + "/v1", "--capabilities", CAPS[0],
                               "--max-context", "4000", "--run", "flag", "--json",
                               "--db", str(tau2_db)])
    chats = [b for p, b in srv.requests if p == "/v1/chat/completions"]
    assert run["notes"][0] == "context 4000 tokens (--max-context)"
    assert "characters / 4" in run["notes"][1]
    for body in chats:  # the estimate keeps the prompt inside the flag's context
        chars = sum(len(m["content"]) for m in body["messages"])
        assert chars / 4 + body["max_tokens"] <= 4000
    assert run["n_cut"] == run["n_trajectories"] == 20  # every tau2 airline one is longer


def test_a_context_too_small_is_a_clear_error(tau2_db: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    with WireServer(lambda p, b, n: Reply(status=404, body={})) as srv:
        def label(run: str, max_context: str) -> int:
            return main(["label", "--labeler", "openai", "--model", "m", "--base-url",
                         srv.url + "/v1", "--capabilities", CAPS[0], "--run", run,
                         "--max-context", max_context, "--db", str(tau2_db)])

        assert label("small", "1200") == 1
        err = capsys.readouterr().err
        assert "error: context of 1200 tokens (--max-context) leaves" in err
        assert "raise --max-context" in err and "Traceback" not in err
        assert label("zero", "0") == 1
        assert "--max-context 0: expected a positive number" in capsys.readouterr().err
    assert not [p for p, _ in srv.requests if p == "/v1/chat/completions"]


def test_the_policy_server_reports_its_context_and_accepts_every_cut_prompt(
        tau2_db: Path, tiny_dir: Path) -> None:
    """The project's own policy server (tiny model, 4096-token context): the labeler reads
    `max_model_len` and the model folder from its `/v1/models`, and the server takes every
    cut prompt and its repair round (a prompt past the context is a 400 there, recorded as
    a failed call): the tiny model's answers are not JSON, so every pair fails as a
    malformed answer, never as a refused call."""
    from trace_lib.runtime.policy_server import PolicyServer, ServerConfig

    tid = _longest(tau2_db)
    with PolicyServer(ServerConfig(model=str(tiny_dir), served_model_name="tiny",
                                   max_model_len=4096)) as srv:
        with pytest.raises(LabelRunFailed, match="malformed answer"):
            run_labeling(tau2_db, "openai", capabilities=CAPS[:1], trajectory_ids=[tid],
                         run_prefix="ours", model="tiny", base_url=srv.base_url,
                         max_tokens=48, max_retries=0, concurrency=1)
    with store.connect(tau2_db) as con:
        notes = con.execute("SELECT notes FROM label_runs WHERE id = 'ours'").fetchone()[0]
        rows = con.execute("SELECT error, cut_messages, cut_tokens FROM labels "
                           "WHERE run_id = 'ours'").fetchall()
    assert "context 4096 tokens (/v1/models max_model_len)" in notes
    assert f"tokenizer at {tiny_dir}" in notes
    [(error, cut_messages, cut_tokens)] = rows
    assert error.startswith("malformed answer") and cut_messages > 0 and cut_tokens > 0
