"""Helpers shared by the policy-server and vLLM tests: real tiny models and real adapters."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import torch

from trace_lib.runtime import base_models as models
from trace_lib.runtime.chat_format import IM_END, format_assistant

TOOLS = [{"type": "function", "function": {
    "name": "get_user", "description": "Look a user up.",
    "parameters": {"type": "object", "properties": {"user_id": {"type": "string"}}}}}]
ASK = [{"role": "user", "content": "Find user u1"}]
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@contextmanager
def private_models_dir(path: Path):
    """TRACE_MODELS_DIR -> `path` and one torch thread (tiny models on a busy CPU)."""
    old = os.environ.get("TRACE_MODELS_DIR")
    os.environ["TRACE_MODELS_DIR"] = str(path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield path
    finally:
        torch.set_num_threads(threads)
        if old is None:
            os.environ.pop("TRACE_MODELS_DIR", None)
        else:
            os.environ["TRACE_MODELS_DIR"] = old


def build_tool_model(out: Path) -> Path:
    """The tiny model fine-tuned for real (~100 full steps) to answer ASK with a tool call."""
    model, tok = models.load_model("tiny")
    model.train()
    prompt = tok.apply_chat_template(ASK, tools=TOOLS, add_generation_prompt=True,
                                     tokenize=True, return_dict=True)["input_ids"]
    target = "Sure.\n" + format_assistant(
        None, [{"function": {"name": "get_user", "arguments": {"user_id": "u1"}}}]) + IM_END
    ids = torch.tensor([prompt + tok.encode(target, add_special_tokens=False)])
    labels = ids.clone()
    labels[0, :len(prompt)] = -100
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(300):
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        if loss.item() < 0.02:
            break
    assert loss.item() < 0.05, f"tool-call fine-tune did not converge: loss {loss.item()}"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def make_lora(base_dir: Path, out_dir: Path, seed: int, lr: float = 0.05) -> Path:
    """A peft LoRA saved after one real AdamW step on some tokens (so every B is nonzero)."""
    from peft import LoraConfig, get_peft_model

    model, _ = models.load_model(str(base_dir))
    torch.manual_seed(seed)
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16,
                                                  target_modules=LORA_TARGETS))
    opt = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=lr)
    ids = torch.randint(3, 900, (2, 24), generator=torch.Generator().manual_seed(seed))
    peft_model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    assert all(float(p.detach().abs().sum()) > 0
               for n, p in peft_model.named_parameters() if "lora_B" in n)
    peft_model.save_pretrained(out_dir)
    return out_dir


def teacher_forced_logprobs(model, prompt_ids: list[int], completion_ids: list[int],
                            temperature: float = 1.0):
    """Logprob of each completion token under `model` at `temperature`, from one forward
    pass (what the trainer's loss computes)."""
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)])
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0].float() / temperature
        logp = torch.log_softmax(logits, dim=-1)
    n = len(prompt_ids)
    return [float(logp[n - 1 + i, t]) for i, t in enumerate(completion_ids)]
