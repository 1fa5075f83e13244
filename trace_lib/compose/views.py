"""What the Routing page draws: token HTML coloured by expert, plotly figures, legends.

Design decisions
- Built here, not in the page, so the notebook shows the same pictures and the page stays
  widgets + calls. Nothing here imports streamlit.
- Trajectory text is untrusted: every token and every hover string goes through
  `html.escape` (quote=True, since hovers live in an attribute). Newlines in tokens are
  drawn as a visible "⏎" plus a real line break, so structure stays readable.
- One discrete colour per slot, fixed by slot index (slot 0 "base" is grey), the same in
  the token view, the heatmap, the share bars and the legend.
- The heatmap is tokens x layers with a discrete colourscale (stepped, so slot colours
  do not blend) and a role band above it; hover shows token, role, layer, expert, p.
"""

from __future__ import annotations

import html
from typing import Any

import numpy as np

from trace_lib.compose.traces import RoutingTrace, entropy, majority

PALETTE = ("#b0b0b0", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
           "#e377c2", "#17becf", "#bcbd22")
ROLE_COLORS = {"system": "#6c757d", "user": "#0d6efd", "assistant": "#198754", "tool": "#fd7e14"}


def slot_color(slot: int) -> str:
    return PALETTE[slot % len(PALETTE)]


def legend_html(slots: list[str]) -> str:
    """One chip per slot in its colour. A chip is one box that wraps as a whole to the
    next line (`inline-block`, no wrap inside; issue 34: "1: precondition_" on one line
    and "verification" on the next read as two chips); a name wider than the column is
    cut with an ellipsis, its full text in the chip's hover."""
    items = [f'<span class="trace-chip" title="{i}: {html.escape(name, quote=True)}" '
             f'style="display:inline-block;white-space:nowrap;max-width:100%;'
             f'overflow:hidden;text-overflow:ellipsis;vertical-align:top;'
             f'background:{slot_color(i)};padding:1px 6px;border-radius:3px;'
             f'margin:0 6px 4px 0">{i}: {html.escape(name)}</span>'
             for i, name in enumerate(slots)]
    return '<div class="trace-legend">' + "".join(items) + "</div>"


def _hover(trace: RoutingTrace, t: int) -> str:
    lines = [f"token {t} ({trace.roles[t]}, turn {trace.turns[t]}): {trace.tokens[t]!r}"]
    for layer in range(trace.n_layers):
        slot = int(trace.chosen[t, layer])
        probs = " ".join(f"{p:.2f}" for p in trace.probs[t, layer])
        lines.append(f"L{layer}: {slot} {trace.slots[slot]} [{probs}]")
    return "\n".join(lines)


def token_html(trace: RoutingTrace, layer: int | None = None, max_tokens: int = 4000,
               start: int = 0) -> str:
    """Tokens coloured by the chosen slot at `layer` (None = majority over layers), from
    token `start` on (e.g. the request, past a long shared system prompt)."""
    slots = majority(trace) if layer is None else trace.chosen[:, layer]
    parts = ['<div class="trace-tokens" style="font-family:monospace;line-height:1.9;'
             'white-space:pre-wrap">']
    if start > 0:
        parts.append(f"<em>({start} tokens of system prompt and tools not shown) </em>")
    for t in range(start, min(trace.n_tokens, start + max_tokens)):
        slot = int(slots[t])
        text = trace.tokens[t]
        shown = html.escape(text.replace("\n", "⏎"), quote=True)
        # Tokens flow inline: a newline shows as ⏎ and breaks the line once per run of
        # newline tokens (32 newline tokens in a row used to take 32 lines).
        nxt = trace.tokens[t + 1] if t + 1 < trace.n_tokens else ""
        if "\n" in text and not ("\n" in nxt and not nxt.strip()):
            shown += "<br>"
        border = ROLE_COLORS.get(trace.roles[t], "#000")
        parts.append(
            f'<span title="{html.escape(_hover(trace, t), quote=True)}" '
            f'style="background:{slot_color(slot)}88;border-bottom:2px solid {border}">'
            f"{shown}</span>")
    if trace.n_tokens > start + max_tokens:
        parts.append(f"<em> … {trace.n_tokens - start - max_tokens} more tokens</em>")
    parts.append("</div>")
    return "".join(parts)


def heatmap_figure(trace: RoutingTrace, max_tokens: int = 2000):
    """Tokens x layers, discrete expert colours, with a role band on top."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    n = min(trace.n_tokens, max_tokens)
    k1 = len(trace.slots)
    z = trace.chosen[:n].T.astype(float)  # [L, T]
    # Stepped colourscale: slot s covers [s/k1, (s+1)/k1), so colours never blend.
    scale = []
    for s in range(k1):
        scale += [[s / k1, slot_color(s)], [(s + 1) / k1, slot_color(s)]]
    tokens = [t.replace("\n", "⏎") for t in trace.tokens[:n]]
    p_chosen = np.take_along_axis(trace.probs[:n], trace.chosen[:n, :, None], -1)[..., 0].T
    hover = [[f"token {t}: {html.escape(tokens[t])}<br>role {trace.roles[t]}<br>layer {layer}"
              f"<br>{html.escape(trace.slots[int(trace.chosen[t, layer])])} "
              f"p={p_chosen[layer, t]:.2f}" for t in range(n)] for layer in range(trace.n_layers)]
    roles = sorted(set(trace.roles[:n]), key=lambda r: list(ROLE_COLORS).index(r)
                   if r in ROLE_COLORS else 9)
    role_idx = {r: i for i, r in enumerate(roles)}
    rscale = []
    for i, r in enumerate(roles):
        rscale += [[i / len(roles), ROLE_COLORS.get(r, "#000")],
                   [(i + 1) / len(roles), ROLE_COLORS.get(r, "#000")]]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.08, 0.92],
                        vertical_spacing=0.02)
    fig.add_trace(go.Heatmap(z=[[role_idx[r] for r in trace.roles[:n]]], colorscale=rscale,
                             zmin=0, zmax=max(len(roles), 1), showscale=False,
                             hovertext=[[f"{r}" for r in trace.roles[:n]]], hoverinfo="text",
                             name="role"), row=1, col=1)
    fig.add_trace(go.Heatmap(z=z, colorscale=scale, zmin=0, zmax=k1, hovertext=hover,
                             hoverinfo="text",
                             colorbar={"tickvals": [s + 0.5 for s in range(k1)],
                                       "ticktext": [f"{s}: {name}" for s, name in
                                                    enumerate(trace.slots)]}),
                  row=2, col=1)
    fig.update_yaxes(showticklabels=False, row=1, col=1)
    fig.update_yaxes(title_text="layer", row=2, col=1)
    fig.update_xaxes(title_text="token", row=2, col=1)
    fig.update_layout(height=260 + 12 * trace.n_layers, margin={"l": 40, "r": 10, "t": 30, "b": 40},
                      title="routing: tokens x layers (role band on top)")
    return fig


def share_figure(rows: list[dict[str, Any]], by: str, slots: list[str]):
    """Stacked bars: share of each expert within each role / turn / outcome."""
    import plotly.graph_objects as go

    keys = sorted({r[by] for r in rows}, key=lambda x: (str(type(x)), x))
    fig = go.Figure()
    for slot, name in enumerate(slots):
        vals = [next((r["share"] for r in rows if r[by] == k and r["slot"] == slot), 0.0)
                for k in keys]
        fig.add_trace(go.Bar(x=[str(k) for k in keys], y=vals, name=f"{slot}: {name}",
                             marker_color=slot_color(slot)))
    fig.update_layout(barmode="stack", title=f"expert share by {by}", yaxis_title="share",
                      xaxis_title=by, height=320, margin={"t": 40, "b": 40})
    return fig


def entropy_figure(trace: RoutingTrace):
    """Gate entropy along the tokens: mean over layers, with the min-max band."""
    import plotly.graph_objects as go

    h = entropy(trace)  # [T, L]
    x = list(range(trace.n_tokens))
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=h.max(1), line={"width": 0}, showlegend=False,
                             hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=x, y=h.min(1), fill="tonexty", line={"width": 0},
                             name="min-max over layers", hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=x, y=h.mean(1), name="mean over layers",
                             text=[t.replace("\n", "⏎") for t in trace.tokens],
                             hovertemplate="%{x}: %{text}<br>H=%{y:.3f}"))
    fig.add_hline(y=float(np.log(len(trace.slots))), line_dash="dot",
                  annotation_text="uniform")
    fig.update_layout(title="gate entropy along the tokens (nats)", height=300,
                      xaxis_title="token", yaxis_title="entropy", margin={"t": 40, "b": 40})
    return fig


def eval_figure(rows: list[dict[str, Any]]):
    """Grouped bars: mean reward per environment for base, singles, merge and composed."""
    import plotly.graph_objects as go

    envs = sorted({r["env"] for r in rows})
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    fig = go.Figure()
    for policy in policies:
        vals = [next((r["reward_mean"] for r in rows if r["env"] == e and r["policy"] == policy),
                     None) for e in envs]
        fig.add_trace(go.Bar(x=envs, y=vals, name=policy))
    fig.update_layout(barmode="group", title="does composition beat collapse? (held-out seeds)",
                      yaxis_title="mean reward", height=360, margin={"t": 40, "b": 40})
    return fig
