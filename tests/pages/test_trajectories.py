"""The Trajectories page under Streamlit's AppTest, on a real imported store."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from trace_lib import store
from trace_lib.errors import UserInputError
from trace_lib.explore import queries as q
from trace_lib.explore import transcript_loading, untrusted_text

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


def open_tab(at: AppTest, label: str) -> AppTest:
    """Open one of the page's lazy tabs (only the open tab's body runs)."""
    at.session_state["traj_tab"] = label
    at.run()
    assert not at.exception, at.exception
    return at


def test_closed_tabs_do_no_work(page_db, monkeypatch):
    from trace_lib.explore import clusters, embeddings

    with store.connect(page_db, read_only=True) as con:
        second = clusters.signature_counts(con).iloc[1].path
    fresh = embeddings.Warmup()  # this process's own may have been started by other tests
    monkeypatch.setattr(embeddings, "_WARMUP", fresh)
    at = run(page_db, monkeypatch)
    keys = {w.key for w in at.selectbox} | {w.key for w in at.slider}
    assert not keys & {"sig_pick", "sem_k"}
    assert len(at.get("plotly_chart")) == 4  # the Charts tab only: no treemap
    # a visit does not start the scikit-learn/encoder import (it competed for the GIL)
    assert fresh._thread is None
    open_tab(at, "Failure clusters")
    at.selectbox(key="sig_pick").set_value(second).run()
    assert len(at.get("plotly_chart")) == 1  # the treemap; the charts are not drawn
    open_tab(at, "Charts")
    open_tab(at, "Failure clusters")  # the cluster choice survives a visit to another tab
    assert at.selectbox(key="sig_pick").value == second


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

    at = open_tab(run(page_db, monkeypatch), "Failure clusters")
    with store.connect(page_db, read_only=True) as con:
        second = clusters.signature_counts(con).iloc[1]
    pick = at.selectbox(key="sig_pick")
    assert len(pick.options) > 1
    assert pick.options[1] == f"{clusters.path_label(second.path)}  ({second.n})"
    # issue 34: the picker never reads "(no tool error) / (no tool error)", and the
    # treemap the page draws has no "(no tool error)" box inside another one
    assert not any("(no tool error) / (no tool error)" in o for o in pick.options)
    from trace_lib.store.derived import NO_ERROR

    [tree] = [json.loads(c.proto.spec)["data"][0] for c in at.get("plotly_chart")
              if '"treemap"' in c.proto.spec]
    label = dict(zip(tree["ids"], tree["labels"], strict=True))
    parent = dict(zip(tree["ids"], tree["parents"], strict=True))
    boxes = [b for b, text in label.items() if text == NO_ERROR]
    assert boxes  # the store has failures without a tool error: the check bites
    assert not [b for b in boxes if label.get(parent[b]) == NO_ERROR], boxes
    pick.set_value(second.path).run()
    assert not at.exception
    members = [d.value for d in at.dataframe if "deviation" in d.value.columns][0]
    assert len(members) == second.n
    assert (members.termination == second.termination).all()
    assert (members.deviation == second.deviation).all()


def test_a_box_above_the_leaves_selects_every_signature_below(page_db, monkeypatch):
    # A treemap click on a termination box sets the picker to that one level (the browser
    # test clicks; here the picker's state is set as the click sets it).
    from trace_lib.explore import clusters

    with store.connect(page_db, read_only=True) as con:
        sigs = clusters.signature_counts(con)
    top = sigs.groupby("termination").n.sum().sort_values(ascending=False)
    term, n = top.index[0], int(top.iloc[0])
    monkeypatch.setenv("TRACE_DB", str(page_db))
    at = AppTest.from_file(PAGE, default_timeout=120)
    at.session_state["sig_pick"] = term
    at.session_state["traj_tab"] = "Failure clusters"
    at.run()
    assert not at.exception, at.exception
    pick = at.selectbox(key="sig_pick")
    assert pick.value == term
    assert pick.options[0] == f"{term}  ({n}, every signature below)"
    members = [d.value for d in at.dataframe if "deviation" in d.value.columns][0]
    assert len(members) == min(n, 100) and (members.termination == term).all()
    assert members.deviation.nunique() > 1  # more than one leaf


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
    assert [e.value for e in at.error] == [untrusted_text.markdown_literal(exc.value)]
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
    at = open_tab(run(db, monkeypatch), "Semantic clusters")
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


def test_any_two_trials_side_by_side(page_db, monkeypatch):
    with store.connect(page_db, read_only=True) as con:
        failed_id, n_trials = con.execute(
            "SELECT any_value(id) FILTER (WHERE NOT success), count(*) FROM trajectories "
            "GROUP BY dataset_id, task_id HAVING bool_or(success) AND count(*) FILTER "
            "(WHERE NOT success) >= 2 ORDER BY 1 LIMIT 1").fetchone()
        trials = transcript_loading.task_trials(con, failed_id)
        xss = con.execute("SELECT id FROM trajectories WHERE task_id = 'xss'").fetchone()[0]
    outcome = dict(zip(trials.id, trials.outcome, strict=True))
    at = run(page_db, monkeypatch)
    at.selectbox(key="trajectory_pick").set_value(failed_id).run()
    assert not at.exception
    assert not any(w.key.startswith("cmp_other") for w in at.selectbox)  # closed: no work
    at.session_state["cmp_wanted"] = True  # the expander is lazy: opening it is a rerun
    at.run()
    [exp] = [e for e in at.expander if e.label.startswith("Compare with another trial")]
    assert f"({n_trials - 1} other trials of this task)" in exp.label
    pick = at.selectbox(key=f"cmp_other::{failed_id}")
    assert len(pick.options) == n_trials - 1
    assert outcome[pick.value] == "passed"  # a contrasting trial is offered first

    def shown():
        bodies = [h.proto.body for h in at.get("html")]
        return ([b for b in bodies if "trace-alignment" in b and "expected</th>" not in b],
                [b for b in bodies if "trace-side-by-side" in b])

    [table], [side] = shown()
    assert f"({pick.value})" in table and f"({failed_id})" in table
    assert "only left" not in table and "only right" not in table
    assert side.count('class="trace-transcript"') == 2 and side.count("system-prompt") <= 1
    # any other trial: another failed one
    other_failed = next(i for i in trials.id if outcome[i] == "failed" and i != failed_id)
    pick.set_value(other_failed).run()
    assert not at.exception
    [table], [side] = shown()
    assert f"({other_failed})" in table and f"({failed_id})" in table
    # a task run once says so, and still takes any trajectory id
    at.selectbox(key="trajectory_pick").set_value(xss).run()
    [exp] = [e for e in at.expander if e.label.startswith("Compare with another")]
    assert "only this one trial" in exp.label
    assert any("only this one trial" in i.value for i in at.info)
    assert shown() == ([], [])
    at.text_input(key=f"cmp_other_id::{xss}").set_value(failed_id).run()
    assert not at.exception
    [table], [side] = shown()
    assert failed_id in table and "<script" not in side and "<img" not in side


def test_keys_move_to_the_next_trajectory_and_failure(page_db, monkeypatch):
    at = run(page_db, monkeypatch)
    ids, outcomes = listing(at).id.tolist(), listing(at).outcome.tolist()
    first = at.selectbox(key="trajectory_pick").value
    assert first == ids[0]
    assert at.button(key="nav_prev").disabled
    at.button(key="nav_next").click().run()
    assert at.selectbox(key="trajectory_pick").value == ids[1]
    at.button(key="nav_prev").click().run()
    assert at.selectbox(key="trajectory_pick").value == ids[0]
    at.button(key="nav_fail").click().run()
    assert at.selectbox(key="trajectory_pick").value == next(
        i for k, i in enumerate(ids) if k > 0 and outcomes[k] == "failure")


def test_system_prompt_folded_and_search_hits_marked(page_db, monkeypatch):
    with store.connect(page_db, read_only=True) as con:
        tid, policy = con.execute("SELECT trajectory_id, content FROM messages "
                                  "WHERE role = 'system' ORDER BY 1 LIMIT 1").fetchone()
    at = run(page_db, monkeypatch)
    at.selectbox(key="trajectory_pick").set_value(tid).run()
    body = next(h.proto.body for h in at.get("html") if "trace-transcript" in h.proto.body)
    assert re.search(r'<details class="msg role-system system-prompt" style', body)
    assert body.index("system-prompt") < body.index("role-user") and len(policy) > 1000
    at.sidebar.text_input(key="f_text").set_value("reservation").run()
    assert not at.exception
    bodies = [h.proto.body for h in at.get("html")]
    body = next(b for b in bodies if "trace-transcript" in b)
    assert '<mark class="trace-hit" id="trace-hit-0"' in body
    assert any("scrollIntoView" in b for b in bodies)  # the jump to the first hit


def test_search_reads_the_conversation_and_the_system_prompt_on_request(page_db, monkeypatch):
    """Issue 34: "refund" is in the benchmarks' policies, so a search over every message
    matched almost every trajectory through its system prompt. The page searches the
    conversation; "Search the system prompt too" adds the prompt, and only then are the
    prompt's hits marked (and unfold it)."""
    with store.connect(page_db, read_only=True) as con:
        talk = set(q.list_trajectories(con, q.TrajectoryFilter(text="refund"), limit=10**6).id)
        every = set(q.list_trajectories(con, q.TrajectoryFilter(text="refund", text_system=True),
                                        limit=10**6).id)
    assert talk < every
    at = run(page_db, monkeypatch)
    at.sidebar.text_input(key="f_text").set_value("refund").run()
    assert not at.exception
    assert set(listing(at).id) == talk
    assert int(at.metric[0].value) == len(talk)
    tid = listing(at).id.iloc[0]
    body = next(h.proto.body for h in at.get("html") if "trace-transcript" in h.proto.body)
    prompt = re.search(r'<details class="msg role-system system-prompt"[^>]*>.*?</details>',
                       body, re.S)
    assert prompt and " open" not in prompt.group(0)[:60] and "<mark" not in prompt.group(0)
    assert "<mark" in body  # the conversation's hits
    at.sidebar.checkbox(key="f_text_system").check().run()
    assert not at.exception
    assert set(listing(at).id) == every and int(at.metric[0].value) == len(every)
    at.selectbox(key="trajectory_pick").set_value(tid).run()
    body = next(h.proto.body for h in at.get("html") if "trace-transcript" in h.proto.body)
    prompt = re.search(r'<details class="msg role-system system-prompt"[^>]*>.*?</details>',
                       body, re.S)
    assert prompt.group(0).startswith('<details class="msg role-system system-prompt" open')
    assert "<mark" in prompt.group(0)
