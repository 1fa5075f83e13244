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


def test_the_treemap_never_nests_no_tool_error_in_itself():
    """Issue 34: a failure without a tool error has "(no tool error)" as tool and as error
    kind; the treemap shows one such box, and a click on any box still maps to the
    cluster's full four-level key (the members query reads all four)."""
    import pandas as pd

    from trace_lib.store.derived import NO_ERROR

    sigs = pd.DataFrame([
        {"termination": "user_stop", "error_tool": NO_ERROR, "error_kind": NO_ERROR,
         "deviation": "missing: book", "n": 3},
        {"termination": "user_stop", "error_tool": "get_user", "error_kind": "not found",
         "deviation": "missing: book", "n": 2},
    ])
    sigs.insert(0, "path", [clusters.PATH_SEP.join(r) for r in sigs[list(clusters.LEVELS)]
                            .itertuples(index=False)])
    tree = trajectory_charts.signature_treemap(sigs).data[0]
    by_id = dict(zip(tree.ids, tree.labels, strict=True))
    parents = dict(zip(tree.ids, tree.parents, strict=True))
    for box, label in by_id.items():
        assert not (label == NO_ERROR and by_id.get(parents[box]) == NO_ERROR), box
    leaf = "failures/user_stop/(no tool error)/missing: book"
    assert leaf in by_id and parents[leaf] == "failures/user_stop/(no tool error)"
    paths = trajectory_charts.treemap_box_paths(sigs)
    assert paths[leaf] == sigs.path[0]  # all four levels
    assert paths["failures/user_stop/(no tool error)"] == (
        "user_stop / (no tool error) / (no tool error)")
    assert paths["failures/user_stop/get_user/not found/missing: book"] == sigs.path[1]
    assert clusters.path_label(sigs.path[0]) == "user_stop / (no tool error) / missing: book"
    assert clusters.path_label(sigs.path[1]) == sigs.path[1]
