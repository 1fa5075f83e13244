"""Failure signatures on the hand-built store (exact) and on the real benchmark files."""

from __future__ import annotations

import json

import pytest

from trace_lib import store
from trace_lib.explore import clusters as cl
from trace_lib.explore import queries as q
from trace_lib.explore.queries import TrajectoryFilter as F
from trace_lib.store import derived as store_derived


def test_known_signatures(known_db):
    with store.connect(known_db, read_only=True) as con:
        sig = cl.failure_signatures(con).set_index("trajectory_id")
    assert set(sig.index) == {"t_f1", "t_f2", "t_f3", "t_f4"}  # failures only
    assert tuple(sig.loc["t_f1", list(cl.LEVELS)]) == (
        "user_stop", store_derived.NO_ERROR, store_derived.NO_ERROR, "wrong args: book")
    assert tuple(sig.loc["t_f2", list(cl.LEVELS)]) == (
        "too_many_errors", "get_user", "user <id> not found", "missing: book")
    # same arguments in another key order still reproduce the expected action
    assert sig.loc["t_f3", "deviation"] == store_derived.ALL_MADE
    assert tuple(sig.loc["t_f4", list(cl.LEVELS)]) == (
        "user_stop", "search", "reservation <id> not found", store_derived.NO_EXPECTED)


def test_counts_members_and_prefixes(known_db):
    with store.connect(known_db, read_only=True) as con:
        counts = cl.signature_counts(con)
        assert counts.n.sum() == 4 and counts.share.sum() == pytest.approx(1.0)
        assert counts.path.iloc[0].count(cl.PATH_SEP) == 3
        assert set(cl.signature_members(con, path=["user_stop"]).trajectory_id) == {
            "t_f1", "t_f4"}
        full = counts[counts.deviation == "missing: book"].iloc[0]
        members = cl.signature_members(con, path=full.path.split(cl.PATH_SEP))
        assert list(members.trajectory_id) == ["t_f2"]
        assert set(cl.signature_members(con).trajectory_id) == {"t_f1", "t_f2", "t_f3", "t_f4"}
        # the filter narrows signatures like every other view
        assert set(cl.signature_counts(con, F(domains=("retail",))).examples.iloc[0]) == {"t_f4"}
        with pytest.raises(ValueError, match="levels"):
            cl.signature_members(con, path=["a", "b", "c", "d", "e"])


def test_real_every_failure_has_one_signature(real_db):
    with store.connect(real_db, read_only=True) as con:
        n_fail = int(q.outcome_summary(con).iloc[0].n_failure)
        sig = cl.failure_signatures(con)
        counts = cl.signature_counts(con)
        assert len(sig) == sig.trajectory_id.nunique() == n_fail == counts.n.sum()
        top = counts.iloc[0]
        members = cl.signature_members(con, path=top.path.split(cl.PATH_SEP), limit=10_000)
        assert len(members) == top.n
        assert (members.deviation == top.deviation).all()


def test_real_deviations_are_true_of_the_transcripts(real_db):
    """Re-derive 'missing: X' and 'wrong args: X' in Python from the stored rows."""
    with store.connect(real_db, read_only=True) as con:
        sig = cl.failure_signatures(con)
        checked = 0
        for row in sig[sig.deviation.str.startswith(("missing:", "wrong args:"))].head(40) \
                .itertuples():
            name = row.deviation.split(": ", 1)[1]
            calls = con.execute(
                "SELECT name, arguments FROM tool_calls WHERE trajectory_id = ?",
                [row.trajectory_id]).fetchall()
            expected = con.execute(
                "SELECT name, arguments FROM expected_actions e JOIN trajectories t "
                "ON t.dataset_id = e.dataset_id AND t.task_id = e.task_id WHERE t.id = ? "
                "ORDER BY e.idx", [row.trajectory_id]).fetchall()
            made = {(n, json.dumps(json.loads(a), sort_keys=True)) for n, a in calls}
            first_unmade = next(
                (n, json.loads(a)) for n, a in expected
                if (n, json.dumps(json.loads(a), sort_keys=True)) not in made)
            assert first_unmade[0] == name
            called = {n for n, _ in calls}
            assert (name in called) == row.deviation.startswith("wrong args:")
            checked += 1
        assert checked >= 20
        tool_err = sig[sig.error_tool != store_derived.NO_ERROR].iloc[0]
        first = con.execute(
            "SELECT name FROM tool_calls WHERE trajectory_id = ? AND error IS NOT NULL "
            "ORDER BY message_idx, call_idx LIMIT 1", [tool_err.trajectory_id]).fetchone()[0]
        assert first == tool_err.error_tool
