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
    args["flight_type"] = "round_trip" if args["flight_type"] == "one_way" else "one_way"
    obs = env.step(json.dumps({"name": gold["name"], "arguments": args}))  # one of 11 wrong
    assert not obs.startswith("Error"), obs  # the tool accepts it: a precision miss
    env.step({"content": "booked"})
    summary = env.summary()
    assert not summary["passed"]
    write = next(c for c in summary["checks"] if c["check"] == "write")
    assert 0.5 < write["score"] < 1.0
    assert 0.0 < summary["reward"] < 1.0


def test_a_call_the_tool_refuses_earns_no_share_of_its_arguments():
    # The loophole GRPO found (session 11): the right reservation id with a cut-down
    # passenger list, which the tool rejects, used to earn 0.25 every time.
    env = make_capability_env("airline", "tool_calling_precision", difficulty=1)
    seed = _seed_where(env, lambda gt: len(gt["reference_actions"][0]["arguments"]
                                           ["passengers"]) > 1)
    env.reset(seed)
    gold = env.ground_truth["reference_actions"][0]
    args = {**gold["arguments"], "passengers": gold["arguments"]["passengers"][:1]}
    assert env.step({"name": gold["name"], "arguments": args}).startswith("Error")
    env.step({"content": f"Done: reservation {args['reservation_id']} updated."})
    summary = env.summary()
    write = next(c for c in summary["checks"] if c["check"] == "write")
    assert write["score"] == 0.0 and summary["reward"] == 0.0


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


# ---------------------------------------------------------------- prompt budget (issue 12)
@pytest.mark.parametrize(("domain", "capability"), PAIRS)
@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_capability_tools_are_a_strict_subset_with_the_domains_own_schemas(domain, capability,
                                                                           difficulty):
    full = make_capability_env(domain, capability, difficulty=difficulty)
    small = make_capability_env(domain, capability, difficulty=difficulty, tools="capability",
                                policy="excerpt", distractors=1)
    by_name = {t["function"]["name"]: json.dumps(t, sort_keys=True) for t in full.tool_schemas}
    shown = [t["function"]["name"] for t in small.tool_schemas]
    assert set(shown) < set(by_name)  # strict subset
    for t in small.tool_schemas:  # byte-identical JSON to the domain's schema
        assert json.dumps(t, sort_keys=True) == by_name[t["function"]["name"]]
    # every tool a reference action or required read uses is shown
    for seed in range(12):
        small.reset(seed)
        used = {a["name"] for a in small.task.actions + small.task.required_reads}
        assert used <= set(shown), (seed, used - set(shown))
        assert run_episode(small, seed, make_policy("reference"))["passed"]
    assert len(small.system_prompt) < len(full.system_prompt)


def test_distractors_are_configurable_and_deterministic():
    def names(n: int) -> list[str]:
        env = make_capability_env("airline", "precondition_verification", tools="capability",
                                  distractors=n)
        return [t["function"]["name"] for t in env.tool_schemas]

    assert len(names(0)) == 3 and len(names(2)) == 5 and names(2) == names(2)
    assert set(names(0)) < set(names(2))
    # the same option through the registry (what train/env verbs and the pages pass)
    from trace_lib.envs import registry
    from trace_lib.errors import UserInputError

    spec = registry.require_static("airline/precondition_verification")
    env = registry.make_builtin(spec, {"tools": "capability", "distractors": 0})
    assert [t["function"]["name"] for t in env.tool_schemas] == names(0)
    with pytest.raises(UserInputError, match="distractors is -1; expected an integer"):
        registry.check_build_options({"distractors": -1}, "env x")
    assert registry.check_build_options({"distractors": 3}) == {"distractors": 3}


def test_policy_excerpt_is_cut_verbatim_from_the_full_policy():
    env = make_capability_env("airline", "precondition_verification", policy="excerpt")
    full = make_capability_env("airline", "precondition_verification")
    excerpt = env.system_prompt
    assert "## Cancelling" in excerpt and "## How to work" in excerpt
    assert "## Booking" not in excerpt and "## Booking" in full.system_prompt
    for block in excerpt.split("\n\n"):
        assert block in full.system_prompt


def test_schemas_have_no_pydantic_titles():
    env = make_capability_env("retail", "tool_calling_precision")
    text = json.dumps(env.tool_schemas)
    assert '"title": "' not in text


def test_difficulty_changes_the_instances():
    a = make_capability_env("airline", "tool_calling_precision", difficulty=1)
    c = make_capability_env("airline", "tool_calling_precision", difficulty=3)
    kinds_a, kinds_c = set(), set()
    for seed in range(8):
        a.reset(seed)
        c.reset(seed)
        kinds_a.add(a.task.actions[-1]["name"])
        kinds_c.add(c.task.actions[-1]["name"])
    assert kinds_a == {"update_reservation_passengers"} and kinds_a != kinds_c


# ------------------------------------------------------------ no reward without the work
def _ineligible_seed(domain: str) -> tuple[object, int]:
    env = make_capability_env(domain, "precondition_verification")
    for seed in range(50):
        env.reset(seed)
        if env.task.refusal_of is not None:
            return env, seed
    raise AssertionError("no ineligible instance in 50 seeds")


@pytest.mark.parametrize("domain", ["airline", "retail"])
def test_refusal_without_the_reads_earns_nothing(domain):
    env, seed = _ineligible_seed(domain)
    env.reset(seed)
    rid = env.task.refusal_of
    env.step({"content": f"I'm sorry, I cannot cancel {rid}: it is not allowed."})
    summary = env.summary()
    assert summary["reward"] == 0.0, summary["reasons"]
    assert "refused without the required reads" in summary["reasons"]


@pytest.mark.parametrize("domain", ["airline", "retail"])
def test_refusal_after_the_reads_must_name_the_instance(domain):
    env, seed = _ineligible_seed(domain)
    env.reset(seed)
    for read in env.task.required_reads:
        env.step(dict(read))
    env.step({"content": "I'm sorry, that is not allowed and I cannot do it."})
    vague = env.summary()
    env.reset(seed)
    for read in env.task.required_reads:
        env.step(dict(read))
    env.step({"content": f"I cannot cancel {env.task.refusal_of}: the policy does not allow "
                         "it."})
    named = env.summary()
    assert named["passed"] and named["reward"] == 1.0, named["reasons"]
    assert vague["reward"] < 1.0 and not vague["passed"]


def test_answer_items_need_the_required_reads():
    env = make_capability_env("airline", "structured_data_reasoning", difficulty=1)
    env.reset(0)
    assert env.task.answer_items and env.task.required_reads
    env.step({"content": env.task.answer})  # the right figures, but no reads done
    summary = env.summary()
    assert summary["reward"] == 0.0
    assert any("without the required reads" in r for r in summary["reasons"])


@pytest.mark.parametrize("policy", ["refuse", "echo", "stuffing", "read_refuse"])
@pytest.mark.parametrize(("domain", "capability"), PAIRS)
def test_loophole_policies_earn_nothing(domain, capability, policy):
    env = make_capability_env(domain, capability, difficulty=2)
    rewards = [run_episode(env, s, make_policy(policy))["reward"] for s in range(10)]
    assert sum(rewards) / len(rewards) <= 0.05, rewards
