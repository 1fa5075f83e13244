"""CLI verbs of the train stage: `train` and `job submit|list|status|logs|cancel|wait|run`.

Design decisions
- `train` in the foreground runs the same `trainer.train` a job runs, in this process,
  with a tqdm bar, then records the adapter in the store (the CLI may write the database;
  a job may not). `--background` builds the same config into a job spec and submits it.
- `job run SPEC.json` is the single entrypoint every backend starts; it never opens the
  database. The other `job` verbs read run directories and sync the store.
- Heavy modules (torch, transformers, ray) are imported inside handlers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from trace_lib.cli import print_json


def _train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", required=True, help="environment name (or module:Class)")
    p.add_argument("--model", default="tiny", help="tiny | smollm2-135m | HF folder | hub name")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--group", type=int, default=8, help="rollouts per seed (G)")
    p.add_argument("--groups-per-step", type=int, default=2, help="seeds per step")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--lora-alpha", type=int, default=16)
    p.add_argument("--lora-targets", default="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
    p.add_argument("--max-turns", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64, help="per assistant turn")
    p.add_argument("--max-sequence", type=int, default=8192,
                   help="episode token budget (prompt included); stops before overrunning it")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--micro-batch", type=int, default=4, help="gradient accumulation chunk")
    p.add_argument("--epochs-per-step", type=int, default=1)
    p.add_argument("--gradient-checkpointing", action="store_true",
                   help="recompute activations in the backward pass (long prompts, less RAM)")
    p.add_argument("--hint-share", type=float, default=0.0)
    p.add_argument("--kl", type=float, default=0.0, help="KL coefficient (0 = off)")
    p.add_argument("--adv-scale", choices=("group", "batch", "none"), default="group")
    p.add_argument("--clip-low", type=float, default=0.2)
    p.add_argument("--clip-high", type=float, default=0.28)
    p.add_argument("--checkpoint-every", type=int, default=5)
    p.add_argument("--eval-seeds", type=int, default=0, help="held-out seeds for before/after")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--server-url", default=None, help="OpenAI-compatible server (vLLM); "
                   "default: start the CPU policy server")
    p.add_argument("--served-model", default=None, help="base model name on --server-url")
    p.add_argument("--api-key-env", default=None, help="env var holding --server-url's key")


def config_from_args(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "env": args.env, "model": args.model, "steps": args.steps, "group": args.group,
        "groups_per_step": args.groups_per_step, "lr": args.lr,
        "max_turns": args.max_turns, "max_tokens": args.max_tokens,
        "max_sequence": args.max_sequence,
        "temperature": args.temperature, "micro_batch": args.micro_batch,
        "epochs_per_step": args.epochs_per_step,
        "gradient_checkpointing": args.gradient_checkpointing, "hint_share": args.hint_share,
        "checkpoint_every": args.checkpoint_every, "eval_seeds": args.eval_seeds,
        "seed": args.seed, "server_url": args.server_url, "served_model": args.served_model,
        "api_key_env": args.api_key_env,
        "lora": {"rank": args.lora_rank, "alpha": args.lora_alpha,
                 "targets": [t.strip() for t in args.lora_targets.split(",") if t.strip()]},
        "loss": {"kl_coef": args.kl, "scale": args.adv_scale, "clip_low": args.clip_low,
                 "clip_high": args.clip_high},
    }


def _cmd_train(args: argparse.Namespace) -> int:
    from trace_lib import jobs
    from trace_lib.train import records
    from trace_lib.train.config import TrainConfig
    from trace_lib.train.trainer import train

    config = config_from_args(args)
    TrainConfig.from_dict(config, where="train arguments")  # fail before anything starts
    config = records.with_environment_code(args.db, config)
    if args.background:
        options = {"address": args.ray_address} if args.ray_address else {}
        spec = jobs.submit(jobs.JobSpec(kind="train_adapter", config=config,
                                        backend=args.backend, backend_options=options))
        records.record_job(args.db, spec)
        out = {"job_id": spec.id, "run_dir": spec.run_dir, "backend": spec.backend}
        print_json(out) if args.json else print(spec.id)
        return 0
    job_id = jobs.new_job_id("train")
    run_dir = Path(args.run_dir) if args.run_dir else jobs.runs_dir() / job_id
    result = train(TrainConfig.from_dict(config), run_dir, resume=True, progress=True)
    records.record_adapter(args.db, result.to_dict(), run_dir.name)
    out = {"adapter_path": result.adapter_path, "metrics_path": result.metrics_path,
           "steps": result.steps, "final_reward": result.final_reward,
           "eval_before": result.eval_before, "eval_after": result.eval_after,
           "wall_s": round(result.wall_s, 2)}
    if args.json:
        print_json(out)
    else:
        for k, v in out.items():
            print(f"{k}: {v}")
    return 0


def _show_status(st: Any, as_json: bool) -> None:
    if as_json:
        print_json(st.to_dict())
        return
    print(f"{st.id}  {st.state}  backend={st.backend}  steps={st.steps_done}  "
          f"run_dir={st.run_dir}")
    if st.error:
        print(f"error: {st.error}")
    if st.log_tail:
        print("--- log tail ---")
        print(st.log_tail)


def _cmd_job_submit(args: argparse.Namespace) -> int:
    from trace_lib import jobs
    from trace_lib.errors import UserInputError
    from trace_lib.train import records

    path = Path(args.spec)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise UserInputError(f"{path}: no such spec file") from exc
    except json.JSONDecodeError as exc:
        raise UserInputError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise UserInputError(f"{path}: expected an object with `kind` and `config`")
    data = {k: v for k, v in data.items() if k in ("kind", "config", "backend_options")}
    data["backend"] = args.backend
    spec = jobs.JobSpec.from_dict(data, str(path))
    if spec.kind == "train_adapter":
        from trace_lib.train.config import TrainConfig

        TrainConfig.from_dict(spec.config, where=f"{path}: config")
    jobs.submit(spec)
    records.record_job(args.db, spec)
    print_json({"job_id": spec.id, "run_dir": spec.run_dir}) if args.json else print(spec.id)
    return 0


def _cmd_job_list(args: argparse.Namespace) -> int:
    from trace_lib.train import records

    statuses = records.sync_jobs(args.db)
    if args.json:
        print_json([s.to_dict() | {"log_tail": None} for s in statuses])
        return 0
    for st in statuses:
        print(f"{st.id:40s} {st.state:10s} {st.backend:6s} steps={st.steps_done}")
    return 0


def _cmd_job_status(args: argparse.Namespace) -> int:
    from trace_lib import jobs
    from trace_lib.train import records

    st = jobs.job_status(args.job_id)
    records.sync_jobs(args.db)
    _show_status(st, args.json)
    return 0


def _cmd_job_logs(args: argparse.Namespace) -> int:
    from trace_lib import jobs

    spec = jobs.find_spec(args.job_id)
    if not args.follow:
        sys.stdout.write(jobs.read_log(spec.path, tail=args.tail) + "\n")
        return 0
    shown = 0
    while True:  # follow until the job ends
        text = jobs.read_log(spec.path)
        sys.stdout.write(text[shown:])
        sys.stdout.flush()
        shown = len(text)
        if jobs.job_status(spec).state in jobs.TERMINAL:
            return 0
        time.sleep(1.0)


def _cmd_job_cancel(args: argparse.Namespace) -> int:
    from trace_lib import jobs
    from trace_lib.train import records

    st = jobs.cancel(args.job_id, grace_s=args.grace)
    records.sync_jobs(args.db)
    _show_status(st, args.json)
    return 0


def _cmd_job_wait(args: argparse.Namespace) -> int:
    from trace_lib import jobs
    from trace_lib.train import records

    st = jobs.wait(args.job_id, timeout_s=args.timeout)
    records.sync_jobs(args.db)
    _show_status(st, args.json)
    return 0 if st.state == "succeeded" else 1


def _cmd_job_run(args: argparse.Namespace) -> int:
    from trace_lib import jobs

    return jobs.run_job(args.spec)


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add this stage's verbs to the CLI."""
    p = sub.add_parser("train", parents=[common], help="train a LoRA adapter with GRPO")
    _train_args(p)
    p.add_argument("--run-dir", default=None, help="foreground: where to write (resumes)")
    p.add_argument("--background", action="store_true", help="submit as a job, print its id")
    p.add_argument("--backend", default="local", choices=("local", "ray"))
    p.add_argument("--ray-address", default=None, help="Ray dashboard URL (else RAY_ADDRESS)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_train)

    job = sub.add_parser("job", parents=[common], help="background jobs")
    jsub = job.add_subparsers(dest="job_verb", metavar="ACTION")
    jsub.required = True
    s = jsub.add_parser("submit", parents=[common], help="submit SPEC.json ({kind, config})")
    s.add_argument("spec")
    s.add_argument("--backend", default="local", choices=("local", "ray"))
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_cmd_job_submit)
    s = jsub.add_parser("list", parents=[common], help="jobs, newest first")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_cmd_job_list)
    for name, fn, helptext in (("status", _cmd_job_status, "state, steps, error, log tail"),
                               ("cancel", _cmd_job_cancel, "SIGTERM, then SIGKILL"),
                               ("wait", _cmd_job_wait, "block until the job ends")):
        s = jsub.add_parser(name, parents=[common], help=helptext)
        s.add_argument("job_id")
        s.add_argument("--json", action="store_true")
        if name == "cancel":
            s.add_argument("--grace", type=float, default=10.0, help="seconds before SIGKILL")
        if name == "wait":
            s.add_argument("--timeout", type=float, default=3600.0)
        s.set_defaults(func=fn)
    s = jsub.add_parser("logs", parents=[common], help="the job's log.txt")
    s.add_argument("job_id")
    s.add_argument("--tail", type=int, default=None)
    s.add_argument("--follow", "-f", action="store_true")
    s.set_defaults(func=_cmd_job_logs)
    s = jsub.add_parser("run", parents=[common], help="the job entrypoint (backends call it)")
    s.add_argument("spec")
    s.set_defaults(func=_cmd_job_run)
