"""Capability catalog: built-in menu, user add/accept/reject, LLM proposals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from synthetic import make_store
from wire_server import WireServer, anthropic_tool_reply

from trace_lib import store
from trace_lib.diagnose import capability_curation as caps
from trace_lib.errors import UserInputError
from trace_lib.llm import get_provider


def test_builtin_menu_has_core_and_distractors(db_path: Path) -> None:
    listed = {c.name: c for c in caps.list_capabilities(db_path)}
    assert len(listed) == 14
    assert set(caps.CORE) <= set(listed) and "adversarial_policy_compliance" in listed
    assert {"tone_empathy", "language_fluency", "format_compliance", "hallucinated_tools",
            "upselling"} == set(caps.DISTRACTORS)
    assert all(c.source == "builtin" and c.applies_when for c in listed.values())


def test_builtin_menu_survives_concurrent_first_writers(tmp_path: Path) -> None:
    """Two sessions' first page renders insert the menu at once (the journey hit a
    duplicate key here): every writer returns, and the menu is there exactly once."""
    import threading

    for k in range(4):
        db = tmp_path / f"race{k}.duckdb"
        with store.connect(db):
            pass  # schema only, no menu yet
        errors: list[BaseException] = []
        start = threading.Barrier(4)

        def first_render(db: Path = db, start: threading.Barrier = start,
                         errors: list[BaseException] = errors) -> None:
            try:
                with store.connect(db) as con:
                    start.wait()
                    caps.ensure_builtin(con)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=first_render) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        with store.connect(db, read_only=True) as con:
            assert con.execute("SELECT count(*), count(DISTINCT name) FROM capabilities "
                               "WHERE source = 'builtin'").fetchone() == (14, 14)


def test_add_accept_reject_edit(db_path: Path) -> None:
    c = caps.add_capability(db_path, "refund_math", "Computes refunds from fare rules.",
                            status="proposed")
    assert (c.source, c.status) == ("user", "proposed")
    assert caps.set_status(db_path, "refund_math", "accepted").status == "accepted"
    assert caps.set_status(db_path, "refund_math", "rejected").status == "rejected"
    assert caps.update_capability(db_path, "refund_math", description="New text here."
                                  ).description == "New text here."
    with pytest.raises(UserInputError, match="snake_case"):
        caps.add_capability(db_path, "Bad Name", "x")
    with pytest.raises(UserInputError, match="already exists"):
        caps.add_capability(db_path, "refund_math", "again")
    with pytest.raises(UserInputError, match="unknown capability 'nope'"):
        caps.set_status(db_path, "nope", "accepted")


def test_proposal_from_contrastive_pairs_lands_as_proposed(db_path: Path) -> None:
    make_store(db_path, {"f1": False, "p1": True, "f2": False, "p2": True}, {})
    with store.connect(db_path) as con:
        for tid in ("f1", "p1", "f2", "p2"):
            con.execute("INSERT INTO messages (trajectory_id, idx, role, content) VALUES "
                        "(?, 0, 'user', 'please cancel'), (?, 1, 'assistant', 'done')", [tid, tid])
        pairs = caps.contrastive_pairs(con)
    # f1 and p2 share task0; f2 (task2) has no passing trial, so the similar p1 stands in.
    assert {(p.failed_id, p.passed_id, p.same_task) for p in pairs} == {
        ("f1", "p2", True), ("f2", "p1", False)}
    answer = {"capabilities": [
        {"name": "refund_policy_lookup", "description": "Looks up the refund rules before "
         "promising money back to the customer.", "example_task_ids": ["task0"]},
        {"name": "tool_calling_precision", "description": "Already exists so must be skipped "
         "by the catalog.", "example_task_ids": []},
    ]}
    with WireServer(lambda p, b, n: anthropic_tool_reply("propose", answer)) as srv:
        provider = get_provider("anthropic", api_key="k", base_url=srv.url)
        added = caps.propose_capabilities(db_path, provider)
    assert [c.name for c in added] == ["refund_policy_lookup"]
    assert (added[0].source, added[0].status, added[0].examples) == ("llm", "proposed", ["task0"])
    body = srv.requests[0][1]
    assert "FAILED trajectory" in body["messages"][0]["content"]
    assert body["tools"][0]["input_schema"]["properties"]["capabilities"]["maxItems"] == 10
    assert json.dumps(body).count("please cancel") >= 2
