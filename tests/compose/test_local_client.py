"""Composition resolves environments through the registry: generated (file / code)
environments run in the sandbox, and errors are never swallowed."""

from __future__ import annotations

import pytest
from envs_fixture import file_env_code, generated_spec, write_file_env

from trace_lib.compose.gated import compose
from trace_lib.errors import UserInputError


def test_composition_evaluates_a_generated_environment_file(tiny_dir, adapter_dirs,
                                                            tmp_path) -> None:
    from trace_lib.compose.evaluate import EvalConfig, evaluate_composition
    from trace_lib.compose.local_client import env_factory, route_env

    path = str(write_file_env(tmp_path))
    env = env_factory(path)()
    try:
        assert type(env).__name__ == "SandboxedEnvironment"  # never imported in-process
        env.reset(3)
        assert env.messages[-1]["content"] == "say 3"
    finally:
        env.close()
    moe = compose(str(tiny_dir), [(None, p) for p in adapter_dirs[:2]])
    rows = evaluate_composition(moe, EvalConfig(envs=[path], seeds=2, max_tokens=3,
                                                max_turns=1))
    assert {r["env"] for r in rows} == {path} and all(r["n"] == 2 for r in rows)
    trace = route_env(moe, path, seed=1, force=2, max_tokens=3, max_turns=1)
    assert trace.meta["env"] == path and (trace.chosen == 2).all()


def test_environment_errors_are_raised_not_swallowed(tmp_path) -> None:
    from trace_lib.compose.local_client import env_factory

    with pytest.raises(UserInputError, match="no such environment module file"):
        env_factory(str(tmp_path / "missing.py"))
    with pytest.raises(UserInputError, match="expected DOMAIN/CAPABILITY"):
        env_factory("nonsense")
    with pytest.raises(UserInputError, match="never reads the store"):
        env_factory("airline/precondition_verification/gen7")


def test_a_stored_generated_environment_builds_from_the_spec_the_app_resolved(db_path) -> None:
    """Composition never reads the store: the use case resolves a stored environment to
    its serialised spec (`workbench.environments.env_specs`) and the stage builds it."""
    from trace_lib.compose.local_client import env_factory
    from trace_lib.envs.catalog import save_environment
    from trace_lib.workbench.environments import env_specs

    spec = generated_spec("toy/say_seed/gen1")
    save_environment(spec, "approved", db=db_path)
    specs = env_specs(["toy/say_seed/gen1", "airline/precondition_verification"], db=db_path)
    assert specs["toy/say_seed/gen1"]["code"] == file_env_code("toy/say_seed/gen1")
    assert specs["airline/precondition_verification"]["source"] == "builtin"
    env = env_factory("toy/say_seed/gen1", env_spec=specs["toy/say_seed/gen1"])()
    try:
        env.reset(5)
        assert env.messages[-1]["content"] == "say 5"
    finally:
        env.close()
    with pytest.raises(UserInputError, match="never reads the store"):
        env_factory("toy/say_seed/gen1")  # a stored name without its spec


def test_batched_greedy_episodes_are_the_sequential_ones(tiny_dir, adapter_dirs,
                                                         monkeypatch) -> None:
    """`greedy_episodes` decodes several episodes' turns in one generate call, their shared
    prompt prefix prefilled once: each episode (transcript, tokens, turns, verdict) is the
    one a sequential greedy rollout gives, under a forced slot and under a mix."""
    from trace_lib.compose import local_client
    from trace_lib.compose.local_client import LocalMoEClient, greedy_episodes
    from trace_lib.envs import registry
    from trace_lib.runtime.rollout import RolloutConfig, run_group

    moe = compose(str(tiny_dir), [(None, p) for p in adapter_dirs[:2]])
    make_env = registry.env_factory(registry.require_static(
        "airline/precondition_verification"), options={"tools": "capability", "difficulty": 1})
    cfg = RolloutConfig(max_turns=2, max_tokens=6, max_sequence=4096, temperature=0.0)
    seeds = [20_000, 20_001, 20_002]
    cuts = []

    def shared_prefix(rows, least=16):
        cuts.append(local_client_shared(rows, least))
        return cuts[-1]

    local_client_shared = local_client._shared_prefix
    monkeypatch.setattr(local_client, "_shared_prefix", shared_prefix)
    for routing in ({"force": 1}, {"mix": [0.0, 0.5, 0.5]}):
        batched = greedy_episodes(moe, [(make_env, s, cfg) for s in seeds], **routing)
        for s, got in zip(seeds, batched, strict=True):
            alone = run_group(make_env, s, LocalMoEClient(moe, **routing), cfg, model="moe",
                              group_size=1, request_seed=s)[0]
            assert got.messages == alone.messages and got.turns == alone.turns
            assert (got.reward, got.passed, got.reasons) == (alone.reward, alone.passed,
                                                              alone.reasons)
            assert got.token_ids == alone.token_ids
    assert cuts and min(cuts) > 100  # the system + tools prefix came from the cache
