"""`trainer.env_factory`: the constructor a training job builds its environment with."""

from __future__ import annotations

import pytest

from trace_lib.errors import UserInputError
from trace_lib.train.trainer import env_factory


def test_env_factory_builds_builtins_and_refuses_unknown_names():
    env = env_factory("retail/precondition_verification")()
    env.reset(3)
    assert env.capability == "precondition_verification" and env.tool_schemas
    with pytest.raises(UserInputError, match="not a built-in"):
        env_factory("retail/not_a_capability")
