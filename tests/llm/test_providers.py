"""The real anthropic and openai SDK clients against a local wire-format server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from wire_server import (
    Reply,
    WireServer,
    anthropic_batch,
    anthropic_text_reply,
    anthropic_tool_reply,
    error_reply,
    openai_reply,
)

from trace_lib.llm import LLMError, MalformedOutputError, get_provider
from trace_lib.llm.replay import RecordingProvider

SCHEMA = {
    "type": "object",
    "properties": {"verdict": {"type": "string", "enum": ["yes", "no"]},
                   "why": {"type": "string"}},
    "required": ["verdict", "why"],
    "additionalProperties": False,
}


def _anthropic(url: str, **kw):
    return get_provider("anthropic", api_key="test-key", base_url=url, model="claude-sonnet-4-5",
                        **kw)


def _openai(url: str, **kw):
    return get_provider("openai", api_key="k", base_url=url + "/v1", model="qwen-test", **kw)


def test_anthropic_forced_tool_cache_and_usage() -> None:
    def respond(path, body, n):
        return anthropic_tool_reply("answer", {"verdict": "yes", "why": "ok"},
                                    input_tokens=50, output_tokens=10, cache_read=900)

    with WireServer(respond) as srv:
        res = _anthropic(srv.url).complete_json("SYSTEM", "USER", SCHEMA)
    assert res.data == {"verdict": "yes", "why": "ok"}
    path, body = srv.requests[0]
    assert path == "/v1/messages"
    assert body["tool_choice"] == {"type": "tool", "name": "answer"}
    assert body["tools"][0]["input_schema"] == SCHEMA
    assert body["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert (res.usage.input_tokens, res.usage.output_tokens, res.usage.cache_read_tokens) == (
        50, 10, 900)
    # 50 * 3 + 10 * 15 + 900 * 0.3 per million
    assert res.usage.cost_usd("claude-sonnet-4-5") == pytest.approx((150 + 150 + 270) / 1e6)


def test_anthropic_backs_off_on_429_and_500() -> None:
    script = [error_reply(429), error_reply(500), None]

    def respond(path, body, n):
        return script[n] or anthropic_tool_reply("answer", {"verdict": "no", "why": "x"})

    with WireServer(respond) as srv:
        res = _anthropic(srv.url).complete_json("S", "U", SCHEMA)
    assert res.data["verdict"] == "no" and len(srv.requests) == 3


def test_anthropic_timeout_is_retried_then_reported() -> None:
    def slow_once(path, body, n):
        if n == 0:
            return Reply(sleep=1.5, body={})
        return anthropic_tool_reply("answer", {"verdict": "yes", "why": "late"})

    with WireServer(slow_once) as srv:
        res = _anthropic(srv.url, timeout=0.5).complete_json("S", "U", SCHEMA)
    assert res.data["why"] == "late"

    with WireServer(lambda p, b, n: Reply(sleep=1.5, body={})) as srv:
        with pytest.raises(LLMError, match="Timeout"):
            _anthropic(srv.url, timeout=0.3, max_retries=1).complete_json("S", "U", SCHEMA)


def test_anthropic_repairs_with_validation_error_then_gives_up() -> None:
    def respond(path, body, n):
        if n == 0:
            return anthropic_tool_reply("answer", {"verdict": "maybe", "why": "?"})
        return anthropic_tool_reply("answer", {"verdict": "yes", "why": "fixed"})

    with WireServer(respond) as srv:
        res = _anthropic(srv.url).complete_json("S", "U", SCHEMA)
    assert res.data["why"] == "fixed" and res.attempts == 2
    repair_turn = srv.requests[1][1]["messages"][-1]["content"][0]
    assert repair_turn["type"] == "tool_result" and repair_turn["is_error"] is True
    assert "verdict" in repair_turn["content"] and "maybe" in repair_turn["content"]

    with WireServer(lambda p, b, n: anthropic_text_reply("I refuse")) as srv:
        with pytest.raises(MalformedOutputError) as info:
            _anthropic(srv.url).complete_json("S", "U", SCHEMA)
    assert "no `answer` tool call" in info.value.reason and len(srv.requests) == 2


def test_anthropic_message_batches() -> None:
    state = {"polls": 0}

    def respond(path, body, n):
        if path == "/v1/messages/batches" and body:
            state["ids"] = [r["custom_id"] for r in body["requests"]]
            return Reply(anthropic_batch("in_progress"))
        if path.endswith("/results"):
            lines = []
            for i, cid in enumerate(state["ids"]):
                verdict = "yes" if i == 0 else "bogus"
                msg = anthropic_tool_reply("answer", {"verdict": verdict, "why": "b"}).body
                lines.append(json.dumps({"custom_id": cid,
                                         "result": {"type": "succeeded", "message": msg}}))
            return Reply(raw="\n".join(lines))
        state["polls"] += 1
        return Reply(anthropic_batch("ended" if state["polls"] >= 2 else "in_progress", url=srv.url))

    with WireServer(respond) as srv:
        out = _anthropic(srv.url).complete_json_batch(
            [("a", "S", "U1"), ("b", "S", "U2")], SCHEMA, poll_s=0.01)
    assert out["a"].data["verdict"] == "yes"
    assert isinstance(out["b"], MalformedOutputError)


def test_openai_json_schema_seed_and_cached_tokens() -> None:
    def respond(path, body, n):
        return openai_reply(json.dumps({"verdict": "yes", "why": "w"}), prompt_tokens=120,
                            completion_tokens=7, cached=100)

    with WireServer(respond) as srv:
        res = _openai(srv.url).complete_json("S", "U", SCHEMA, seed=7, temperature=0.7)
    path, body = srv.requests[0]
    assert path == "/v1/chat/completions"
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["schema"] == SCHEMA
    assert body["seed"] == 7 and body["temperature"] == 0.7
    assert (res.usage.input_tokens, res.usage.cache_read_tokens, res.usage.output_tokens) == (
        20, 100, 7)


def test_openai_malformed_json_is_repaired_and_429_500_retried() -> None:
    script = [error_reply(429), openai_reply("{not json"), error_reply(500)]

    def respond(path, body, n):
        if n < len(script):
            return script[n]
        return openai_reply(json.dumps({"verdict": "no", "why": "ok"}))

    with WireServer(respond) as srv:
        res = _openai(srv.url).complete_json("S", "U", SCHEMA)
    assert res.data["verdict"] == "no" and res.attempts == 2
    repair = srv.requests[-1][1]["messages"]
    assert repair[-2] == {"role": "assistant", "content": "{not json"}
    assert "not valid JSON" in repair[-1]["content"]

    with WireServer(lambda p, b, n: openai_reply('{"verdict": "yes"}')) as srv:
        with pytest.raises(MalformedOutputError, match="'why' is a required property"):
            _openai(srv.url).complete_json("S", "U", SCHEMA)


def test_openai_timeout_after_retries_is_an_llm_error() -> None:
    with WireServer(lambda p, b, n: Reply(sleep=1.0, body={})) as srv:
        with pytest.raises(LLMError, match="Timeout"):
            _openai(srv.url, timeout=0.2, max_retries=1).complete_json("S", "U", SCHEMA)
    assert len(srv.requests) == 2


def test_missing_key_and_unknown_provider_are_clear(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(LLMError, match="ANTHROPIC_API_KEY"):
        get_provider("anthropic")
    with pytest.raises(LLMError, match="unknown LLM provider 'nope'"):
        get_provider("nope")


def test_record_then_replay_offline(tmp_path: Path) -> None:
    rec = tmp_path / "rec.jsonl"

    def respond(path, body, n):
        return openai_reply(json.dumps({"verdict": "yes", "why": "recorded"}))

    with WireServer(respond) as srv:
        RecordingProvider(_openai(srv.url), rec).complete_json("S", "U", SCHEMA, seed=3)
    replay = get_provider("replay", path=rec)
    assert replay.complete_json("S", "U", SCHEMA, seed=3).data["why"] == "recorded"
    with pytest.raises(LLMError, match="no recorded answer"):
        replay.complete_json("S", "other", SCHEMA, seed=3)
