"""The tool-call convention: template rendering, parsing, round trips, malformed output."""

from __future__ import annotations

import json

import pytest

from trace_lib.errors import UserInputError
from trace_lib.runtime.chat_format import (
    CHAT_TEMPLATE,
    IM_END,
    format_assistant,
    normalize_messages,
    parse_assistant,
    render_prompt,
)
from trace_lib.runtime.tokenizer_tiny import save_tiny_tokenizer

TOOLS = [
    {"type": "function", "function": {
        "name": "get_user_details", "description": "Look a user up.",
        "parameters": {"type": "object", "properties": {"user_id": {"type": "string"}},
                       "required": ["user_id"]}}},
    {"type": "function", "function": {
        "name": "cancel_reservation", "description": "Cancel a reservation.",
        "parameters": {"type": "object",
                       "properties": {"reservation_id": {"type": "string"}}}}},
]

CONVERSATION = [
    {"role": "system", "content": "You are an airline agent."},
    {"role": "user", "content": "Cancel reservation ABC for user u1 <b>now</b>."},
    {"role": "assistant", "content": "Let me look.", "tool_calls": [
        {"id": "c1", "type": "function",
         "function": {"name": "get_user_details", "arguments": '{"user_id": "u1"}'}},
        {"id": "c2", "type": "function",
         "function": {"name": "cancel_reservation", "arguments": {"reservation_id": "ABC"}}}]},
    {"role": "tool", "tool_call_id": "c1", "content": '{"name": "Ann"}'},
    {"role": "tool", "tool_call_id": "c2", "content": "Error: not allowed"},
    {"role": "assistant", "content": "It cannot be cancelled."},
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return save_tiny_tokenizer(tmp_path_factory.mktemp("tok"))


def test_render_matches_tokenizer_chat_template(tokenizer):
    ours = render_prompt(CONVERSATION, TOOLS, add_generation_prompt=True)
    theirs = tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False,
                                           add_generation_prompt=True)
    assert ours == theirs
    assert tokenizer.chat_template == CHAT_TEMPLATE
    # Tools are listed one JSON object per line inside <tools>, in the system turn.
    tools_block = ours.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    assert [json.loads(line) for line in tools_block.splitlines()] == TOOLS
    assert ours.startswith("<|im_start|>system\nYou are an airline agent.\n\n# Tools")
    # Both tool results go in ONE user turn, in order.
    assert ('<|im_start|>user\n<tool_response>\n{"name": "Ann"}\n</tool_response>\n'
            '<tool_response>\nError: not allowed\n</tool_response><|im_end|>\n') in ours
    assert ours.endswith("<|im_start|>assistant\n")


def test_render_without_tools_or_system():
    text = render_prompt([{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    text = render_prompt([{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}],
                         add_generation_prompt=False)
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"


@pytest.mark.parametrize("content,calls", [
    (None, [("get_user_details", {"user_id": "u1"})]),
    ("Checking.", [("get_user_details", {"user_id": "u1"})]),
    ("Two calls:", [("get_user_details", {"user_id": "u1"}),
                    ("cancel_reservation", {"reservation_id": "ABC", "why": "ünïcode \"q\""})]),
    ("No calls at all.", []),
])
def test_generation_round_trips_through_parser_and_template(content, calls):
    tool_calls = [{"function": {"name": n, "arguments": a}} for n, a in calls]
    generated = format_assistant(content, tool_calls)
    parsed = parse_assistant(generated + IM_END)
    assert parsed.content == (content if content or not calls else None)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in parsed.tool_calls] == calls
    assert all(c["id"].startswith("call_") and c["type"] == "function"
               for c in parsed.tool_calls)
    assert len({c["id"] for c in parsed.tool_calls}) == len(calls)
    # Rendering the parsed message reproduces exactly what was generated.
    prefix = render_prompt([{"role": "user", "content": "q"}])
    full = render_prompt([{"role": "user", "content": "q"}, parsed.to_message()],
                         add_generation_prompt=False)
    assert full == prefix + generated + IM_END + "\n"


@pytest.mark.parametrize("text", [
    "<tool_call>\n{not json}\n</tool_call>",
    '<tool_call>\n{"arguments": {}}\n</tool_call>',
    '<tool_call>\n{"name": "", "arguments": {}}\n</tool_call>',
    '<tool_call>\n{"name": "f", "arguments": [1, 2]}\n</tool_call>',
    '<tool_call>\n{"name": "f", "arguments": "{broken"}\n</tool_call>',
    '<tool_call>\n["name", "f"]\n</tool_call>',
    '<tool_call>\n{"name": "f", "arguments": {}}',  # cut off by max_tokens
    "<tool_call>" + "[" * 5000 + "</tool_call>",  # deeply nested garbage
    "</tool_call> stray close",
])
def test_malformed_calls_stay_plain_content(text):
    parsed = parse_assistant(text)
    assert parsed.tool_calls == []
    assert parsed.content == text


def test_good_calls_survive_next_to_malformed_ones():
    text = ('<tool_call>\n{oops}\n</tool_call>\n'
            '<tool_call>\n{"name": "f", "arguments": "{\\"a\\": 1}"}\n</tool_call>')
    parsed = parse_assistant(text)
    assert [c["function"]["name"] for c in parsed.tool_calls] == ["f"]
    assert json.loads(parsed.tool_calls[0]["function"]["arguments"]) == {"a": 1}
    assert parsed.content == "<tool_call>\n{oops}\n</tool_call>"
    assert parsed.malformed_calls == 1
    missing_args = parse_assistant('<tool_call>{"name": "g"}</tool_call>')
    assert json.loads(missing_args.tool_calls[0]["function"]["arguments"]) == {}


def test_text_after_stop_token_is_dropped_and_parsing_can_be_off():
    parsed = parse_assistant("Hello<|im_end|>garbage after stop")
    assert parsed.content == "Hello" and parsed.raw_text.endswith("after stop")
    call = format_assistant(None, [{"function": {"name": "f", "arguments": {}}}])
    off = parse_assistant(call, parse_tools=False)
    assert off.content == call and off.tool_calls == []


def test_assistant_mask_covers_only_sampled_tokens(tokenizer):
    out = tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=True,
                                        return_dict=True, return_assistant_tokens_mask=True)
    ids, mask = out["input_ids"], out["assistant_masks"]
    masked_text = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    first = format_assistant("Let me look.", CONVERSATION[2]["tool_calls"])
    assert masked_text == first + IM_END + "It cannot be cancelled." + IM_END
    unmasked = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if not m])
    assert "Error: not allowed" in unmasked and "airline agent" in unmasked


@pytest.mark.parametrize("messages,field", [
    ([], "messages"),
    ([{"role": "robot", "content": "x"}], "messages[0].role"),
    ([{"role": "user", "content": [{"type": "image_url"}]}], "messages[0].content[0]"),
    ([{"role": "user", "content": 5}], "messages[0].content"),
    ([{"role": "assistant", "content": None, "tool_calls": [{"function": {"arguments": {}}}]}],
     "messages[0].tool_calls[0].function.name"),
])
def test_bad_messages_name_the_field(messages, field):
    with pytest.raises(UserInputError, match=field.replace("[", r"\[").replace("]", r"\]")):
        normalize_messages(messages)


def test_text_parts_are_joined():
    msgs = normalize_messages([{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    assert msgs[0]["content"] == "ab"


@pytest.mark.parametrize("text", [
    '<tool_call>{"name":"get","arguments":{"id":"A1"}}</tool_call>',
    '  <tool_call>\n\n  {"name": "get", "arguments": {"id": "A1"}}  \n</tool_call>  ',
    '<tool_call>[{"name":"get","arguments":{"id":"A1"}}]</tool_call>',
    '<tool_call>{"name":"get","arguments":"{\\"id\\": \\"A1\\"}"}</tool_call><|im_end|>',
])
def test_small_model_call_forms_parse(text):
    parsed = parse_assistant(text)
    assert [c["function"]["name"] for c in parsed.tool_calls] == ["get"]
    assert json.loads(parsed.tool_calls[0]["function"]["arguments"]) == {"id": "A1"}
    assert parsed.malformed_calls == 0 and not parsed.content


def test_list_form_carries_several_calls_and_bad_lists_stay_text():
    two = parse_assistant('<tool_call>[{"name":"a","arguments":{}},{"name":"b"}]</tool_call>')
    assert [c["function"]["name"] for c in two.tool_calls] == ["a", "b"]
    bad = parse_assistant('<tool_call>[{"name":"a","arguments":{}}, 3]</tool_call>')
    assert not bad.tool_calls and bad.malformed_calls == 1 and "<tool_call>" in bad.content
    for junk in ("<tool_call>[]</tool_call>", "<tool_call>[[[</tool_call>", "<tool_call>"):
        parse_assistant(junk)  # never raises


def test_one_template_registry_by_family():
    from trace_lib.errors import UserInputError
    from trace_lib.runtime.chat_format import CHAT_TEMPLATE, chat_template_for

    assert chat_template_for("smollm2") == CHAT_TEMPLATE == chat_template_for("tiny")
    with pytest.raises(UserInputError, match="no chat template for model family"):
        chat_template_for("nope")
