"""Plotly figures for the Trajectories page and the notebook (no streamlit here).

Design decisions
- Each function takes the DataFrame a `queries`/`clusters`/`embeddings` function returned
  and gives back a `plotly.graph_objects.Figure`; the page shows it, the notebook shows
  it, and a test can inspect its traces. Figures never query the store themselves.
- Outcome colours are fixed (success green, failure red, unknown grey) across figures so
  a glance reads the same everywhere.
- Plotly renders a subset of HTML in labels and hover text (<a href>, <b>, <br>, ...), so
  every string that comes from a trajectory (error texts, error kinds, tool names,
  previews, termination reasons, model names) goes through `html.escape` before it
  reaches a figure; plotly shows the entities as the characters they stand for. Previews
  are cut short so a 4 kB message does not cover the chart.
- Every figure ends with `explore.chart_labels.readable` (the one label-fitting rule,
  shared with the diagnose stage's figures).
"""

from __future__ import annotations

import html

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from trace_lib.explore.chart_labels import readable
from trace_lib.explore.clusters import LEVELS as SIGNATURE_LEVELS
from trace_lib.explore.clusters import PATH_SEP, shown_levels

OUTCOME_COLORS = {"success": "#16a34a", "failure": "#dc2626", "unknown": "#9ca3af"}


def _safe(df: pd.DataFrame, *cols: str) -> pd.DataFrame:
    """A copy with the given text columns HTML-escaped (None stays None)."""
    out = df.copy()
    for c in cols:
        if c in out.columns:
            out[c] = out[c].map(lambda v: html.escape(v) if isinstance(v, str) else v)
    return out


def _empty(title: str) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=title, annotations=[{
        "text": "no data for this filter", "showarrow": False, "x": 0.5, "y": 0.5,
        "xref": "paper", "yref": "paper"}], height=300)
    return fig


def success_rate_chart(df: pd.DataFrame) -> go.Figure:
    """Bars of success rate per domain, one per agent model, with Wilson intervals."""
    title = "Success rate by domain and agent"
    if df.empty:
        return _empty(title)
    d = _safe(df, "domain", "agent_model")
    d["err_plus"] = d.ci_high - d.success_rate
    d["err_minus"] = d.success_rate - d.ci_low
    fig = px.bar(d, x="domain", y="success_rate", color="agent_model", barmode="group",
                 error_y="err_plus", error_y_minus="err_minus",
                 hover_data={"n_known": True, "n_success": True, "err_plus": False,
                             "err_minus": False},
                 title=title, range_y=[0, 1])
    fig.update_layout(yaxis_tickformat=".0%", height=420, legend_title_text="agent",
                      legend={"orientation": "h", "yanchor": "top", "y": -0.2})
    return readable(fig)


def termination_chart(df: pd.DataFrame) -> go.Figure:
    title = "Termination reasons"
    if df.empty:
        return _empty(title)
    fig = px.bar(_safe(df, "termination"), x="n", y="termination", color="outcome",
                 orientation="h",
                 color_discrete_map=OUTCOME_COLORS, title=title)
    fig.update_layout(height=350, yaxis={"categoryorder": "total ascending"})
    return readable(fig)


def tool_calls_chart(df: pd.DataFrame) -> go.Figure:
    title = "Tool calls per trajectory"
    if df.empty:
        return _empty(title)
    fig = px.bar(df, x="n_tool_calls", y="n", color="outcome",
                 color_discrete_map=OUTCOME_COLORS, title=title,
                 labels={"n_tool_calls": "tool calls", "n": "trajectories"})
    fig.update_layout(height=350, bargap=0.1)
    return readable(fig)


def tool_errors_chart(df: pd.DataFrame, top: int = 15) -> go.Figure:
    title = "Tool error kinds"
    if df.empty:
        return _empty(title)
    d = _safe(df.head(top), "tool", "error_kind", "example")
    d["kind"] = d.tool + ": " + d.error_kind.fillna("")
    fig = px.bar(d, x="n", y="kind", orientation="h", color="tool", title=title,
                 hover_data={"example": True, "n_trajectories": True})
    fig.update_layout(height=max(300, 28 * len(d) + 120), showlegend=False,
                      yaxis={"categoryorder": "total ascending", "title": None})
    return readable(fig)


def signature_treemap(df: pd.DataFrame) -> go.Figure:
    """Failure signatures (from `clusters.signature_counts`) as a treemap.

    Built as a `go.Treemap` from the counted signatures (a few hundred rows at most)
    rather than `px.treemap`, whose path processing cost ~0.8 s a figure at 100k
    failures. Box ids stay the ones `px.treemap` gives (`failures/<level>/...`, each
    level HTML-escaped, joined by "/"): a click sends the id, and the page maps it back
    to the cluster (`treemap_box_paths`). The boxes are the levels a person reads
    (`clusters.shown_levels`: no "(no tool error)" box inside a "(no tool error)" one)."""
    title = "Failure signatures: termination › first erroring tool › error kind › deviation"
    if df.empty:
        return _empty(title)
    values: dict[str, int] = {}  # box id -> failures below it, in first-seen order
    labels: dict[str, str] = {}
    parents: dict[str, str] = {}
    for row in df[list(SIGNATURE_LEVELS) + ["n"]].itertuples(index=False):
        levels, n = [v for v, _ in shown_levels(row[:-1])], int(row[-1])
        values[ROOT_BOX] = values.get(ROOT_BOX, 0) + n
        for depth in range(1, len(levels) + 1):
            box = _box_id(levels[:depth])
            labels.setdefault(box, html.escape(str(levels[depth - 1])))
            parents.setdefault(box, _box_id(levels[:depth - 1]))
            values[box] = values.get(box, 0) + n
    ids = list(values)
    fig = go.Figure(go.Treemap(
        ids=ids, labels=[labels.get(i, ROOT_BOX) for i in ids],
        parents=[parents.get(i, "") for i in ids], values=[values[i] for i in ids],
        branchvalues="total", root_color="#f3f4f6", textinfo="label+value+percent root"))
    fig.update_layout(title=title, height=520, margin={"t": 50, "l": 10, "r": 10, "b": 10})
    return fig


def treemap_box_paths(df: pd.DataFrame) -> dict[str, str]:
    """Treemap box id -> its cluster: the data's levels down to the box joined by
    `PATH_SEP` ("" for the root, all failures; a box standing for two levels gives both).
    A level that itself holds "/" could give two boxes one id: the first, largest,
    signature keeps it (as in the figure)."""
    out: dict[str, str] = {ROOT_BOX: ""}
    for row in df[list(SIGNATURE_LEVELS)].itertuples(index=False):
        shown = shown_levels(row)
        for k in range(1, len(shown) + 1):
            out.setdefault(_box_id([v for v, _ in shown[:k]]),
                           PATH_SEP.join(str(v) for v in row[:shown[k - 1][1]]))
    return out


ROOT_BOX = "failures"


def _box_id(levels) -> str:
    """The treemap id of the box for these signature levels (the root for none): the
    levels HTML-escaped and joined by "/" under the root, as `px.treemap` names them."""
    return "/".join([ROOT_BOX, *(html.escape(str(v)) for v in levels)])


def semantic_map(points: pd.DataFrame) -> go.Figure:
    """2-D map of embedded trajectories: colour = cluster, symbol = outcome."""
    title = "Semantic clusters (PCA of sentence embeddings)"
    if points.empty:
        return _empty(title)
    d = points.copy()
    d["cluster"] = d.cluster.astype(str)
    d["preview"] = d.text.str.slice(0, 160)
    d = _safe(d, "preview", "termination", "task_id", "agent_model", "domain")
    fig = px.scatter(d, x="x", y="y", color="cluster", symbol="outcome",
                     custom_data=["trajectory_id"],
                     hover_data={"trajectory_id": True, "task_id": True, "termination": True,
                                 "preview": True, "x": False, "y": False},
                     title=title)
    fig.update_traces(marker={"size": 9, "line": {"width": 0.5, "color": "#374151"}})
    fig.update_layout(height=480, xaxis_title=None, yaxis_title=None, legend_title_text="")
    return readable(fig)
