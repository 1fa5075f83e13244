"""Routing traces: a shared opening run once gives the trace a full forward gives."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trace_lib.compose.gated import GatedMoE, compose
from trace_lib.compose.traces import replay_trajectory, token_roles, trace_prefix
from trace_lib.train.local_rollouts import common_prefix


@pytest.fixture
def moe(tiny_dir: Path, adapter_dirs: list[Path]) -> GatedMoE:
    moe = compose(str(tiny_dir), [(None, p) for p in adapter_dirs])
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # gates that really choose: zero gates route every token to base
        for gate in moe.gates:
            gate.weight.copy_(torch.randn(gate.weight.shape, generator=g) * 2.0)
            gate.bias.copy_(torch.randn(gate.bias.shape, generator=g))
    return moe


def _chat(request: str, reply: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "You are an airline agent. Follow the policy."},
            {"role": "user", "content": request},
            {"role": "assistant", "content": reply}]


def test_traces_sharing_an_opening_equal_full_forwards_in_top1_mode(moe: GatedMoE) -> None:
    """The routing demo traces one environment's replies from one cached opening: every
    token's slot and gate probabilities equal those of the trace that runs it all."""
    moe.set_mode("top1")
    chats = [_chat("Cancel reservation ABC123 please.", "Let me check it first."),
             _chat("Add a bag to reservation XYZ789.", "Which passenger is it for?")]
    rows = [token_roles(moe.tokenizer, c[:2], None, add_generation_prompt=False)[0]
            for c in chats]
    opening = common_prefix(rows)
    prefix = trace_prefix(moe, opening)
    assert prefix is not None and len(opening) > 10
    for chat in chats:
        full = replay_trajectory(moe, chat)
        shared = replay_trajectory(moe, chat, prefix=prefix)
        assert shared.token_ids == full.token_ids and shared.roles == full.roles
        assert (shared.chosen == full.chosen).all()
        assert shared.probs == pytest.approx(full.probs, abs=1e-5)
        assert len(set(full.chosen.ravel().tolist())) > 1  # the gates do route
    # a conversation that does not open that way is traced whole, not from the cache
    other = [{"role": "system", "content": "Another system prompt."}, *chats[0][1:]]
    assert (replay_trajectory(moe, other, prefix=prefix).chosen
            == replay_trajectory(moe, other).chosen).all()
    # trajectory mode pools over the whole request: no opening stands alone
    moe.set_mode("trajectory")
    assert trace_prefix(moe, opening) is None
