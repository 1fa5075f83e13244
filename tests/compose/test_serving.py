"""The composed model behind the project's policy server: same API, traced completions."""

from __future__ import annotations

from pathlib import Path

import pytest

from trace_lib.compose.gated import compose
from trace_lib.compose.serving import MoEPolicyServer, chatml_roles
from trace_lib.compose.traces import RoutingTrace, token_roles


def test_chatml_roles_match_the_template_roles(tiny_dir) -> None:
    from trace_lib.runtime.base_models import load_tokenizer

    tok = load_tokenizer(str(tiny_dir))
    messages = [{"role": "system", "content": "Policy."},
                {"role": "user", "content": "Cancel ABC123"},
                {"role": "assistant", "content": "",
                 "tool_calls": [{"id": "c1", "type": "function",
                                 "function": {"name": "get", "arguments": {"id": "ABC123"}}}]},
                {"role": "tool", "tool_call_id": "c1", "name": "get", "content": "{\"ok\": 1}"},
                {"role": "assistant", "content": "Done."}]
    ids, roles, turns = token_roles(tok, messages, add_generation_prompt=False)
    got_roles, got_turns = chatml_roles([tok.decode([i]) for i in ids])
    assert set(roles) == {"system", "user", "assistant", "tool"}
    assert got_roles == roles and got_turns == turns


def test_server_answers_like_any_policy_and_records_traces(tiny_dir, adapter_dirs,
                                                           tmp_path) -> None:
    from trace_lib.runtime.policy_client import OpenAIPolicyClient

    compose(str(tiny_dir), [(None, p) for p in adapter_dirs], out=tmp_path / "moe")
    record = tmp_path / "traces"
    with MoEPolicyServer(tmp_path / "moe", record_dir=record, port=0, torch_threads=1) as srv:
        client = OpenAIPolicyClient(srv.url)
        try:
            samples = client.chat([{"role": "user", "content": "hello"}], tools=None,
                                  model=srv.model_name, n=2, max_tokens=5, temperature=1.0,
                                  seed=3)
        finally:
            client.close()
    assert len(samples) == 2 and all(len(s.token_ids) == len(s.logprobs) for s in samples)
    files = sorted(record.glob("*.npz"))
    assert len(files) == 2
    trace = RoutingTrace.load(files[0])
    n_prompt = len(samples[0].prompt_token_ids)
    assert trace.prompt_len == n_prompt
    assert trace.token_ids[:n_prompt] == samples[0].prompt_token_ids
    assert trace.token_ids[n_prompt:] in ([s.token_ids for s in samples])
    assert set(trace.roles[:n_prompt]) >= {"user"} and trace.roles[-1] == "assistant"


@pytest.mark.parametrize("missing", ["nope"])
def test_server_refuses_a_folder_that_is_not_composed(tmp_path: Path, missing: str) -> None:
    from trace_lib.errors import UserInputError

    with pytest.raises(UserInputError, match="moe.json"):
        MoEPolicyServer(tmp_path / missing, port=0).start()


def _episodes_and_one_completion(srv, make_env, seed: int, group_size: int, max_turns: int,
                                 max_tokens: int):
    """`group_size` episodes of `make_env` at `seed` through the served model (the rollout
    loop over HTTP), then one raw greedy completion of its opening request (the routing)."""
    import httpx

    from trace_lib.runtime.policy_client import OpenAIPolicyClient
    from trace_lib.runtime.rollout import RolloutConfig, run_group

    client = OpenAIPolicyClient(srv.url)
    try:
        rollouts = run_group(make_env, seed, client, RolloutConfig(max_turns=max_turns,
                                                                   max_tokens=max_tokens),
                             model=srv.model_name, group_size=group_size, request_seed=1)
    finally:
        client.close()
    env = make_env()
    env.reset(seed)
    body = {"model": srv.model_name, "messages": env.messages, "tools": env.tool_schemas,
            "max_tokens": 4, "temperature": 0.0}
    return rollouts, httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=600).json()


def test_an_environment_episode_runs_through_the_served_composition(tiny_dir, adapter_dirs,
                                                                    tmp_path) -> None:
    """moe-serve's server, trained-looking gates in trajectory mode, a tool environment:
    the rollout loop talks to it over HTTP like any policy (tools in the request, tool
    calls parsed back), and every completion carries its routing."""
    import torch

    from trace_lib.compose.gated import load_moe
    from trace_lib.train.smoke_envs import LookupEnv

    moe = compose(str(tiny_dir), [(None, p) for p in adapter_dirs[:2]])
    with torch.no_grad():
        for gate in moe.gates:  # a gate that prefers slot 2 everywhere
            gate.bias.copy_(torch.tensor([0.0, 0.0, 3.0]))
    moe.config.mode = "trajectory"
    moe.save(tmp_path / "moe")
    assert load_moe(tmp_path / "moe").config.mode == "trajectory"
    record = tmp_path / "traces"
    with MoEPolicyServer(tmp_path / "moe", record_dir=record, port=0, torch_threads=1) as srv:
        rollouts, data = _episodes_and_one_completion(srv, LookupEnv, 3, group_size=2,
                                                      max_turns=2, max_tokens=6)
    assert len(rollouts) == 2 and all(r.turns >= 1 and r.n_sampled > 0 for r in rollouts)
    tool_text = "\n".join(str(t) for t in [moe.tokenizer.decode(rollouts[0].token_ids)])
    assert '"name": "lookup"' in tool_text  # the tools block reached the served prompt
    choice = data["choices"][0]
    assert "tool_calls" in choice["message"]  # tools requested -> the tool-call field
    routing = choice["routing"]
    assert routing["slots"] == moe.slots and routing["mode"] == "trajectory"
    assert routing["request_slot"] == 2 and set(routing["request_choice"]) == {2}
    assert routing["completion_share"][2] == 1.0
    assert routing["trace_id"] in data["routing_trace_ids"]
    calls = sum(r.turns for r in rollouts) + 1
    assert len(list(record.glob("*.npz"))) == calls  # one trace per completion


def test_the_composed_smollm2_model_serves_an_airline_episode(tmp_path, adapter_maker) -> None:
    """The real small instruct model, composed with two LoRA adapters behind gates that
    prefer the second in trajectory mode, served by moe-serve's server: an airline
    capability episode (the SmolLM2-sized prompt: difficulty 1, the capability's tools, the
    policy excerpt) rolls through it over HTTP and every completion says where it went."""
    import torch

    from trace_lib.envs.capabilities import make_capability_env
    from trace_lib.runtime.base_models import ensure_model_dir

    base = ensure_model_dir("smollm2-135m")
    adapters = [adapter_maker(base, tmp_path / cap, seed=i, targets=["q_proj", "v_proj"],
                             capability=cap)
                for i, cap in enumerate(["tool_calling_precision", "precondition_verification"])]
    moe = compose(str(base), [(None, p) for p in adapters])
    with torch.no_grad():
        for gate in moe.gates:
            gate.bias.copy_(torch.tensor([0.0, 0.0, 3.0]))
    moe.config.mode = "trajectory"
    moe.save(tmp_path / "moe")

    def make_env():
        return make_capability_env("airline", "tool_calling_precision", difficulty=1,
                                   tools="capability", policy="excerpt", distractors=1)

    with MoEPolicyServer(tmp_path / "moe", port=0, torch_threads=1) as srv:
        (rollout,), data = _episodes_and_one_completion(srv, make_env, 0, group_size=1,
                                                        max_turns=1, max_tokens=8)
    assert rollout.turns == 1 and rollout.n_sampled > 0
    assert len(rollout.token_ids) > 1000  # the whole airline prompt went through the gates
    routing = data["choices"][0]["routing"]
    assert routing["slots"] == ["base", "tool_calling_precision", "precondition_verification"]
    assert routing["request_slot"] == 2 and set(routing["request_choice"]) == {2}
    assert len(routing["request_choice"]) == 30  # SmolLM2's 30 blocks, each gated
