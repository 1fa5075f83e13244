"""Search hits in a transcript: what a query matches, marked and counted.

Design decisions
- `query_pattern` reads a query the way `store.search` does (`words`: each word starts a
  token, a "quoted phrase" is its tokens in a row; `substring`: the query as typed), so
  the viewer marks exactly what the search found; and where it looked: a system prompt's
  hits count (and are marked) only when the search read the system prompt too.
- Highlighting is escaping with marks: `Highlighter` escapes the raw pieces between hits
  with the one escape (`untrusted_text.escape_html`), never already-escaped text, and adds
  only its own numbered `<mark class="trace-hit">`, so a query can neither split an
  entity nor smuggle markup in.
"""

from __future__ import annotations

import json
import re
from typing import Any

from trace_lib.explore.untrusted_text import escape_html as _e
from trace_lib.transcript_model import Transcript

_MARK = "background:#fde047;padding:0 1px;border-radius:2px"


def query_pattern(query: str | None, mode: str = "words") -> re.Pattern[str] | None:
    """What a search query matches, as `store.search` reads it. `words`: each word
    starts a token (a prefix: "reserv" marks "reservation", not "preserve"), a "quoted
    phrase" is its tokens in a row, tokens being runs of letters and digits; `substring`:
    the query as typed, anywhere. Case-insensitive; None when nothing can match."""
    if not query or not query.strip():
        return None
    if mode == "substring":
        return re.compile(re.escape(query), re.IGNORECASE)
    bodies = []
    for phrase, word in re.findall(r'"([^"]+)"|(\S+)', query):
        tokens = re.findall(r"[^\W_]+", phrase or word)
        if tokens:
            bodies.append(r"(?<![^\W_])" + r"[\W_]+".join(re.escape(t) for t in tokens)
                          + (r"(?![^\W_])" if phrase else ""))
    if not bodies:
        return None
    return re.compile("|".join(sorted(set(bodies), key=lambda b: (-len(b), b))),
                      re.IGNORECASE)


class Highlighter:
    """Escapes text for HTML, wrapping every hit of the query in a numbered `<mark>`.

    Escaping is done on the raw pieces between hits, never on already-escaped text, so a
    query can never split an entity (`&amp;`) or smuggle markup in: the only markup added
    is our own `<mark>`. Hit ids are `{prefix}-{n}` so links can jump to them.
    """

    def __init__(self, query: str | None, prefix: str = "trace-hit", mode: str = "words"
                 ) -> None:
        self.pattern = query_pattern(query, mode)
        self.prefix = prefix
        self.hits = 0

    def __call__(self, text: Any) -> str:
        raw = "" if text is None else str(text)
        if self.pattern is None:
            return _e(raw)
        out, last = [], 0
        for m in self.pattern.finditer(raw):
            if m.start() == m.end():
                continue
            out.append(_e(raw[last:m.start()]))
            out.append(f'<mark class="trace-hit" id="{self.prefix}-{self.hits}" '
                       f'style="{_MARK}">{_e(m.group(0))}</mark>')
            self.hits += 1
            last = m.end()
        out.append(_e(raw[last:]))
        return "".join(out)

    def has_hit(self, text: Any) -> bool:
        return self.pattern is not None and bool(self.pattern.search(str(text or "")))


def highlight_html(text: Any, query: str | None, mode: str = "words") -> str:
    """`text` as escaped HTML with each query hit in `<mark class="trace-hit">`."""
    return Highlighter(query, mode=mode)(text)


def count_hits(t: Transcript, query: str | None, mode: str = "words", *,
               system: bool = False) -> int:
    """Hits of `query` in the transcript's conversation (with `system`, its system prompt
    too) and tool-call arguments."""
    pattern = query_pattern(query, mode)
    if pattern is None:
        return 0
    texts = [m["content"] for m in t.messages if system or m["role"] != "system"] + [
        json.dumps(c.arguments, ensure_ascii=False, default=str) for c in t.calls]
    return sum(len(pattern.findall(x)) for x in texts if x)
