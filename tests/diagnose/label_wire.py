"""What the label tests' real HTTP servers answer: a `/v1/models` card and JSON label answers
computed from the request they received (quotes taken from the fenced transcript), and
the helpers that take a labeler's request apart (the fence, what lies inside and outside)."""

from __future__ import annotations

import json
import re
from typing import Any

from wire_server import Reply, openai_reply

FENCE_OPEN = re.compile(r"^<transcript-([0-9a-f]{16})>$", re.M)


def models_reply(model: str, **card: Any) -> Reply:
    """`/v1/models` listing `model` with the extra card fields (vLLM's `max_model_len`,
    `root`)."""
    return Reply({"object": "list", "data": [{"id": model, "object": "model", "created": 0,
                                              "owned_by": "test", **card}]})


def fenced(user: str) -> tuple[str, str, str, str]:
    """(nonce, text before the opening line, the transcript inside, text after the closing
    line) of a labeler's user message; fails unless there is exactly one fence."""
    opens = FENCE_OPEN.findall(user)
    assert len(opens) == 1, f"expected one opening fence line, found {opens}"
    nonce = opens[0]
    open_line, close_line = f"<transcript-{nonce}>", f"</transcript-{nonce}>"
    lines = user.split("\n")
    assert lines.count(open_line) == 1 and lines.count(close_line) == 1
    before, rest = user.split("\n" + open_line + "\n")
    inside, after = rest.split("\n" + close_line + "\n")
    return nonce, before, inside, after


def quoting_answer(body: dict[str, Any], *, value: str = "lacking") -> Reply:
    """A label answer for every capability of the request's schema. The first capability is
    `value` with two evidence items, a real quote of the first user message (in upper case:
    the check ignores case) and a sentence nobody wrote; every other capability is
    `present` with only the invented sentence (so it is unsupported)."""
    props = list(body["response_format"]["json_schema"]["schema"]["properties"])
    _, _, inside, _ = fenced(body["messages"][1]["content"])
    m = re.search(r"^\[(\d+)\] user: (.{12,60})", inside, re.M)
    assert m, "no user message in the transcript"
    real = {"message_idx": int(m[1]), "text": m[2][:40].upper()}
    invented = {"message_idx": int(m[1]), "text": "a sentence nobody in this chat wrote"}
    answer = {c: {"value": "present", "evidence": [invented], "confidence": 0.5}
              for c in props}
    answer[props[0]] = {"value": value, "evidence": [real, invented], "confidence": 0.9}
    return openai_reply(json.dumps(answer), prompt_tokens=100, completion_tokens=20)
