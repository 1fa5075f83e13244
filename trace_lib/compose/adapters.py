"""Reading PEFT LoRA adapter folders into plain factors, and merging them.

Design decisions
- The composed model reads adapter folders directly (`adapter_config.json` +
  `adapter_model.safetensors`, what `PeftModel.save_pretrained` and the training stage
  write) instead of stacking them inside peft: the router needs each adapter's A, B and
  scale per projection as tensors it can index by token, and peft's multi-adapter layers
  offer no per-token dispatch. Any PEFT LoRA folder works, trained here or elsewhere.
- Scale follows peft exactly: alpha / r, or alpha / sqrt(r) with `use_rslora`;
  `rank_pattern` / `alpha_pattern` are honoured per module (rank is read from A's shape).
- What the mixture cannot express is refused with a message naming the file and field:
  DoRA (a magnitude vector per module), `modules_to_save` (full copies of a module) and
  LoRA on embeddings. Silently dropping them would make the composed model differ from
  the adapter that was evaluated.
- A capability name travels with each adapter: `name=path` on the command line, else
  `capability` in a `trace_adapter.json` beside the weights (if the training stage wrote
  one), else the folder name.
- `linear_merge` (the "collapse" baseline the evaluation compares against) writes an
  ordinary PEFT folder whose rank is the sum of the ranks (A and B concatenated, each
  block weighted), so the merge is exact, not an SVD approximation, and vLLM serves it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from trace_lib.errors import UserInputError

_PREFIX = "base_model.model."
_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<which>[AB])(?:\.[^.]+)?\.weight$")


@dataclass
class LoRAFactors:
    """One adapter on one projection: delta W = scale * B @ A."""

    A: torch.Tensor  # [r, in_features]
    B: torch.Tensor  # [out_features, r]
    scale: float


@dataclass
class Adapter:
    name: str  # the capability it was trained for (or the folder name)
    path: Path
    base_model: str | None
    rank: int
    alpha: float
    target_modules: list[str]
    factors: dict[str, LoRAFactors] = field(default_factory=dict)  # module name -> factors

    def summary(self) -> dict[str, object]:
        return {
            "name": self.name,
            "path": str(self.path),
            "base_model": self.base_model,
            "rank": self.rank,
            "alpha": self.alpha,
            "target_modules": self.target_modules,
            "modules": len(self.factors),
        }


def parse_adapter_arg(spec: str) -> list[tuple[str | None, Path]]:
    """`A1,A2` or `cap1=A1,cap2=A2` (mixable) -> [(name or None, path), ...]."""
    out: list[tuple[str | None, Path]] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        name, sep, path = part.partition("=")
        out.append((name.strip(), Path(path.strip())) if sep else (None, Path(part)))
    if not out:
        raise UserInputError("--adapters: expected a comma-separated list of adapter folders")
    return out


def _pattern_value(patterns: dict[str, float], module: str, default: float) -> float:
    # peft matches a pattern key against the end of the module's dotted name.
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?{key}$", module):
            return float(value)
    return float(default)


def read_adapter(path: str | Path, name: str | None = None) -> Adapter:
    """Load a PEFT LoRA folder's factors (fp32, CPU)."""
    from safetensors.torch import load_file

    folder = Path(path).expanduser()
    cfg_path = folder / "adapter_config.json"
    if not cfg_path.is_file():
        raise UserInputError(f"{folder}: not a PEFT adapter folder (no adapter_config.json)")
    try:
        cfg = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as exc:
        raise UserInputError(f"{cfg_path}: not valid JSON ({exc})") from exc
    if str(cfg.get("peft_type", "LORA")).upper() != "LORA":
        raise UserInputError(f"{cfg_path}: peft_type is {cfg.get('peft_type')!r}, expected 'LORA'")
    if cfg.get("use_dora"):
        raise UserInputError(f"{cfg_path}: use_dora=true; DoRA adapters cannot be gated per token")
    if cfg.get("modules_to_save"):
        raise UserInputError(
            f"{cfg_path}: modules_to_save={cfg['modules_to_save']}; full module copies cannot "
            f"be gated per token (train the adapter with LoRA only)"
        )
    weights = folder / "adapter_model.safetensors"
    if not weights.is_file():
        raise UserInputError(f"{folder}: no adapter_model.safetensors (only safetensors is read)")
    if name is None:
        meta = folder / "trace_adapter.json"
        if meta.is_file():
            try:
                name = json.loads(meta.read_text()).get("capability")
            except json.JSONDecodeError:
                name = None
        name = name or folder.name
    r_default = int(cfg.get("r", 8))
    alpha_default = float(cfg.get("lora_alpha", r_default))
    rslora = bool(cfg.get("use_rslora", False))
    rank_pattern = cfg.get("rank_pattern") or {}
    alpha_pattern = cfg.get("alpha_pattern") or {}

    pieces: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in load_file(str(weights)).items():
        stripped = key[len(_PREFIX):] if key.startswith(_PREFIX) else key
        match = _KEY.match(stripped)
        if match is None:
            if "lora_embedding" in key or "magnitude" in key:
                raise UserInputError(f"{weights}: tensor {key!r} is not a LoRA A/B on a Linear")
            continue  # biases etc. that peft may save; the mixture ignores them
        pieces.setdefault(match["module"], {})[match["which"]] = tensor.float()
    factors: dict[str, LoRAFactors] = {}
    for module, ab in sorted(pieces.items()):
        if set(ab) != {"A", "B"}:
            raise UserInputError(f"{weights}: module {module!r} has lora_{list(ab)[0]} only")
        rank = int(ab["A"].shape[0])
        if ab["B"].shape[1] != rank:
            raise UserInputError(
                f"{weights}: module {module!r}: lora_B is {tuple(ab['B'].shape)}, expected "
                f"[out, {rank}] to match lora_A {tuple(ab['A'].shape)}"
            )
        _pattern_value(rank_pattern, module, r_default)  # validated through A's shape
        alpha = _pattern_value(alpha_pattern, module, alpha_default)
        scale = alpha / math.sqrt(rank) if rslora else alpha / rank
        factors[module] = LoRAFactors(A=ab["A"].contiguous(), B=ab["B"].contiguous(), scale=scale)
    if not factors:
        raise UserInputError(f"{weights}: no lora_A/lora_B tensors found")
    targets = cfg.get("target_modules") or []
    if isinstance(targets, str):
        targets = [targets]
    return Adapter(
        name=str(name),
        path=folder.resolve(),
        base_model=cfg.get("base_model_name_or_path"),
        rank=r_default,
        alpha=alpha_default,
        target_modules=sorted(targets),
        factors=factors,
    )


def read_adapters(specs: list[tuple[str | None, Path]]) -> list[Adapter]:
    adapters = [read_adapter(path, name) for name, path in specs]
    names = [a.name for a in adapters]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise UserInputError(
            f"--adapters: two adapters are named {dupes}; give names with cap=path"
        )
    return adapters


def linear_merge(
    adapters: list[Adapter],
    out: str | Path,
    weights: list[float] | None = None,
    base_model: str | None = None,
) -> Path:
    """Write the weighted sum of `adapters` as one exact PEFT LoRA folder.

    Block concatenation: A = [A_1; ...; A_K], B = [w_1 s_1/s B_1, ..., w_K s_K/s B_K] with the
    merged scale s = 1 (alpha = r), so B @ A * s = sum_k w_k s_k B_k A_k exactly.
    """
    from safetensors.torch import save_file

    if not adapters:
        raise UserInputError("linear_merge: no adapters given")
    w = weights or [1.0 / len(adapters)] * len(adapters)
    if len(w) != len(adapters):
        raise UserInputError(f"linear_merge: {len(w)} weights for {len(adapters)} adapters")
    modules = sorted({m for a in adapters for m in a.factors})
    tensors: dict[str, torch.Tensor] = {}
    rank = 0
    for module in modules:
        a_blocks, b_blocks = [], []
        for wk, adapter in zip(w, adapters, strict=True):
            f = adapter.factors.get(module)
            if f is None:
                continue
            a_blocks.append(f.A)
            b_blocks.append(f.B * (wk * f.scale))
        a_cat, b_cat = torch.cat(a_blocks, 0), torch.cat(b_blocks, 1)
        # Modules touched by fewer adapters are zero-padded to one rank for the whole file.
        rank = max(rank, a_cat.shape[0])
        tensors[f"{_PREFIX}{module}.lora_A.weight"] = a_cat
        tensors[f"{_PREFIX}{module}.lora_B.weight"] = b_cat
    for key in list(tensors):
        t = tensors[key]
        if key.endswith("lora_A.weight") and t.shape[0] < rank:
            tensors[key] = torch.cat([t, t.new_zeros(rank - t.shape[0], t.shape[1])], 0)
        elif key.endswith("lora_B.weight") and t.shape[1] < rank:
            tensors[key] = torch.cat([t, t.new_zeros(t.shape[0], rank - t.shape[1])], 1)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()},
              str(folder / "adapter_model.safetensors"))
    targets = sorted({m.rsplit(".", 1)[-1] for m in modules})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": rank,  # scale 1: the weights are folded into B
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": targets,
        "base_model_name_or_path": base_model or adapters[0].base_model,
        "use_rslora": False,
        "use_dora": False,
    }
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    (folder / "trace_adapter.json").write_text(json.dumps({
        "capability": "merge(" + "+".join(a.name for a in adapters) + ")",
        "merged_from": [a.summary() | {"weight": wk} for a, wk in zip(adapters, w, strict=True)],
    }, indent=2))
    return folder
