"""Plotly figures of a training run, read from its metrics.jsonl rows.

Design decisions
- Figures are built here, not in the page, so the notebook and the page draw the same
  thing from the same rows; the page only places them.
- One figure with four small panels (reward, pass rate, loss, throughput) sharing the
  step axis, so a person watching a run sees at a glance whether reward moves while the
  loss and throughput stay sane.
- Panel titles never sit on an axis (issue 34: the lower panels' titles were drawn over
  the upper panels' "step" titles): the x axis is titled once per column, under the
  bottom row, and the rows are far enough apart for the tick labels and the titles
  between them; the legend goes under the bottom titles, the margins grow to fit
  (`automargin`). A browser test measures the boxes.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reward (mean ± std)", ("reward_mean",)),
    ("pass rate", ("pass_rate",)),
    ("loss", ("loss",)),
    ("throughput (sampled tokens/s, rollouts/s)", ("tokens_per_s", "rollouts_per_s")),
)


def metrics_figure(rows: list[dict[str, Any]], title: str | None = None) -> go.Figure:
    fig = make_subplots(rows=2, cols=2, subplot_titles=[p[0] for p in PANELS],
                        horizontal_spacing=0.1, vertical_spacing=0.2)
    steps = [r.get("step") for r in rows]
    for k, (_, keys) in enumerate(PANELS):
        row, col = k // 2 + 1, k % 2 + 1
        for key in keys:
            ys = [r.get(key) for r in rows]
            err = None
            if key == "reward_mean":
                err = dict(type="data", array=[r.get("reward_std", 0) for r in rows],
                           visible=True)
            fig.add_trace(go.Scatter(x=steps, y=ys, mode="lines+markers", name=key,
                                     error_y=err), row=row, col=col)
    fig.update_xaxes(title_text="step", row=2, automargin=True)
    fig.update_yaxes(automargin=True)
    fig.update_layout(height=560, margin=dict(l=40, r=20, t=60, b=40), title=title,
                      legend=dict(orientation="h", yanchor="top", y=-0.14))
    return fig
