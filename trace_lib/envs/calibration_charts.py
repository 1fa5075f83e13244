"""Plotly figures of calibration results, for the Environments page and the notebook.

Design decisions
- Figures take the calibration dict exactly as `calibrate()` returns and the store keeps
  it, so a stored calibration redraws without rerunning anything.
- The target band is drawn on the figures (shaded mean-reward band, a line at 50%
  informative), so a reader sees where the environment sits, not only a verdict.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go


def reward_histogram(cal: dict[str, Any]) -> go.Figure:
    edges = cal["histogram"]["edges"]
    counts = cal["histogram"]["counts"]
    labels = [f"{edges[i]:.1f}-{edges[i + 1]:.1f}" for i in range(len(counts))]
    fig = go.Figure(go.Bar(x=labels, y=counts, marker_color="#4c78a8"))
    fig.update_layout(title=f"Rewards ({cal.get('policy', '')}), mean "
                            f"{cal['mean_reward']:.3f}", xaxis_title="reward",
                      yaxis_title="rollouts", height=320, margin={"t": 50, "b": 40})
    return fig


def group_shares(cal: dict[str, Any]) -> go.Figure:
    cfg = cal.get("config", {})
    names = ["all-success", "all-fail", "informative"]
    values = [cal["all_success_share"], cal["all_fail_share"], cal["informative_share"]]
    limits = [cfg.get("max_all_success", 0.2), cfg.get("max_all_fail", 0.2),
              cfg.get("min_informative", 0.5)]
    ok = [values[0] <= limits[0], values[1] <= limits[1], values[2] >= limits[2]]
    fig = go.Figure(go.Bar(x=names, y=values,
                           marker_color=["#54a24b" if o else "#e45756" for o in ok],
                           text=[f"{v:.0%}" for v in values], textposition="outside"))
    for name, limit in zip(names, limits, strict=True):
        fig.add_shape(type="line", x0=names.index(name) - 0.4, x1=names.index(name) + 0.4,
                      y0=limit, y1=limit, line={"dash": "dash", "color": "#333"})
    fig.update_layout(title="Groups (dashed: target band)", yaxis={"range": [0, 1.1],
                      "tickformat": ".0%"}, height=320, margin={"t": 50, "b": 40})
    return fig


def pass_at_k(cal: dict[str, Any]) -> go.Figure:
    ks = [k for k in (1, 4, 8, 16) if f"pass@{k}" in cal]
    fig = go.Figure(go.Scatter(x=ks, y=[cal[f"pass@{k}"] for k in ks], mode="lines+markers"))
    fig.update_layout(title="pass@k", xaxis={"title": "k", "type": "log", "tickvals": ks},
                      yaxis={"range": [0, 1.05], "tickformat": ".0%"}, height=320,
                      margin={"t": 50, "b": 40})
    return fig


def calibration_figures(cal: dict[str, Any]) -> list[go.Figure]:
    return [reward_histogram(cal), group_shares(cal), pass_at_k(cal)]
