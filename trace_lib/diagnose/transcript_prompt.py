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
- Rendering is the untrusted-text boundary for prompts: tool outputs are clipped
  (long JSON blobs dominate token counts and rarely matter past a few KB) and the
  whole transcript is bounded by `max_chars`, cutting the middle, not the end, since
  how a trajectory ends is what failure analysis needs most.
- No store access here: a label job imports the labelers (and so this module) and must
  not import DuckDB, not even for type checking (import-linter counts it).
"""

from __future__ import annotations

import json

from trace_lib.transcript_model import Call, Transcript


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n // 2] + f" ...[{len(text) - n} chars cut]... " + text[-n // 2:]


def render_transcript(t: Transcript, *, max_chars: int = 60_000, max_tool_chars: int = 2_000
                      ) -> str:
    """Plain text with `[idx] role:` prefixes; tool calls shown as `name(args)`."""
    calls_at: dict[int, list[Call]] = {}
    for c in t.calls:
        calls_at.setdefault(c.message_idx, []).append(c)
    lines = []
    for m in t.messages:
        content = m["content"] or ""
        if m["role"] == "tool":
            content = _clip(content, max_tool_chars)
            lines.append(f"[{m['idx']}] tool {m['name'] or ''}: {content}")
            continue
        line = f"[{m['idx']}] {m['role']}: {content}".rstrip()
        for c in calls_at.get(m["idx"], []):
            line += f"\n    -> call {c.name}({json.dumps(c.arguments, ensure_ascii=False)})"
        lines.append(line)
    text = "\n".join(lines)
    if len(text) > max_chars:
        head = max_chars // 3
        text = text[:head] + f"\n...[{len(text) - max_chars} chars cut]...\n" + text[-(max_chars - head):]
    return text
