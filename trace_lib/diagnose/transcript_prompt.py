"""A transcript as labeler prompts show it: plain text, every message under its `[idx]`.

Design decisions
- The transcript itself is the shared model (`trace_lib.transcript_model`), loaded by the
  one store reader (`trace_lib.trajectories.load_transcript(s)`), so every importer's
  output works without the diagnose stage knowing the source format and the viewer shows
  the same `Call`s a labeler cites, each paired with its answering tool message by the
  same `pair_results`. Expected actions keep their requestor; labelers read
  `expected_agent` (a user-side miss, tau2 telecom's device actions, is never the agent
  lacking a capability).
- Messages keep the store's `idx`, and the rendered text prefixes every message with
  `[idx]`: that is the index labelers cite as evidence and the Labels page scrolls to.
- One message is one block: `[idx] role: first line`, every further line of its text
  prefixed with `  | `, every tool call it made on a line `    -> call name(args)`. So no
  text inside a message can start a line that reads as another message's header or as a
  call: the boundaries and indices a labeler cites cannot be forged by the data. Every
  line break Python or a tokenizer might honour (`\\r`, `\\v`, `\\f`, U+2028, ...) counts.
  Names (roles, tool names) are collapsed to one line; call arguments are JSON.
- This module only draws: a block whole, or with its text clipped to a head
  (`max_content`). Which messages to shorten or leave out to fit a context window is the
  cutting rule's decision (`transcript_cut`); the fence around the transcript and the
  prompt's wording are `label_prompt`'s.
- No store access here: a label job imports the labelers (and so this module) and must
  not import DuckDB, not even for type checking (import-linter counts it).
"""

from __future__ import annotations

import json
import re
from typing import Any

from trace_lib.transcript_model import Call, Transcript

CONTINUATION = "\n  | "  # what starts every line of a message's text after its first
CALL_PREFIX = "\n    -> call "
# Every character sequence some reader takes for a line break (str.splitlines' set).
_BREAKS = re.compile(r"\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")


def one_line(text: Any) -> str:
    """`text` with every run of whitespace (line breaks included) as one space."""
    return " ".join(str(text).split())


CLIP_SLACK = 24  # a text at most this much longer than its clip is kept whole (the marker
# saying what was cut would be about as long as what it replaces)


def clip_head(text: str, n: int | None) -> str:
    """The first `n` characters of `text` and how many were cut (`text` when it fits)."""
    if n is None or len(text) <= n + CLIP_SLACK:
        return text
    return text[:n] + (" " if n else "") + f"…[{len(text) - n} chars cut]"


def calls_by_message(t: Transcript) -> dict[int, list[Call]]:
    out: dict[int, list[Call]] = {}
    for c in t.calls:
        if c.message_idx is not None:
            out.setdefault(int(c.message_idx), []).append(c)
    return out


def call_text(c: Call) -> str:
    """`name(arguments as JSON)` on one line (what a call line shows, and evidence quotes)."""
    args = json.dumps(c.arguments, ensure_ascii=False)
    return _BREAKS.sub(" ", f"{one_line(c.name)}({args})")


def render_message(m: dict[str, Any], calls: list[Call] | None = None, *,
                   max_content: int | None = None) -> str:
    """One message's block; its text clipped to `max_content` characters when given."""
    content = clip_head(m.get("content") or "", max_content)
    body = _BREAKS.sub(CONTINUATION, content)
    if m["role"] == "tool":
        head = f"[{m['idx']}] tool {one_line(m.get('name') or '')}".rstrip() + ":"
    else:
        head = f"[{m['idx']}] {one_line(m['role'])}:"
    block = f"{head} {body}".rstrip()
    for c in calls or []:
        block += CALL_PREFIX + call_text(c)
    return block


def render_transcript(t: Transcript) -> str:
    """Every message whole, in order (the transcript before any cut)."""
    calls = calls_by_message(t)
    return "\n".join(render_message(m, calls.get(int(m["idx"]))) for m in t.messages)
