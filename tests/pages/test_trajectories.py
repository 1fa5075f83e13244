"""The Trajectories page under Streamlit's AppTest, on a real imported store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from trace_lib import store
from trace_lib.errors import UserInputError
from trace_lib.explore import queries as q
from trace_lib.explore import transcript

PAGE = str(Path(__file__).resolve().parents[2] / "pages" / "1_Trajectories.py")
HOSTILE = {
    "id": "xss-1", "task_id": "xss", "domain": "airline", "agent_model": "evil-model",
    "reward": 0.0,
    "messages": [
        {"role": "user", "content": "<script>window.__xss=1</script> help"},
        {"role": "assistant", "content": "<img src=x onerror=\"window.__xss=2\"> sorry"},
    ],
}


@pytest.fixture(scope="module")
def page_db(tmp_path_factory, shared_data) -> Path:
    from trace_lib.ingest import ingest_bytes, ingest_paths

    db = tmp_path_factory.mktemp("page") / "trace.duckdb"
    ingest_paths([
        str(shared_data / "tau-bench/historical_trajectories/gpt-4o-airline.json"),
        str(shared_data / "tau2-bench/results/feature-gym/gpt-4.1_retail_defautl_gpt-4.1_1trials.json"),
    ], db=db)
    ingest_bytes("hostile.jsonl", json.dumps(HOSTILE).encode() + b"\n", db=db)
    return db


def run(db: Path, monkeypatch) -> AppTest:
    monkeypatch.setenv("TRACE_DB", str(db))
    at = AppTest.from_file(PAGE, default_timeout=120).run()
    assert not at.exception, at.exception
    return at


def listing(at: AppTest):
    return at.dataframe(key="listing").value


def test_empty_states(tmp_path, monkeypatch):
    at = run(tmp_path / "none.duckdb", monkeypatch)
    assert any("make demo" in i.value for i in at.info)
    assert not (tmp_path / "none.duckdb").exists()  # looking does not create a store
    empty = tmp_path / "empty.duckdb"
    with store.connect(empty):
        pass
    at = run(empty, monkeypatch)
    assert any("no trajectories yet" in i.value for i in at.info)


def test_filters_change_the_table(page_db, monkeypatch):
    at = run(page_db, monkeypatch)
    with store.connect(page_db, read_only=True) as con:
        s = q.outcome_summary(con).iloc[0]
    assert len(listing(at)) == s.n_trajectories
    assert at.metric[0].value == str(int(s.n_trajectories))

    at.radio(key="f_outcome").set_value("failures").run()
    assert not at.exception
    df = listing(at)
    assert len(df) == s.n_failure and set(df.outcome) == {"failure"}

    at.multiselect(key="f_domain").set_value(["retail"]).run()
    df = listing(at)
    assert set(df.domain) == {"retail"} and set(df.outcome) == {"failure"} and len(df) > 0

    at.radio(key="f_outcome").set_value("all").run()
    at.multiselect(key="f_domain").set_value([]).run()
    at.radio(key="f_tool_error").set_value("with tool errors").run()
    df = listing(at)
    assert len(df) > 0 and (df.n_tool_errors > 0).all()


def test_failure_cluster_lists_its_members(page_db, monkeypatch):
    from trace_lib.explore import clusters

    at = run(page_db, monkeypatch)
    with store.connect(page_db, read_only=True) as con:
        second = clusters.signature_counts(con).iloc[1]
    pick = at.selectbox(key="sig_pick")
    assert len(pick.options) > 1 and pick.options[1] == f"{second.path}  ({second.n})"
    pick.set_value(second.path).run()
    assert not at.exception
    members = [d.value for d in at.dataframe if "deviation" in d.value.columns][0]
    assert len(members) == second.n
    assert (members.termination == second.termination).all()
    assert (members.deviation == second.deviation).all()


def test_transcript_shows_markup_as_text(page_db, monkeypatch):
    at = run(page_db, monkeypatch)
    with store.connect(page_db, read_only=True) as con:
        tid = con.execute("SELECT id FROM trajectories WHERE task_id = 'xss'").fetchone()[0]
    at.selectbox(key="trajectory_pick").set_value(tid).run()
    assert not at.exception
    bodies = " ".join(h.proto.body for h in at.get("html"))
    assert "&lt;script&gt;window.__xss=1&lt;/script&gt;" in bodies
    assert "<script" not in bodies and "<img" not in bodies


def test_upload_reports_the_same_errors_as_the_library(page_db, tmp_path, monkeypatch):
    from trace_lib.ingest import ingest_bytes

    db = tmp_path / "up.duckdb"
    with store.connect(db):
        pass
    bad = b'{"messages": [], "reward": "high"}\n'
    with pytest.raises(UserInputError) as exc:
        ingest_bytes("bad.jsonl", bad, db=tmp_path / "scratch.duckdb")
    at = run(db, monkeypatch)
    at.sidebar.get("file_uploader")[0].upload("bad.jsonl", bad).run()
    at.button(key="upload_go").click().run()
    # the library's message, shown literally (markdown metacharacters escaped)
    assert [e.value for e in at.error] == [transcript.markdown_literal(exc.value)]
    assert "bad.jsonl" in str(exc.value)

    at = run(db, monkeypatch)
    at.sidebar.get("file_uploader")[0].upload("ok.jsonl", json.dumps(HOSTILE).encode()).run()
    at.button(key="upload_go").click().run()
    assert not at.exception and not at.error
    assert any("imported 1 trajectories" in s.value for s in at.success)
    with store.connect(db, read_only=True) as con:
        assert q.outcome_summary(con).iloc[0].n_trajectories == 1


def test_semantic_clusters_embed_then_map(page_db, tmp_path, monkeypatch):
    import shutil

    db = tmp_path / "sem.duckdb"
    shutil.copy(page_db, db)  # embedding writes; the module's store stays as imported
    at = run(db, monkeypatch)
    at.multiselect(key="f_domain").set_value(["retail"]).run()
    with store.connect(db, read_only=True) as con:
        n_fail = int(q.outcome_summary(con, q.TrajectoryFilter(
            domains=("retail",), outcomes=("failure",))).iloc[0].n_failure)
    assert any(f"Embed {n_fail} trajectories" == b.label for b in at.button)
    at.button(key="sem_embed").click().run()
    assert not at.exception
    with store.connect(db, read_only=True) as con:
        assert con.execute("SELECT count(*) FROM embeddings").fetchone()[0] == n_fail
    assert not any(b.label.startswith("Embed ") for b in at.button)  # all cached now
    table = [d.value for d in at.dataframe if "top_terms" in d.value.columns][0]
    assert table.n.sum() == n_fail
    assert any(c.value.startswith("k = ") for c in at.caption)


def test_passed_and_failed_trials_side_by_side(page_db, monkeypatch):
    from trace_lib.explore import transcript as tr

    with store.connect(page_db, read_only=True) as con:
        failed_id = con.execute(
            "SELECT any_value(id) FILTER (WHERE NOT success) FROM trajectories "
            "GROUP BY dataset_id, task_id HAVING bool_or(success) AND bool_or(NOT success) "
            "ORDER BY 1 LIMIT 1").fetchone()[0]
        passed_id, _ = tr.contrast_pair(con, failed_id)
    at = run(page_db, monkeypatch)
    at.selectbox(key="trajectory_pick").set_value(failed_id).run()
    assert not at.exception
    assert any(e.label.startswith("Passed vs failed trial") for e in at.expander)
    bodies = [h.proto.body for h in at.get("html")]
    table = [b for b in bodies if f"passed {passed_id}" in b and f"failed {failed_id}" in b]
    assert len(table) == 1 and "trace-alignment" in table[0]
    assert sum("trace-transcript" in b for b in bodies) == 3  # the open one + the pair
