"""Tasks and the scripted agent: ground truth by replay, each deficit knob acts as described."""

from __future__ import annotations

import json

import pytest

from trace_lib.envs.domains import get_domain
from trace_lib.envs.domains.airline.scripted_agent import DEFICITS, draw_deficits, play
from trace_lib.envs.domains.airline.tasks import AirlineTask, generate_tasks


@pytest.fixture(scope="module")
def world():
    dom = get_domain("airline")
    db = dom.make_db(seed=0)
    return dom, db, generate_tasks(db, 40, seed=0)


def _task(tasks: list[AirlineTask], pred) -> AirlineTask:
    for t in tasks:
        if pred(t):
            return t
    pytest.fail("no task of the needed kind among the generated ones")


def _kinds(t: AirlineTask) -> list[str]:
    return [op.kind for op in t.operations]


def _calls(rec) -> list[tuple[str, dict]]:
    out = []
    for m in rec["messages"]:
        for tc in m.get("tool_calls") or []:
            out.append((tc["function"]["name"], json.loads(tc["function"]["arguments"])))
    return out


def test_tasks_are_deterministic_and_varied(world):
    dom, db, tasks = world
    again = generate_tasks(dom.make_db(seed=0), 40, seed=0)
    assert [(t.task_id, t.request, t.expected_actions, t.expected_db_hash) for t in tasks] == [
        (t.task_id, t.request, t.expected_actions, t.expected_db_hash) for t in again]
    kinds = {k for t in tasks for k in _kinds(t)}
    assert {"cancel", "cancel_denied", "add_bags", "change_passenger"} <= kinds
    assert any(len(t.operations) > 1 for t in tasks)
    assert all(t.user_id in t.request and "I confirm" in t.request for t in tasks)


def test_careful_agent_without_knobs_solves_every_task(world):
    dom, db, tasks = world
    for task in tasks:
        rec = play(task, db, dom.policy, deficits=set())
        assert rec["success"] and rec["reward"] == 1.0, (task.task_id, rec["meta"])
        assert rec["meta"]["planted_deficits"] == []
        # It makes exactly the calls the task expects (plus free reads/calculations).
        made = [(n, a) for n, a in _calls(rec) if n not in ("calculate", "search_direct_flight")]
        assert made == [(a["name"], a["arguments"]) for a in task.expected_actions]


def test_trajectory_shape(world):
    dom, db, tasks = world
    rec = play(tasks[0], db, dom.policy, agent="scripted-sloppy", trial=1)
    msgs = rec["messages"]
    assert msgs[0] == {"role": "system", "content": dom.policy}
    assert msgs[1]["role"] == "user" and msgs[1]["content"] == tasks[0].request
    assert msgs[-1]["role"] == "assistant" and msgs[-1]["content"]
    for i, m in enumerate(msgs[2:-1], start=2):
        if m["role"] == "assistant":
            assert m["content"] is None and len(m["tool_calls"]) == 1
            nxt = msgs[i + 1]
            assert nxt["role"] == "tool" and nxt["tool_call_id"] == m["tool_calls"][0]["id"]
    assert rec["id"] == f"{tasks[0].task_id}__scripted-sloppy__1"
    assert set(rec["meta"]["planted_deficits"]) <= set(rec["meta"]["armed_deficits"])


def test_precondition_knob_cancels_an_ineligible_reservation(world):
    dom, db, tasks = world
    task = _task(tasks, lambda t: _kinds(t) == ["cancel_denied"])
    rid = task.operations[0].reservation_id
    good = play(task, db, dom.policy, deficits=set())
    assert ("cancel_reservation", {"reservation_id": rid}) not in _calls(good)
    assert "cannot cancel" in good["messages"][-1]["content"]
    bad = play(task, db, dom.policy, deficits={"precondition_verification"})
    assert _calls(bad)[1] == ("cancel_reservation", {"reservation_id": rid})
    assert "get_reservation_details" not in [n for n, _ in _calls(bad)]
    assert bad["reward"] == 0.0 and not bad["meta"]["db_match"]
    assert bad["meta"]["planted_deficits"] == ["precondition_verification"]


def test_precondition_knob_changes_basic_economy_flights(world):
    dom, db, tasks = world
    task = _task(tasks, lambda t: "change_flight_denied" in _kinds(t))
    bad = play(task, db, dom.policy, deficits={"precondition_verification"})
    assert "update_reservation_flights" in [n for n, _ in _calls(bad)]
    assert bad["reward"] == 0.0
    good = play(task, db, dom.policy, deficits=set())
    assert "update_reservation_flights" not in [n for n, _ in _calls(good)]


def test_multi_step_knob_stops_after_the_first_operation(world):
    dom, db, tasks = world
    task = _task(tasks, lambda t: len(t.operations) > 1 and t.operations[-1].allowed)
    last = task.operations[-1].reservation_id
    bad = play(task, db, dom.policy, deficits={"multi_step_task_completion"})
    touched = {a.get("reservation_id") for _, a in _calls(bad)}
    assert last not in touched
    assert bad["reward"] == 0.0 and bad["meta"]["missing_writes"]
    assert bad["meta"]["planted_deficits"] == ["multi_step_task_completion"]
    single = _task(tasks, lambda t: len(t.operations) == 1)
    rec = play(single, db, dom.policy, deficits={"multi_step_task_completion"})
    assert rec["success"] and rec["meta"]["planted_deficits"] == []  # nothing to stop early


def test_tool_precision_knob_copies_an_argument_from_the_wrong_record(world):
    dom, db, tasks = world
    task = _task(tasks, lambda t: len(t.operations) == 1 and t.operations[0].kind in (
        "add_bags", "change_passenger") and len(db.users[t.user_id].reservations) > 1 and len(
        db.users[t.user_id].payment_methods) > 1)
    good_write = [c for c in _calls(play(task, db, dom.policy, deficits=set()))
                  if c[0].startswith("update_")]
    bad = play(task, db, dom.policy, deficits={"tool_calling_precision"})
    bad_write = [c for c in _calls(bad) if c[0].startswith("update_")]
    assert good_write[0][0] == bad_write[0][0]
    diff = {k for k in good_write[0][1] if good_write[0][1][k] != bad_write[0][1].get(k)}
    assert len(diff) == 1 and diff <= {"reservation_id", "payment_id"}
    wrong = bad_write[0][1][diff.pop()]
    user = db.users[task.user_id]
    assert wrong in user.reservations or wrong in user.payment_methods
    assert bad["reward"] == 0.0 and bad["meta"]["planted_deficits"] == ["tool_calling_precision"]


def test_structured_knob_misreads_a_nested_field(world):
    dom, db, tasks = world

    def misreadable(t):
        op = t.operations[0]
        res = db.reservations[op.reservation_id]
        if op.kind == "change_passenger":
            return op.params["index"] > 0
        return op.kind == "add_bags" and len(res.flights) != len(res.passengers)

    task = _task(tasks, lambda t: len(t.operations) == 1 and misreadable(t))
    good = [c for c in _calls(play(task, db, dom.policy, deficits=set()))
            if c[0].startswith("update_")][0]
    bad_rec = play(task, db, dom.policy, deficits={"structured_data_reasoning"})
    bad = [c for c in _calls(bad_rec) if c[0].startswith("update_")][0]
    assert good != bad and good[1]["reservation_id"] == bad[1]["reservation_id"]
    assert bad_rec["reward"] == 0.0
    assert bad_rec["meta"]["planted_deficits"] == ["structured_data_reasoning"]


def test_deficit_draws_follow_the_profile_and_the_seed():
    from trace_lib.envs.domains.airline.scripted_agent import AGENT_PROFILES

    hasty, careful = AGENT_PROFILES["scripted-hasty"], AGENT_PROFILES["scripted-careful"]
    draws = [draw_deficits(hasty, 0, f"t{i}", 0) for i in range(200)]
    assert draws == [draw_deficits(hasty, 0, f"t{i}", 0) for i in range(200)]
    share = sum("precondition_verification" in d for d in draws) / 200
    assert 0.65 < share < 0.95
    calm = [draw_deficits(careful, 0, f"t{i}", 0) for i in range(200)]
    assert sum(len(d) for d in calm) < sum(len(d) for d in draws) / 3
    with pytest.raises(KeyError, match="unknown deficits"):
        play(generate_tasks(get_domain("airline").make_db(0), 1)[0],
             get_domain("airline").make_db(0), "", deficits={"tone"})
    assert set(DEFICITS) == {"structured_data_reasoning", "multi_step_task_completion",
                             "precondition_verification", "tool_calling_precision"}
