"""Built-in capability environments: seeded instances, reference solves, verifier credit."""

from __future__ import annotations

import json

import pytest

from trace_lib.envs.capabilities import builtin_pairs, make_capability_env
from trace_lib.envs.capabilities.task_env import answer_contains
from trace_lib.envs.policies import make_policy, run_episode
from trace_lib.envs.protocol import Environment

PAIRS = builtin_pairs()


def test_every_capability_exists_on_both_domains():
    caps = {"structured_data_reasoning", "multi_step_task_completion",
            "precondition_verification", "tool_calling_precision"}
    assert {(d, c) for d in ("airline", "retail") for c in caps} <= set(PAIRS)


@pytest.mark.parametrize(("domain", "capability"), PAIRS)
@pytest.mark.parametrize("difficulty", [1, 3])
def test_reference_solves_and_trivial_policies_fail(domain, capability, difficulty):
    env = make_capability_env(domain, capability, difficulty=difficulty)
    assert isinstance(env, Environment)
    for seed in range(4):
        ref = run_episode(env, seed, make_policy("reference"))
        assert ref["passed"] and ref["reward"] == 1.0, ref["reasons"]
        null = run_episode(env, seed, make_policy("null"))
        assert null["reward"] == 0.0 and not null["passed"]
        assert env.hint and env.messages[-1]["role"] == "user"


@pytest.mark.parametrize(("domain", "capability"), PAIRS)
def test_instances_come_from_the_seed_alone(domain, capability):
    a = make_capability_env(domain, capability)
    b = make_capability_env(domain, capability)
    a.reset(11)
    b.reset(11)
    assert a.messages == b.messages
    assert json.dumps(a.ground_truth, sort_keys=True) == json.dumps(b.ground_truth,
                                                                    sort_keys=True)
    b.reset(12)
    assert a.messages != b.messages
    tools = {t["function"]["name"] for t in a.tool_schemas}
    for action in a.ground_truth["reference_actions"]:
        assert action["name"] in tools


def _seed_where(env, predicate, limit=60):
    for seed in range(limit):
        env.reset(seed)
        if predicate(env.ground_truth):
            return seed
    raise AssertionError("no seed with the wanted instance")


def test_precondition_write_on_an_ineligible_instance_scores_zero():
    env = make_capability_env("airline", "precondition_verification")
    seed = _seed_where(env, lambda gt: not gt["facts"]["eligible"])
    env.reset(seed)
    rid = env.ground_truth["facts"]["reservation_id"]
    env.step({"name": "get_reservation_details", "arguments": {"reservation_id": rid}})
    env.step({"name": "cancel_reservation", "arguments": {"reservation_id": rid}})
    env.step({"content": "I'm sorry, I cannot cancel it."})
    summary = env.summary()
    assert summary["reward"] == 0.0 and not summary["passed"]
    assert any("database differs" in r for r in summary["reasons"])


def test_precondition_write_without_reading_first_gets_partial_credit():
    env = make_capability_env("airline", "precondition_verification")
    seed = _seed_where(env, lambda gt: gt["facts"]["eligible"])
    env.reset(seed)
    rid = env.ground_truth["facts"]["reservation_id"]
    env.step({"name": "cancel_reservation", "arguments": {"reservation_id": rid}})
    env.step({"content": "done"})
    summary = env.summary()
    assert summary["reward"] == 0.5 and not summary["passed"]
    assert any("did not check get_reservation_details" in r for r in summary["reasons"])


def test_precision_partial_credit_is_the_share_of_right_arguments():
    env = make_capability_env("airline", "tool_calling_precision", difficulty=2)
    seed = _seed_where(env, lambda gt: gt["facts"]["tool"] == "book_reservation")
    env.reset(seed)
    gold = env.ground_truth["reference_actions"][0]
    args = dict(gold["arguments"])
    args["insurance"] = "no" if args["insurance"] == "yes" else "yes"  # one of 11 wrong
    env.step(json.dumps({"name": gold["name"], "arguments": args}))
    env.step({"content": "booked"})
    summary = env.summary()
    assert not summary["passed"]
    write = next(c for c in summary["checks"] if c["check"] == "write")
    assert 0.5 < write["score"] < 1.0
    assert 0.0 < summary["reward"] < 1.0


def test_reasoning_answer_must_carry_the_figure():
    env = make_capability_env("retail", "structured_data_reasoning", difficulty=1)
    env.reset(3)
    gt = env.ground_truth
    for action in gt["reference_actions"]:
        env.step(action)
    env.step({"content": "I could not work it out."})
    assert env.summary()["reward"] == 0.5  # the read was made, the figure is missing
    assert any("reply lacks" in r for r in env.summary()["reasons"])


def test_bad_actions_become_observations_not_crashes():
    env = make_capability_env("retail", "multi_step_task_completion")
    env.reset(0)
    assert env.step("not json").startswith("Error:")
    assert env.step({"name": "no_such_tool", "arguments": {}}).startswith("Error:")
    assert env.step({"nonsense": 1}).startswith("Error:")
    assert env.step({"content": ""}) and env.done
    assert env.step({"content": "again"}) == "Error: the episode is over"


def test_step_budget_ends_the_episode():
    env = make_capability_env("airline", "structured_data_reasoning", max_steps=3)
    env.reset(0)
    for _ in range(3):
        env.step({"name": "list_all_airports", "arguments": {}})
    assert env.done and env.summary()["steps"] == 3


@pytest.mark.parametrize(("answer", "alt", "hit"), [
    ("You paid $1,250 in total.", "1250", True),
    ("Dates: 2024-05-02", "2", False),
    ("Reservation ABC123 it is", "abc123", True),
    ("Total 21.00 dollars", "21.00", True),
    ("Total 121", "21", False),
    ("I'm sorry, I can't do that", "can't", True),
])
def test_answer_matching_is_whole_token(answer, alt, hit):
    assert answer_contains(answer, alt) is hit


def test_unknown_names_are_clear_errors():
    with pytest.raises(KeyError, match="unknown capability"):
        make_capability_env("airline", "flying")
    with pytest.raises(ValueError, match="difficulty"):
        make_capability_env("airline", "tool_calling_precision", difficulty=7)
