"""Untrusted trajectory text on its way into HTML or markdown: the one escape for each.

Design decisions
- Trajectory text is untrusted (users, tools and models wrote it). Every piece of it that
  reaches the transcript viewer's HTML goes through `html.escape(..., quote=True)` in
  exactly one helper, `escape_html` (the renderer and the search highlighter import it as
  `_e`); the markup around it is the caller's own and static. A message holding
  `<script>` shows as text.
- A markdown-rendering widget (st.caption, st.error) gets `markdown_literal`: every
  markdown/LaTeX metacharacter backslash-escaped, so a `[link](...)` in a file name or a
  field stays text.
- Its own module so the boundary is one file to read: the transcript renderer, the
  search highlighter and the run comparison (`compare.render_pair_html`) import it and
  write no HTML escape of their own.
"""

from __future__ import annotations

import html
import re
from typing import Any

_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:])")


def markdown_literal(text: Any) -> str:
    """Untrusted text for a markdown-rendering widget (st.caption, st.error): every
    markdown/LaTeX metacharacter backslash-escaped, so it shows exactly as written and a
    `[link](...)` or `![img](...)` in a file name or field stays text."""
    return _MD_SPECIAL.sub(r"\\\1", "" if text is None else str(text))


def escape_html(value: Any) -> str:
    """The one way trajectory text enters HTML."""
    return html.escape("" if value is None else str(value), quote=True)
