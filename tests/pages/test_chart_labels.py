"""Chart labels are not clipped (issue 17): on the Rankings and Trajectories pages, in a real
browser, every axis tick label, axis title and legend text of every drawn plotly chart lies
inside its chart's `svg.main-svg`; and `chart_labels.readable` cuts long categories on the axis
only (the data and the hover keep the full text).

Design decisions
- Plotly draws SVG, so the check reads `getBoundingClientRect` of the `<text>` elements
  against the chart's first `svg.main-svg` (the plotting surface; text outside it is cut).
- Two viewport widths: the Rankings and Trajectories pages put charts two to a row, so a
  narrower window is where a long label runs out of room first.
- Plotly lays a chart out again after `automargin` grew a margin; the check polls until
  every drawn chart has its labels and none is outside (or times out with the last
  offenders), so a measurement between the two layouts cannot fail the test.
"""

from __future__ import annotations

import html
import sys
from pathlib import Path

import plotly.graph_objects as go
import pytest

from trace_lib.diagnose.ranking_charts import cluster_bars
from trace_lib.explore.chart_labels import LABEL_CHARS, readable, short_label

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from journey_helpers import goto, wait_until  # noqa: E402

# Per chart: how many labels were measured, which lie outside (text, room left/right/top/
# bottom in px, negative = outside), and whether the chart is drawn (a hidden tab: width 0).
CHECK_JS = """() => [...document.querySelectorAll('.js-plotly-plot')].map((plot) => {
  const svg = plot.querySelector('svg.main-svg');
  if (!svg) return {drawn: false, n: 0, bad: [], cut: 0, cuts: []};
  const b = svg.getBoundingClientRect();
  if (b.width === 0) return {drawn: false, n: 0, bad: [], cut: 0, cuts: []};
  const sel = '[class*="axislayer"] text, [class^="g-x"] text, [class^="g-y"] text, '
            + '.legend text';
  const bad = [];
  let n = 0, cut = 0;
  for (const t of plot.querySelectorAll(sel)) {
    const r = t.getBoundingClientRect();
    if (!t.textContent.trim() || r.width === 0) continue;
    n += 1;
    if (t.textContent.includes('\\u2026')) cut += 1;
    const room = [r.left - b.left, b.right - r.right, r.top - b.top, b.bottom - r.bottom];
    if (room.some((v) => v < -1)) bad.push([t.textContent.slice(0, 60), room.map(Math.round)]);
  }
  // the axes' cut labels beside the categories they stand for (plotly keeps its layout)
  const cuts = [];
  for (const [key, axis] of Object.entries(plot.layout || {})) {
    if (!/^[xy]axis/.test(key) || !axis || !axis.ticktext) continue;
    axis.ticktext.forEach((t, i) => { if (t.includes('\u2026')) cuts.push([axis.tickvals[i], t]); });
  }
  return {drawn: true, n, bad, cut, cuts};
})"""

PAGES = {"Rankings": 5, "Trajectories": 4}  # drawn charts each page shows on demo data


def test_short_label_cuts_in_the_middle() -> None:
    assert short_label("tool_calling_precision") == "tool_calling_precision"
    long = "multi_step_task_completion + structured_data_reasoning"
    cut = short_label(long)
    assert len(cut) <= LABEL_CHARS and "…" in cut
    assert cut.startswith("multi_step") and cut.endswith("reasoning")


def test_short_label_cuts_between_words_and_never_inside_an_entity() -> None:
    """Issue 34: "book_reservation:…lt;id>, but pai" was cut inside a word and inside the
    escaped "&lt;"."""
    kind = html.escape("book_reservation: reservation <id> not found, but payment <id> "
                       "was charged")
    cut = short_label(kind)
    head, tail = html.unescape(cut).split("…")
    raw = html.unescape(kind)
    assert _between_words(raw, head, tail), cut
    assert "&lt;" not in html.unescape(cut) and "lt;" not in cut.replace("&lt;", "")
    assert len(html.unescape(cut)) <= LABEL_CHARS
    # one long identifier: cut at its underscores
    ident = "get_reservation_details_for_the_user_with_the_longest_name"
    head, tail = short_label(ident).split("…")
    assert _between_words(ident, head, tail)
    # no joint at all: a hard cut is the last resort
    assert len(short_label("x" * 80)) == LABEL_CHARS


def _between_words(full: str, head: str, tail: str) -> bool:
    """`head` and `tail` are a start and an end of `full` that fall between words (a space,
    punctuation or an identifier's underscore on the cut side)."""
    joints = set(" \t/,;:|+()[]{}<>=!?'\"_-.")
    after_head = full[len(head):len(head) + 1]
    before_tail = full[len(full) - len(tail) - 1:len(full) - len(tail)]
    return (full.startswith(head) and full.endswith(tail)
            and (head[-1:] in joints or after_head in joints)
            and (tail[:1] in joints or before_tail in joints))


def test_readable_cuts_tick_text_not_data() -> None:
    sigs = ["multi_step_task_completion + structured_data_reasoning",
            "multi_step_task_completion + tool_calling_precision", "tool_calling_precision"]
    fig = cluster_bars([{"signature": s, "n": i + 1} for i, s in enumerate(sigs)])
    assert list(fig.data[0].y) == sigs[::-1]  # bars and hover keep the full text
    assert fig.layout.yaxis.automargin and fig.layout.xaxis.automargin
    ticks = dict(zip(fig.layout.yaxis.tickvals, fig.layout.yaxis.ticktext, strict=True))
    assert ticks[sigs[2]] == sigs[2]
    assert all(len(t) <= LABEL_CHARS for t in ticks.values())
    assert len(set(ticks.values())) == len(sigs)  # two cut labels stay told apart
    # Short categories are left alone: no fixed tick list on a numeric or short axis.
    short = readable(go.Figure(go.Bar(x=["a", "b"], y=[1, 2])))
    assert short.layout.xaxis.tickvals is None


@pytest.mark.e2e
def test_rankings_and_trajectories_chart_labels_inside(streamlit_server, browser,
                                                       wait_for_app, db_path: Path,
                                                       tmp_path: Path) -> None:
    from trace_lib.demo import build_demo
    from trace_lib.diagnose.labeling import run_labeling

    build_demo(tmp_path / "demo", n=60, seed=0, db=db_path)
    run_labeling(db_path, "heuristic", runs=3, run_prefix="h")
    server = streamlit_server(db_path)
    cut_seen = cuts_checked = 0
    for width in (1500, 1100):
        ctx = browser.new_context(viewport={"width": width, "height": 1000})
        try:
            page = ctx.new_page()
            page.set_default_timeout(60_000)
            for name, n_charts in PAGES.items():
                goto(page, f"{server.url}/{name}", wait_for_app)
                last: list = []

                def labels_inside(p=page, n=n_charts, last=last) -> bool:
                    last[:] = [c for c in p.evaluate(CHECK_JS) if c["drawn"]]
                    return (len(last) >= n and all(c["n"] > 0 for c in last)
                            and not any(c["bad"] for c in last))

                try:
                    wait_until(labels_inside, 90, f"{name} charts drawn with labels inside")
                except AssertionError as exc:
                    raise AssertionError(f"{name} at {width}px: {last}") from exc
                cut_seen += sum(c["cut"] for c in last)
                for value, text in (pair for c in last for pair in c["cuts"]):
                    head, tail = html.unescape(text).split("…")
                    assert _between_words(html.unescape(value), head, tail), (value, text)
                    cuts_checked += 1
        finally:
            ctx.close()
    # the demo's cluster signatures and tool error kinds are long: some label was cut, and
    # every cut fell between words (issue 34)
    assert cut_seen > 0 and cuts_checked > 0
