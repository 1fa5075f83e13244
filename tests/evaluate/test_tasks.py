"""Target task sets: the demo's own tasks, rewarded by each task's code verdict."""

from __future__ import annotations

import math

import pytest

from trace_lib.errors import UserInputError
from trace_lib.evaluate.tasks import DEMO_TASKS, load_task_set


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
    assert env.calls[-1]["error"] is True


def test_malformed_actions_never_crash():
    ts = load_task_set("airline", 1)
    env = ts.environment(ts.tasks[0])
    env.reset(0)
    assert env.step("not json").startswith("Error:")
    assert env.step({"bogus": 1}).startswith("Error:")
    assert env.step({"name": "get_user_details", "arguments": "{oops"}).startswith("Error:")
    assert env.summary()["reward"] == 0.0


def test_unknown_and_taskless_domains_and_bad_counts_are_clear_errors():
    with pytest.raises(UserInputError, match="no target task set"):
        load_task_set("retail")
    with pytest.raises(UserInputError, match="unknown domain"):
        load_task_set("telecom")
    with pytest.raises(UserInputError, match="has 50 tasks"):
        load_task_set("airline", 51)
    with pytest.raises(UserInputError, match="positive number"):
        load_task_set("airline", 0)
