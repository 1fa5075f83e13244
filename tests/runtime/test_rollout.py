"""The multi-turn rollout loop: token bookkeeping, masks and hint stripping.

The policy here is scripted (it always calls `lookup` and then answers), so that the exact
token layout can be checked; it renders prompts with the real tiny tokenizer and the real
chat template, i.e. what the policy server does. The same loop against the real server
is covered by test_trainer.py.
"""

from __future__ import annotations

import json
import re

import pytest

from trace_lib.runtime.base_models import load_tokenizer  # noqa: E402
from trace_lib.runtime.chat_format import IM_END, format_assistant, render_prompt  # noqa: E402
from trace_lib.runtime.rollout import RolloutConfig, Sample, run_group  # noqa: E402
from trace_lib.train.smoke_envs import LookupEnv  # noqa: E402


class ScriptedPolicy:
    """Turn 1: call lookup(key); turn 2: answer with the tool's value."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.prompts: list[str] = []
        self.sampled_texts: list[str] = []

    def _ids(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    compact = False  # write the call as compact JSON (what small models do)

    def chat(self, messages, tools=None, *, model, n, max_tokens, temperature, seed):
        prompt = render_prompt(messages, tools)
        self.prompts.append(prompt)
        tool_msgs = [m for m in messages if m["role"] == "tool"]
        if not tool_msgs:
            key = re.search(r"value of (k\d+)\?", messages[1]["content"]).group(1)
            call = {"id": "call_1", "type": "function",
                    "function": {"name": "lookup", "arguments": json.dumps({"key": key})}}
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
        else:
            value = json.loads(tool_msgs[-1]["content"])["value"]
            message = {"role": "assistant", "content": f"The value is {value}."}
        text = format_assistant(message.get("content"), message.get("tool_calls")) + IM_END
        if self.compact and message.get("tool_calls"):
            fn = message["tool_calls"][0]["function"]
            body = json.dumps({"name": fn["name"], "arguments": json.loads(fn["arguments"])},
                              separators=(",", ":"))
            text = f"<tool_call>{body}</tool_call>{IM_END}"
            self.sampled_texts.append(text)
        ids = self._ids(text)
        return [Sample(message=message, prompt_token_ids=self._ids(prompt), token_ids=ids,
                       logprobs=[-0.5] * len(ids), finish_reason="stop") for _ in range(n)]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny")  # built once into data/models/tiny (about a second)


def test_multi_turn_sequence_masks_only_sampled_tokens(tokenizer):
    policy = ScriptedPolicy(tokenizer)
    rollouts = run_group(LookupEnv, 3, policy, RolloutConfig(max_turns=4), model="m",
                         group_size=2)
    assert len(rollouts) == 2
    r = rollouts[0]
    assert r.passed and r.reward == 1.0 and r.turns == 2 and r.prefix_mismatches == 0
    assert len(r.token_ids) == len(r.loss_mask) == len(r.sampler_logprobs)
    # The training sequence is exactly the final conversation rendered by the template.
    final = render_prompt(r.messages, LookupEnv().tool_schemas, add_generation_prompt=False)
    assert tokenizer.decode(r.token_ids) == final.rstrip("\n")
    # Masked text = system, user, tool; unmasked text = what the policy produced.
    pairs = list(zip(r.token_ids, r.loss_mask, strict=True))
    sampled = tokenizer.decode([t for t, m in pairs if m])
    assert "<tool_call>" in sampled and "The value is v10." in sampled
    context = tokenizer.decode([t for t, m in pairs if not m])
    assert "<tool_response>" in context and "What is the value of k3?" in context
    assert "<tool_response>" not in sampled and "What is the value" not in sampled
    assert all((lp is None) == (m == 0) for lp, m in zip(r.sampler_logprobs, r.loss_mask, strict=True))


def test_hint_is_seen_in_rollout_but_stripped_before_training(tokenizer):
    policy = ScriptedPolicy(tokenizer)
    rollouts = run_group(LookupEnv, 5, policy, RolloutConfig(), model="m", group_size=4,
                         n_hinted=2)
    hinted = [r for r in rollouts if r.hinted]
    plain = [r for r in rollouts if not r.hinted]
    assert len(hinted) == 2 and len(plain) == 2
    assert "Hint: call lookup first" in hinted[0].messages[1]["content"]
    assert any("Hint: call lookup first" in p for p in policy.prompts)
    # After stripping, a hinted rollout trains on the same tokens as a plain one.
    assert hinted[0].token_ids == plain[0].token_ids
    assert hinted[0].loss_mask == plain[0].loss_mask
    assert "Hint" not in tokenizer.decode(hinted[0].token_ids)


def test_max_turns_truncates(tokenizer):
    policy = ScriptedPolicy(tokenizer)
    r = run_group(LookupEnv, 1, policy, RolloutConfig(max_turns=1), model="m", group_size=2)[0]
    assert r.truncated and r.turns == 1 and r.reward == 0.0


def test_parallel_rollouts_batch_on_the_server_and_match_sequential(tokenizer):
    """`parallel=True` through the real CPU server: the seeded rollouts are token for token
    those of the sequential path, however the server happened to batch the requests (that
    seeded requests batch at all is tested on the engine in test_policy_server.py)."""
    from trace_lib.runtime.policy_client import OpenAIPolicyClient
    from trace_lib.runtime.policy_server import PolicyServer, ServerConfig

    cfg = RolloutConfig(max_turns=3, max_tokens=12)
    with PolicyServer(ServerConfig(model="tiny", served_model_name="tiny",
                                   torch_threads=1)) as srv:
        client = OpenAIPolicyClient(srv.base_url)
        try:
            seq = run_group(LookupEnv, 7, client, cfg, model="tiny", group_size=4, n_hinted=2,
                            request_seed=123)
            par = run_group(LookupEnv, 7, client, cfg, model="tiny", group_size=4, n_hinted=2,
                            request_seed=123, parallel=True)
        finally:
            client.close()
    assert [r.token_ids for r in par] == [r.token_ids for r in seq]
    assert [r.loss_mask for r in par] == [r.loss_mask for r in seq]
    assert [r.hinted for r in par] == [True, True, False, False]
    assert [r.reward for r in par] == [r.reward for r in seq]


def test_compact_json_call_keeps_its_sampled_tokens_in_the_loss(tokenizer):
    """The template re-renders a compact call with canonical spacing; the rollout must keep
    the sampled ids (mask 1) and append only the new tool turn, never the re-rendering."""
    policy = ScriptedPolicy(tokenizer)
    policy.compact = True
    [r] = run_group(LookupEnv, 3, policy, RolloutConfig(max_turns=4), model="m", group_size=1)
    assert r.passed and r.prefix_mismatches == 0 and r.rerendered_turns == 1
    sampled = policy._ids(policy.sampled_texts[0])
    # the compact call's ids sit in the sequence exactly as sampled, all in the loss
    starts = [i for i in range(len(r.token_ids)) if r.token_ids[i:i + len(sampled)] == sampled]
    assert len(starts) == 1
    i = starts[0]
    assert r.loss_mask[i:i + len(sampled)] == [1] * len(sampled)
    # what follows is the tool turn (not in the loss), then the answer (in the loss)
    rest = tokenizer.decode(r.token_ids[i + len(sampled):])
    assert rest.startswith("\n<|im_start|>user\n<tool_response>")
    # and the whole sequence is the first prompt, the samples and the new turns only
    text = tokenizer.decode(r.token_ids)
    assert '{"name":"lookup"' in text and '<tool_call>\n{"name": "lookup"' not in text
