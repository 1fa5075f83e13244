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
- One step = `groups_per_step` seeds x `group` rollouts through the policy server, group
  advantages (constant groups dropped), then `epochs_per_step` passes of AdamW over the
  kept rollouts in micro-batches (gradient accumulation, token-level normalisation over
  the whole step). With one epoch the old policy is the current one (ratio 1, the loss is
  the plain policy gradient); with more, old log-probs are taken once before the first.
- A step's groups (and, inside each, its requests) are sent from threads at once so the
  server decodes them as one batch; the seeds make the samples independent of that timing.
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
import importlib
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
from trace_lib.errors import UserInputError
from trace_lib.jobs import Cancelled
from trace_lib.runtime.lora import (
    attach_lora,
    load_adapter_weights,
    save_adapter,
    trainable_parameters,
)
from trace_lib.runtime.rollout import OpenAIChatClient, Rollout, RolloutConfig, evaluate, run_group
from trace_lib.train.config import TrainConfig
from trace_lib.train.grpo import group_advantages, grpo_loss, token_logprobs


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


def env_factory(name: str, code: str | None = None) -> Callable[[], Environment]:
    """A zero-argument constructor for environment `name`.

    "package.module:Attr" imports your own Environment class (or factory); a built-in
    registry name ("airline/precondition_verification") builds it in-process; a generated
    environment arrives as `code` in the job spec (a job never reads the store) and runs
    only in the sandbox, as the registry requires; a path to a .py module likewise.
    """
    if ":" in name and code is None:
        module_name, attr = name.split(":", 1)
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise UserInputError(f"env {name!r}: cannot import module {module_name!r}: {exc}") \
                from exc
        if not hasattr(module, attr):
            raise UserInputError(f"env {name!r}: module {module_name!r} has no {attr!r}")
        return getattr(module, attr)
    from trace_lib.envs import registry

    if code is not None:
        return lambda: registry.environment_from_code(code)
    if name in registry.builtin_names() or name.endswith(".py"):
        spec = registry.resolve(name)
        if spec.source == "builtin":
            return lambda: registry.make_builtin(spec)
        return lambda: registry.environment_from_code(spec.code or "")
    raise UserInputError(
        f"env {name!r}: not a built-in environment ({', '.join(registry.builtin_names())}), "
        "not module:Class, and the config carries no `env_code` (generated environments are "
        "launched from the app or CLI, which put their code into the job spec)"
    )


# ---------------------------------------------------------------------- policy server


@dataclass
class Endpoint:
    url: str
    base_model: str  # the model name requests use for the base policy
    api_key: str | None = None


@contextlib.contextmanager
def policy_endpoint(cfg: TrainConfig, model_path: str) -> Iterator[Endpoint]:
    """The server rollouts go to: a remote one (vLLM) or our CPU server for this job."""
    if cfg.server_url:
        key = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
        yield Endpoint(cfg.server_url, cfg.served_model or model_path, key)
        return
    from trace_lib.runtime.policy_server import PolicyServer, ServerConfig

    server = PolicyServer(ServerConfig(model=model_path, served_model_name=cfg.model))
    server.start()
    try:
        yield Endpoint(server.url, server.model_name)
    finally:
        server.stop()


# -------------------------------------------------------------------------- helpers


def _pad(rows: list[list[int]], value: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=torch.long)


def _batches(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


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


def _eval_log(label: str) -> Callable[[int, int], None]:
    return lambda k, n: print(f"[eval {label}] {k}/{n} held-out seeds", flush=True)


def optimise(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: list[Rollout],
    advantages: list[float],
    cfg: TrainConfig,
    pad_id: int,
) -> dict[str, float]:
    """`epochs_per_step` AdamW updates on the kept rollouts; returns loss/clip/kl stats."""
    total_tokens = sum(r.n_sampled for r in batch)
    if total_tokens == 0:
        return {"loss": 0.0, "clip_fraction": 0.0, "kl": 0.0, "grad_norm": 0.0}
    chunks = _batches(list(range(len(batch))), cfg.micro_batch)
    tensors = []
    for idx in chunks:
        ids = _pad([batch[i].token_ids for i in idx], pad_id)
        att = _pad([[1] * len(batch[i].token_ids) for i in idx], 0)
        mask = _pad([batch[i].loss_mask for i in idx], 0)[:, 1:]
        adv = torch.tensor([advantages[i] for i in idx], dtype=torch.float32)
        # First position whose log-prob carries loss: logits before it are never computed.
        first = min(batch[i].loss_mask.index(1) for i in idx if 1 in batch[i].loss_mask) \
            if any(1 in batch[i].loss_mask for i in idx) else ids.shape[1] - 1
        tensors.append((ids, att, mask, adv, max(first - 1, 0)))
    old: list[torch.Tensor | None] = [None] * len(tensors)
    if cfg.epochs_per_step > 1:
        with torch.no_grad():
            old = [token_logprobs(model, ids, att, kf) for ids, att, _, _, kf in tensors]
    ref: list[torch.Tensor | None] = [None] * len(tensors)
    if cfg.loss.kl_coef > 0:
        with torch.no_grad(), model.disable_adapter():
            ref = [token_logprobs(model, ids, att, kf) for ids, att, _, _, kf in tensors]
    # How far the server's log-probs are from ours on the sampled tokens: ~1e-6 when the
    # server runs the same weights (our CPU server), larger under vLLM's kernels/precision.
    # Measured on the first epoch's own forward when there is no separate `old` pass (same
    # weights, dropout 0): a second no-grad forward just for this figure cost ~1/3 of a step.
    mismatch, n_cmp = 0.0, 0

    def gap(k: int, lps: torch.Tensor) -> None:
        nonlocal mismatch, n_cmp
        lps = lps.detach()
        for row, i in enumerate(chunks[k]):
            for t, lp in enumerate(batch[i].sampler_logprobs[1:]):
                if lp is not None:
                    mismatch += abs(float(lps[row, t]) - lp)
                    n_cmp += 1

    model.train()
    stats = {"loss": 0.0, "clip_fraction": 0.0, "kl": 0.0, "grad_norm": 0.0}
    for epoch in range(cfg.epochs_per_step):
        optimizer.zero_grad(set_to_none=True)
        loss_sum, clip_sum, kl_sum = 0.0, 0.0, 0.0
        for k, (ids, att, mask, adv, kf) in enumerate(tensors):
            new = token_logprobs(model, ids, att, kf)
            if epoch == 0:
                gap(k, old[k] if old[k] is not None else new)
            old_k = old[k] if old[k] is not None else new.detach()
            loss, st = grpo_loss(new, old_k, adv, mask, cfg.loss, ref_logp=ref[k],
                                 total_tokens=total_tokens)
            loss.backward()
            loss_sum += st.loss
            clip_sum += st.clip_fraction * st.n_tokens
            kl_sum += st.kl * st.n_tokens
        norm = torch.nn.utils.clip_grad_norm_(trainable_parameters(model), cfg.max_grad_norm)
        optimizer.step()
        stats = {"loss": loss_sum, "clip_fraction": clip_sum / total_tokens,
                 "kl": kl_sum / total_tokens, "grad_norm": float(norm),
                 "sampler_logprob_gap": mismatch / max(n_cmp, 1)}
    model.eval()
    return stats


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
    from trace_lib.runtime.base_models import load_model, resolve_model

    cfg.validate()
    t_start = time.perf_counter()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "train_config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    metrics_path = run_dir / "metrics.jsonl"
    make_env = env_factory(cfg.env, cfg.env_code)
    probe = make_env()
    capability = getattr(probe, "capability", None) or cfg.env
    if hasattr(probe, "close"):
        probe.close()
    stop = should_stop or (lambda: False)

    model_path = resolve_model(cfg.model)
    base, tokenizer = load_model(model_path)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    if cfg.gradient_checkpointing:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = attach_lora(base, cfg.lora, seed=cfg.seed)
    model.eval()
    optimizer = torch.optim.AdamW(trainable_parameters(model), lr=cfg.lr,
                                  weight_decay=cfg.weight_decay)
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

    with policy_endpoint(cfg, model_path) as ep:
        client = OpenAIChatClient(ep.url, api_key=ep.api_key, timeout_s=cfg.request_timeout_s)
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
            if start_step > 0:
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

                def group_of(g: int, step: int = step, n_hinted: int = n_hinted,
                             served: str = served) -> list[Rollout]:
                    seed = step * cfg.groups_per_step + g
                    return run_group(
                        make_env, seed, client, rollout_cfg, model=served,
                        group_size=cfg.group, n_hinted=n_hinted,
                        request_seed=cfg.seed * 7_919 + seed, parallel=True,
                    )

                # All of a step's groups at once: the server batches their requests into
                # one decode; per-request seeds keep the samples what they would be alone.
                with ThreadPoolExecutor(cfg.groups_per_step) as pool:
                    groups = list(pool.map(group_of, range(cfg.groups_per_step)))
                if stop():
                    raise Cancelled()
                t_roll = time.perf_counter() - t0
                flat = [r for grp in groups for r in grp]
                adv = group_advantages([[r.reward for r in grp] for grp in groups],
                                       cfg.loss.scale, cfg.loss.eps)
                kept = [flat[i] for i in adv.kept]
                t1 = time.perf_counter()
                stats = optimise(model, optimizer, kept, adv.advantages, cfg, pad_id)
                t_train = time.perf_counter() - t1
                publish(step + 1)
                rewards = torch.tensor([r.reward for r in flat])
                sampled = sum(r.n_sampled for r in flat)
                row = {
                    "step": step + 1,
                    "reward_mean": float(rewards.mean()),
                    "reward_std": float(rewards.std(unbiased=False)),
                    "pass_rate": sum(r.passed for r in flat) / len(flat),
                    "loss": stats["loss"],
                    "clip_fraction": stats["clip_fraction"],
                    "kl": stats["kl"],
                    "grad_norm": stats["grad_norm"],
                    "sampler_logprob_gap": stats.get("sampler_logprob_gap", 0.0),
                    "groups_kept": adv.n_groups - adv.n_dropped_groups,
                    "groups_dropped": adv.n_dropped_groups,
                    "rollouts": len(flat),
                    "sampled_tokens": sampled,
                    "tokens_per_s": sampled / max(t_roll, 1e-9),
                    "rollouts_per_s": len(flat) / max(t_roll, 1e-9),
                    "train_tokens_per_s": sum(len(r.token_ids) for r in kept)
                    / max(t_train, 1e-9),
                    "turns_mean": sum(r.turns for r in flat) / len(flat),
                    "prefix_mismatches": sum(r.prefix_mismatches for r in flat),
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
                print(f"[train] step {step + 1}/{cfg.steps} reward {row['reward_mean']:.3f} "
                      f"pass {row['pass_rate']:.2f} loss {row['loss']:.4f} "
                      f"groups kept {row['groups_kept']}/{cfg.groups_per_step} "
                      f"{row['wall_s']:.1f}s", flush=True)
                last_reward = row["reward_mean"]
                every = cfg.checkpoint_every
                if (every and (step + 1) % every == 0) or step + 1 == cfg.steps:
                    ck = save_adapter(model, run_dir / "checkpoints" / f"step_{step + 1}",
                                      model_path)
                    torch.save({"step": step + 1, "optimizer": optimizer.state_dict(),
                                "config": cfg.to_dict()}, ck / "trainer_state.pt")
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
