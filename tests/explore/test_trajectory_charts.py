"""Figures carry escaped trajectory text and the data they were given."""

from __future__ import annotations

import json

from trace_lib import store
from trace_lib.explore import clusters, queries, trajectory_charts


def test_figures_from_the_known_store(known_db):
    with store.connect(known_db, read_only=True) as con:
        figs = {
            "rate": trajectory_charts.success_rate_chart(queries.success_by_domain_agent(con)),
            "term": trajectory_charts.termination_chart(queries.termination_counts(con)),
            "calls": trajectory_charts.tool_calls_chart(queries.tool_call_histogram(con)),
            "errors": trajectory_charts.tool_errors_chart(queries.tool_error_kinds(con)),
            "tree": trajectory_charts.signature_treemap(clusters.signature_counts(con)),
        }
    rate = figs["rate"].data
    assert {t.name for t in rate} == {"gpt-x", "gpt-y"}
    assert sum(t.y[0] for t in rate if t.name == "gpt-x") == 0.25
    tree = figs["tree"].data[0]
    assert "failures" in tree.labels and "missing: book" in tree.labels
    assert sum(v for v, p in zip(tree.values, tree.parents, strict=True) if p == "failures") == 4
    assert all(f.data for f in figs.values())


def test_hostile_strings_are_escaped_in_figures():
    import pandas as pd

    evil = '<a href="javascript:alert(1)">x</a>'
    errs = pd.DataFrame([{"tool": evil, "error_kind": evil, "n": 1, "n_trajectories": 1,
                          "example": evil}])
    pts = pd.DataFrame([{"trajectory_id": "t", "task_id": evil, "termination": evil,
                         "outcome": "failure", "cluster": 0, "x": 0.0, "y": 0.0,
                         "text": evil}])
    for fig in (trajectory_charts.tool_errors_chart(errs), trajectory_charts.semantic_map(pts)):
        blob = json.dumps(fig.to_plotly_json(), default=str)
        assert "<a href" not in blob and "&lt;a href=&quot;javascript" in blob


def test_empty_frames_give_an_annotated_figure():
    import pandas as pd

    fig = trajectory_charts.signature_treemap(pd.DataFrame())
    assert fig.layout.annotations[0].text == "no data for this filter"
