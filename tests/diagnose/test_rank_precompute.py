"""The Rankings view's failure clusters stored at a label run's finish (issue 35): read
instead of computed while the labels stay as they are, equal to the computation, and
computed again (and stored) after an edit or for another scope."""

from __future__ import annotations

from pathlib import Path

from test_agreement import _one_run_store

from trace_lib import store
from trace_lib.diagnose import rank_precompute, ranking
from trace_lib.diagnose.labeling import run_labeling
from trace_lib.diagnose.labels import edit_label
from trace_lib.scope import Scope
from trace_lib.workbench import diagnose as wb


def _caps(con, scope: Scope | None = None) -> list[str]:
    return [r.capability for r in ranking.rank_con(con, ranking.RankConfig(), scope=scope).rows
            if r.status != "rejected"]


def _stored(con, scope: Scope | None = None) -> tuple[list[dict], str]:
    runs = [r[0] for r in con.execute("SELECT id FROM label_runs ORDER BY started_at, id"
                                      ).fetchall()]
    return rank_precompute.stored_failure_clusters(con, runs, scope, _caps(con, scope))


def test_a_label_run_stores_the_default_clusters_and_rankings_reads_them(
        demo_db: Path, monkeypatch) -> None:
    run_labeling(demo_db, "heuristic", run_prefix="h")
    calls: list[int] = []
    real = rank_precompute.failure_clusters
    monkeypatch.setattr(rank_precompute, "failure_clusters",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    with store.connect(demo_db) as con:
        got, source = _stored(con)
        assert source == "stored" and got == ranking.failure_clusters(con, _caps(con))
        assert got and {"signature", "n", "examples"} <= set(got[0])
    view = wb.rankings(demo_db, wb.RankConfig(), stability=wb.StabilityConfig())
    assert view.clusters == got and not calls  # the use case read them too
    # An edit: another version, so they are computed (and equal the definition) again.
    with store.connect(demo_db) as con:
        tid, cap = con.execute("SELECT trajectory_id, capability FROM label_pairs p JOIN "
                               "trajectories t ON t.id = p.trajectory_id WHERE NOT t.success "
                               "AND p.value = 'lacking' ORDER BY ALL LIMIT 1").fetchall()[0]
    edit_label(demo_db, tid, cap, "present", editor="t")
    view = wb.rankings(demo_db, wb.RankConfig(), stability=wb.StabilityConfig())
    assert len(calls) == 1
    with store.connect(demo_db) as con:
        assert view.clusters == ranking.failure_clusters(con, _caps(con)) != got
        assert _stored(con)[1] == "stored"


def test_a_scope_computes_and_stores_its_own_clusters(db_path: Path) -> None:
    _one_run_store(db_path)
    with store.connect(db_path) as con:
        assert rank_precompute.store_default(con) == {"stability": "computed",
                                                      "clusters": "computed",
                                                      "cover": "computed"}
        assert rank_precompute.store_default(con) == {"stability": "stored",
                                                      "clusters": "stored",
                                                      "cover": "stored"}
        con.execute("INSERT INTO datasets (id, name, format, content_sha256) "
                    "VALUES ('d2', 'other', 'test', 'y')")
        con.execute("UPDATE trajectories SET dataset_id = 'd2' WHERE id IN ('f00', 'f01')")
    with store.connect(db_path) as con:  # moving trajectories is a new version
        scope = Scope(datasets=["other"])
        first = _stored(con, scope)
        again = _stored(con, scope)
        assert (first[1], again[1]) == ("computed", "stored") and first[0] == again[0]
        assert first[0] == ranking.failure_clusters(con, _caps(con, scope), scope=scope)
        assert sum(c["n"] for c in first[0]) == 2
        assert _stored(con)[1] == "computed"
