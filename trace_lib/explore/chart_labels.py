"""Labels that stay inside a plotly figure: the one label-fitting rule of every chart.

Design decisions
- `readable` is the one place that keeps labels inside a figure (every chart of the
  explore and diagnose stages ends with it): axes make room for their tick labels and
  titles (`automargin`, whatever template draws them: Streamlit's or plotly's), and a
  category longer than `LABEL_CHARS` is shown cut in the middle on its axis (start and end
  stay, so "a + b + c" signatures stay told apart) while the bar, its hover and its value
  keep the full text. Cutting the tick text, not the data, never merges two categories.
- Its own module because two stages draw with it (`explore.trajectory_charts`,
  `diagnose.ranking_charts`): the Rankings figures import the rule, not the Trajectories
  page's figures.
"""

from __future__ import annotations

import plotly.graph_objects as go

LABEL_CHARS = 36  # longest category label shown whole on an axis


def short_label(text: str, limit: int = LABEL_CHARS) -> str:
    """`text` cut in the middle to at most `limit` characters ("multi_ste…_reasoning")."""
    if len(text) <= limit:
        return text
    head = (limit - 1) // 2
    return text[:head] + "…" + text[len(text) - (limit - 1 - head):]


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
