"""Semantic clusters with the real offline MiniLM encoder (no mocks)."""

from __future__ import annotations

import numpy as np
import pytest

from trace_lib import store
from trace_lib.explore import embeddings as emb
from trace_lib.explore.queries import TrajectoryFilter as F


def test_compose_text_puts_the_request_first_and_is_bounded():
    text = emb.compose_text("book a flight " * 100, ["b: Error 2", "a: Error 1"],
                            ["first", "last"])
    lines = text.split("\n")
    assert lines[0].startswith("User request: book a flight")
    assert len(lines[0]) <= len("User request: ") + emb.TEXT_CHARS[0]
    assert lines[1] == "Tool errors: a: Error 1 | b: Error 2"
    assert lines[2] == "Agent's last turns: first | last"
    assert emb.compose_text(None, [], []) == "User request: "


def test_embeddings_are_cached_by_text_hash(known_db):
    ticks = []
    with store.connect(known_db) as con:
        texts = emb.trajectory_texts(con)
        assert list(texts.trajectory_id) == ["t_f1", "t_f2", "t_f3", "t_f4"]
        assert "Tool errors: get_user: Error: User u9 not found" in texts.text[1]
        rep = emb.ensure_embeddings(con, progress=lambda d, t: ticks.append((d, t)))
        assert (rep.n_computed, rep.n_cached) == (4, 0) and ticks[-1] == (4, 4)
        assert emb.missing_embeddings(con) == 0
        assert emb.ensure_embeddings(con).n_computed == 0  # nothing changed
        vec = np.array(con.execute("SELECT vector FROM embeddings WHERE trajectory_id = 't_f1'")
                       .fetchone()[0])
        assert vec.shape == (384,) and np.linalg.norm(vec) == pytest.approx(1.0, abs=1e-3)
        # the text of one trajectory changes: only that one is embedded again
        con.execute("UPDATE messages SET content = 'a new request' "
                    "WHERE trajectory_id = 't_f2' AND role = 'user'")
        assert emb.missing_embeddings(con) == 1
        assert emb.ensure_embeddings(con).n_computed == 1
        # successes join when asked
        assert emb.ensure_embeddings(con, failures_only=False).n_computed == 2


def test_semantic_clusters_group_identical_texts(known_db):
    with store.connect(known_db) as con:
        emb.ensure_embeddings(con)
        smap = emb.semantic_clusters(con, k=2)
        nothing = emb.semantic_clusters(con, F(domains=("none",)))
    p = smap.points.set_index("trajectory_id")
    assert smap.k == 2 and len(p) == 4
    # t_f1 and t_f3 have the same text, so the same vector and cluster
    assert p.loc["t_f1", "cluster"] == p.loc["t_f3", "cluster"]
    assert p.loc["t_f1", "x"] == pytest.approx(p.loc["t_f3", "x"], abs=1e-5)
    assert set(smap.clusters.columns) >= {"cluster", "n", "top_terms", "typical"}
    assert smap.clusters.n.sum() == 4
    for _, c in smap.clusters.iterrows():  # typical = closest to the centroid first
        members = p[p.cluster == c.cluster].sort_values("distance")
        assert c.typical[0] == members.index[0]
    assert nothing.points.empty and nothing.k == 0


def test_real_failures_cluster(real_db, tmp_path):
    import shutil

    db = tmp_path / "copy.duckdb"
    shutil.copy(real_db, db)  # the session store stays read-only for other tests
    with store.connect(db) as con:
        flt = F(domains=("airline",), agent_models=("gpt-4.1",))
        rep = emb.ensure_embeddings(con, flt)
        assert rep.n_computed == rep.n_in_scope > 3
        smap = emb.semantic_clusters(con, flt)
    assert 2 <= smap.k <= 10 and smap.silhouette is not None
    assert len(smap.points) == rep.n_in_scope
    assert (smap.points.outcome == "failure").all()
    assert smap.clusters.top_terms.str.len().gt(0).all()


def test_warm_up_runs_once_in_the_background():
    w = emb.warm_up()
    assert w is emb.warm_up()  # one per process
    assert w.wait("sklearn", timeout=600) and w.ready("sklearn")
    assert w.wait("encoder", timeout=600) and w.error is None
    assert w.fraction == 1.0 and w.text == "encoder ready"
    assert emb._load_minilm() is emb._load_minilm()  # the loaded model is the one reused
