"""The transcript viewer's reading order: folded system prompt, calls paired with their
results, pretty JSON outputs, search hits, plain-word alignments, two transcripts side by
side, any two trials compared, and escaping of all of it."""

from __future__ import annotations

import json
import re

import pytest

from trace_lib import store
from trace_lib.errors import UserInputError
from trace_lib.explore import (
    call_alignment,
    search_highlight,
    transcript_loading,
    transcript_render,
)
from trace_lib.transcript_model import Call, Transcript, pair_results
from trace_lib.workbench import explore

SCRIPT = "<script>window.__xss=1</script>"
IMG = '<img src=x onerror="window.__xss=2">'
POLICY = "You are an airline agent.\n" + "Rule: never rebook without consent.\n" * 60


def msg(idx, role, content, *, name=None, tcid=None, calls=(), is_error=False):
    return {"idx": idx, "role": role, "content": content, "name": name,
            "tool_call_id": tcid, "turn_idx": idx, "tool_calls": list(calls),
            "is_error": is_error}


def transcript(system: str = POLICY, output: str | None = None) -> Transcript:
    """system, user, assistant with two calls (ids), their two results, an unanswered
    call, a stray tool message, a final answer."""
    big = output if output is not None else json.dumps(
        {"user_id": "u1", "reservations": [f"R{i}" for i in range(12)], "note": IMG})
    c1 = Call("get_user", {"user_id": SCRIPT}, message_idx=2, call_id="a")
    c2 = Call("get_order", '{"id": 7}', message_idx=2, call_id="b")
    c3 = Call("cancel", {"id": 7}, message_idx=5)
    messages = [
        msg(0, "system", system),
        msg(1, "user", f"{SCRIPT} please cancel order 7 & refund"),
        msg(2, "assistant", None, calls=[c1, c2]),
        # answers in the other order: ids decide, not positions
        msg(3, "tool", '{"status": "open", "id": 7}', name="get_order", tcid="b"),
        msg(4, "tool", big, name="get_user", tcid="a"),
        msg(5, "assistant", "Cancelling.", calls=[c3]),
        msg(6, "user", "thanks"),
        msg(7, "tool", f"late output {IMG}", name="cancel"),
        msg(8, "assistant", f"Done. {IMG}"),
    ]
    calls = [c1, c2, c3]
    for i, idx in pair_results(messages, calls).items():
        calls[i].result_idx = idx
    return Transcript({"id": "t<1>", "task_id": "7"}, messages, calls)


def no_markup(out: str) -> None:
    assert not re.search(r"<script|<img", out, re.IGNORECASE)


def test_pairing_by_id_then_position_never_across_a_turn():
    t = transcript()
    assert [c.result_idx for c in t.calls] == [4, 3, None]  # #7 follows a user turn
    msgs = [msg(0, "assistant", None), msg(1, "tool", "x"), msg(2, "tool", "y", name="b"),
            msg(3, "tool", "z", name="a")]
    calls = [Call("a", {}, message_idx=0), Call("b", {}, message_idx=0),
             Call("a", {}, message_idx=0)]
    # position within the run of tool messages, a named message only for its own tool
    assert pair_results(msgs, calls) == {0: 1, 1: 2, 2: 3}
    assert pair_results(msgs, []) == {}


def test_system_prompt_is_folded_and_pairs_are_drawn_together():
    out = transcript_render.render_transcript_html(transcript())
    first = re.search(r'<details class="msg role-system system-prompt"([^>]*)>', out)
    assert first and " open" not in first.group(1).split("style")[0]
    assert "system prompt</b> · " in out and "61 lines" in out and "click to show" in out
    assert out.index("system-prompt") < out.index("role-user")
    pairs = re.findall(r'<div class="tool-pair".*?</details></div></div>', out, re.S)
    assert len(pairs) == 2
    assert "get_user" in pairs[0] and 'data-idx="4"' in pairs[0]
    assert "get_order" in pairs[1] and 'data-idx="3"' in pairs[1]
    # each answered tool message once (inside its pair), the stray one on its own
    assert out.count('data-idx="3"') == 1 and out.count('data-idx="4"') == 1
    assert "no tool message answers this call" in out
    assert out.count('class="msg role-tool unpaired"') == 1 and "late output" in out
    assert transcript_render.render_transcript_html(transcript(), system="omit").count("system-prompt") == 0


def test_tool_outputs_are_pretty_json_and_fold_when_long():
    out = transcript_render.render_transcript_html(transcript())
    short = re.search(r'<details class="tool-output" open data-idx="3".*?</details>', out, re.S)
    assert short and "JSON, 4 lines" in short.group(0)
    assert "{\n  &quot;status&quot;: &quot;open&quot;,\n  &quot;id&quot;: 7\n}" in short.group(0)
    long = re.search(r'<details class="tool-output" data-idx="4".*?</details>', out, re.S)
    assert long, "a long output starts folded"
    assert "&quot;reservations&quot;: [\n    &quot;R0&quot;," in long.group(0)
    assert transcript_render.pretty_output("not json {") == ("not json {", False)
    assert transcript_render.pretty_output("[1, 2]") == ("[\n  1,\n  2\n]", True)
    assert transcript_render.pretty_output('"a string"') == ('"a string"', False)
    # call arguments, given as a dict or as a JSON string, are indented too
    assert "{\n  &quot;id&quot;: 7\n}" in out


def test_search_hits_are_marked_numbered_and_unfold_what_hides_them():
    t = transcript()
    # a search that read the system prompt too (the page's "Search the system prompt too")
    out = transcript_render.render_transcript_html(t, query="REBOOK reservations",
                                                   query_system=True)
    hits = re.findall(r'<mark class="trace-hit" id="trace-hit-(\d+)"[^>]*>([^<]*)</mark>', out)
    assert [int(i) for i, _ in hits] == list(range(len(hits)))
    assert {w.lower() for _, w in hits} == {"rebook", "reservations"}
    assert f'data-hits="{len(hits)}"' in out and 'href="#trace-hit-0"' in out
    # the folded parts holding a hit open: the system prompt and the long output
    assert re.search(r'<details class="msg role-system system-prompt" open', out)
    assert re.search(r'<details class="tool-output" open data-idx="4"', out)
    assert search_highlight.count_hits(t, "rebook", system=True) == 60
    # by default the search reads the conversation: the prompt's hits are neither marked
    # nor counted, and it stays folded (the first hit is in the conversation)
    talk = transcript_render.render_transcript_html(t, query="REBOOK reservations")
    hits = re.findall(r'<mark class="trace-hit" id="trace-hit-(\d+)"[^>]*>([^<]*)</mark>', talk)
    assert {w.lower() for _, w in hits} == {"reservations"}
    assert re.search(r'<details class="msg role-system system-prompt" style', talk)
    assert search_highlight.count_hits(t, "rebook") == 0
    none = transcript_render.render_transcript_html(t, query="zzz")
    assert "no match for the search" in none and "<mark" not in none

def test_hits_follow_the_search_modes():
    # words (the index's reading): a word starts a token, a phrase is tokens in a row
    marked = re.compile(r"<mark[^>]*>([^<]*)</mark>")
    assert marked.findall(search_highlight.highlight_html("preserve the Reservation", "reserv")) == [
        "Reserv"]
    assert marked.findall(search_highlight.highlight_html("cancel  order, cancel orders", '"cancel order"')
                          ) == ["cancel  order"]
    assert marked.findall(search_highlight.highlight_html("user_id=u1", "user_id")) == ["user_id"]
    assert search_highlight.highlight_html("a & b", "&") == "a &amp; b"  # no token: nothing to mark
    # substring: the query as typed, anywhere, case-insensitive
    assert marked.findall(search_highlight.highlight_html("ref xZFA04Y", "zfa0", "substring")) == ["ZFA0"]
    assert search_highlight.query_pattern("  ") is None and search_highlight.query_pattern(None, "substring") is None


def test_highlighting_escapes_and_never_splits_entities():
    assert search_highlight.highlight_html("a & b", "amp") == "a &amp; b"
    assert search_highlight.highlight_html("a & b", "&", "substring") == (
        'a <mark class="trace-hit" id="trace-hit-0" style="background:#fde047;padding:0 1px;'
        'border-radius:2px">&amp;</mark> b')
    out = search_highlight.highlight_html(f"x {SCRIPT} y", "script")
    no_markup(out)
    assert out.count("<mark") == 2 and "&lt;<mark" in out
    hostile = search_highlight.highlight_html("text", '<img src=x onerror="1">')
    no_markup(hostile)
    out = transcript_render.render_transcript_html(transcript(), query=f'{IMG} "{SCRIPT}"')
    no_markup(out)
    assert "&lt;script&gt;window.__xss=1&lt;/script&gt;" in re.sub(r"<mark[^>]*>|</mark>", "",
                                                                    out)
    script = transcript_render.jump_to_first_hit_script("t<1>", SCRIPT)
    assert script.count("<script") == 1 and "xss" not in script and "t<1>" not in script
    assert script != transcript_render.jump_to_first_hit_script("t<2>", SCRIPT)


def test_every_piece_of_trajectory_text_is_escaped():
    t = transcript(system=f"{SCRIPT} policy {IMG}")
    t.calls[0].error = IMG
    t.trajectory["id"] = '"><img src=x onerror=1>'
    for out in (transcript_render.render_transcript_html(t), transcript_render.render_transcript_html(t, query="x"),
                transcript_render.render_side_by_side_html(t, transcript(), SCRIPT, IMG, query="img"),
                transcript_render.render_alignment_html(call_alignment.align_calls(t.calls, t.calls[:1]), SCRIPT, IMG,
                                         names=(SCRIPT, IMG))):
        no_markup(out)
    assert "&lt;img src=x onerror=&quot;window.__xss=2&quot;&gt;" in transcript_render.render_transcript_html(t)


def test_alignment_says_missed_and_extra_in_plain_words():
    exp = [Call("get_user", {"id": 1}), Call("book", {"f": 1})]
    got = [Call("get_user", {"id": 1}), Call("search", {})]
    out = transcript_render.render_alignment_html(call_alignment.align_calls(exp, got), "expected", "agent",
                                   against_expected=True)
    assert "as expected" in out and "missed: expected, never made" in out
    assert "extra: made, not expected" in out
    assert "only left" not in out and "only right" not in out
    two = transcript_render.render_alignment_html(call_alignment.align_calls(exp, got), "passed trial 0 (a)",
                                   "failed trial 1 (b)",
                                   names=("passed trial 0", "failed trial 1"))
    assert "missed by failed trial 1 (only passed trial 0 made it)" in two
    assert "extra in failed trial 1 (passed trial 0 never made it)" in two
    assert call_alignment.status_words("only left (user)", against_expected=True) == (
        "missed: expected, never made — the user's action")
    assert call_alignment.status_words("args differ", "A", "B") == "same tool, other arguments"
    assert call_alignment.status_words("args differ", against_expected=True) == "right tool, other arguments"


def test_side_by_side_shows_a_shared_system_prompt_once():
    a, b = transcript(), transcript()
    out = transcript_render.render_side_by_side_html(a, b, "A", "B")
    assert out.count("system-prompt") == 1 and "the same in both" in out
    assert out.count('class="trace-transcript"') == 2
    assert out.count("Rule: never rebook") == 60  # once, not once per column
    differ = transcript_render.render_side_by_side_html(a, transcript(system="other policy"), "A", "B")
    assert differ.count("system-prompt") == 2 and "system prompts differ" in differ
    hits = transcript_render.render_side_by_side_html(a, b, "A", "B", query="thanks")
    assert 'id="trace-hit-a-0"' in hits and 'id="trace-hit-b-0"' in hits


def test_any_two_trials_and_a_task_run_once(known_db):
    trials = explore.trials(known_db, "t_f1")
    assert trials.id.tolist() == ["t_ok1", "t_f1", "t_f2", "t_f3"]
    assert trials.outcome.tolist() == ["passed", "failed", "failed", "failed"]
    assert explore.trials(known_db, "t_f4").id.tolist() == ["t_f4"]  # one trial
    # two failed trials of a task, and two trajectories of different tasks and datasets
    both_failed = explore.compare(known_db, "t_f1", "t_f2")
    assert (both_failed.left.id, both_failed.right.id) == ("t_f1", "t_f2")
    assert [r.status for r in both_failed.alignment] == ["only right", "same", "only left"]
    across = explore.compare(known_db, "t_f4", "t_ok1")
    assert [r.status for r in across.alignment][-2:] == ["only right", "only right"]
    default = explore.compare(known_db, "t_f2")
    assert (default.passed.id, default.failed.id) == ("t_ok1", "t_f2")
    with pytest.raises(UserInputError, match="another trajectory"):
        explore.compare(known_db, "t_f4")
    with pytest.raises(UserInputError, match="itself"):
        explore.compare(known_db, "t_f1", "t_f1")
    with pytest.raises(UserInputError, match="nope"):
        explore.compare(known_db, "t_f1", "nope")


def test_loaded_transcripts_pair_calls_with_results(known_db, real_db):
    with store.connect(known_db, read_only=True) as con:
        t = transcript_loading.load_transcript(con, "t_f2")
    assert [(c.result_idx, c.result) for c in t.calls] == [
        (3, "Error: User u9 not found"), (5, '{"ok": true}')]
    with store.connect(real_db, read_only=True) as con:
        tid = con.execute("SELECT id FROM trajectories WHERE task_id = 'xss'").fetchone()[0]
        x = transcript_loading.load_transcript(con, tid)
    assert x.calls[0].result_idx == 3
    out = transcript_render.render_transcript_html(x)
    no_markup(out)
    assert out.count("tool-pair") == 1 and "tool-error" in out


def test_cli_compares_any_two(known_db, capsys):
    from trace_lib.cli import main

    capsys.readouterr()
    assert main(["explore", "compare", "t_f4", "--with", "t_ok1", "--db", str(known_db),
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["left"], out["right"]) == ("t_f4", "t_ok1") and "passed" not in out
    assert [r["status"] for r in out["alignment"]] == ["only left", "only right", "only right"]
    assert main(["explore", "compare", "t_f2", "--db", str(known_db), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["passed"], out["failed"]) == (out["left"], out["right"]) == ("t_ok1", "t_f2")


def test_labelers_and_viewer_pair_calls_alike(known_db, real_db):
    from trace_lib.trajectories import load_transcripts

    for db in (known_db, real_db):
        with store.connect(db, read_only=True) as con:
            ids = [r[0] for r in con.execute(
                "SELECT id FROM trajectories ORDER BY id LIMIT 40").fetchall()]
            viewer = [transcript_loading.load_transcript(con, i) for i in ids]
            labeler = load_transcripts(con, ids)
        for v, lab in zip(viewer, labeler, strict=True):
            assert [(c.name, c.result_idx, c.result) for c in v.calls] == [
                (c.name, c.result_idx, c.result) for c in lab.calls]
        assert any(c.result_idx is not None for t in viewer for c in t.calls)


def test_each_turn_shows_what_was_measured_and_nothing_else():
    """Issue 34: tokens, cost and latency per message where the source measured them (tau2,
    Inspect), their sum above the transcript; no "0 tokens" for what nobody measured."""
    t = transcript()
    t.messages[2]["meta"] = {"input_tokens": 3346, "output_tokens": 57, "cost": 0.00234,
                             "latency_s": 0.93}
    t.messages[5]["meta"] = {"input_tokens": 4000, "output_tokens": 3}
    out = transcript_render.render_transcript_html(t)
    usage = re.findall(r'<span class="trace-usage"[^>]*>([^<]*)</span>', out)
    assert usage == ["· 3,346 → 57 tokens · $0.0023 · 0.9 s", "· 4,000 → 3 tokens"]
    total = re.search(r'<div class="trace-usage-total"[^>]*>([^<]*)</div>', out).group(1)
    assert total == "2 measured messages · 7,346 → 60 tokens · $0.0023 · 0.9 s"
    assert transcript_render.usage_text(None) == "" and transcript_render.usage_text({}) == ""
    assert transcript_render.usage_text({"output_tokens": 5}) == "? → 5 tokens"
    bare = transcript_render.render_transcript_html(transcript())
    assert "trace-usage" not in bare  # nothing measured: nothing shown
    text = transcript_render.transcript_text(t)
    assert "[2] assistant (3,346 → 57 tokens · $0.0023 · 0.9 s)" in text


def test_evidence_is_noted_above_its_message_escaped_and_scrolled_to():
    """The Labels page's view: notes above the message they point at (above the call box
    for a tool message drawn with its call), escaped; the scroll script holds no text."""
    t = transcript()
    out = transcript_render.render_transcript_html(
        t, evidence={1: [f"run (lacking): {SCRIPT}"], 4: ["run (lacking): bad lookup"]})
    no_markup(out)
    assert out.count('class="evidence-note"') == 2
    assert re.search(r'class="msg role-user trace-evidence" data-idx="1"', out)
    # message 4 is get_user's answer, drawn inside message 2's call box: noted above it
    assert re.search(r'class="msg role-assistant trace-evidence" data-idx="2"', out)
    assert out.index("bad lookup") < out.index('data-idx="2"')
    assert "&lt;script&gt;" in out
    # the system prompt stays folded; evidence in it unfolds it
    assert re.search(r'<details class="msg role-system system-prompt" style', out)
    into = transcript_render.render_transcript_html(t, evidence={0: ["run (na): policy"]})
    assert '<details class="msg role-system system-prompt trace-evidence" open' in into
    box = transcript_render.scroll_box_html(out, 500)
    assert box.startswith('<div class="trace-scroll" style="max-height:500px;overflow-y:auto">')
    script = transcript_render.scroll_box_to_evidence_script("t<1>", SCRIPT)
    code = script.removeprefix("<script>").removesuffix("</script>")
    assert "<" not in code and "t<1>" not in script and "xss" not in script
    assert script != transcript_render.scroll_box_to_evidence_script("t<1>", "other")
