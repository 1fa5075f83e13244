"""The distance of each curriculum level to the dev target tasks, measured (SmolLM2's
tokenizer, reference episodes): the schedule gets no farther from the target as it goes."""

from __future__ import annotations

import pytest

from trace_lib.envs.capabilities import make_capability_env
from trace_lib.envs.curriculum import CURRICULUM
from trace_lib.evaluate.env_distance import FIGURES, curriculum_distance, request_template

CAPS = ("multi_step_task_completion", "precondition_verification",
        "structured_data_reasoning", "tool_calling_precision")


def test_a_template_masks_values_not_phrasing():
    a = request_template("I'm user mia_li_3139. Cancel PIPER0 for Mia Li (visa ending in "
                         "1234), born 1990-01-02, in basic economy, 2 bags. Insurance: yes.")
    b = request_template("I'm user noah_kim_12. Cancel ZXCVBN for Noah Kim (amex ending in "
                         "99), born 1985-12-31, in business, 1 bag. Insurance: no.")
    assert a == b and "#" in a and "ID" in a and "NAME" in a and "CABIN" in a
    assert request_template("Please cancel it.") != request_template("Can you cancel it?")
    env = make_capability_env("airline", "structured_data_reasoning", difficulty=1)
    env.reset(0)
    first = request_template(env.messages[1]["content"])
    env.reset(1)
    assert request_template(env.messages[1]["content"]) == first  # one template at 1


@pytest.fixture(scope="module")
def measured():
    return curriculum_distance("airline", seeds=8, capabilities=CAPS, split="dev")


def _mean_gap(row):
    return sum(row["gap"].values()) / len(row["gap"])


@pytest.mark.slow
def test_the_schedule_never_moves_away_from_the_target(measured):
    for cap in CAPS:
        rows = [r for r in measured["levels"] if r["capability"] == cap]
        assert [(r["difficulty"], r["tools"], r["policy"]) for r in rows] == \
            CURRICULUM.as_list()
        gaps = [_mean_gap(r) for r in rows]
        # Today's difficulty 1 -> 3 moves within the capability builders' task family and
        # may wobble a little; every move this schedule adds after it (tools, policy, task
        # source, reads) must bring the level strictly closer.
        for i, (a, b) in enumerate(zip(gaps, gaps[1:], strict=False)):
            assert b <= a + 0.05, (cap, i, gaps)
            if i >= 2:
                assert b < a, (cap, i, gaps)
        assert gaps[-1] == min(gaps) and gaps[-1] < 0.15, (cap, gaps)


@pytest.mark.slow
def test_the_last_level_has_the_target_tasks_shape(measured):
    for cap in CAPS:
        last = [r for r in measured["levels"] if r["capability"] == cap][-1]
        target = measured["targets"][cap]
        assert last["tools_shown"] == target["tools_shown"] == 15
        assert abs(last["prompt_tokens"] - target["prompt_tokens"]) / target[
            "prompt_tokens"] < 0.03
        assert last["reads_before_write"] >= 1 and last["reference_turns"] >= 3
        assert last["templates"] >= 5
        assert set(last["gap"]) == set(FIGURES)
