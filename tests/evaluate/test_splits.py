"""Target-task splits: demo, dev and test drawn by one generator, disjoint, named in records."""

from __future__ import annotations

import pytest

from trace_lib.envs.splits import SPLITS, split_of
from trace_lib.errors import UserInputError
from trace_lib.evaluate.policy import EvalConfig
from trace_lib.evaluate.tasks import load_task_set


@pytest.mark.parametrize("domain", ["airline", "retail"])
def test_splits_are_disjoint_and_test_holds_at_least_100_tasks(domain):
    sets = {name: load_task_set(domain, split=name) for name in SPLITS}
    assert len(sets["test"].tasks) >= 100 and len(sets["dev"].tasks) >= 50
    assert len(sets["demo"].tasks) == 50
    for name, ts in sets.items():
        assert ts.split == name and ts.total == SPLITS[name].size
        assert all(t.task_id.startswith(f"{domain}_{SPLITS[name].seed}_") for t in ts.tasks)
    requests = {name: {t.request for t in ts.tasks} for name, ts in sets.items()}
    for a in SPLITS:
        for b in SPLITS:
            if a < b:
                assert not requests[a] & requests[b], (a, b)
    # the held-out split exercises what dev does: the same tools (so the same prompt) and
    # a share of write tasks (not a set a do-nothing policy passes)
    assert sets["dev"].tool_names("capability") == sets["test"].tool_names("capability")
    for ts in sets.values():
        assert sum(t.write_required for t in ts.tasks) > len(ts.tasks) / 2


def test_the_demo_split_is_the_default_and_prefixes_are_stable():
    assert [t.task_id for t in load_task_set("airline").tasks] == [
        t.task_id for t in load_task_set("airline", split="demo").tasks]
    few = load_task_set("airline", 3, split="test")
    assert [t.request for t in few.tasks] == [
        t.request for t in load_task_set("airline", split="test").tasks[:3]]


def test_a_slice_of_a_split_is_those_tasks_in_order():
    dev = load_task_set("airline", split="dev")
    tail = load_task_set("airline", 20, split="dev", offset=80)
    assert [t.task_id for t in tail.tasks] == [t.task_id for t in dev.tasks[80:]]
    assert [t.task_id for t in load_task_set("airline", None, split="dev", offset=95).tasks] \
        == [t.task_id for t in dev.tasks[95:]]
    with pytest.raises(UserInputError, match="--tasks 90:110: the airline dev split has 100"):
        load_task_set("airline", 20, split="dev", offset=90)
    with pytest.raises(UserInputError, match="task_offset must be a number >= 0"):
        EvalConfig(split="dev", tasks=3, task_offset=-1).validate()


def test_every_split_task_is_solved_by_its_reference_and_not_by_doing_nothing():
    ts = load_task_set("airline", 20, split="test")
    for task in ts.tasks:
        env = ts.environment(task)
        env.reset(0)
        while not env.done:
            env.step(env.reference_action())
        assert env.summary()["passed"], task.task_id
        idle = ts.environment(task)
        idle.reset(0)
        idle.step({"content": "Done."})
        assert idle.summary()["passed"] == (not task.write_required), task.task_id


def test_bad_splits_are_clear_errors():
    with pytest.raises(UserInputError, match="expected one of demo, dev, test"):
        load_task_set("airline", split="train")
    with pytest.raises(UserInputError, match="--split test is task-set seed 2"):
        load_task_set("airline", split="test", seed=0)
    with pytest.raises(UserInputError, match="dev split has 100 tasks"):
        load_task_set("airline", 101, split="dev")
    with pytest.raises(UserInputError, match="--split dev is task-set seed 1"):
        EvalConfig(split="dev", seed=3).validate()
    with pytest.raises(UserInputError, match="expected one of"):
        EvalConfig(split="holdout").validate()


def test_config_resolves_the_task_seed():
    assert EvalConfig().task_seed == 0 and EvalConfig(split="test").task_seed == 2
    assert EvalConfig(seed=7).task_seed == 7 and split_of(7) == "custom"
    # a job spec written before splits existed ("seed": 0) still loads, as the demo split
    assert EvalConfig.from_dict({"seed": 0}).task_seed == 0


def test_the_do_nothing_floor_is_the_tasks_whose_right_outcome_is_silence():
    from trace_lib.evaluate.tasks import do_nothing_verdicts

    ts = load_task_set("airline", split="dev")
    floor = do_nothing_verdicts(ts)
    assert set(floor) == {t.task_id for t in ts.tasks}
    # airline's refusals need no reply text, so the floor is exactly the read-only tasks
    assert {t for t, ok in floor.items() if ok} == {
        t.task_id for t in ts.tasks if not t.write_required}
    retail = load_task_set("retail", 12)
    idle = do_nothing_verdicts(retail)
    # a retail question needs its answer in the reply: silence fails it
    assert all(not idle[t.task_id] for t in retail.tasks if t.raw.answer_items)
