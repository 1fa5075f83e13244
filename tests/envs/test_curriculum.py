"""The curriculum schedule: one axis at a time, every level buildable and trainable by the
paths that build a built-in (make_capability_env, the registry, TrainConfig, the CLI)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from trace_lib.envs.capabilities import make_capability_env
from trace_lib.envs.capabilities.target_shaped import TargetShapedEnvironment
from trace_lib.envs.curriculum import CURRICULUM, DIFFICULTIES, Level
from trace_lib.envs.registry import env_factory, require_static
from trace_lib.errors import UserInputError
from trace_lib.train.config import TrainConfig


def test_the_schedule_runs_from_today_to_the_target_shape_one_axis_at_a_time():
    levels = CURRICULUM.as_list()
    assert levels[0] == (1, "capability", "excerpt")
    assert levels[-1] == (5, "all", "full")
    for a, b in zip(levels, levels[1:], strict=False):
        assert sum(x != y for x, y in zip(a, b, strict=True)) == 1, (a, b)
        assert b[0] >= a[0]  # difficulty never goes back
    # After today's difficulty 3: tools, then policy, then the task source, then reads.
    assert levels[2:] == [(3, "capability", "excerpt"), (3, "all", "excerpt"),
                          (3, "all", "full"), (4, "all", "full"), (5, "all", "full")]
    assert {lv.difficulty for lv in CURRICULUM.levels} == set(DIFFICULTIES)


def test_retail_keeps_the_levels_it_has():
    assert [lv.difficulty for lv in CURRICULUM.for_domain("retail")] == [1, 2, 3, 3, 3]
    assert CURRICULUM.for_domain("airline") == CURRICULUM.levels


@pytest.mark.parametrize("level", CURRICULUM.levels, ids=lambda lv: lv.name)
def test_every_level_builds_and_its_reference_solves(level: Level):
    from trace_lib.envs.policies import make_policy, run_episode

    env = make_capability_env("airline", "precondition_verification", **level.options)
    assert isinstance(env, TargetShapedEnvironment) == (level.difficulty >= 4)
    summary = run_episode(env, 1, make_policy("reference"))
    assert summary["passed"] and summary["reward"] == 1.0


def test_training_reaches_the_target_shaped_level_by_name_and_difficulty():
    cfg = TrainConfig.from_dict({"env": "airline/tool_calling_precision", "difficulty": 5,
                                 "tools": "all", "policy": "full", "max_turns": 12})
    from trace_lib.train.trainer import build_options

    make = env_factory(require_static(cfg.env), options=build_options(cfg))
    env = make()
    assert isinstance(env, TargetShapedEnvironment) and env.config.difficulty == 5
    with pytest.raises(UserInputError, match="difficulty"):
        TrainConfig.from_dict({"env": "airline/tool_calling_precision", "difficulty": 6})
    with pytest.raises(UserInputError, match="max_turns"):  # would cut the reference short
        TrainConfig.from_dict({"env": "airline/tool_calling_precision", "difficulty": 5})
    with pytest.raises(UserInputError, match="airline only"):
        env_factory(require_static("retail/tool_calling_precision"),
                    options={"difficulty": 4})


def test_the_cli_takes_difficulty_5(tmp_path):
    env = {"TRACE_DB": str(tmp_path / "t.duckdb"), "HF_HUB_OFFLINE": "1",
           "PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-m", "trace_lib", "env", "sample",
                          "airline/structured_data_reasoning", "--difficulty", "5",
                          "--seed", "2"], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert '"difficulty": 5' in out.stdout and "get_user_details" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "trace_lib", "env", "sample",
                          "retail/structured_data_reasoning", "--difficulty", "5"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode != 0 and "airline only" in (bad.stderr + bad.stdout)


def test_the_cli_offers_every_difficulty():
    from trace_lib.cli import build_parser
    from trace_lib.cli import envs as cli_envs
    from trace_lib.cli import train as cli_train

    assert cli_envs.DIFFICULTIES is cli_train.DIFFICULTIES == DIFFICULTIES  # one home in cli
    args = build_parser().parse_args(["train", "--env", "airline/tool_calling_precision",
                                      "--difficulty", "5", "--max-turns", "10"])
    assert args.difficulty == 5


def test_a_difficulty_outside_the_schedule_is_refused():
    with pytest.raises(ValueError, match="difficulty"):
        make_capability_env("airline", "tool_calling_precision", difficulty=6)
