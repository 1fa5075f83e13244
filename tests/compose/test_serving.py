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
    from trace_lib.runtime.rollout import OpenAIChatClient

    compose(str(tiny_dir), [(None, p) for p in adapter_dirs], out=tmp_path / "moe")
    record = tmp_path / "traces"
    with MoEPolicyServer(tmp_path / "moe", record_dir=record, port=0, torch_threads=1) as srv:
        client = OpenAIChatClient(srv.url)
        try:
            samples = client.chat([{"role": "user", "content": "hello"}], None,
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
