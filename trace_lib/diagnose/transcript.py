"""A trajectory as the diagnose stage reads it: messages, tool calls, expected actions.

Design decisions
- Read straight from the store tables, so every importer's output works without the
  diagnose stage knowing the source format, into the shared transcript model
  (`trace_lib.transcript_model`: the viewer shows the same `Call`s a labeler cites, each
  paired with its answering tool message by the same `pair_results`).
  Expected actions keep their requestor; labelers read `expected_agent` (a user-side
  miss, tau2 telecom's device actions, is never the agent lacking a capability).
- Messages keep the store's `idx`, and the rendered text prefixes every message with
  `[idx]`: that is the index labelers cite as evidence and the Labels page scrolls to.
- Rendering is the untrusted-text boundary for prompts: tool outputs are clipped
  (long JSON blobs dominate token counts and rarely matter past a few KB) and the
  whole transcript is bounded by `max_chars`, cutting the middle, not the end, since
  how a trajectory ends is what failure analysis needs most.
"""

from __future__ import annotations

import json
from typing import Any

from trace_lib.transcript_model import Call, Transcript, pair_results

# `con` is a DuckDB connection, typed Any: a label job imports the labelers (and so this
# module) and must not import DuckDB, not even for type checking (import-linter counts it).

__all__ = ["Call", "Transcript", "load_transcript", "load_transcripts", "render_transcript"]


def _loads(text: Any) -> Any:
    if text is None or isinstance(text, dict | list):
        return text
    try:
        return json.loads(text)
    except (TypeError, json.JSONDecodeError):
        return text


def load_transcripts(con: Any, ids: list[str]) -> list[Transcript]:
    """Transcripts for `ids`, in that order, with four set-based queries (not 4 per id)."""
    if not ids:
        return []
    heads = con.execute("""
        SELECT t.id, t.dataset_id, t.source_id, t.task_id, t.domain, t.success, t.reward,
               t.termination, t.meta
        FROM trajectories t JOIN (SELECT unnest(?::VARCHAR[]) AS id) w USING (id)""", [ids]).fetchall()
    head_cols = ("id", "dataset_id", "source_id", "task_id", "domain", "success", "reward",
                 "termination")
    out = {h[0]: Transcript({**dict(zip(head_cols, h[:8], strict=True)),
                             "meta": _loads(h[8]) or {}}, [])
           for h in heads}
    for tid, idx, role, content, name, tcid in con.execute("""
            SELECT m.trajectory_id, m.idx, m.role, m.content, m.name, m.tool_call_id
            FROM messages m JOIN (SELECT unnest(?::VARCHAR[]) AS id) w ON w.id = m.trajectory_id
            ORDER BY m.trajectory_id, m.idx""", [ids]).fetchall():
        out[tid].messages.append({"idx": idx, "role": role, "content": content, "name": name,
                                  "tool_call_id": tcid})
    for tid, midx, cidx, cid, name, args, req, err in con.execute("""
            SELECT c.trajectory_id, c.message_idx, c.call_idx, c.call_id, c.name, c.arguments,
                   c.requestor, c.error
            FROM tool_calls c JOIN (SELECT unnest(?::VARCHAR[]) AS id) w ON w.id = c.trajectory_id
            ORDER BY c.trajectory_id, c.message_idx, c.call_idx""", [ids]).fetchall():
        t = out[tid]
        args_d = _loads(args)
        t.calls.append(Call(name=name, arguments=args_d if isinstance(args_d, dict) else {},
                            error=err, message_idx=midx, requestor=req, call_idx=cidx,
                            call_id=cid))
    for t in out.values():  # the viewer's pairing: by call id, else by position
        contents = {m["idx"]: m["content"] for m in t.messages}
        for i, idx in pair_results(t.messages, t.calls).items():
            t.calls[i].result_idx, t.calls[i].result = idx, contents[idx]
    # A store opened read-only is not migrated: older files have no expected requestor.
    req = "e.requestor" if con.execute(
        "SELECT count(*) FROM information_schema.columns WHERE table_name = 'expected_actions' "
        "AND column_name = 'requestor'").fetchone()[0] else "NULL"
    for tid, name, args, requestor in con.execute(f"""
            SELECT t.id, e.name, e.arguments, {req}
            FROM trajectories t JOIN (SELECT unnest(?::VARCHAR[]) AS id) w USING (id)
            JOIN expected_actions e ON e.dataset_id = t.dataset_id AND e.task_id = t.task_id
            ORDER BY t.id, e.idx""", [ids]).fetchall():
        a = _loads(args)
        out[tid].expected.append(Call(name=name, arguments=a if isinstance(a, dict) else {},
                                      requestor=requestor))
    missing = [i for i in ids if i not in out]
    if missing:
        from trace_lib.errors import UserInputError
        raise UserInputError(f"unknown trajectory id(s): {', '.join(missing[:5])}")
    return [out[i] for i in ids]


def load_transcript(con: Any, trajectory_id: str) -> Transcript:
    return load_transcripts(con, [trajectory_id])[0]


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
