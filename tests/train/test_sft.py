"""Supervised warm start (`local_rollouts.sft`): micro-batches accumulate to the same
update as the whole batch. Real tiny model, real backward passes."""

from __future__ import annotations

import torch

from trace_lib.runtime.base_models import load_model
from trace_lib.runtime.lora import attach_lora, trainable_parameters
from trace_lib.train.config import LoraSettings
from trace_lib.train.local_rollouts import sft
from trace_lib.train.step import TokenForward

torch.set_num_threads(1)


def _demo(tok, prompt: str, answer: str) -> tuple[list[int], list[int]]:
    p = tok(f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n",
            add_special_tokens=False)["input_ids"]
    a = tok(f"{answer}<|im_end|>", add_special_tokens=False)["input_ids"]
    return p + a, [0] * len(p) + [1] * len(a)


def _trained(micro_batch: int | None) -> tuple[list[float], list[torch.Tensor]]:
    base, tok = load_model("tiny")
    model = attach_lora(base, LoraSettings(rank=4, alpha=4, targets=["q_proj", "v_proj"]),
                        seed=0)
    params = trainable_parameters(model)
    # demos of different lengths and answer sizes: padding and per-token normalisation
    demos = [_demo(tok, "hi", "hello there"), _demo(tok, "what is two plus two", "4"),
             _demo(tok, "name a colour", "blue, or green, or a red one"),
             _demo(tok, "count", "one two three four five six")]
    opt = torch.optim.SGD(params, lr=0.5)
    losses = sft(params, opt, demos, TokenForward(model, 1.0), steps=2, batch=4,
                 micro_batch=micro_batch, pad_id=tok.pad_token_id or 0, seed=3,
                 train_mode=lambda on: model.train(on))
    return losses, [p.detach().clone() for p in params]


def test_micro_batches_make_the_same_update_as_the_whole_batch():
    whole_losses, whole = _trained(None)
    micro_losses, micro = _trained(1)
    assert whole_losses[0] > 0
    assert all(abs(a - b) < 1e-4 for a, b in zip(whole_losses, micro_losses, strict=True))
    # the second step starts from the first step's update: equal only if the update was
    for a, b in zip(whole, micro, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert any((p != 0).any() for p in micro)
