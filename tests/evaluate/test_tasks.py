"""Target task sets: the demo's own tasks, rewarded by each task's code verdict."""

from __future__ import annotations

import json
import math

import pytest

from trace_lib.envs.splits import DEMO_TASKS
from trace_lib.errors import UserInputError
from trace_lib.evaluate.tasks import load_task_set


def test_task_set_is_the_demo_task_set():
    from trace_lib.demo import DemoConfig

    cfg = DemoConfig()
    assert DEMO_TASKS == math.ceil(cfg.n / (len(cfg.agents) * cfg.trials))
    ts = load_task_set("airline")
    assert len(ts.tasks) == DEMO_TASKS
    assert ts.tasks[0].task_id == "airline_0_000" and ts.tasks[-1].task_id == "airline_0_049"


def test_first_n_is_a_prefix_of_the_whole_set():
    from trace_lib.envs.domains import get_domain
    from trace_lib.envs.domains.airline.tasks import generate_tasks

    few = generate_tasks(get_domain("airline").make_db(0), 4, seed=0)
    ts = load_task_set("airline", 4)
    assert [t.task_id for t in ts.tasks] == [t.task_id for t in few]
    assert [t.request for t in ts.tasks] == [t.request for t in few]


def _play(env, actions, answer="Done."):
    env.reset(0)
    for a in actions:
        obs = env.step({"name": a["name"], "arguments": a["arguments"]})
        assert not obs.startswith("Error:"), obs
    env.step({"content": answer})
    return env.summary()


def test_reference_actions_pass_and_a_skipped_write_fails():
    ts = load_task_set("airline", 10)
    task = next(t for t in ts.tasks if t.raw.expected_writes)
    env = ts.environment(task)
    ok = _play(env, task.expected_actions)
    assert ok["passed"] and ok["reward"] == 1.0 and ok["db_match"]
    reads = [a for a in task.expected_actions if a not in task.raw.expected_writes]
    bad = _play(ts.environment(task), reads)
    assert not bad["passed"] and bad["reward"] == 0.0 and bad["missing_writes"]
    assert any(r.startswith("never made") for r in bad["reasons"])


def test_prompt_is_policy_tools_and_request():
    ts = load_task_set("airline", 1)
    env = ts.environment(ts.tasks[0])
    env.reset(0)
    assert env.messages[0]["role"] == "system" and "policy" in env.messages[0]["content"].lower()
    assert env.messages[1] == {"role": "user", "content": ts.tasks[0].request}
    assert env.hint is None


def test_capability_tools_are_a_strict_subset_with_the_same_schemas():
    ts = load_task_set("airline", 2)
    full = {s["function"]["name"]: s for s in ts.environment(ts.tasks[0], "all").tool_schemas}
    sub = ts.environment(ts.tasks[0], "capability").tool_schemas
    names = [s["function"]["name"] for s in sub]
    assert set(names) < set(full)
    assert all(s == full[s["function"]["name"]] for s in sub)
    # the same list for every task: it is the whole set's union, not the task's own calls
    assert names == [s["function"]["name"]
                     for s in ts.environment(ts.tasks[1], "capability").tool_schemas]
    used = {a["name"] for t in load_task_set("airline").tasks for a in t.expected_actions}
    assert set(names) == used


def test_a_tool_not_offered_is_an_error_observation():
    ts = load_task_set("airline", 1)
    env = ts.environment(ts.tasks[0], "capability")
    env.reset(0)
    obs = env.step({"name": "search_direct_flight",
                    "arguments": {"origin": "JFK", "destination": "LAX", "date": "2024-05-20"}})
    assert obs.startswith("Error: unknown tool")
    assert env.calls[-1]["observation"] == obs and env.calls[-1]["write"] is False


def test_malformed_actions_never_crash():
    ts = load_task_set("airline", 1)
    env = ts.environment(ts.tasks[0])
    env.reset(0)
    assert env.step("not json").startswith("Error:")
    assert env.step({"bogus": 1}).startswith("Error:")
    assert env.step({"name": "get_user_details", "arguments": "{oops"}).startswith("Error:")
    assert env.summary()["reward"] == 0.0


def test_unknown_and_taskless_domains_and_bad_counts_are_clear_errors(monkeypatch):
    from trace_lib.evaluate import tasks
    from trace_lib.registry import Registry

    only_airline = Registry("target task set", builtins={
        "airline": "trace_lib.evaluate.tasks:airline_task_set"})
    monkeypatch.setattr(tasks, "TASK_SETS", only_airline)
    with pytest.raises(UserInputError, match="no target task set"):
        load_task_set("retail")
    with pytest.raises(UserInputError, match="unknown domain"):
        load_task_set("telecom")
    with pytest.raises(UserInputError, match="has 50 tasks"):
        load_task_set("airline", 51)
    with pytest.raises(UserInputError, match="positive number"):
        load_task_set("airline", 0)


# ------------------------------------------------------------------------------ retail


def test_retail_has_a_target_task_set_the_reference_solves():
    ts = load_task_set("retail")
    assert len(ts.tasks) == 50 and ts.tasks[0].task_id == "retail_0_000"
    assert [t.task_id for t in load_task_set("retail", 3).tasks] == [
        "retail_0_000", "retail_0_001", "retail_0_002"]
    # every retail capability's builder contributes, in turn
    assert {t.operations[0] for t in ts.tasks[:4]} == {
        "multi_step_task_completion", "precondition_verification",
        "structured_data_reasoning", "tool_calling_precision"}
    passed, idle = 0, 0
    for task in ts.tasks:
        env = ts.environment(task)
        env.reset(0)
        while not env.done:
            env.step(env.reference_action())
        passed += env.summary()["passed"]
        idle_env = ts.environment(task)
        idle_env.reset(0)
        idle_env.step({"content": "Done."})
        idle += idle_env.summary()["passed"]
    assert passed == 50
    # doing nothing passes only tasks that need neither a write nor an answer
    assert idle == sum(1 for t in ts.tasks if not t.write_required and not t.raw.answer_items)
    assert idle < 10


def test_a_question_needs_its_answer_in_the_reply():
    ts = load_task_set("retail", 3)
    task = ts.tasks[2]  # structured_data_reasoning: a question, no write
    assert not task.write_required and task.raw.answer_items
    env = ts.environment(task)
    env.reset(0)
    for action in task.expected_actions:
        env.step(action)
    env.step({"content": "I looked it up."})
    out = env.summary()
    assert not out["passed"] and any(r.startswith("reply lacks") for r in out["reasons"])


# --------------------------------------------------------------- one loop, any action shape


def test_the_target_environment_is_the_capability_environments_loop():
    from trace_lib.envs.capabilities.task_env import TaskEnvironment
    from trace_lib.envs.protocol import ValidatedEnvironment

    env = load_task_set("airline", 1).environment(load_task_set("airline", 1).tasks[0])
    assert isinstance(env, TaskEnvironment) and isinstance(env, ValidatedEnvironment)


@pytest.mark.parametrize("domain", ["airline", "retail"])
def test_openai_function_shaped_tool_calls_are_played(domain):
    """What an OpenAI-compatible endpoint returns: {"type": "function", "function":
    {"name", "arguments": "<json string>"}} with an id, as a dict or as JSON text."""
    ts = load_task_set(domain, 5)
    task = next(t for t in ts.tasks if t.write_required)
    env = ts.environment(task)
    env.reset(0)
    for k, action in enumerate(task.expected_actions):
        call = {"id": f"call_{k}", "type": "function",
                "function": {"name": action["name"],
                             "arguments": json.dumps(action["arguments"])}}
        obs = env.step(json.dumps(call) if k % 2 else call)
        assert not obs.startswith("Error:"), obs
    env.step({"content": task.reference_answer or "Done."})
    assert env.summary()["passed"]
