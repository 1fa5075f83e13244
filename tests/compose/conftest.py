"""Fixtures for the compose tests: the training stage's `tiny` Llama and real PEFT adapters.

Adapters are made the way the training stage makes them (peft `get_peft_model` +
`save_pretrained`), with B drawn at random instead of zero so every adapter really changes
the model's output and the routing is visible in the logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

TARGETS_ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(base_dir: Path, out: Path, seed: int, targets: list[str] | None = None,
                 rank: int = 4, alpha: int = 8, capability: str | None = None) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # see one_torch_thread below
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets or TARGETS_ALL,
                        lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, config)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.3)
    peft_model.save_pretrained(str(out))
    torch.set_num_threads(previous)
    if capability:
        (out / "trace_adapter.json").write_text(json.dumps({"capability": capability}))
    return out


@pytest.fixture(scope="session")
def tiny_dir() -> Path:
    from trace_lib.runtime.base_models import ensure_model_dir

    return ensure_model_dir("tiny")


@pytest.fixture(scope="session")
def adapter_factory():
    """`make_adapter` for a test that lays out its own folders (test modules cannot import
    a conftest by name)."""
    return make_adapter


@pytest.fixture(scope="session")
def adapter_dirs(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("adapters")
    caps = ["precondition_verification", "tool_calling_precision", "structured_reasoning"]
    out = []
    for i, cap in enumerate(caps):
        # The third adapter skips the MLP, as an adapter trained elsewhere might.
        targets = ["q_proj", "v_proj", "o_proj"] if i == 2 else None
        out.append(make_adapter(tiny_dir, root / cap, seed=100 + i, targets=targets,
                                capability=cap))
    return out


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models run fastest on one thread; two threads spin against each other on a
    busy 2-core CI machine (measured: 1 ms vs up to 1 s per tiny forward)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def adapter_maker():
    """`make_adapter`, for tests that need adapters on another base (SmolLM2)."""
    return make_adapter
