"""Transcript loading, safe HTML, and tool-call alignment."""

from __future__ import annotations

import re

import pytest

from trace_lib import store
from trace_lib.errors import UserInputError
from trace_lib.explore import (
    call_alignment,
    transcript_loading,
    transcript_render,
    untrusted_text,
)
from trace_lib.transcript_model import Call


def keys(rows):
    return [(r.status, r.left and r.left.name, r.right and r.right.name) for r in rows]


def test_align_equal_inserted_deleted_and_changed_calls():
    a = [Call("get", {"id": 1}), Call("book", {"f": "x", "n": 1}), Call("pay", {})]
    b = [Call("get", {"id": 1}), Call("search", {}), Call("book", {"n": 2, "f": "x"})]
    assert keys(call_alignment.align_calls(a, b)) == [
        ("same", "get", "get"),
        ("only right", None, "search"),
        ("args differ", "book", "book"),
        ("only left", "pay", None),
    ]
    # key order and JSON-string arguments do not make equal calls differ
    assert keys(call_alignment.align_calls([Call("f", {"a": 1, "b": 2})], [Call("f", '{"b": 2, "a": 1}')])) \
        == [("same", "f", "f")]
    assert call_alignment.align_calls([], []) == []
    assert keys(call_alignment.align_calls([], [Call("x")])) == [("only right", None, "x")]


def test_alignment_uses_every_call_once_in_order():
    a = [Call(n, {"i": i}) for i, n in enumerate("abcabcdd")]
    b = [Call(n, {"i": i}) for i, n in enumerate("bcaddxab")]
    rows = call_alignment.align_calls(a, b)
    assert [r.left for r in rows if r.left] == a
    assert [r.right for r in rows if r.right] == b


def test_load_render_and_escape(known_db):
    with store.connect(known_db, read_only=True) as con:
        t = transcript_loading.load_transcript(con, "t_f4")
        with pytest.raises(UserInputError, match="nope"):
            transcript_loading.load_transcript(con, "nope")
    assert t.id == "t_f4" and len(t.messages) == 5
    assert [c.name for c in t.agent_calls()] == ["search"]
    assert t.agent_calls()[0].error.startswith("Error: Reservation")
    html = transcript_render.render_transcript_html(t)
    assert "<script" not in html and "&lt;script&gt;window.__xss=1&lt;/script&gt;" in html
    # the error is the answering tool message, shown once inside the call's box
    assert html.count("Error: Reservation ZFA04Y not found") == 1
    assert re.search(r'class="tool-pair".*tool-error.*Error: Reservation ZFA04Y', html, re.S)


def test_contrast_pair_and_expected_vs_actual(known_db):
    with store.connect(known_db, read_only=True) as con:
        assert transcript_loading.contrast_pair(con, "t_f2") == ("t_ok1", "t_f2")
        assert transcript_loading.contrast_pair(con, "t_ok1") == ("t_ok1", "t_f1")
        assert transcript_loading.contrast_pair(con, "t_f4") is None  # no passed trial of task 2
        f1 = transcript_loading.load_transcript(con, "t_f1")
    assert keys(call_alignment.expected_vs_actual(f1)) == [
        ("same", "get_user", "get_user"), ("args differ", "book", "book")]
    frame = call_alignment.alignment_frame(call_alignment.expected_vs_actual(f1), "expected", "agent")
    assert list(frame.columns) == ["status", "expected", "agent"]
    assert frame.agent.iloc[1] == 'book({"flight":"f1","n":2})'


HOSTILE = ['<script>window.__xss=1</script>', '<img src=x onerror="window.__xss=2">']


def test_real_hostile_trajectory_renders_as_text(real_db):
    with store.connect(real_db, read_only=True) as con:
        tid = con.execute("SELECT id FROM trajectories WHERE task_id = 'xss'").fetchone()[0]
        t = transcript_loading.load_transcript(con, tid)
    html = transcript_render.render_transcript_html(t)
    table = transcript_render.render_alignment_html(call_alignment.align_calls(t.agent_calls(), t.agent_calls()),
                                     HOSTILE[0], HOSTILE[1])
    for out in (html, table):
        assert not re.search(r"<script|<img", out)
        assert "&lt;img src=x onerror=&quot;window.__xss=2&quot;&gt;" in out
    assert any(m["is_error"] for m in t.messages)  # the tool's error message is flagged


def test_real_pair_alignment_covers_both_trials(real_db):
    with store.connect(real_db, read_only=True) as con:
        row = con.execute(
            "SELECT any_value(id) FILTER (WHERE NOT success) FROM trajectories "
            "WHERE task_id IS NOT NULL GROUP BY dataset_id, task_id "
            "HAVING bool_or(success) AND bool_or(NOT success) LIMIT 1").fetchone()
        passed_id, failed_id = transcript_loading.contrast_pair(con, row[0])
        assert failed_id == row[0]
        p, f = transcript_loading.load_transcript(con, passed_id), transcript_loading.load_transcript(con, failed_id)
    assert p.trajectory["success"] and not f.trajectory["success"]
    rows = call_alignment.align_calls(p.agent_calls(), f.agent_calls())
    assert [r.left for r in rows if r.left] == p.agent_calls()
    assert [r.right for r in rows if r.right] == f.agent_calls()
    for r in rows:
        if r.status == "same":
            assert r.left.key == r.right.key
        if r.status == "args differ":
            assert r.left.name == r.right.name and r.left.key != r.right.key


def test_markdown_literal_escapes_links_images_and_math():
    out = untrusted_text.markdown_literal('see [x](http://e) ![i](u) <b> $x$ *a*_b_')
    for raw in ("[x]", "](", "![", "<b>", "$x$", "*a*"):
        assert raw not in out
    assert re.sub(r"\\(.)", r"\1", out) == 'see [x](http://e) ![i](u) <b> $x$ *a*_b_'
    assert untrusted_text.markdown_literal(None) == ""
