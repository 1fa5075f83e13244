"""The Rankings page's figures from real rankings of a small store."""

from __future__ import annotations

from pathlib import Path

from test_agreement import _one_run_store, _two_labelers_store

from trace_lib import store
from trace_lib.diagnose import ranking_charts
from trace_lib.diagnose import stability as ag
from trace_lib.diagnose.ranking import RankConfig


def test_delta_strip_shows_each_run_and_a_box_per_capability_for_resamples(
        db_path: Path, tmp_path: Path) -> None:
    _one_run_store(db_path)
    with store.connect(db_path) as con:
        boot = ag.stable_ranking(con, RankConfig(), ag.StabilityConfig(method="bootstrap",
                                                                      b=60, seed=1))
    fig = ranking_charts.delta_per_run(boot.ranking)
    assert fig.layout.yaxis.title.text == "Delta per resample"
    assert {t.boxpoints for t in fig.data} == {False}  # a box each, not 60 points
    assert all(len(t.y) == 60 for t in fig.data)
    runs_db = tmp_path / "runs.duckdb"
    _two_labelers_store(runs_db)
    with store.connect(runs_db) as con:
        runs = ag.stable_ranking(con, RankConfig(), ag.StabilityConfig(method="runs"))
    fig = ranking_charts.delta_per_run(runs.ranking)
    assert fig.layout.yaxis.title.text == "Delta per run"
    [trace] = [t for t in fig.data if len(t.y)]
    assert trace.boxpoints == "all" and sorted(trace.text) == ["h1", "h2", "o1"]
