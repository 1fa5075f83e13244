"""LLM labelers through the real SDKs against local wire-format servers: one call per
trajectory, N runs stored separately, malformed answers repaired or recorded as failed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from synthetic import make_store
from wire_server import Reply, WireServer, anthropic_tool_reply, error_reply, openai_reply

from trace_lib import store
from trace_lib.diagnose.labeling import LabelRunFailed, run_labeling

CAPS = ["tool_calling_precision", "precondition_verification"]


def _store(db: Path) -> None:
    make_store(db, {"a": False, "b": True}, {})
    with store.connect(db) as con:
        for tid in ("a", "b"):
            con.execute("INSERT INTO messages (trajectory_id, idx, role, content) VALUES "
                        "(?, 0, 'user', 'cancel my trip'), (?, 1, 'assistant', 'cancelled')",
                        [tid, tid])


def _answer(schema_props: list[str], value: str = "lacking") -> dict:
    # One quote of message 1 and one that message never said (dropped by the check).
    return {c: {"value": value, "evidence": [{"message_idx": 1, "text": "Cancelled"},
                                             {"message_idx": 1, "text": "cancelled blindly"}],
                "confidence": 0.8} for c in schema_props}


def test_anthropic_labeler_runs_cache_and_cost(db_path: Path) -> None:
    _store(db_path)

    def respond(path, body, n):
        if n == 1:
            return error_reply(429)  # backoff inside the SDK, then success
        props = list(body["tools"][0]["input_schema"]["properties"])
        return anthropic_tool_reply("record_labels", _answer(props), input_tokens=40,
                                    output_tokens=30, cache_read=1000)

    with WireServer(respond) as srv:
        summaries = run_labeling(db_path, "anthropic", runs=2, capabilities=CAPS,
                                 run_prefix="claude", api_key="k", base_url=srv.url,
                                 model="claude-sonnet-4-5", concurrency=2)
    assert [s.run_id for s in summaries] == ["claude-r0", "claude-r1"]
    label_calls = [b for p, b in srv.requests if p == "/v1/messages"]
    assert len(label_calls) == 2 * 2 + 1  # one per trajectory per run, plus the 429
    first = label_calls[0]
    assert first["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert "tool_calling_precision" in first["system"][0]["text"]
    assert "cancel my trip" in first["messages"][0]["content"]
    assert "reward" not in first["messages"][0]["content"].lower()  # outcome hidden
    with store.connect(db_path) as con:
        n, vals = con.execute("SELECT count(*), list(DISTINCT value) FROM labels").fetchone()
        cost = json.loads(con.execute("SELECT cost FROM label_runs WHERE id = 'claude-r0'"
                                      ).fetchone()[0])
        ev, dropped, unsupported, cut = con.execute(
            "SELECT evidence, evidence_dropped, unsupported, cut_tokens FROM labels LIMIT 1"
        ).fetchone()
        notes = con.execute("SELECT notes FROM label_runs WHERE id = 'claude-r0'").fetchone()[0]
    assert n == 2 * 2 * 2 and vals == ["lacking"]
    assert cost["input_tokens"] == 80 and cost["cache_read_tokens"] == 2000
    assert cost["cost_usd"] > 0 and cost["n_failed_pairs"] == 0
    assert json.loads(ev) == [{"message_idx": 1, "text": "Cancelled"}]  # the quote it said
    assert dropped == 1 and unsupported is False and cut == 0
    # Claude's documented window; no Claude tokenizer here, so the count is an estimate.
    assert "context 200000 tokens" in notes and "characters / 4" in notes


def test_openai_labeler_repairs_then_records_failures(db_path: Path) -> None:
    _store(db_path)
    seen_seeds = []

    def respond(path, body, n):
        if path == "/v1/models":  # a server without a model list: sized without it
            return Reply(status=404, body={"error": {"message": "no such route"}})
        seen_seeds.append(body.get("seed"))
        props = list(body["response_format"]["json_schema"]["schema"]["properties"])
        user = body["messages"][1]["content"]
        if "trajectory: a\n" in user:
            if len(body["messages"]) == 2:
                return openai_reply("{truncated")  # repaired on the second try
            return openai_reply(json.dumps(_answer(props, "present")))
        # Trajectory b: always missing a capability -> recorded as failed, not `na`.
        return openai_reply(json.dumps(_answer(props[:1])))

    with WireServer(respond) as srv:
        [s] = run_labeling(db_path, "openai", capabilities=CAPS, run_prefix="vllm",
                           base_url=srv.url + "/v1", model="qwen", api_key="x", concurrency=1)
    assert s.n_failed == 2 and seen_seeds[0] == 0
    with store.connect(db_path) as con:
        rows = con.execute("SELECT trajectory_id, value, error FROM labels ORDER BY 1, 2").fetchall()
    assert [(r[0], r[1]) for r in rows if r[0] == "a"] == [("a", "present"), ("a", "present")]
    failed = [r for r in rows if r[0] == "b"]
    assert all(r[1] is None and "precondition_verification" in r[2] for r in failed)


def test_timeouts_after_retries_are_recorded_as_failed(db_path: Path) -> None:
    _store(db_path)
    with WireServer(lambda p, b, n: Reply(sleep=1.0, body={})) as srv:
        with pytest.raises(LabelRunFailed, match="all 2 pairs failed.*Timeout"):
            run_labeling(db_path, "openai", capabilities=CAPS[:1], run_prefix="slow",
                         base_url=srv.url + "/v1", model="m", timeout=0.2, max_retries=0)
    with store.connect(db_path) as con:
        errors = [r[0] for r in con.execute("SELECT error FROM labels").fetchall()]
        status = con.execute("SELECT status, status_reason FROM label_runs").fetchone()
    assert all("call failed" in e and "Timeout" in e for e in errors)
    assert status[0] == "failed" and "Timeout" in status[1]


def test_anthropic_message_batches_with_repair_of_invalid_answers(db_path: Path) -> None:
    _store(db_path)
    state: dict = {"polls": 0}

    def respond(path, body, n):
        if path == "/v1/messages/batches" and body:
            state["reqs"] = body["requests"]
            return Reply(_batch("in_progress"))
        if path.endswith("/results"):
            lines = []
            for r in state["reqs"]:
                props = list(r["params"]["tools"][0]["input_schema"]["properties"])
                # trajectory b's batch answer misses a capability: repaired by a direct call
                ans = _answer(props if r["custom_id"] == "a" else props[:1])
                msg = anthropic_tool_reply("record_labels", ans).body
                lines.append(json.dumps({"custom_id": r["custom_id"],
                                         "result": {"type": "succeeded", "message": msg}}))
            return Reply(raw="\n".join(lines))
        if path == "/v1/messages":  # the repair call for trajectory b
            props = list(body["tools"][0]["input_schema"]["properties"])
            return anthropic_tool_reply("record_labels", _answer(props, "na"))
        state["polls"] += 1
        return Reply(_batch("ended", url=srv.url))

    with WireServer(respond) as srv:
        [s] = run_labeling(db_path, "anthropic", capabilities=CAPS, run_prefix="batch",
                           api_key="k", base_url=srv.url, batch=True, batch_poll_s=0.01)
    assert s.n_failed == 0
    assert sum(p == "/v1/messages" for p, _ in srv.requests) == 1  # one repair call only
    with store.connect(db_path) as con:
        vals = dict(con.execute("SELECT trajectory_id, list(DISTINCT value) FROM labels "
                                "GROUP BY 1").fetchall())
    assert vals == {"a": ["lacking"], "b": ["na"]}


def _batch(status: str, url: str = "") -> dict:
    return {
        "id": "msgbatch_1", "type": "message_batch", "processing_status": status,
        "request_counts": {"processing": 0, "succeeded": 2, "errored": 0, "canceled": 0,
                           "expired": 0},
        "created_at": "2026-01-01T00:00:00Z", "expires_at": "2026-01-02T00:00:00Z",
        "ended_at": None, "cancel_initiated_at": None, "archived_at": None,
        "results_url": f"{url}/v1/messages/batches/msgbatch_1/results" if url else None,
    }
