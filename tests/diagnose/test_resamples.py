"""Bootstrap resamples: stratified draws that depend on the seed only (not on the number
of threads), and counts equal to a plain recount of each resample."""

from __future__ import annotations

import numpy as np
import pytest

from trace_lib.diagnose import resamples


def _success(n_failed: int, n_passed: int) -> np.ndarray:
    return np.array([False] * n_failed + [True] * n_passed)


def test_each_resample_keeps_the_strata_and_the_seed_alone_fixes_the_draws(monkeypatch):
    success = _success(37, 23)
    monkeypatch.setattr(resamples, "workers", lambda: 1)
    one = resamples.multiplicities(success, 50, seed=3)
    monkeypatch.setattr(resamples, "workers", lambda: 3)
    three = resamples.multiplicities(success, 50, seed=3)
    assert one.dtype == np.uint8 and (one == three).all()
    assert (one[:, :37].sum(axis=1) == 37).all() and (one[:, 37:].sum(axis=1) == 23).all()
    assert not (one == resamples.multiplicities(success, 50, seed=4)).all()
    assert len({row.tobytes() for row in one}) == 50  # every resample its own draw
    # Each trajectory is drawn once per resample on average (a uniform resample).
    assert one.mean() == pytest.approx(1.0) and 0.8 < one[:, 0].mean() < 1.2


def test_one_stratum_empty_and_unsorted_input():
    w = resamples.multiplicities(_success(0, 5), 10, seed=0)
    assert (w.sum(axis=1) == 5).all()
    with pytest.raises(ValueError, match="failed trajectories first"):
        resamples.multiplicities(np.array([True, False]), 10, seed=0)


def test_counts_equal_a_recount_of_every_resample():
    rng = np.random.default_rng(1)
    success = _success(41, 29)
    codes = rng.integers(-1, 3, size=(70, 4)).astype(np.int8)  # -1: unlabeled
    w = resamples.multiplicities(success, 20, seed=9)
    got = resamples.resample_counts(w, codes, success, chunk=16)  # chunks cross the strata
    want = np.zeros((20, 4, 6))
    for b in range(20):
        for t in range(70):
            for c in range(4):
                if codes[t, c] >= 0:
                    want[b, c, 3 * int(success[t]) + codes[t, c]] += w[b, t]
    assert (got == want).all()


def test_a_block_of_rows_is_the_same_draws_as_in_the_whole():
    success = _success(37, 23)
    whole = resamples.multiplicities(success, 50, seed=3)
    assert (resamples.multiplicities(success, 50, seed=3, rows=range(20, 33))
            == whole[20:33]).all()


def test_counts_drawn_a_block_at_a_time_equal_the_full_resamples(tmp_path):
    """What a label run's finish stores (`draw_counts`, no (B, T) multiplicities held)
    equals the counts of `draw_resamples` to the bit, whatever the block, in a scope too."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_agreement import _one_run_store

    from trace_lib import store
    from trace_lib.scope import Scope

    db = tmp_path / "s.duckdb"
    _one_run_store(db)
    with store.connect(db) as con:
        con.execute("INSERT INTO datasets (id, name, format, content_sha256) "
                    "VALUES ('d2', 'other', 'test', 'y')")
        con.execute("UPDATE trajectories SET dataset_id = 'd2' WHERE id IN "
                    "('f00', 'f03', 'f07', 'p01', 'p02')")
        for scope in (Scope(), Scope(datasets=["other"])):
            sc, sp = scope.where(con, "t")
            full = resamples.draw_resamples(con, ["h"], 45, 9, sc, sp)
            for block in (7, 40, 45, 100):
                seen = []
                got = resamples.draw_counts(con, ["h"], 45, 9, sc, sp,
                                            progress=lambda f, t, seen=seen: seen.append(f),
                                            block=block)
                assert got.caps == full.caps and got.counts.dtype == full.counts.dtype
                assert (got.counts == full.counts).all()
                assert seen[0] == 0.0 and seen[-1] == 1.0 and seen == sorted(seen)
