"""The training half of a step on a GPU vs this CPU: the product's SFT and GRPO passes.

    python bench/gpu_train.py --device cpu  --shapes smollm2-135m            # here
    python bench/gpu_train.py --device cuda --shapes smollm2-135m,smollm2-1.7b  # GPU box

What it times is the product's own code, on real episode token sequences: the reference
episodes of a built-in environment (default `airline/tool_calling_precision`, difficulty
1, the capability's tools and policy excerpt: ~1,100-token prompts, a 110-190-token call,
the tool's answer, the closing reply), rendered and tokenised with SmolLM2's tokenizer as
`train --sft-steps` does; `local_rollouts.sft` (the SFT warm start) and
`step.GRPOStep.update` (the GRPO step the trainer and gate training share), with the LoRA
of `runtime.lora.attach_lora` on a base placed by `TrainConfig.device`'s rules
(`base_models.resolve_device` / `resolve_dtype`: bf16 on CUDA, fp32 on the CPU).

Design decisions
- Random-initialised weights in the shapes of real models (SmolLM2-135M's own config;
  the 360M and 1.7B members of the family), because no weights can travel to the GPU
  machine. Step time and memory do not depend on the weights' values; learning does,
  and is not measured here (bench/learning.py measures it, on the real 135M, on the CPU).
- GRPO groups are reference episodes of `--groups-per-step` seeds, each repeated `--group`
  times with alternating rewards 1/0: the advantages are synthetic, the compute is a real
  step's (every sampled token in the loss, one backward per micro-batch). The rollouts
  themselves are the server's work (vLLM on a GPU box) and are not timed here.
- Each pass is timed after `--warmup` untimed steps with the device synchronised; peak
  memory is CUDA's allocator peak (or the process's max RSS on the CPU). The LoRA is
  checked after training: finite, and moved from its initial values.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trace_lib.runtime.base_models import resolve_device, resolve_dtype  # noqa: E402
from trace_lib.runtime.lora import LoraSettings, attach_lora, trainable_parameters  # noqa: E402
from trace_lib.runtime.rollout import Rollout  # noqa: E402
from trace_lib.train.config import LossConfig, TrainConfig  # noqa: E402
from trace_lib.train.local_rollouts import reference_episode, sft  # noqa: E402
from trace_lib.train.step import GRPOStep, StepSettings, TokenForward  # noqa: E402
from trace_lib.train.trainer import build_options, env_factory  # noqa: E402

# The SmolLM2 family's shapes (Llama blocks, 49,152-token vocabulary, tied embeddings).
SHAPES: dict[str, dict[str, int]] = {
    "smollm2-135m": {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                     "num_attention_heads": 9, "num_key_value_heads": 3},
    "smollm2-360m": {"hidden_size": 960, "intermediate_size": 2560, "num_hidden_layers": 32,
                     "num_attention_heads": 15, "num_key_value_heads": 5},
    "smollm2-1.7b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 24,
                     "num_attention_heads": 32, "num_key_value_heads": 32},
}


def build_model(shape: str, device: str, dtype: torch.dtype, seed: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    conf = LlamaConfig(vocab_size=49152, max_position_embeddings=8192, tie_word_embeddings=True,
                       rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, pad_token_id=2,
                       head_dim=64, rope_parameters={"rope_theta": 100000.0,
                                                     "rope_type": "default"},
                       **SHAPES[shape])
    with torch.device(device):  # initialise where it runs: 1.7B on the CPU takes a minute
        model = LlamaForCausalLM(conf).to(dtype=dtype)
    model.eval()
    return model


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def peak_gib(device: str) -> float:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def env_maker(env_name: str):
    """`env_name` as the learning benchmark trains it: difficulty 1, the capability's tools
    plus one distractor, the policy excerpt."""
    cfg = TrainConfig(env=env_name, difficulty=1, tools="capability", policy="excerpt",
                      distractors=1)
    return env_factory(cfg.env, None, build_options(cfg))


def demos_of(args: argparse.Namespace, tokenizer) -> list[tuple[list[int], list[int]]]:
    make_env = env_maker(args.env)
    out = []
    for seed in range(args.seeds):
        env = make_env()
        ep = reference_episode(env, seed, tokenizer, max_turns=2)
        if ep is not None:
            out.append(ep)
    return out


def run_shape(shape: str, args: argparse.Namespace, demos: list, device: str) -> dict:
    dtype = resolve_dtype(args.dtype, device)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    base = build_model(shape, device, dtype, args.seed)
    n_params = sum(p.numel() for p in base.parameters())
    if args.gradient_checkpointing:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = attach_lora(base, LoraSettings(), seed=args.seed)
    params = trainable_parameters(model)
    start = [p.detach().clone() for p in params]
    forward = TokenForward(model, 1.0)

    # SFT: the warm start's own loop, `--sft-steps` timed after `--warmup` untimed.
    opt = torch.optim.AdamW(params, lr=5e-4, weight_decay=0.0)
    sft(params, opt, demos, forward, steps=args.warmup, batch=args.sft_batch, pad_id=2,
        seed=args.seed, train_mode=model.train)
    sft_times, sft_losses = [], []
    for k in range(args.sft_steps):
        sync(device)
        t0 = time.perf_counter()
        sft_losses += sft(params, opt, demos, forward, steps=1, batch=args.sft_batch, pad_id=2,
                          seed=args.seed + 1 + k, train_mode=model.train)
        sync(device)
        sft_times.append(time.perf_counter() - t0)

    # GRPO: groups of one seed's episode repeated, rewards alternating (synthetic advantages).
    def groups_for(step: int) -> list[list[Rollout]]:
        groups = []
        for g in range(args.groups_per_step):
            ids, mask = demos[(step * args.groups_per_step + g) % len(demos)]
            groups.append([Rollout(seed=g, hinted=False, token_ids=list(ids),
                                   loss_mask=list(mask), sampler_logprobs=[None] * len(ids),
                                   messages=[], reward=float(i % 2))
                           for i in range(args.group)])
        return groups

    grpo = GRPOStep(params, torch.optim.AdamW(params, lr=2e-4),
                    StepSettings(loss=LossConfig(), micro_batch=args.micro_batch),
                    forward=forward, pad_id=2, train_mode=model.train)
    for w in range(args.warmup):
        grpo.update(groups_for(w))
    grpo_times, grpo_losses, tokens = [], [], 0
    for k in range(args.grpo_steps):
        groups = groups_for(args.warmup + k)
        tokens = sum(len(r.token_ids) for grp in groups for r in grp)
        sync(device)
        t0 = time.perf_counter()
        out = grpo.update(groups)
        sync(device)
        grpo_times.append(time.perf_counter() - t0)
        grpo_losses.append(out.metrics["loss"])

    moved = max(float((p.detach() - s).abs().max()) for p, s in zip(params, start, strict=True))
    finite = all(bool(torch.isfinite(p).all()) for p in params)
    row = {
        "shape": shape, "device": device, "dtype": str(dtype).removeprefix("torch."),
        "params_m": round(n_params / 1e6, 1),
        "lora_params_m": round(sum(p.numel() for p in params) / 1e6, 2),
        "lora_dtype": str(params[0].dtype).removeprefix("torch."),
        "sft_s_per_step": statistics.median(sft_times) if sft_times else None,
        "sft_losses": sft_losses,
        "grpo_s_per_step": statistics.median(grpo_times) if grpo_times else None,
        "grpo_tokens_per_step": tokens,
        "grpo_tokens_per_s": tokens / statistics.median(grpo_times) if grpo_times else None,
        "grpo_losses": grpo_losses,
        "peak_gib": round(peak_gib(device), 2),
        "lora_moved_max_abs": moved, "lora_finite": finite,
    }
    del model, base, opt, grpo
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return row


def shape_arguments(doc: str, seeds: int) -> argparse.ArgumentParser:
    """The flags every GPU-shape bench shares (this one and bench/gpu_gates.py): where it
    runs, which shapes, the episodes it trains on and the GRPO step's shape."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--shapes", default="smollm2-135m")
    p.add_argument("--tokenizer", default=str(ROOT / "data" / "models" / "smollm2-135m"),
                   help="a folder with SmolLM2's tokenizer.json (no weights needed)")
    p.add_argument("--env", default="airline/tool_calling_precision")
    p.add_argument("--seeds", type=int, default=seeds, help="reference episodes to train on")
    p.add_argument("--grpo-steps", type=int, default=2)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--groups-per-step", type=int, default=2)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="JSON file for the rows")
    return p


def main() -> None:
    p = shape_arguments(__doc__, seeds=16)
    p.add_argument("--sft-steps", type=int, default=3)
    p.add_argument("--sft-batch", type=int, default=2)
    p.add_argument("--gradient-checkpointing", action="store_true")
    args = p.parse_args()

    from transformers import AutoTokenizer

    device = resolve_device(args.device)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    demos = demos_of(args, tokenizer)
    lens = [len(ids) for ids, _ in demos]
    header = {"device": device, "torch": torch.__version__, "machine": platform.processor()
              or platform.machine(), "threads": torch.get_num_threads(),
              "gpu": torch.cuda.get_device_name(0) if device.startswith("cuda") else None,
              "env": args.env, "episodes": len(demos),
              "episode_tokens": [min(lens), int(statistics.median(lens)), max(lens)]}
    print(json.dumps(header), flush=True)
    rows = []
    for shape in args.shapes.split(","):
        row = run_shape(shape, args, demos, device)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"run": header, "rows": rows}, indent=2))
    print(f"\n{'shape':14} {'device':6} {'dtype':9} {'SFT s/step':>10} {'GRPO s/step':>11} "
          f"{'GRPO tok/s':>10} {'peak GiB':>8}")
    for r in rows:
        print(f"{r['shape']:14} {r['device']:6} {r['dtype']:9} {r['sft_s_per_step']:10.3f} "
              f"{r['grpo_s_per_step']:11.3f} {r['grpo_tokens_per_s']:10.0f} {r['peak_gib']:8.2f}")


if __name__ == "__main__":
    main()
