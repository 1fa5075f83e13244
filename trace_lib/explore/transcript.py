"""Transcripts: load one trajectory, render it as safe HTML, align tool calls.

Design decisions
- `Call` and `Transcript` are the shared model (`trace_lib.transcript_model`, also what
  the labelers read); this module loads one with the viewer's extras (each message's
  `tool_calls` and `is_error`) and renders and aligns it.
- Trajectory text is untrusted (users, tools and models wrote it). Every piece of it that
  reaches HTML goes through `html.escape(..., quote=True)` in exactly one helper, `_e`;
  the markup around it is ours and static. A message holding `<script>` shows as text.
- Tool-call identity for alignment is `name + canonical JSON of the arguments`
  (`sort_keys`, compact separators), so key order never makes two equal calls differ.
- Alignment is difflib's LCS-style `SequenceMatcher` on those keys (autojunk off: a
  repeated `get_user_details` is signal, not junk). Inside a "replace" block a second
  pass on names alone pairs calls of the same tool as "args differ"; what is left is
  "only left" / "only right". Two trials of a task and expected-vs-actual use the same
  function, so the page shows the same vocabulary for both.
- Expected actions are compared side by side: the agent's expected actions with the
  agent's own calls (`requestor` assistant or unknown), the user's (tau2 telecom:
  `toggle_roaming`, ...) with the user simulator's calls. User-side rows carry the status
  with " (user)" (`only left (user)` = the user never made an expected action): a user
  miss is not the agent's deviation, and it is never hidden either.
"""

from __future__ import annotations

import difflib
import html
import json
import re
from dataclasses import dataclass
from typing import Any

import duckdb
import pandas as pd

from trace_lib.errors import UserInputError
from trace_lib.transcript_model import Call, Transcript, canonical_json


@dataclass(frozen=True)
class AlignedRow:
    status: str  # same | args differ | only left | only right
    left: Call | None
    right: Call | None


def _loads(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


# --------------------------------------------------------------------------- loading


def load_transcript(con: duckdb.DuckDBPyConnection, trajectory_id: str) -> Transcript:
    """Everything the viewer shows about one trajectory."""
    head = con.execute(
        "SELECT t.*, d.name AS dataset FROM trajectories t "
        "LEFT JOIN datasets d ON d.id = t.dataset_id WHERE t.id = ?",
        [trajectory_id],
    ).df()
    if head.empty:
        raise UserInputError(f"trajectory {trajectory_id!r}: not in the store")
    traj = {k: (None if pd.isna(v) else v) if not isinstance(v, list | dict) else v
            for k, v in head.iloc[0].to_dict().items()}
    msgs = con.execute(
        "SELECT idx, role, content, name, tool_call_id, turn_idx FROM messages "
        "WHERE trajectory_id = ? ORDER BY idx",
        [trajectory_id],
    ).fetchall()
    calls = con.execute(
        "SELECT message_idx, name, arguments, error, requestor, call_id FROM tool_calls "
        "WHERE trajectory_id = ? ORDER BY message_idx, call_idx",
        [trajectory_id],
    ).fetchall()
    by_msg: dict[int, list[Call]] = {}
    errors_by_call_id: dict[str, str] = {}
    for midx, name, args, err, req, call_id in calls:
        by_msg.setdefault(midx, []).append(
            Call(name=name, arguments=_loads(args), error=err, message_idx=midx, requestor=req,
                 call_id=call_id)
        )
        if err is not None and call_id:
            errors_by_call_id[call_id] = err
    error_texts = {c.error for cs in by_msg.values() for c in cs if c.error}
    messages = [
        {
            "idx": idx,
            "role": role,
            "content": content,
            "name": name,
            "tool_call_id": tcid,
            "turn_idx": turn,
            "tool_calls": by_msg.get(idx, []),
            # A tool message is an error when the call it answers carries one; files without
            # call ids are matched on the error text itself.
            "is_error": role == "tool" and (
                tcid in errors_by_call_id if tcid else (content or "") in error_texts),
        }
        for idx, role, content, name, tcid, turn in msgs
    ]
    requestor = "requestor" if _has_column(con, "expected_actions", "requestor") else "NULL"
    expected = [
        Call(name=n, arguments=_loads(a), requestor=r)
        for n, a, r in con.execute(
            f"SELECT name, arguments, {requestor} FROM expected_actions "
            "WHERE dataset_id = ? AND task_id = ? ORDER BY idx",
            [traj["dataset_id"], traj["task_id"]],
        ).fetchall()
    ]
    return Transcript(trajectory=traj, messages=messages,
                      calls=[c for cs in by_msg.values() for c in cs], expected=expected)


def contrast_pair(
    con: duckdb.DuckDBPyConnection, trajectory_id: str
) -> tuple[str, str] | None:
    """(passed id, failed id) of the same task and dataset as `trajectory_id`, or None.

    The given trajectory is one of the two when its outcome allows; otherwise the first
    passed and first failed trial (by trial number) are used.
    """
    row = con.execute(
        "SELECT dataset_id, task_id, success FROM trajectories WHERE id = ?", [trajectory_id]
    ).fetchone()
    if row is None or row[1] is None:
        return None
    dataset_id, task_id, success = row
    trials = con.execute(
        "SELECT id, success FROM trajectories WHERE dataset_id = ? AND task_id = ? "
        "AND success IS NOT NULL ORDER BY trial, id",
        [dataset_id, task_id],
    ).fetchall()
    passed = [i for i, s in trials if s]
    failed = [i for i, s in trials if not s]
    if not passed or not failed:
        return None
    p = trajectory_id if success else passed[0]
    f = trajectory_id if success is False else failed[0]
    return p, f


# ------------------------------------------------------------------------- alignment


def align_calls(left: list[Call], right: list[Call]) -> list[AlignedRow]:
    """Align two tool-call sequences (LCS on name+args, then names within replacements)."""
    rows: list[AlignedRow] = []
    sm = difflib.SequenceMatcher(None, [c.key for c in left], [c.key for c in right],
                                 autojunk=False)
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        if op == "equal":
            rows += [AlignedRow("same", left[i1 + k], right[j1 + k]) for k in range(i2 - i1)]
        elif op == "delete":
            rows += [AlignedRow("only left", c, None) for c in left[i1:i2]]
        elif op == "insert":
            rows += [AlignedRow("only right", None, c) for c in right[j1:j2]]
        else:
            rows += _align_by_name(left[i1:i2], right[j1:j2])
    return rows


def _align_by_name(left: list[Call], right: list[Call]) -> list[AlignedRow]:
    rows: list[AlignedRow] = []
    sm = difflib.SequenceMatcher(None, [c.name for c in left], [c.name for c in right],
                                 autojunk=False)
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        if op == "equal":
            rows += [AlignedRow("args differ", left[i1 + k], right[j1 + k])
                     for k in range(i2 - i1)]
        else:
            rows += [AlignedRow("only left", c, None) for c in left[i1:i2]]
            rows += [AlignedRow("only right", None, c) for c in right[j1:j2]]
    return rows


def expected_vs_actual(t: Transcript) -> list[AlignedRow]:
    """Expected actions (left) aligned with the calls of the same side (right): the agent's
    first, then the user's (their statuses end in " (user)")."""
    agent, user = t.expected_agent, t.expected_user
    rows = align_calls(agent, t.agent_calls())
    if user:
        rows += [AlignedRow(f"{r.status} (user)", r.left, r.right)
                 for r in align_calls(user, t.user_calls())]
    return rows


def _has_column(con: duckdb.DuckDBPyConnection, table: str, column: str) -> bool:
    # A store opened read-only is not migrated: an older file may lack a newer column.
    return bool(con.execute(
        "SELECT count(*) FROM information_schema.columns WHERE table_name = ? "
        "AND column_name = ?", [table, column]).fetchone()[0])


def alignment_frame(rows: list[AlignedRow], left: str = "left", right: str = "right"
                    ) -> pd.DataFrame:
    """The alignment as a table (what the CLI prints and `st.dataframe` shows)."""

    def cell(c: Call | None) -> str:
        if c is None:
            return ""
        text = f"{c.name}({canonical_json(c.arguments)})"
        return text + (f"  !! {c.error}" if c.error else "")

    return pd.DataFrame(
        [{"status": r.status, left: cell(r.left), right: cell(r.right)} for r in rows],
        columns=["status", left, right],
    )


# ------------------------------------------------------------------------- rendering

_ROLE_STYLE = {
    "system": "background:#f3f4f6;border-left:4px solid #9ca3af",
    "user": "background:#eff6ff;border-left:4px solid #3b82f6",
    "assistant": "background:#f0fdf4;border-left:4px solid #22c55e",
    "tool": "background:#fafafa;border-left:4px solid #a855f7",
}
_ERROR_STYLE = "background:#fef2f2;border-left:4px solid #dc2626"
_STATUS_STYLE = {
    "same": "",
    "args differ": "background:#fffbeb",
    "only left": "background:#fef2f2",
    "only right": "background:#eff6ff",
}
_PRE = "white-space:pre-wrap;word-break:break-word;margin:4px 0;font-size:0.85em"


_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:])")


def markdown_literal(text: Any) -> str:
    """Untrusted text for a markdown-rendering widget (st.caption, st.error): every
    markdown/LaTeX metacharacter backslash-escaped, so it shows exactly as written and a
    `[link](...)` or `![img](...)` in a file name or field stays text."""
    return _MD_SPECIAL.sub(r"\\\1", "" if text is None else str(text))


def _e(value: Any) -> str:
    """The one way trajectory text enters HTML."""
    return html.escape("" if value is None else str(value), quote=True)


def _json_block(value: Any) -> str:
    try:
        text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = str(value)
    return f'<pre style="{_PRE}">{_e(text)}</pre>'


def render_transcript_html(t: Transcript, *, max_chars: int = 4000) -> str:
    """The transcript as self-contained HTML; long messages are cut at `max_chars`."""
    parts = ['<div class="trace-transcript" style="font-family:sans-serif;font-size:14px">']
    for m in t.messages:
        style = _ERROR_STYLE if m["is_error"] else _ROLE_STYLE.get(m["role"], "")
        label = m["role"] + (f" · {m['name']}" if m.get("name") else "")
        if m["is_error"]:
            label += " · ERROR"
        content = m["content"] or ""
        if len(content) > max_chars:
            content = content[:max_chars] + f"\n… ({len(m['content']) - max_chars} more chars)"
        parts.append(
            f'<div class="msg role-{_e(m["role"])}" style="{style};padding:6px 10px;'
            f'margin:6px 0;border-radius:4px">'
            f'<div style="font-weight:600;font-size:0.8em;color:#374151">#{m["idx"]} '
            f"{_e(label)}</div>"
        )
        if content:
            parts.append(f'<div style="white-space:pre-wrap">{_e(content)}</div>')
        for c in m["tool_calls"]:
            err = (
                f'<div style="color:#b91c1c;font-weight:600">error: {_e(c.error)}</div>'
                if c.error
                else ""
            )
            who = f" (by {_e(c.requestor)})" if c.requestor not in (None, "assistant") else ""
            parts.append(
                f'<div class="tool-call" style="margin-top:4px">tool call <code>{_e(c.name)}</code>'
                f"{who}{_json_block(c.arguments)}{err}</div>"
            )
        parts.append("</div>")
    parts.append("</div>")
    return "".join(parts)


def render_alignment_html(rows: list[AlignedRow], left: str, right: str) -> str:
    """Two aligned columns of tool calls, rows coloured by status."""

    def cell(c: Call | None) -> str:
        if c is None:
            return "<td></td>"
        err = f'<div style="color:#b91c1c">error: {_e(c.error)}</div>' if c.error else ""
        args = canonical_json(c.arguments)
        return (
            f'<td style="vertical-align:top"><code>{_e(c.name)}</code>'
            f'<pre style="{_PRE}">{_e(args)}</pre>{err}</td>'
        )

    head = (
        '<table class="trace-alignment" style="width:100%;border-collapse:collapse;'
        'font-size:13px"><tr><th>status</th>'
        f"<th>{_e(left)}</th><th>{_e(right)}</th></tr>"
    )
    body = "".join(
        f'<tr style="{_STATUS_STYLE.get(r.status.removesuffix(" (user)"), "")};'
        f'border-top:1px solid #e5e7eb">'
        f'<td style="vertical-align:top;white-space:nowrap">{_e(r.status)}</td>'
        f"{cell(r.left)}{cell(r.right)}</tr>"
        for r in rows
    )
    return head + body + "</table>"


def transcript_text(t: Transcript) -> str:
    """Plain-text transcript (CLI `explore show`)."""
    lines = [
        f"{t.id}  task={t.trajectory.get('task_id')} trial={t.trajectory.get('trial')} "
        f"success={t.trajectory.get('success')} termination={t.trajectory.get('termination')}"
    ]
    for m in t.messages:
        tag = f"[{m['idx']}] {m['role']}" + (" ERROR" if m["is_error"] else "")
        lines.append(f"{tag}: {m['content'] or ''}")
        for c in m["tool_calls"]:
            lines.append(f"    -> {c.name}({canonical_json(c.arguments)})"
                         + (f"  !! {c.error}" if c.error else ""))
    return "\n".join(lines)
