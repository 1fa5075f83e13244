"""Filters and aggregates: exact answers on a hand-built store, consistency on real data."""

from __future__ import annotations

import json

import duckdb
import pytest

from trace_lib import store
from trace_lib.explore import queries as q
from trace_lib.explore.queries import TrajectoryFilter as F


def ids(con, flt) -> set[str]:
    return set(q.list_trajectories(con, flt).id)


@pytest.fixture
def con(known_db):
    with store.connect(known_db, read_only=True) as c:
        yield c


def test_filter_fields_select_the_right_trajectories(con):
    assert ids(con, None) == {"t_ok1", "t_f1", "t_f2", "t_f3", "t_f4", "t_u1"}
    assert ids(con, F(outcomes=("failure",))) == {"t_f1", "t_f2", "t_f3", "t_f4"}
    assert ids(con, F(outcomes=("success", "unknown"))) == {"t_ok1", "t_u1"}
    assert ids(con, F(domains=("retail",))) == {"t_f4", "t_u1"}
    assert ids(con, F(agent_models=("gpt-x",), terminations=("user_stop",))) == {"t_ok1", "t_f1"}
    assert ids(con, F(datasets=("ds2",))) == {"t_f4", "t_u1"}
    assert ids(con, F(tools_used=("book",))) == {"t_ok1", "t_f1", "t_f3"}
    assert ids(con, F(tool_error=True)) == {"t_f2", "t_f4"}
    assert ids(con, F(tool_error=False)) == {"t_ok1", "t_f1", "t_f3", "t_u1"}
    assert ids(con, F(error_kinds=("reservation <id> not found",))) == {"t_f4"}
    assert ids(con, F(task_ids=("1",), outcomes=("failure",))) == {"t_f1", "t_f2", "t_f3"}
    assert ids(con, F(trajectory_ids=("t_f2", "nope"))) == {"t_f2"}


def test_text_filter_is_case_insensitive_and_literal(con):
    sub = "substring"
    assert ids(con, F(text="WINDOW.__xss", text_mode=sub)) == {"t_f4"}
    # % and _ are not wildcards: "help_me" does not match "help me"
    assert ids(con, F(text="help_me", text_mode=sub)) == set()
    assert ids(con, F(text="%", text_mode=sub)) == set()


def test_text_filter_words_mode(con):
    # words (the default): every word starts a token; "_" separates tokens as "." does
    assert ids(con, F(text="WINDOW.__xss")) == {"t_f4"}
    assert ids(con, F(text="help_me")) == {"t_ok1", "t_f1", "t_f2", "t_f3", "t_u1"}
    assert ids(con, F(text="hel")) == {"t_ok1", "t_f1", "t_f2", "t_f3", "t_u1"}
    assert ids(con, F(text="elp")) == set()  # not a token start: use substring mode
    assert ids(con, F(text="elp", text_mode="substring")) == {"t_ok1", "t_f1", "t_f2", "t_f3", "t_u1"}
    assert ids(con, F(text='"me please"')) == {"t_ok1", "t_f1", "t_f2", "t_f3", "t_u1"}
    assert ids(con, F(text='"please me"')) == set()
    assert ids(con, F(text="%")) == set()
    with pytest.raises(ValueError, match="text_mode"):
        F(text="x", text_mode="regex")


def test_filter_values_are_bound_not_spliced(con):
    assert ids(con, F(domains=("airline' OR TRUE --",))) == set()
    assert ids(con, F(text="'; DROP TABLE trajectories; --")) == set()
    assert con.execute("SELECT count(*) FROM trajectories").fetchone()[0] == 6


def test_filter_validates_and_stays_hashable():
    with pytest.raises(ValueError, match="outcomes"):
        F(outcomes=("passed",))
    f = F(domains=["airline"])  # widgets hand over lists
    assert f.domains == ("airline",) and hash(f) == hash(F(domains=("airline",)))
    assert F().is_empty() and not f.is_empty()


def test_summary_and_rates(con):
    s = q.outcome_summary(con).iloc[0]
    assert (s.n_trajectories, s.n_success, s.n_failure, s.n_unknown) == (6, 1, 4, 1)
    assert s.success_rate == pytest.approx(1 / 5)  # unknown outcomes are not counted
    assert (s.n_tool_calls, s.n_tool_errors) == (9, 2)
    by = q.success_by_domain_agent(con).set_index(["domain", "agent_model"])
    air = by.loc[("airline", "gpt-x")]
    assert (air.n, air.n_known, air.n_success) == (4, 4, 1)
    assert air.ci_low <= air.success_rate == 0.25 <= air.ci_high
    assert by.loc[("retail", "gpt-y")].n_known == 1


def test_terminations_histogram_tools_errors(con):
    t = q.termination_counts(con)
    assert t.n.sum() == 6
    assert t.set_index(["termination", "outcome"]).loc[("user_stop", "failure")].n == 2
    h = q.tool_call_histogram(con).set_index(["n_tool_calls", "outcome"]).n
    assert h[(2, "failure")] == 3 and h[(0, "unknown")] == 1
    u = q.tool_usage(con).set_index("tool")
    assert (u.loc["get_user"].n_calls, u.loc["get_user"].n_errors) == (5, 1)
    assert u.loc["search"].error_rate == 1.0
    k = q.tool_error_kinds(con)
    assert set(zip(k.tool, k.error_kind, strict=True)) == {
        ("get_user", "user <id> not found"), ("search", "reservation <id> not found")}


def test_error_kind_masks_ids_and_numbers():
    c = duckdb.connect()
    def kind(text):
        return c.execute(f"SELECT {q.error_kind_sql('?')}", [text]).fetchone()[0]
    assert kind("Error: Reservation ZFA04Y not found") == "reservation <id> not found"
    assert kind("Error: Reservation 8JX2 not found") == "reservation <id> not found"
    assert kind("Error: Payment method credit_card_7334 not found") == \
        "payment method <id> not found"
    assert kind("error: total price is 375, but paid 299") == "total price is <id>, but paid <id>"
    assert kind("Error: 'abc' is invalid") == "<id> is invalid"
    assert kind("   ") is None


def test_filter_options_lists_every_field(con):
    o = q.filter_options(con)
    got = {f: dict(zip(g.value, g.n, strict=True)) for f, g in o.groupby("field")}
    assert got["domain"] == {"airline": 4, "retail": 2}
    assert got["outcome"] == {"success": 1, "failure": 4, "unknown": 1}
    assert got["tool"]["get_user"] == 5  # calls
    assert got["error_kind"] == {"user <id> not found": 1, "reservation <id> not found": 1}
    assert dict(zip(o[o.field == "dataset"].value, o[o.field == "dataset"].label,
                    strict=True)) == {"ds1": "ds1.json", "ds2": "ds2.json"}


def test_list_pages_and_columns(con):
    first = q.list_trajectories(con, None, limit=2)
    rest = q.list_trajectories(con, None, limit=10, offset=2)
    assert len(first) == 2 and len(rest) == 4 and not set(first.id) & set(rest.id)
    row = q.list_trajectories(con, F(trajectory_ids=("t_f2",))).iloc[0]
    assert (row.outcome, row.first_error_tool, row.dataset) == ("failure", "get_user", "ds1.json")


def test_pipeline_counts_on_a_store_missing_later_tables(tmp_path):
    path = tmp_path / "old.duckdb"
    with duckdb.connect(str(path)) as c:  # a file from before later stages existed
        c.execute("CREATE TABLE datasets (id VARCHAR)")
        c.execute("CREATE TABLE trajectories (id VARCHAR, success BOOLEAN)")
        c.execute("INSERT INTO trajectories VALUES ('a', false), ('b', true)")
    with duckdb.connect(str(path), read_only=True) as c:
        p = q.pipeline_counts(c).set_index("item").n
    assert p["trajectories"] == 2 and p["failures"] == 1 and p["adapters"] == 0


# ---------------------------------------------------------------------------- real data


def test_real_counts_match_the_source_files(real_db, shared_data):
    raw = json.loads((shared_data / "tau-bench/historical_trajectories/gpt-4o-airline.json")
                     .read_text())
    with store.connect(real_db, read_only=True) as con:
        ds = q.filter_options(con)
        ds = ds[(ds.field == "dataset") & ds.label.str.contains("gpt-4o-airline")].value.iloc[0]
        s = q.outcome_summary(con, F(datasets=(ds,))).iloc[0]
        assert s.n_trajectories == len(raw)
        assert s.n_success == sum(1 for r in raw if r["reward"] == 1.0)
        allsum = q.outcome_summary(con).iloc[0]
        assert q.termination_counts(con).n.sum() == allsum.n_trajectories
        assert q.tool_call_histogram(con).n.sum() == allsum.n_trajectories
        assert q.tool_usage(con).n_calls.sum() == allsum.n_tool_calls
        assert q.tool_error_kinds(con, limit=1000).n.sum() == allsum.n_tool_errors
        by = q.success_by_domain_agent(con)
        assert set(by.domain) >= {"airline", "retail", "telecom"}
        assert by.n.sum() == allsum.n_trajectories


def test_real_filters_agree_with_each_other(real_db):
    with store.connect(real_db, read_only=True) as con:
        fail = q.outcome_summary(con, F(outcomes=("failure",))).iloc[0]
        ok = q.outcome_summary(con, F(outcomes=("success",))).iloc[0]
        assert fail.n_success == 0 and ok.n_failure == 0
        total = q.outcome_summary(con).iloc[0]
        assert fail.n_trajectories + ok.n_trajectories + total.n_unknown == total.n_trajectories
        kinds = q.tool_error_kinds(con, limit=1000)
        top = kinds.iloc[0]
        with_kind = q.list_trajectories(con, F(error_kinds=(top.error_kind,)), limit=10_000)
        assert len(with_kind) >= top.n_trajectories and (with_kind.n_tool_errors > 0).all()
        used = q.list_trajectories(con, F(tools_used=("book_reservation",)), limit=10_000)
        assert len(used) > 0 and (used.n_tool_calls > 0).all()
