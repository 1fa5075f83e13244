"""The Environment protocol is defined once (in the runtime layer, re-exported by envs), and
`parse_action` / `tool_arguments` read every action shape a policy sends."""

from __future__ import annotations

import json

import pytest

from trace_lib.envs import protocol
from trace_lib.runtime import environment


def test_one_definition_of_the_protocol():
    assert protocol.Environment is environment.Environment
    assert protocol.ValidatedEnvironment is environment.ValidatedEnvironment


ARGS = {"user_id": "u1", "amount": 3}


@pytest.mark.parametrize("action", [
    {"name": "get_user", "arguments": ARGS},
    {"name": "get_user", "arguments": json.dumps(ARGS)},
    json.dumps({"name": "get_user", "arguments": ARGS}),
    # OpenAI's tool_call shape, as an OpenAI-compatible endpoint returns it
    {"id": "call_1", "type": "function",
     "function": {"name": "get_user", "arguments": json.dumps(ARGS)}},
    json.dumps({"type": "function", "function": {"name": "get_user", "arguments": ARGS}}),
])
def test_every_tool_call_shape_reads_the_same(action):
    act = protocol.parse_action(action)
    assert act["name"] == "get_user"
    assert protocol.tool_arguments(act) == ARGS


def test_tool_arguments_reads_the_function_shape_directly():
    call = {"type": "function", "function": {"name": "f", "arguments": json.dumps(ARGS)}}
    assert protocol.tool_arguments(call) == ARGS
    assert protocol.tool_arguments({"name": "f", "arguments": ""}) == {}
    # not JSON: handed to the tool as it is, whose argument check reports it
    assert protocol.tool_arguments({"name": "f", "arguments": "{oops"}) == "{oops"


def test_final_answers_and_malformed_actions():
    assert protocol.parse_action({"content": "done"}) == {"content": "done"}
    with pytest.raises(ValueError, match="not valid JSON"):
        protocol.parse_action("not json")
    with pytest.raises(ValueError, match="must be a JSON object"):
        protocol.parse_action("[1, 2]")
