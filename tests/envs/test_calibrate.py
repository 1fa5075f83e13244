"""Calibration figures: pass@k, group shares, the band; a policy served over HTTP."""

from __future__ import annotations

import json

import pytest

from trace_lib.envs.calibrate import CalibrationConfig, calibrate, group_figures, pass_at_k
from trace_lib.envs.capabilities import make_capability_env
from trace_lib.envs.policies import make_policy
from trace_lib.errors import UserInputError


@pytest.mark.parametrize(("n", "c", "k", "want"), [
    (16, 0, 1, 0.0), (16, 16, 16, 1.0), (4, 1, 1, 0.25), (4, 1, 4, 1.0), (4, 2, 2, 5 / 6),
    (16, 1, 8, 0.5),
])
def test_pass_at_k(n, c, k, want):
    assert pass_at_k(n, c, k) == pytest.approx(want)


def test_group_figures_and_band():
    def g(*rewards):
        return [{"reward": r, "passed": r == 1.0} for r in rewards]

    groups = [g(1, 1, 1, 1), g(0, 0, 0, 0), g(0, 1, 0.5, 0), g(0.5, 0.5, 0.5, 0.5)]
    fig = group_figures(groups, CalibrationConfig(group=4))
    assert fig["all_success_share"] == 0.25
    assert fig["all_fail_share"] == 0.5  # the constant 0.5 group never passes either
    assert fig["informative_share"] == 0.25
    assert fig["mean_reward"] == pytest.approx(sum(r for x in groups for r in
                                                   (y["reward"] for y in x)) / 16)
    assert sum(fig["histogram"]["counts"]) == 16
    assert fig["pass@1"] == pytest.approx((1 + 0 + 0.25 + 0) / 4)
    assert "pass@8" not in fig  # k larger than the group is not estimable
    assert not fig["in_band"]
    assert any("informative" in m for m in fig["band_misses"])


def test_reference_policy_is_flagged_as_too_easy():
    env = make_capability_env("airline", "precondition_verification")
    result = calibrate(env, "reference", CalibrationConfig(seeds=3, group=2))
    assert result["mean_reward"] == 1.0 and result["all_success_share"] == 1.0
    assert not result["in_band"]
    assert any("all-success" in m for m in result["band_misses"])


def test_epsilon_policy_gives_informative_groups():
    env = make_capability_env("retail", "precondition_verification")
    seen = []
    result = calibrate(env, "epsilon:0.4", CalibrationConfig(seeds=4, group=6),
                       progress=lambda d, t: seen.append(d))
    assert seen[-1] == 24
    assert 0.0 < result["mean_reward"] < 1.0
    assert result["informative_share"] > 0.0
    assert sum(result["histogram"]["counts"]) == 24


def test_policy_over_the_chat_completions_api(scripted_llm):
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_user_details", "arguments": json.dumps({"user_id": "x"})}}
    scripted_llm.script = [{"content": None, "tool_calls": [call]},
                           {"content": "I'm sorry, I cannot cancel that reservation."}]
    env = make_capability_env("airline", "precondition_verification")
    result = calibrate(env, f"openai:test-policy@{scripted_llm.url}/v1",
                       CalibrationConfig(seeds=4, group=2))
    first, second = scripted_llm.requests[0], scripted_llm.requests[1]
    assert first["model"] == "test-policy"
    assert {t["function"]["name"] for t in first["tools"]} >= {"cancel_reservation"}
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert second["messages"][-1]["role"] == "tool"
    assert second["messages"][-1]["content"].startswith("Error: user x not found")
    # never reads the reservation: refusals earn half on ineligible seeds, nothing else
    assert 0.0 <= result["mean_reward"] <= 0.5
    assert len(scripted_llm.requests) == 4 * 2 + 1


def test_unknown_policy_is_a_clear_error():
    with pytest.raises(UserInputError, match="--policy 'gpt'"):
        make_policy("gpt")
