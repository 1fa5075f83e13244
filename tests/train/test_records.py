"""The store side of training: which environments the page offers, generated code carried
into a job spec, adapters listed with their held-out pass rates (real DuckDB files)."""

from __future__ import annotations

import json

import pytest

from trace_lib.envs.catalog import save_environment
from trace_lib.envs.registry import EnvSpec
from trace_lib.errors import UserInputError
from trace_lib.train import records
from trace_lib.train.trainer import env_factory

GEN_CODE = "def make_env():\n    raise RuntimeError('never imported in the host')\n"


def test_builtins_offered_only_when_asked_and_approved_always(db_path):
    save_environment(EnvSpec(name="retail/precondition_verification/gen1",
                             capability="precondition_verification", domain="retail",
                             version=1, source="generated", code=GEN_CODE),
                     status="approved", db=db_path)
    approved = records.training_environments(db_path)
    assert [e["name"] for e in approved] == ["retail/precondition_verification/gen1"]
    with_builtins = {e["name"] for e in records.training_environments(db_path, True)}
    assert "airline/precondition_verification" in with_builtins
    assert "retail/precondition_verification/gen1" in with_builtins


def test_generated_environment_code_travels_in_the_spec(db_path):
    save_environment(EnvSpec(name="retail/tool_calling_precision/gen2",
                             capability="tool_calling_precision", domain="retail", version=2,
                             source="generated", code=GEN_CODE), status="approved", db=db_path)
    cfg = records.with_environment_code(db_path, {"env": "retail/tool_calling_precision/gen2"})
    assert cfg["env_code"] == GEN_CODE
    # Built-ins and module references need no code.
    for name in ("airline/tool_calling_precision", "trace_lib.train.smoke_envs:LookupEnv"):
        assert "env_code" not in records.with_environment_code(db_path, {"env": name})
    with pytest.raises(UserInputError, match="nope/none"):
        records.with_environment_code(db_path, {"env": "nope/none"})


def test_env_factory_builds_builtins_and_refuses_unknown_names():
    env = env_factory("retail/precondition_verification")()
    env.reset(3)
    assert env.capability == "precondition_verification" and env.tool_schemas
    with pytest.raises(UserInputError, match="not a built-in"):
        env_factory("retail/not_a_capability")


def test_list_adapters_reads_before_after(db_path):
    result = {"capability": "cap", "env": "e", "adapter_path": "/x/adapter",
              "base_model": "tiny", "final_reward": 0.5, "steps": 3,
              "eval_before": {"pass_rate": 0.25}, "eval_after": {"pass_rate": 0.75}}
    assert records.record_adapter(db_path, result, "job1") == "a_job1"
    records.record_adapter(db_path, result, "job1")  # idempotent
    rows = records.list_adapters(db_path)
    assert len(rows) == 1
    assert (rows[0]["pass_rate_before"], rows[0]["pass_rate_after"]) == (0.25, 0.75)
    assert json.dumps(rows[0], default=str)
