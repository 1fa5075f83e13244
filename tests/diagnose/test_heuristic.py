"""The heuristic labeler on hand-built transcripts and on the real demo store."""

from __future__ import annotations

from pathlib import Path

from trace_lib.data_model import Capability
from trace_lib.diagnose.label_quality import evaluate
from trace_lib.diagnose.labelers import get_labeler
from trace_lib.diagnose.labeling import run_labeling
from trace_lib.diagnose.ranking import rank
from trace_lib.transcript_model import Call, Transcript


def _call(message_idx: int, call_idx: int, name: str, arguments: dict, requestor: str | None,
          error: str | None) -> Call:
    return Call(name=name, arguments=arguments, error=error, message_idx=message_idx,
                requestor=requestor, call_idx=call_idx)


def _t(calls: list[Call], expected: list[tuple[str, dict]], outputs: dict[int, str]) -> Transcript:
    msgs = [{"idx": 0, "role": "user", "content": "help", "name": None, "tool_call_id": None}]
    for c in calls:
        msgs.append({"idx": c.message_idx, "role": "assistant", "content": None, "name": None,
                     "tool_call_id": None})
        msgs.append({"idx": c.message_idx + 1, "role": "tool", "name": c.name,
                     "content": outputs.get(c.message_idx, "{}"), "tool_call_id": None})
    msgs.append({"idx": 99, "role": "assistant", "content": "bye", "name": None,
                 "tool_call_id": None})
    head = {"id": "t1", "dataset_id": "d", "source_id": None, "task_id": "task",
            "domain": "airline", "success": False, "reward": 0.0, "termination": "user_stop",
            "meta": {}}
    return Transcript(head, msgs, calls,
                      [Call(name=name, arguments=args) for name, args in expected])


CAPS = [Capability(name=n, description="d") for n in (
    "tool_calling_precision", "structured_data_reasoning", "multi_step_task_completion",
    "precondition_verification", "tone_empathy")]


def _labels(t: Transcript) -> dict[str, tuple[str, list]]:
    out = get_labeler("heuristic").label(t, CAPS)
    return {p.capability: (p.value, p.evidence) for p in out.labels}


def test_wrong_record_copied_is_tool_calling_precision() -> None:
    user = '{"user_id": "u1", "reservations": ["AAA111", "BBB222"]}'
    calls = [_call(1, 0, "get_user_details", {"user_id": "u1"}, "assistant", None),
             _call(3, 0, "get_reservation_details", {"reservation_id": "BBB222"}, "assistant", None),
             _call(5, 0, "cancel_reservation", {"reservation_id": "BBB222"}, "assistant", None)]
    expected = [("get_user_details", {"user_id": "u1"}),
                ("cancel_reservation", {"reservation_id": "CCC333"})]
    lab = _labels(_t(calls, expected, {1: user}))
    assert lab["tool_calling_precision"][0] == "lacking"
    assert lab["tool_calling_precision"][1][0]["message_idx"] == 5
    assert lab["structured_data_reasoning"][0] != "lacking"
    assert lab["tone_empathy"][0] == "na"


def test_derived_value_is_structured_reasoning_and_missing_write_is_incomplete() -> None:
    res = '{"reservation_id": "AAA111", "passengers": [1, 2], "flights": [1]}'
    calls = [_call(1, 0, "get_reservation_details", {"reservation_id": "AAA111"}, "assistant",
                  None),
             _call(3, 0, "update_reservation_baggages",
                  {"reservation_id": "AAA111", "total_baggages": 3, "nonfree_baggages": 2},
                  "assistant", None)]
    expected = [("get_reservation_details", {"reservation_id": "AAA111"}),
                ("update_reservation_baggages",
                 {"reservation_id": "AAA111", "total_baggages": 3, "nonfree_baggages": 1}),
                ("cancel_reservation", {"reservation_id": "CCC333"})]
    lab = _labels(_t(calls, expected, {1: res}))
    assert lab["structured_data_reasoning"][0] == "lacking"
    assert "nonfree_baggages" in lab["structured_data_reasoning"][1][0]["text"]
    assert lab["multi_step_task_completion"][0] == "lacking"
    assert lab["multi_step_task_completion"][1][0]["message_idx"] == 99
    assert lab["precondition_verification"][0] == "present"


def test_write_without_lookup_is_precondition() -> None:
    calls = [_call(1, 0, "cancel_reservation", {"reservation_id": "AAA111"}, "assistant", None)]
    lab = _labels(_t(calls, [], {}))
    assert lab["precondition_verification"][0] == "lacking"
    assert lab["multi_step_task_completion"][0] == "na"  # no expected actions: no grounds


def test_recovers_planted_deficits_on_demo(demo_db: Path) -> None:
    [summary] = run_labeling(demo_db, "heuristic", run_prefix="h")
    assert summary.n_failed == 0 and summary.n_trajectories == 36
    report = evaluate(demo_db)["planted"]
    kept = {r.capability for r in rank(demo_db).selected}
    planted = set(report["planted_capabilities"])
    # Nothing unplanted is kept (the distractors and the other rules-less capabilities are
    # `na`); on 36 trajectories a rarely planted one may miss the Cov threshold.
    assert kept <= planted and len(kept) >= 3, (kept, planted)
    assert report["per_trajectory_micro"]["precision"] >= 0.8
    assert report["per_trajectory_micro"]["recall"] >= 0.8


def test_read_then_wrong_decision_is_structured_reasoning() -> None:
    res = '{"reservation_id": "AAA111", "created_at": "2024-05-01T10:00:00"}'
    calls = [_call(1, 0, "get_reservation_details", {"reservation_id": "AAA111"}, "assistant",
                  None),
             _call(3, 0, "cancel_reservation", {"reservation_id": "AAA111"}, "assistant", None)]
    expected = [("get_user_details", {"user_id": "u1"}),
                ("get_reservation_details", {"reservation_id": "AAA111"})]  # deny, no write
    t = _t(calls, expected, {1: res})
    t.messages[0]["content"] = "I am u1"
    lab = _labels(t)
    assert lab["structured_data_reasoning"][0] == "lacking"
    assert "misjudged" in lab["structured_data_reasoning"][1][0]["text"]
    assert lab["precondition_verification"][0] != "lacking"  # it did look the record up
