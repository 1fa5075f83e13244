"""Labels page (Streamlit AppTest) on a real labeled demo store: grid, evidence, review
queue decision, undo, capabilities, and the ranking moving after an edit."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from trace_lib import store
from trace_lib.diagnose import labels as lb
from trace_lib.diagnose.labeling import run_labeling
from trace_lib.diagnose.ranking import rank

PAGE = str(Path(__file__).resolve().parents[2] / "pages" / "2_Labels.py")


@pytest.fixture(scope="module")
def labeled_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trace_lib.demo import build_demo

    root = tmp_path_factory.mktemp("labels_page")
    db = root / "demo.duckdb"
    build_demo(root / "files", n=24, seed=0, db=db)
    run_labeling(db, "heuristic", run_prefix="h")
    # A second, disagreeing run so the review queue has work: flip one lacking label.
    with store.connect(db) as con:
        con.execute("INSERT INTO label_runs (id, labeler) VALUES ('h2', 'test')")
        con.execute("""INSERT INTO labels (run_id, trajectory_id, capability, value)
                       SELECT 'h2', trajectory_id, capability,
                              CASE WHEN value = 'lacking' THEN 'present' ELSE value END
                       FROM labels WHERE run_id = 'h'""")
    return db


@pytest.fixture
def labeled(labeled_template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    db = tmp_path / "t.duckdb"
    shutil.copy(labeled_template, db)
    monkeypatch.setenv("TRACE_DB", str(db))
    monkeypatch.setenv("USER", "tester")
    return db


def test_grid_and_transcript_with_evidence(labeled: Path) -> None:
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    assert not at.exception
    grid = at.dataframe[0].value  # the st.data_editor grid
    assert {"trajectory_id", "tool_calling_precision", "precondition_verification"} <= set(
        grid.columns)
    assert set(grid["tool_calling_precision"].dropna()) <= {"present", "lacking", "na"}
    # Pick a failed trajectory whose capability is lacking: its evidence is highlighted.
    g = lb.label_grid(labeled, lb.LabelFilter(capabilities=["tool_calling_precision"],
                                              value="lacking"))
    tid = g["trajectory_id"].iloc[0]
    at.selectbox(key="t_pick").set_value(tid)
    at.selectbox(key="t_cap").set_value("tool_calling_precision").run()
    assert not at.exception
    # The viewer's transcript (issue 34): the evidence above its message, the system
    # prompt folded, and the box opened at the evidence by a script.
    body = next(h.proto.body for h in at.get("html") if "trace-transcript" in h.proto.body)
    view = lb.evidence(labeled, tid, "tool_calling_precision")
    first = min(i["message_idx"] for e in view for i in e["evidence"]
                if isinstance(i.get("message_idx"), int))
    assert 'class="trace-scroll"' in body and "h (lacking):" in body
    assert "trace-evidence" in body
    assert body.index("👉 Evidence") > body.index("system-prompt")
    assert re.search(r'<details class="msg role-system system-prompt" style', body)
    assert any("trace-evidence" in h.proto.body and "<script>" in h.proto.body
               for h in at.get("html"))
    assert any(f"evidence at message {first}" in t.value for t in at.text)


def _open_tab(at: AppTest, label: str) -> AppTest:
    """Open one of the page's lazy tabs (only the open tab's body runs)."""
    at.session_state["labels_tab"] = label
    return at.run()


def test_closed_tabs_do_no_work(labeled: Path) -> None:
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    keys = {w.key for w in at.selectbox}
    assert "t_pick" in keys and not keys & {"q_pick", "undo_pick", "cap_pick"}
    at.selectbox(key="f_outcome").set_value("failed").run()
    _open_tab(at, "Capabilities")
    keys = {w.key for w in at.selectbox}
    assert "cap_pick" in keys and "t_pick" not in keys
    _open_tab(at, "Grid")  # the grid's filters survive a visit to another tab
    assert at.selectbox(key="f_outcome").value == "failed"


def test_review_queue_decision_moves_ranking_and_undo(labeled: Path) -> None:
    before = {r.capability: r for r in rank(labeled).rows}
    at = _open_tab(AppTest.from_file(PAGE, default_timeout=60), "Review queue")
    pick = at.selectbox(key="q_pick")
    tid, cap = pick.value.split(" · ")
    current = {r.capability: r for r in rank(labeled).rows}[cap]
    at.selectbox(key="q_value").set_value("na")
    at.text_input(key="q_note").set_value("checked by hand")
    at.button(key="q_go").click().run()
    assert not at.exception
    hist = lb.edit_history(labeled)
    assert (hist["editor"].iloc[0], hist["note"].iloc[0], hist["new"].iloc[0]) == (
        "tester", "checked by hand", "na")
    after = {r.capability: r for r in rank(labeled).rows}[cap]
    assert after.pooled != current.pooled  # the ranking moved at once
    # Undo from the History tab restores the figures.
    _open_tab(at, "History")
    # the picker names each edit (issue 34: it showed a bare id)
    undo = at.selectbox(key="undo_pick")
    assert undo.options[0] == (f"#{hist['id'].iloc[0]} · {tid} · {cap}: "
                               f"{hist['old'].iloc[0] or '(labeler)'} → na · tester, "
                               f"{hist['edited_at'].iloc[0]:%Y-%m-%d %H:%M}")
    undo.set_value(int(hist["id"].iloc[0]))
    at.button(key="undo_go").click().run()
    assert not at.exception
    restored = {r.capability: r for r in rank(labeled).rows}[cap]
    assert restored.pooled == before[cap].pooled


def test_capability_accept_reject_and_add(labeled: Path) -> None:
    at = _open_tab(AppTest.from_file(PAGE, default_timeout=60), "Capabilities")
    at.selectbox(key="cap_pick").set_value("upselling")
    at.button(key="cap_reject").click().run()
    assert not at.exception
    from trace_lib.diagnose.capability_curation import list_capabilities

    assert {c.name: c.status for c in list_capabilities(labeled)}["upselling"] == "rejected"
    at.selectbox(key="cap_pick").set_value("tone_empathy").run()
    at.text_area(key="edit_cap_desc_tone_empathy").set_value("Warm and professional tone.")
    at.button(key="FormSubmitter:edit_cap-Save description").click().run()
    assert not at.exception
    assert {c.name: c.description for c in list_capabilities(labeled)}["tone_empathy"] == \
        "Warm and professional tone."
    at.text_input(key="new_cap_name").set_value("refund_math")
    at.text_area(key="new_cap_desc").set_value("Computes refunds from the fare rules.")
    at.button(key="FormSubmitter:add_cap-Add").click().run()
    names = {c.name for c in list_capabilities(labeled)}
    assert "refund_math" in names


def test_bulk_edit_of_filtered_selection(labeled: Path) -> None:
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    at.multiselect(key="f_caps").set_value(["upselling"])
    at.selectbox(key="f_outcome").set_value("passed").run()
    at.selectbox(key="bulk_value").set_value("present")
    at.text_input(key="bulk_note").set_value("distractor never applies")
    at.button(key="bulk_go").click().run()
    assert not at.exception
    with store.connect(labeled) as con:
        n_passed = con.execute("SELECT count(*) FROM trajectories WHERE success").fetchone()[0]
        edits = con.execute("SELECT count(*), min(new), max(new) FROM label_edits "
                            "WHERE capability = 'upselling'").fetchone()
    assert edits == (n_passed, "present", "present")


def test_grid_shows_cut_and_unsupported_labels(labeled: Path) -> None:
    """An LLM run's rows say what its prompt cut and which labels are unsupported: the grid
    shows both, read-only, after the capabilities; the evidence view says it per run."""
    with store.connect(labeled) as con:
        tid = con.execute("SELECT min(trajectory_id) FROM labels").fetchone()[0]
        con.execute("INSERT INTO label_runs (id, labeler) VALUES ('llm', 'openai')")
        con.execute("""INSERT INTO labels (run_id, trajectory_id, capability, value, evidence,
                                           cut_messages, cut_tokens, evidence_dropped,
                                           unsupported)
                       VALUES ('llm', ?, 'tool_calling_precision', 'lacking', '[]', 12, 3456,
                               2, true)""", [tid])
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    assert not at.exception
    grid = at.dataframe[0].value
    caps = [c for c in grid.columns if c not in {"trajectory_id", "task_id", "domain",
                                                  "success"}]
    assert caps[-3:] == ["cut_messages", "cut_tokens", "unsupported"]  # after the labels
    row = grid.set_index("trajectory_id").loc[tid]
    assert (row["cut_messages"], row["cut_tokens"]) == (12, 3456)
    assert row["unsupported"] == "tool_calling_precision"
    at.selectbox(key="t_pick").set_value(tid)
    at.selectbox(key="t_cap").set_value("tool_calling_precision").run()
    assert not at.exception
    shown = [t.value for t in at.text]
    assert any(s.startswith("❔ llm (lacking): unsupported") for s in shown)
    assert any("llm: the prompt left out 12 messages, 3456 tokens" in s for s in shown)
    # The openai labeler's sidebar takes a context size for servers that report none.
    at.selectbox(key="labeler").set_value("openai").run()
    assert at.number_input(key="max_context").value == 0


def test_agreement_table_reads_n_a_not_none(labeled: Path) -> None:
    """An undefined kappa reads "n/a", as the caption above the table says (issue 34: the
    grid drew a missing number as "None")."""
    at = _open_tab(AppTest.from_file(PAGE, default_timeout=60), "Review queue")
    assert not at.exception
    fleiss = next(d.value for d in at.dataframe if "Fleiss κ" in d.value.columns)
    assert len(fleiss) and not fleiss.isna().any().any()
    assert all(v == "n/a" or re.fullmatch(r"-?\d\.\d{3}", v) for v in fleiss["Fleiss κ"])
