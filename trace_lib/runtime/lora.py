"""LoRA on a frozen base through peft, saved in the form vLLM serves as it is.

Design decisions
- peft does the LoRA work (injection, scaling, saving); this module only fixes the
  settings the workbench uses and the on-disk form. Defaults are the reference ones:
  r=16, alpha=16, targets q/k/v/o/gate/up/down, no dropout (dropout makes the training
  forward differ from the rollout forward, which GRPO's ratio then reads as drift).
- Targets that the model does not have are dropped with the list of what was kept in the
  saved config, rather than failing: a GPT-2 style test model has no `gate_proj`. None
  kept is an error that names the model's linear layers.
- A saved adapter is exactly what `PeftModel.save_pretrained` writes (adapter_config.json
  + adapter_model.safetensors) with `base_model_name_or_path` set to what the server
  serves, so `vllm serve BASE --enable-lora` and `/v1/load_lora_adapter` take the folder
  unchanged. Trainer state (optimizer, RNG) goes into a separate file beside it, which
  vLLM ignores.
- `LoraSettings` (the dataclass a training config nests) lives here with the code that
  reads it; torch and peft are imported inside the functions, so `train.config` (which the
  Training page and the CLI import to build and check settings) still pulls in neither.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from peft import PeftModel

DEFAULT_TARGETS: tuple[str, ...] = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)


@dataclass
class LoraSettings:
    rank: int = 16
    alpha: int = 16
    dropout: float = 0.0
    targets: list[str] = field(default_factory=lambda: list(DEFAULT_TARGETS))


def _linear_names(model: torch.nn.Module) -> set[str]:
    import torch

    return {
        name.rsplit(".", 1)[-1]
        for name, mod in model.named_modules()
        if isinstance(mod, torch.nn.Linear) and name
    }


def attach_lora(model: torch.nn.Module, settings: LoraSettings, *, seed: int = 0) -> PeftModel:
    """Freeze `model` and wrap it with a fresh LoRA adapter named "default".

    `seed` fixes the A-matrix initialisation, so two runs with the same seed start from the
    same adapter (needed for checkpoint/resume equivalence).
    """
    import torch
    from peft import LoraConfig, get_peft_model

    available = _linear_names(model)
    targets = [t for t in settings.targets if t in available]
    if not targets:
        raise ValueError(
            f"none of the LoRA targets {settings.targets} is a linear layer of this model; "
            f"its linear layers are {sorted(available)}"
        )
    for p in model.parameters():
        p.requires_grad_(False)
    config = LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        peft_model = get_peft_model(model, config)
    finally:
        torch.random.set_rng_state(state)
    return peft_model


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def save_adapter(model: PeftModel, path: str | Path, base_model: str) -> Path:
    """Write the adapter folder vLLM loads; `base_model` is what the server serves."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    config_path = out / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = base_model
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True))
    return out


def load_adapter_weights(model: PeftModel, path: str | Path) -> None:
    """Load a saved adapter's weights into the (already attached) "default" adapter."""
    from peft.utils import set_peft_model_state_dict
    from safetensors.torch import load_file

    weights = Path(path) / "adapter_model.safetensors"
    if not weights.exists():
        raise FileNotFoundError(f"{weights}: no adapter weights here")
    result = set_peft_model_state_dict(model, load_file(str(weights)))
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise ValueError(f"{weights}: keys that are not in this model's adapter: {unexpected[:5]}")

