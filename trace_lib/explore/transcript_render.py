"""Transcripts drawn: self-contained escaped HTML for the viewer, plain text for the CLI.

Design decisions
- Trajectory text is untrusted. Every piece of it that reaches HTML goes through the one
  escape (`untrusted_text.escape_html`, imported as `_e`), or through the search
  `Highlighter`, which escapes with it and adds only its own `<mark>`; the markup around
  it is ours and static. A message holding `<script>` shows as text. The one script the
  page adds (jump to the first hit) holds no trajectory text.
- Reading order follows Docent's and Inspect's viewers: the system prompt folded (it is
  often screens of policy before the first user turn), each tool call in one box with
  the tool message that answers it (`transcript_model.pair_results`), tool outputs
  pretty-printed when they are JSON and folded when long, search hits marked, counted
  and linked. Two transcripts side by side show a shared system prompt once.
- Aligned tool calls (`call_alignment`) are drawn as two columns, each row coloured by
  its status and saying it in plain words (`call_alignment.status_words`). A tool name
  wraps only between its parts (after "_" or "."; `breakable_name`), never inside one:
  "get_reservation_de / tails" read as two words (issue 34). Arguments wrap anywhere.
- What the source measured of a message (`Message.meta`: tokens in and out, cost,
  latency; tau2 and Inspect logs have them) is shown in its header (`usage_text`), as
  Inspect's viewer and Docent do, and summed once above the transcript. Nothing is shown
  where nothing was measured: no "0 tokens".
- Evidence (the Labels page): the messages a labeler's evidence points at carry the
  notes above them and the class `trace-evidence`; in a scroll box (`scroll_box_html`)
  the static `scroll_box_to_evidence_script` opens the box at the first of them, so a
  long system prompt or the turns before the evidence are not what a person reads first.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from trace_lib.explore.call_alignment import AlignedRow, status_words
from trace_lib.explore.search_highlight import Highlighter
from trace_lib.explore.untrusted_text import escape_html as _e
from trace_lib.transcript_model import Call, Transcript, canonical_json

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
_MSG = "padding:6px 10px;margin:6px 0;border-radius:4px"
_HEAD = "font-weight:600;font-size:0.8em;color:#374151"
_SUMMARY = "cursor:pointer;font-size:0.8em;color:#374151"
OPEN_LINES = 8  # tool outputs up to this many lines start open; longer ones start folded


def pretty_output(content: Any) -> tuple[str, bool]:
    """(text, is_json): a tool output that parses as a JSON object or array, indented;
    anything else as it is."""
    text = "" if content is None else str(content)
    stripped = text.strip()
    if stripped[:1] in ("{", "["):
        try:
            value = json.loads(stripped)
        except ValueError:
            return text, False
        if isinstance(value, dict | list):
            return json.dumps(value, indent=2, ensure_ascii=False), True
    return text, False


def _json_text(value: Any) -> str:
    if isinstance(value, str):
        pretty, is_json = pretty_output(value)
        return pretty if is_json else value
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def _clip(text: str, max_chars: int, hl: Highlighter) -> str:
    # A message cut for length keeps a hit visible: the cut moves to just past the last hit.
    if len(text) <= max_chars:
        return text
    end = max_chars
    if hl.pattern is not None:
        ends = [m.end() for m in hl.pattern.finditer(text)]
        if ends and ends[-1] > end:
            end = ends[-1] + 200
    if end >= len(text):
        return text
    return text[:end] + f"\n… ({len(text) - end} more chars)"


def _lines(n: int) -> str:
    return f"{n} line" + ("" if n == 1 else "s")


def usage_text(meta: dict[str, Any] | None) -> str:
    """What was measured of one message, in words: "3,346 → 57 tokens · $0.0023 · 0.9 s";
    "" when nothing was."""
    if not meta:
        return ""
    parts = []
    tokens_in, tokens_out = meta.get("input_tokens"), meta.get("output_tokens")
    if tokens_in is not None or tokens_out is not None:
        show = [f"{int(v):,}" if v is not None else "?" for v in (tokens_in, tokens_out)]
        parts.append(f"{show[0]} → {show[1]} tokens")
    if meta.get("cost") is not None:
        parts.append(f"${meta['cost']:.4f}")
    if meta.get("latency_s") is not None:
        parts.append(f"{meta['latency_s']:.1f} s")
    return " · ".join(parts)


def usage_total(t: Transcript) -> dict[str, Any] | None:
    """The transcript's measurements summed (each key over the messages that have it) and
    the number of measured messages; None when no message was measured."""
    measured = [m["meta"] for m in t.messages if m.get("meta")]
    if not measured:
        return None
    total: dict[str, Any] = {"messages": len(measured)}
    for key in ("input_tokens", "output_tokens", "cost", "latency_s"):
        values = [m[key] for m in measured if m.get(key) is not None]
        if values:
            total[key] = sum(values)
    return total


def _usage_html(meta: dict[str, Any] | None) -> str:
    text = usage_text(meta)
    return (f' <span class="trace-usage" style="font-weight:400;color:#6b7280">· {_e(text)}'
            "</span>" if text else "")


def _evidence_html(notes: list[str] | None) -> str:
    if not notes:
        return ""
    items = "".join(f'<li style="font-size:inherit;margin:0">{_e(n)}</li>' for n in notes)
    return ('<div class="evidence-note" style="background:#fef9c3;border-left:4px solid '
            '#ca8a04;padding:4px 10px;margin:6px 0 0;font-size:0.85em">'
            f"<b>👉 Evidence</b><ul style=\"margin:2px 0 2px 18px;padding:0\">{items}</ul></div>")


def system_prompt(t: Transcript) -> str:
    """The system messages' text, joined (what the comparison view shows once)."""
    return "\n\n".join(m["content"] or "" for m in t.messages if m["role"] == "system")


def _system_html(text: str, idx_label: str, hl: Highlighter, max_chars: int,
                 note: str = "", *, opened: bool = False, css: str = "") -> str:
    n_lines = len(text.splitlines())
    opened_attr = " open" if opened or hl.has_hit(text) else ""
    return (
        f'<details class="msg role-system system-prompt{css}"{opened_attr} '
        f'style="{_ROLE_STYLE["system"]};{_MSG}">'
        f'<summary style="{_SUMMARY}"><b>{_e(idx_label)} system prompt</b> · '
        f"{len(text):,} chars, {_lines(n_lines)}{_e(note)} · click to show</summary>"
        f'<div style="white-space:pre-wrap">{hl(_clip(text, max_chars * 4, hl))}</div>'
        "</details>")


def _output_html(m: dict[str, Any], hl: Highlighter, max_chars: int, label: str) -> str:
    """A tool message's content: pretty JSON when it is JSON, folded when long."""
    text, is_json = pretty_output(m["content"])
    text = _clip(text, max_chars, hl)
    n_lines = len(text.splitlines())
    opened = " open" if n_lines <= OPEN_LINES or hl.has_hit(text) else ""
    kind = "JSON, " if is_json else ""
    err = " · ERROR" if m.get("is_error") else ""
    style = _ERROR_STYLE if m.get("is_error") else "border-left:2px solid #d8b4fe"
    return (
        f'<details class="tool-output{" tool-error" if m.get("is_error") else ""}"{opened} '
        f'data-idx="{_e(m["idx"])}" style="{style};padding:2px 8px;margin-top:4px">'
        f'<summary style="{_SUMMARY}">{_e(label)} #{_e(m["idx"])}{err} · {kind}'
        f"{_lines(n_lines)}</summary>"
        f'<pre class="{"json" if is_json else "text"}" style="{_PRE}">{hl(text)}</pre>'
        "</details>")


def render_transcript_html(t: Transcript, *, max_chars: int = 4000, query: str | None = None,
                           query_mode: str = "words", query_system: bool = False,
                           system: str = "collapsed", hit_prefix: str = "trace-hit",
                           evidence: dict[int, list[str]] | None = None) -> str:
    """The transcript as self-contained, escaped HTML.

    - the system prompt is folded (`system="collapsed"`) or left out (`"omit"`, when the
      caller shows it once for two transcripts); its search hits are marked, and unfold
      it, only when the search read it (`query_system`, as `store.search`'s `system`);
    - each tool call is drawn in one box with the tool message that answers it
      (`Call.result_idx`), whose output is pretty JSON, folded past `OPEN_LINES` lines;
      a tool message no call claims shows on its own, in its place;
    - `query` hits (`query_pattern`, in `query_mode`) are wrapped in numbered
      `<mark class="trace-hit">` (ids `hit_prefix-N`) and listed as links at the top;
      long messages are cut at `max_chars`, past the last hit;
    - a message's measurements (`usage_text`) follow its header, their sum heads it;
    - `evidence` (message idx -> notes) puts the notes above the message they point at
      (above the call box, for a tool message drawn with its call) and marks it
      `trace-evidence` (a system prompt holding evidence is unfolded).
    """
    evidence = evidence or {}
    hl = Highlighter(query, hit_prefix, query_mode)
    system_hl = hl if query_system else Highlighter(None)
    by_idx = {m["idx"]: m for m in t.messages}
    paired: dict[int, dict[str, Any]] = {}
    for m in t.messages:
        for c in m["tool_calls"]:
            if c.result_idx is not None and c.result_idx in by_idx:
                paired[c.result_idx] = by_idx[c.result_idx]
    # Evidence on a tool message drawn inside its call's box shows above that box.
    answered_by = {c.result_idx: m["idx"] for m in t.messages for c in m["tool_calls"]
                   if c.result_idx in paired}
    notes: dict[int, list[str]] = {}
    for idx, items in evidence.items():
        notes.setdefault(answered_by.get(idx, idx), []).extend(items)
    parts: list[str] = []
    for m in t.messages:
        if m["idx"] in paired:
            continue  # drawn with the call it answers
        here = notes.get(m["idx"])
        mark = " trace-evidence" if here else ""
        parts.append(_evidence_html(here))
        if m["role"] == "system":
            if system != "omit":
                parts.append(_system_html(m["content"] or "", f"#{m['idx']}", system_hl,
                                          max_chars, opened=bool(here), css=mark))
            continue
        if m["role"] == "tool":
            parts.append(
                f'<div class="msg role-tool unpaired{mark}" data-idx="{_e(m["idx"])}" '
                f'style="{_ROLE_STYLE["tool"]};{_MSG}">'
                f"{_output_html(m, hl, max_chars, 'tool output' + _name(m))}</div>")
            continue
        style = _ERROR_STYLE if m["is_error"] else _ROLE_STYLE.get(m["role"], "")
        label = m["role"] + (f" · {m['name']}" if m.get("name") else "")
        parts.append(
            f'<div class="msg role-{_e(m["role"])}{mark}" data-idx="{_e(m["idx"])}" '
            f'style="{style};{_MSG}"><div style="{_HEAD}">#{_e(m["idx"])} {_e(label)}'
            f'{_usage_html(m.get("meta"))}</div>')
        content = _clip(m["content"] or "", max_chars, hl)
        if content:
            parts.append(f'<div style="white-space:pre-wrap">{hl(content)}</div>')
        for c in m["tool_calls"]:
            parts.append(_pair_html(c, paired.get(c.result_idx) if c.result_idx is not None
                                    else None, hl, max_chars))
        parts.append("</div>")
    head = (f'<div class="trace-transcript" data-trajectory="{_e(t.id)}" '
            f'data-hits="{hl.hits}" style="font-family:sans-serif;font-size:14px">')
    return head + _hits_nav(hl) + _total_html(t) + "".join(parts) + "</div>"


def _total_html(t: Transcript) -> str:
    total = usage_total(t)
    if total is None:
        return ""
    n = total.pop("messages")
    return ('<div class="trace-usage-total" style="font-size:0.85em;color:#374151">'
            f"{n} measured message{'s' if n != 1 else ''} · {_e(usage_text(total))}</div>")


def _name(m: dict[str, Any]) -> str:
    return f" · {m['name']}" if m.get("name") else ""


def _pair_html(c: Call, result: dict[str, Any] | None, hl: Highlighter, max_chars: int
               ) -> str:
    who = f" (by {c.requestor})" if c.requestor not in (None, "assistant") else ""
    # The error line is dropped only when the answering tool message says the same.
    shown = (result or {}).get("content") or ""
    err = (f'<div style="color:#b91c1c;font-weight:600">error: {hl(c.error)}</div>'
           if c.error and shown.strip() != c.error.strip() else "")
    answer = (_output_html(result, hl, max_chars, f"← result of {c.name}")
              if result is not None else
              '<div style="font-size:0.8em;color:#6b7280">no tool message answers this call'
              "</div>")
    return (
        f'<div class="tool-pair" style="border:1px solid #d8b4fe;border-radius:4px;'
        f'background:#faf5ff;padding:4px 8px;margin-top:6px">'
        f'<div class="tool-call"><span style="{_HEAD}">→ tool call{_e(who)}</span> '
        f"<code>{hl(c.name)}</code>"
        f'<pre class="json" style="{_PRE}">{hl(_json_text(c.arguments))}</pre>{err}</div>'
        f'<div class="tool-result">{answer}</div></div>')


def _hits_nav(hl: Highlighter) -> str:
    if hl.pattern is None:
        return ""
    if not hl.hits:
        return ('<div class="trace-hits" data-hits="0" style="font-size:0.85em;color:#6b7280">'
                "no match for the search in this transcript</div>")
    links = " ".join(f'<a href="#{hl.prefix}-{i}">{i + 1}</a>' for i in range(min(hl.hits, 50)))
    more = f" … ({hl.hits - 50} more)" if hl.hits > 50 else ""
    return (f'<div class="trace-hits" data-hits="{hl.hits}" style="font-size:0.85em;'
            f'position:sticky;top:0;background:#fefce8;padding:2px 6px;z-index:1">'
            f"{hl.hits} match{'es' if hl.hits != 1 else ''} · jump to {links}{more}</div>")


def jump_to_first_hit_script(*key: str) -> str:
    """A static script that scrolls the first search hit into view; the page shows it with
    `st.html(..., unsafe_allow_javascript=True)`, the transcripts stay script-free. It holds
    no trajectory text: `key` (trajectory id, query) only enters as a digest, which makes
    the script differ, and so run again, when either changes. The code has no `<`:
    the page's sanitizer drops a script whose text looks like markup (`n<40`)."""
    return scroll_into_view_script("mark.trace-hit", *key)


# The only selectors a scroll script may name: fixed page markup, never trajectory text.
SCROLL_TARGETS = {"mark.trace-hit": "center", "#transcript": "start"}


def scroll_into_view_script(selector: str, *key: str) -> str:
    """The static scroll script behind `jump_to_first_hit_script`, for any of the fixed
    `SCROLL_TARGETS` (the page's "#transcript" heading: a map click opens the transcript
    in view). `key` only enters as a digest, as there."""
    if selector not in SCROLL_TARGETS:
        raise ValueError(f"scroll target {selector!r} is not one of {sorted(SCROLL_TARGETS)}")
    token = hashlib.sha256("\0".join((selector, *key)).encode()).hexdigest()[:16]
    return ("<script>/* " + token + " */(function(){var n=0;function go(){"
            "var el=document.querySelector('" + selector + "');"
            "if(el){el.scrollIntoView({block:'" + SCROLL_TARGETS[selector] + "'});return;}"
            "n+=1;if(n>=40){return;}setTimeout(go,100);}go();})();</script>")


def scroll_box_html(inner: str, max_height_px: int = 620) -> str:
    """`inner` (rendered HTML) in a box of at most `max_height_px` that scrolls on its own:
    what `scroll_box_to_evidence_script` moves."""
    return (f'<div class="trace-scroll" style="max-height:{int(max_height_px)}px;'
            f'overflow-y:auto">{inner}</div>')


def scroll_box_to_evidence_script(*key: str) -> str:
    """A static script that scrolls the `scroll_box_html` box (not the page) so the first
    `trace-evidence` message is at its top. Like `scroll_into_view_script`: no trajectory
    text, `key` only as a digest (a new trajectory or capability runs it again), no `<`."""
    token = hashlib.sha256("\0".join(("trace-evidence", *key)).encode()).hexdigest()[:16]
    return ("<script>/* " + token + " */(function(){var n=0;function go(){"
            "var el=document.querySelector('.trace-scroll .trace-evidence');"
            "if(el){var box=el.closest('.trace-scroll');"
            "box.scrollTop+=el.getBoundingClientRect().top-box.getBoundingClientRect().top-8;"
            "return;}"
            "n+=1;if(n>=40){return;}setTimeout(go,100);}go();})();</script>")


def render_side_by_side_html(a: Transcript, b: Transcript, label_a: str, label_b: str, *,
                             query: str | None = None, query_mode: str = "words",
                             query_system: bool = False, max_chars: int = 4000) -> str:
    """Two transcripts in two columns. A system prompt both share is shown once, folded,
    above them; when they differ, each column keeps its own (folded) and says so."""
    sys_a, sys_b = system_prompt(a), system_prompt(b)
    parts = ['<div class="trace-side-by-side">']
    if sys_a == sys_b:
        if sys_a:
            sys_hl = Highlighter(query if query_system else None, "trace-hit-sys", query_mode)
            parts.append(_system_html(sys_a, "", sys_hl, max_chars, " · the same in both"))
        mode = "omit"
    else:
        parts.append('<div class="system-differs" style="font-size:0.85em;color:#92400e">'
                     "The two system prompts differ: each column keeps its own.</div>")
        mode = "collapsed"
    parts.append('<div style="display:grid;grid-template-columns:1fr 1fr;gap:12px">')
    for t, label, prefix in ((a, label_a, "trace-hit-a"), (b, label_b, "trace-hit-b")):
        parts.append(f'<div class="trace-column"><div style="font-weight:600">{_e(label)}</div>'
                     + render_transcript_html(t, max_chars=max_chars, query=query,
                                              query_mode=query_mode,
                                              query_system=query_system, system=mode,
                                              hit_prefix=prefix) + "</div>")
    parts.append("</div></div>")
    return "".join(parts)


_NAME_JOINTS = ("_", ".")
_NAME_STYLE = "overflow-wrap:break-word;word-break:normal"


def breakable_name(name: Any) -> str:
    """A tool name as escaped HTML that may wrap after each "_" or "." (`<wbr>`), and
    inside a part only when that part alone is wider than the column."""
    out = _e(name)
    for joint in _NAME_JOINTS:
        out = out.replace(joint, joint + "<wbr>")
    return out


def render_alignment_html(rows: list[AlignedRow], left: str, right: str, *,
                          against_expected: bool = False,
                          names: tuple[str, str] | None = None) -> str:
    """Two aligned columns of tool calls, rows coloured by status, the status in plain
    words (`status_words`; `names` are the short names it uses, default the headers)."""
    short_l, short_r = names or (left, right)

    def cell(c: Call | None) -> str:
        if c is None:
            return "<td></td>"
        err = f'<div style="color:#b91c1c">error: {_e(c.error)}</div>' if c.error else ""
        args = canonical_json(c.arguments)
        return (
            f'<td style="vertical-align:top;overflow-wrap:anywhere">'
            f'<code class="tool-name" style="{_NAME_STYLE}">{breakable_name(c.name)}</code>'
            f'<pre style="{_PRE}">{_e(args)}</pre>{err}</td>'
        )

    # Automatic column widths: a column is never narrower than its longest name part, so
    # names wrap only at their joints; arguments (wrapped anywhere) take what is left.
    head = (
        '<table class="trace-alignment" style="width:100%;border-collapse:collapse;'
        'table-layout:auto;font-size:13px"><tr><th style="width:7em">what</th>'
        f"<th>{_e(left)}</th><th>{_e(right)}</th></tr>"
    )
    body = "".join(
        f'<tr class="row-{_e(r.status.removesuffix(" (user)").replace(" ", "-"))}" '
        f'style="{_STATUS_STYLE.get(r.status.removesuffix(" (user)"), "")};'
        f'border-top:1px solid #e5e7eb">'
        f'<td style="vertical-align:top">'
        f"{_e(status_words(r.status, short_l, short_r, against_expected=against_expected))}"
        f"</td>{cell(r.left)}{cell(r.right)}</tr>"
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
        if usage := usage_text(m.get("meta")):
            tag += f" ({usage})"
        lines.append(f"{tag}: {m['content'] or ''}")
        for c in m["tool_calls"]:
            lines.append(f"    -> {c.name}({canonical_json(c.arguments)})"
                         + (f"  !! {c.error}" if c.error else ""))
    return "\n".join(lines)
