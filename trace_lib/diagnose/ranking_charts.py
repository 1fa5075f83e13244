"""Plotly figures of the diagnose stage (the Rankings page and the notebook draw these).

Design decisions
- Figures are built from `Ranking` objects and plain lists, never from a connection, so
  the page, the notebook and a test can draw the same thing.
- Undefined figures (Cov or Delta None) are left out of the plots, and the caption of
  the table says how many runs were defined; a point at 0 would be a lie.
- Threshold lines are drawn where the selection rule puts them, so moving a slider
  moves the line and the colours together.
- Every figure ends with `explore.chart_labels.readable` (the one label-fitting rule): long
  capability names and cluster signatures are cut on the axis, whole in the hover. Point
  labels (capability names beside markers, "+n" on the cover curve) are drawn over the
  axes' edge (`cliponaxis=False`) rather than cut off there.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from trace_lib.diagnose.ranking import Ranking
from trace_lib.explore.chart_labels import readable

KEPT, DROPPED = "#d62728", "#7f7f7f"


def coverage_contrast(ranking: Ranking) -> go.Figure:
    """Mean Cov vs mean Delta per capability; threshold lines; kept ones marked."""
    fig = go.Figure()
    for kept in (True, False):
        rows = [r for r in ranking.rows if r.selected == kept
                and r.mean_cov is not None and r.mean_delta is not None]
        fig.add_trace(go.Scatter(
            x=[r.mean_cov for r in rows], y=[r.mean_delta for r in rows],
            error_x={"type": "data", "array": [r.std_cov or 0 for r in rows], "thickness": 1},
            error_y={"type": "data", "array": [r.std_delta or 0 for r in rows], "thickness": 1},
            mode="markers+text", text=[r.capability for r in rows], textposition="top center",
            cliponaxis=False,
            marker={"size": 12 if kept else 9, "color": KEPT if kept else DROPPED,
                    "symbol": "star" if kept else "circle"},
            name="kept" if kept else "not kept",
            hovertemplate="%{text}<br>Cov %{x:.2f}<br>Delta %{y:.2f}<extra></extra>"))
    fig.add_vline(x=ranking.config.rho, line_dash="dash", annotation_text=f"rho {ranking.config.rho:.2f}")
    fig.add_hline(y=ranking.config.delta, line_dash="dash",
                  annotation_text=f"delta {ranking.config.delta:.2f}")
    fig.update_layout(xaxis_title="coverage of failures (mean Cov)",
                      yaxis_title="contrast (mean Delta = ER- - ER+)", height=460,
                      margin={"t": 30})
    return readable(fig)


STRIP_POINTS = 30  # more Delta values per capability than this: a box, not every point


def delta_per_run(ranking: Ranking) -> go.Figure:
    """Delta of every run per capability (stability across runs): each run a point. With
    bootstrap stability there are B (200) values per capability: they are drawn as a box
    (quartiles, whiskers), which reads better than 2,800 jittered points and is what
    made the browser spend ~1 s redrawing the page on each Rankings slider move."""
    fig = go.Figure()
    many = max((len(r.runs) for r in ranking.rows), default=0) > STRIP_POINTS
    for r in ranking.rows:
        pts = [f for f in r.runs if f.delta is not None]
        colour = KEPT if r.selected else DROPPED
        if many:
            fig.add_trace(go.Box(
                y=[f.delta for f in pts], x=[r.capability] * len(pts), name=r.capability,
                boxpoints=False,
                line={"color": colour}, fillcolor="rgba(0,0,0,0.04)", showlegend=False))
            continue
        fig.add_trace(go.Box(
            y=[f.delta for f in pts], x=[r.capability] * len(pts), name=r.capability,
            boxpoints="all", jitter=0.4, pointpos=0, fillcolor="rgba(0,0,0,0)",
            line={"color": "rgba(0,0,0,0)"},
            marker={"color": colour, "size": 7},
            text=[f.run for f in pts], hovertemplate="%{text}: %{y:.2f}<extra></extra>",
            showlegend=False))
    fig.add_hline(y=ranking.config.delta, line_dash="dash")
    fig.update_layout(yaxis_title="Delta per resample" if many else "Delta per run",
                      height=380, margin={"t": 30})
    return readable(fig)


def k_of_n_bars(ranking: Ranking) -> go.Figure:
    rows = ranking.rows
    fig = go.Figure(go.Bar(
        x=[r.capability for r in rows], y=[r.n_runs_passed for r in rows],
        marker_color=[KEPT if r.selected else DROPPED for r in rows],
        hovertemplate="%{x}: %{y} runs passed<extra></extra>"))
    fig.add_hline(y=ranking.k_effective, line_dash="dash",
                  annotation_text=f"K = {ranking.k_effective} of {ranking.n_runs}")
    fig.update_layout(yaxis_title="runs passing both thresholds", height=340, margin={"t": 30})
    return readable(fig)


def cover_curve(curve: list[dict[str, Any]]) -> go.Figure:
    fig = go.Figure(go.Scatter(
        x=[c["capability"] for c in curve], y=[c["fraction"] for c in curve],
        mode="lines+markers+text", text=[f"+{c['new']}" for c in curve],
        textposition="top center", cliponaxis=False,
        hovertemplate="%{x}: %{y:.0%} of labelled failures explained<extra></extra>"))
    fig.update_layout(yaxis_title="share of labelled failures explained",
                      yaxis_range=[0, 1.05],
                      xaxis_title="capability added (greedy order)", height=340,
                      margin={"t": 30})
    return readable(fig)


def cluster_bars(clusters: list[dict[str, Any]]) -> go.Figure:
    fig = go.Figure(go.Bar(y=[c["signature"] for c in clusters][::-1],
                           x=[c["n"] for c in clusters][::-1], orientation="h",
                           hovertemplate="%{y}: %{x} failed<extra></extra>"))
    fig.update_layout(xaxis_title="failed trajectories", height=80 + 28 * len(clusters),
                      margin={"t": 30, "l": 10})
    return readable(fig)
