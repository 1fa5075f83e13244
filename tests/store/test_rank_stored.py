"""The stored stability counts' table: a round trip to the bit, never read for another
version, rows of other versions dropped on write, at most KEEP entries."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trace_lib import store
from trace_lib.store import rank_stored as rs


def _entry(b: int = 3, caps: tuple[str, ...] = ("a", "b"), seed: int = 0
           ) -> rs.StoredStability:
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 1_000_000, size=(b, len(caps), 6)).astype(np.float64)
    return rs.StoredStability("bootstrap", "1 label run", b, seed, list(caps), counts, 0.5)


def test_round_trip_is_exact_and_keyed_by_version(tmp_path: Path) -> None:
    e = _entry(caps=("zeta", "alpha", "mid"))  # not sorted: the stored order is kept
    with store.connect(tmp_path / "s.duckdb") as con:
        assert rs.write(con, "k1", "v1", e)
        got = rs.read(con, "k1", "v1")
        assert got is not None and got.caps == ["zeta", "alpha", "mid"]
        assert got.counts.dtype == np.float64 and (got.counts == e.counts).all()
        assert (got.method, got.reason, got.b, got.seed) == ("bootstrap", "1 label run", 3, 0)
        assert rs.read(con, "k1", "v2") is None and not rs.has(con, "k1", "v2")
        assert rs.read(con, "k2", "v1") is None
        runs = rs.StoredStability("runs", "2 runs that differ", None, None, [], None, 0.0)
        assert rs.write(con, "k2", "v1", runs)
        got = rs.read(con, "k2", "v1")
        assert got is not None and got.method == "runs" and got.counts is None
        # A new version: the old version's rows go, whatever their key.
        assert rs.write(con, "k3", "v2", _entry(seed=1))
        assert rs.entries(con) == [("k3", "v2", "bootstrap")]
        assert con.execute("SELECT count(DISTINCT key) FROM rank_stability_counts"
                           ).fetchall()[0][0] == 1
        # The same key again replaces its rows.
        assert rs.write(con, "k3", "v2", _entry(seed=2))
        assert (rs.read(con, "k3", "v2").counts == _entry(seed=2).counts).all()
        assert con.execute("SELECT count(*) FROM rank_stability_counts").fetchall()[0][0] == 6


def test_at_most_keep_entries(tmp_path: Path) -> None:
    with store.connect(tmp_path / "s.duckdb") as con:
        for i in range(rs.KEEP + 5):  # a transaction each: later computed_at values
            rs.write(con, f"k{i:02d}", "v", _entry(b=2, seed=i))
        keys = [k for k, _, _ in rs.entries(con)]
        assert len(keys) == rs.KEEP and f"k{rs.KEEP + 4:02d}" in keys
        assert con.execute("SELECT count(DISTINCT key) FROM rank_stability_counts"
                           ).fetchall()[0][0] == rs.KEEP


def test_a_read_only_connection_writes_nothing_and_fails_nothing(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    with store.connect(db) as con:
        rs.write(con, "k1", "v1", _entry())
    with store.connect(db, read_only=True) as con:
        assert not rs.write(con, "k2", "v1", _entry(seed=1))
        assert not rs.write_clusters(con, "k2", "v1", [{"signature": "a", "n": 1}], 0.1)
        assert not rs.write_cover(con, "k2", "v1", {"n": []}, {}, 0.1)
        assert rs.entries(con) == [("k1", "v1", "bootstrap")]


def test_cover_rows_are_keyed_by_version_and_round_trip(tmp_path: Path) -> None:
    sigs = {"capabilities": ["a", "b"], "lacking": [[2**64 - 1], [0]],
            "labelled": [[3], [0]], "n": [5, 1]}  # a full uint64 word survives JSON
    examples = {"a": [{"trajectory_id": "t1", "case": "d/task 1/trial 0"}], "b": []}
    with store.connect(tmp_path / "s.duckdb") as con:
        assert rs.write_cover(con, "k1", "v1", sigs, examples, 0.2)
        assert rs.read_cover(con, "k1", "v1") == (sigs, examples)
        assert rs.has_cover(con, "k1", "v1") and not rs.has_cover(con, "k1", "v2")
        assert rs.read_cover(con, "k1", "v2") is None and rs.read_cover(con, "k2", "v1") is None
        assert rs.write_cover(con, "k2", "v1", sigs, {}, 0.1)
        assert rs.write_cover(con, "k1", "v2", sigs, {}, 0.1)  # a new version: the rest go
        assert con.execute("SELECT key, version FROM rank_cover").fetchall() == [("k1", "v2")]
        for i in range(rs.KEEP + 3):
            rs.write_cover(con, f"k{i:02d}", "v2", sigs, {}, 0.0)
        assert con.execute("SELECT count(*) FROM rank_cover").fetchall()[0][0] == rs.KEEP
