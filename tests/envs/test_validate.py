"""Validation accepts every built-in and rejects each kind of broken environment."""

from __future__ import annotations

import copy
import random

import pytest

from trace_lib.envs.capabilities import builtin_pairs, make_capability_env
from trace_lib.envs.capabilities.task_env import TaskEnvironment
from trace_lib.envs.validate import ValidationConfig, compare_tool_schemas, validate_environment

SMALL = ValidationConfig(n_seeds=6, determinism_seeds=2)


@pytest.mark.parametrize(("domain", "capability"), builtin_pairs())
def test_every_builtin_validates(domain, capability):
    report = validate_environment(make_capability_env(domain, capability), SMALL)
    assert report["status"] == "validated", report["errors"]
    figures = report["figures"]
    assert figures["reference_solves"] == 1.0
    assert figures["trivial_null"] <= 0.1 and figures["trivial_random"] <= 0.1
    assert figures["schema_fidelity"] == 1.0 and figures["determinism"] == 1.0
    assert figures["distinct_instances"] >= 0.9


def _base() -> TaskEnvironment:
    return make_capability_env("airline", "precondition_verification")


class RenamedArgument(TaskEnvironment):
    @property
    def tool_schemas(self):
        tools = copy.deepcopy(super().tool_schemas)
        params = tools[0]["function"]["parameters"]["properties"]
        first = sorted(params)[0]
        params[first + "_x"] = params.pop(first)
        return tools


class RetypedArgument(TaskEnvironment):
    @property
    def tool_schemas(self):
        tools = copy.deepcopy(super().tool_schemas)
        for tool in tools:
            props = tool["function"]["parameters"]["properties"]
            if "reservation_id" in props:
                props["reservation_id"] = {"type": "integer"}
        return tools


class InventedTool(TaskEnvironment):
    @property
    def tool_schemas(self):
        extra = {"type": "function", "function": {"name": "refund_everything",
                 "parameters": {"type": "object", "properties": {}}}}
        return super().tool_schemas + [extra]


class GlobalRandomness(TaskEnvironment):
    def reset(self, seed):
        super().reset(random.randrange(10**6))  # ignores the seed: not reproducible


class SameInstanceEverySeed(TaskEnvironment):
    def reset(self, seed):
        super().reset(0)


class LazyReference(TaskEnvironment):
    def reference_action(self):
        return None if self.done else {"content": "ok"}


class GenerousVerifier(TaskEnvironment):
    def summary(self):
        return {**super().summary(), "reward": 1.0, "passed": True}


class OutOfRange(TaskEnvironment):
    def summary(self):
        out = super().summary()
        return {**out, "reward": out["reward"] * 2}


def _make(cls):
    base = _base()
    return cls(base.name, base.capability, base.domain, base._builder, base.config)


@pytest.mark.parametrize(("cls", "failing"), [
    (RenamedArgument, "schema_fidelity"),
    (RetypedArgument, "schema_fidelity"),
    (InventedTool, "schema_fidelity"),
    (GlobalRandomness, "determinism"),
    (SameInstanceEverySeed, "distinct_instances"),
    (LazyReference, "reference_solves"),
    (GenerousVerifier, "trivial_null"),
    (OutOfRange, "reward_range"),
])
def test_broken_environments_are_rejected_with_the_reason(cls, failing):
    report = validate_environment(_make(cls), ValidationConfig(n_seeds=6, determinism_seeds=2))
    assert report["status"] == "rejected"
    assert report["checks"][failing]["passed"] is False
    assert any(e.startswith(failing) for e in report["errors"])


def test_an_exception_in_the_environment_is_a_rejection_not_a_crash():
    class Crashing(TaskEnvironment):
        def step(self, action):
            raise ZeroDivisionError("bug in step")

    report = validate_environment(_make(Crashing), SMALL)
    assert report["status"] == "rejected"
    assert "ZeroDivisionError" in report["checks"]["runtime"]["message"]


def test_schema_comparison_names_the_problem():
    original = make_capability_env("retail", "tool_calling_precision").tool_schemas
    mine = copy.deepcopy(original)
    mine[0]["function"]["parameters"]["properties"].pop(
        sorted(mine[0]["function"]["parameters"]["properties"])[0])
    result = compare_tool_schemas(mine, original)
    assert not result[0]["ok"] and "missing" in result[0]["problems"][0]
    assert all(r["ok"] for r in result[1:])


def test_progress_is_reported():
    seen = []
    validate_environment(_base(), ValidationConfig(n_seeds=3, determinism_seeds=1),
                         progress=lambda done, total: seen.append((done, total)))
    assert seen[-1][0] == seen[-1][1] and len(seen) > 3


@pytest.mark.parametrize("domain", ["airline", "retail"])
def test_builtin_tools_match_tau2_published_schemas(domain, shared_data):
    from trace_lib.envs.validate import tau2_comparison

    env = make_capability_env(domain, "tool_calling_precision")
    result = tau2_comparison(env.tool_schemas, domain)
    assert result is not None and result["problems"] == []
    assert result["matching"] == result["compared"] >= 14


def test_validation_runs_the_loophole_probes():
    from trace_lib.envs.capabilities import make_capability_env
    from trace_lib.envs.validate import ValidationConfig, validate_environment

    env = make_capability_env("airline", "precondition_verification", tools="capability",
                              policy="excerpt", difficulty=1)
    report = validate_environment(env, ValidationConfig(n_seeds=8, determinism_seeds=1))
    for name in ("refuse", "echo", "stuffing", "read_refuse"):
        check = report["checks"][f"loophole_{name}"]
        assert check["passed"] and check["figure"] <= 0.05 and check["threshold"] == "<= 0.05"
    assert report["status"] == "validated", report["errors"]


def test_a_bag_of_words_verifier_fails_the_loophole_probes():
    """A refusal check on generic words alone (the old verifier) is caught."""
    from trace_lib.envs.capabilities import make_capability_env
    from trace_lib.envs.validate import ValidationConfig, validate_environment

    class BagOfWords:
        def __init__(self):
            self._env = make_capability_env("airline", "precondition_verification")

        def __getattr__(self, name):
            return getattr(self._env, name)

        def summary(self):
            s = self._env.summary()
            answer = (self._env.final_answer or "").lower()
            if "sorry" in answer and not any(c["write"] for c in self._env.calls):
                s["reward"] = max(s["reward"], 0.5)
            return s

    import trace_lib.envs.validate as v

    report = validate_environment(BagOfWords(), ValidationConfig(n_seeds=8,
                                                                  determinism_seeds=1))
    assert not report["checks"]["loophole_refuse"]["passed"]
    assert report["status"] == "rejected"
    assert v.ValidationConfig().loophole_max_reward == 0.05


def test_fewer_seeds_than_the_determinism_check_asks_for_still_pass():
    """`env validate --seeds 3` with determinism_seeds=5: the check runs on the 3 seeds
    there are and passes when they all replay the same (it asked for 5 and failed)."""
    report = validate_environment(_base(), ValidationConfig(n_seeds=3, determinism_seeds=5))
    det = report["checks"]["determinism"]
    assert det["seeds"] == 3 and det["figure"] == 1.0 and det["passed"], det
