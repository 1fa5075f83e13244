"""Our GRPO step vs TRL's GRPOTrainer: wall time per step, side by side, same settings.

    python bench/grpo_vs_trl.py [--model tiny|smollm2-135m] [--steps 4] [--group 8]
                                [--groups 2] [--max-tokens 16]

Both sides train the same base (loaded from the same folder) with the same LoRA (r, alpha,
targets), group size, number of prompts per step, completion length, learning rate,
loss (token-level, clip 0.2/0.28, no KL) and the same reward (the smoke environment
`TargetLetterEnv`: 1 when the answer contains an "a"), single turn, one optimizer step per
generation batch, on the CPU.

- ours: `trainer.train`: rollouts through the project's CPU policy server (HTTP, chat
  API, batched decoding with a KV cache), GRPO step, adapter saved and hot-swapped into
  the server every step. Per-step wall time from metrics.jsonl (`wall_s`).
- TRL 1.16 `GRPOTrainer` with `use_vllm=False` (generation with `model.generate` in the
  training process, peft LoRA, `loss_type="dapo"`, `beta=0`), per-step wall time from
  `on_step_begin`/`on_step_end` callbacks.

The first step of each side is reported apart (warm-up: server start, first adapter load,
TRL's dataloader/accelerate set-up), the ratio uses the median of the following steps.
Ratio > 1 means ours is faster.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
warnings.filterwarnings("ignore")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trace_lib.train.smoke_envs import TargetLetterEnv  # noqa: E402

ENV = "trace_lib.train.smoke_envs:TargetLetterEnv"


def run_ours(args: argparse.Namespace, targets: list[str], work: Path) -> list[dict]:
    from trace_lib.jobs import read_metrics
    from trace_lib.train.trainer import TrainConfig, train

    cfg = TrainConfig.from_dict({
        "env": ENV, "model": args.model, "steps": args.steps, "group": args.group,
        "groups_per_step": args.groups, "max_tokens": args.max_tokens, "max_turns": 1,
        "lr": args.lr, "checkpoint_every": 0, "micro_batch": args.group * args.groups,
        "lora": {"rank": args.rank, "alpha": args.rank, "targets": targets},
        "loss": {"kl_coef": 0.0, "clip_low": 0.2, "clip_high": 0.28, "scale": "group"},
    })
    train(cfg, work / "ours", resume=False)
    return read_metrics(work / "ours")


def run_trl(args: argparse.Namespace, targets: list[str], work: Path) -> list[float]:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from trace_lib.runtime.base_models import load_model

    model, tok = load_model(args.model)
    tok.padding_side = "left"
    env = TargetLetterEnv()
    prompts = []
    for seed in range(args.steps * args.groups):
        env.reset(seed)
        prompts.append({"prompt": env.messages})

    def reward(completions, **_):
        out = []
        for c in completions:
            text = c[-1]["content"] if isinstance(c, list) else str(c)
            out.append(float(TargetLetterEnv.target in (text or "").lower()))
        return out

    times: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.t0)

    config = GRPOConfig(
        output_dir=str(work / "trl"), per_device_train_batch_size=args.group * args.groups,
        num_generations=args.group, max_completion_length=args.max_tokens,
        max_steps=args.steps, learning_rate=args.lr, beta=0.0, loss_type="dapo",
        epsilon=0.2, epsilon_high=0.28, temperature=1.0, use_cpu=True, bf16=False,
        report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True,
        gradient_accumulation_steps=1, dataloader_num_workers=0, seed=0,
        lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0,
    )
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=config,
        train_dataset=Dataset.from_list(prompts), processing_class=tok,
        peft_config=LoraConfig(r=args.rank, lora_alpha=args.rank, target_modules=targets,
                               lora_dropout=0.0, task_type="CAUSAL_LM"),
        callbacks=[StepTimer()],
    )
    trainer.train()
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--groups", type=int, default=2, help="prompts (seeds) per step")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--threads", type=int, default=None, help="torch threads for both sides")
    args = p.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    with tempfile.TemporaryDirectory(prefix="bench_grpo_") as tmp:
        work = Path(tmp)
        ours_rows = run_ours(args, targets, work)
        trl = run_trl(args, targets, work)
    ours = [r["wall_s"] for r in ours_rows]
    print(f"model={args.model} steps={args.steps} group={args.group} prompts/step={args.groups} "
          f"completion tokens={args.max_tokens} lora r={args.rank} torch threads="
          f"{torch.get_num_threads()}")
    print(f"{'':22s}{'ours (trace_lib)':>18s}{'TRL GRPOTrainer':>18s}")
    print(f"{'first step (s)':22s}{ours[0]:18.2f}{trl[0]:18.2f}")
    o = statistics.median(ours[1:] or ours)
    t = statistics.median(trl[1:] or trl)
    print(f"{'median step (s)':22s}{o:18.2f}{t:18.2f}")
    later = ours_rows[1:] or ours_rows
    print(f"{'ours: rollout / train':22s}{statistics.median(r['rollout_s'] for r in later):9.2f}"
          f" /{statistics.median(r['train_s'] for r in later):6.2f} s (median of the same steps)")
    print(f"ratio TRL / ours (median step wall time): x{t / o:.2f}  (> 1: ours is faster)")


if __name__ == "__main__":
    main()
