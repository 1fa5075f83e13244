"""bench/selftrace.py's figures that are not a pass rate: expected-action recall per task
(from an episodes file as `evaluate` writes it) and each policy's share of the oracle's
recall gain over base, with its paired bootstrap interval; the loop's recipe over its
training seeds (mean and spread)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from loop import expected_action_recall  # noqa: E402
from selftrace import grpo_seeds, oracle_shares  # noqa: E402

GET = {"name": "get_user_details", "arguments": {"user_id": "u1"}}
CANCEL = {"name": "cancel_reservation", "arguments": {"reservation_id": "R1"}}


def _episode(task: str, calls: list[dict], expected: list[dict]) -> dict:
    msgs = [{"role": "user", "content": "hi"}]
    for c in calls:  # arguments as the server returns them: a JSON string
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}]})
        msgs.append({"role": "tool", "tool_call_id": "c", "content": "{}"})
    return {"task_id": task, "messages": msgs, "expected_actions": expected}


def test_recall_counts_each_expected_action_once_with_its_exact_arguments(tmp_path: Path
                                                                          ) -> None:
    wrong_args = {"name": "cancel_reservation", "arguments": {"reservation_id": "R2"}}
    episodes = [
        _episode("a", [GET, GET, GET], [GET, CANCEL]),        # a repeated read: once
        _episode("b", [GET, wrong_args], [GET, CANCEL]),      # the wrong id: not the action
        _episode("c", [GET, CANCEL], [GET, CANCEL]),
        _episode("d", [], [CANCEL]),
        _episode("e", [GET], []),                             # nothing expected: no figure
    ]
    path = tmp_path / "episodes.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in episodes))
    assert expected_action_recall(path) == {"a": 0.5, "b": 0.5, "c": 1.0, "d": 0.0}


def _row(policy: str, recall: dict[str, float]) -> dict:
    return {"policy": policy, "split": "test", "n": len(recall), "recall": recall}


def test_share_of_the_oracle_gain_is_relative_to_base_with_a_paired_interval() -> None:
    tasks = [f"t{i}" for i in range(40)]
    base = {t: 0.0 for t in tasks}
    oracle = {t: (1.0 if i % 2 else 0.5) for i, t in enumerate(tasks)}   # mean 0.75
    half = {t: oracle[t] / 2 for t in tasks}                             # mean 0.375
    res = {"rows": [_row("base", base), _row("oracle_sft@20", oracle), _row("half", half),
                    _row("final", dict(base))]}
    shares = oracle_shares(res, "test")
    assert set(shares) == {"half", "final"}
    assert shares["half"]["share"] == pytest.approx(0.5)
    # half is exactly half the oracle on every task: every paired resample says 0.5
    assert shares["half"]["ci95"] == pytest.approx([0.5, 0.5])
    assert shares["final"]["share"] == 0.0 and shares["final"]["ci95"] == [0.0, 0.0]
    assert shares["half"]["oracle"] == "oracle_sft@20" and shares["half"]["tasks"] == 40


def test_no_share_without_an_oracle_gain_or_an_oracle_row_of_the_same_size() -> None:
    tasks = [f"t{i}" for i in range(10)]
    flat = {t: 0.2 for t in tasks}
    assert oracle_shares({"rows": [_row("base", flat), _row("oracle_sft", dict(flat)),
                                   _row("final", dict(flat))]}, "test") == {}
    small_oracle = _row("oracle_sft@20", {"t0": 1.0})
    assert oracle_shares({"rows": [_row("base", flat), small_oracle,
                                   _row("final", dict(flat))]}, "test") == {}


def test_the_loop_recipe_over_training_seeds_is_final_and_each_grpo_seed_row() -> None:
    def row(policy: str, passes: int, split: str = "test") -> dict:
        return {"policy": policy, "split": split, "n": 150, "passes": passes,
                "pass_rate": passes / 150, "recall": {"t0": passes / 100}}

    res = {"training": {"loop": {"config": {"train": {"sft_steps": 8}}}},
           "rows": [row("final", 25), row("grpo_seed1", 22), row("grpo_seed2", 28),
                    row("grpo_seed1", 30, split="dev"), row("sft_equal_compute", 40),
                    row("grpo_seedling", 0)]}
    seeds = grpo_seeds(res, "test")
    assert seeds["seeds"] == [0, 1, 2] and seeds["passes"] == [25, 22, 28]
    assert seeds["pass_rate_mean"] == pytest.approx(25 / 150)
    assert seeds["pass_rate_sd"] == pytest.approx(3 / 150)
    assert seeds["pass_rate_range"] == pytest.approx([22 / 150, 28 / 150])
    assert seeds["recall_mean"] == pytest.approx(0.25)
    # the loop's own seed is the one it was trained with
    res["training"]["loop"]["config"]["train"]["seed"] = 7
    assert grpo_seeds(res, "test")["seeds"] == [1, 2, 7]
    # one seed is not a spread
    assert grpo_seeds(res, "dev") is None
