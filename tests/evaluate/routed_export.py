"""A `moe-merge --per-request` export on the tiny model whose gates send every request to
`cap_b`: two real PEFT adapters (B drawn at random, so each changes the output), composed,
gates biased, exported with the product's `export_per_request`."""

from __future__ import annotations

from pathlib import Path

import torch

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Cancel ABC"}]


def _adapter(folder: Path, seed: int) -> Path:
    """A PEFT adapter that really changes the output (B drawn at random, not zero)."""
    from trace_lib.runtime.base_models import load_model
    from trace_lib.runtime.lora import attach_lora, save_adapter
    from trace_lib.train.config import LoraSettings

    torch.manual_seed(seed)
    model, _ = load_model("tiny")
    peft_model = attach_lora(model, LoraSettings(rank=4, alpha=8))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.3)
    save_adapter(peft_model, folder, "tiny")
    return folder


def make_routed_export(root: Path) -> Path:
    """`root/export`: gates that send every request to slot 2 (cap_b) at both layers."""
    from trace_lib.compose.export import export_per_request
    from trace_lib.compose.gated import MoEConfig, compose

    moe = compose("tiny", [("cap_a", _adapter(root / "a", 1)), ("cap_b", _adapter(root / "b", 2))],
                  config=MoEConfig("trajectory"))
    with torch.no_grad():
        for gate in moe.gates:
            gate.bias.copy_(torch.tensor([0.0, 0.0, 6.0]))
    export_per_request(moe, root / "export", {"cap_b": [(MSGS, None)]})
    return root / "export"
