"""Labels that stay inside a plotly figure: the one label-fitting rule of every chart.

Design decisions
- `readable` is the one place that keeps labels inside a figure (every chart of the
  explore and diagnose stages ends with it): axes make room for their tick labels and
  titles (`automargin`, whatever template draws them: Streamlit's or plotly's), and a
  category longer than `LABEL_CHARS` is shown cut in the middle on its axis (start and end
  stay, so "a + b + c" signatures stay told apart) while the bar, its hover and its value
  keep the full text. Cutting the tick text, not the data, never merges two categories.
- A cut falls between words (issue 34: "book_reservation:…lt;id>, but pai" was cut inside
  a word and inside the escaped `&lt;`): at a space or punctuation when one is near the
  limit, else after an underscore of an identifier, and only as a last resort inside a
  word. The text is cut as a person reads it (entities unescaped) and escaped again, so a
  cut never splits `&lt;` (chart text is escaped: plotly renders a subset of HTML).
- Its own module because two stages draw with it (`explore.trajectory_charts`,
  `diagnose.ranking_charts`): the Rankings figures import the rule, not the Trajectories
  page's figures.
"""

from __future__ import annotations

import html

import plotly.graph_objects as go

LABEL_CHARS = 36  # longest category label shown whole on an axis
WORD_BREAKS = frozenset(" \t/,;:|+()[]{}<>=!?'\"")  # between words: a cut may fall here
PART_BREAKS = frozenset("_-.")  # between the parts of an identifier: the next best place


def _head(text: str, room: int) -> str:
    """The longest start of `text` of at most `room` characters that ends between words
    (see the module docstring)."""
    if len(text) <= room or text[room] in WORD_BREAKS or text[room - 1] in WORD_BREAKS:
        return text[:room].rstrip()
    for breaks in (WORD_BREAKS, PART_BREAKS):
        at = max((i for i, ch in enumerate(text[:room]) if ch in breaks), default=-1)
        if at >= room // 3:
            return text[:at + 1].rstrip()
    return text[:room]


def _tail(text: str, room: int) -> str:
    """The longest end of `text` of at most `room` characters that starts between words."""
    return _head(text[::-1], room)[::-1]


def short_label(text: str, limit: int = LABEL_CHARS) -> str:
    """`text` cut in the middle, between words, to at most `limit` characters
    ("multi_step_task…data_reasoning"); `text` may hold HTML entities (as escaped chart
    text does), which count as the character they stand for and are never split."""
    raw = html.unescape(text)
    if len(raw) <= limit:
        return text
    head_room = (limit - 1) // 2
    # No space or identifier joint next to the ellipsis: "multi_step_task…data_reasoning".
    cut = (_head(raw, head_room).rstrip(" _-.") + "…"
           + _tail(raw, limit - 1 - head_room).lstrip(" _-."))
    return html.escape(cut, quote=False) if raw != text else cut


def readable(fig: go.Figure, limit: int = LABEL_CHARS) -> go.Figure:
    """Keep `fig`'s axis labels inside it (see the module docstring); returns `fig`."""
    fig.update_xaxes(automargin=True)
    fig.update_yaxes(automargin=True)
    categories: dict[str, list[str]] = {}  # layout axis name -> its category values
    for trace in fig.data:
        for letter in ("x", "y"):
            values = getattr(trace, letter, None) if hasattr(trace, f"{letter}axis") else None
            if values is None or not all(isinstance(v, str) for v in values):
                continue
            axis = letter + "axis" + (getattr(trace, f"{letter}axis") or letter)[1:]
            seen = categories.setdefault(axis, [])
            seen.extend(v for v in values if v not in seen)
    for axis, values in categories.items():
        if any(len(v) > limit for v in values):
            fig.update_layout({axis: {"tickmode": "array", "tickvals": values,
                                      "ticktext": [short_label(v, limit) for v in values]}})
    return fig
