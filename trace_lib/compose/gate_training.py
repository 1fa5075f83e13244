"""Training the gates: a KL warm start from per-seed rewards, then GRPO on the gates only.

Design decisions
- Warm start: every slot (base and each adapter, by forcing the routing) is rolled out
  greedily on `warm_seeds` seeds of every capability environment. Per seed the rewards
  become a soft target over slots, softmax(r / tau), and the gates fit it by KL on every
  prompt token and layer. This gives the zero-initialised gates (which route everything to
  the base, where straight-through top-1 has little signal) a start that already sends
  each capability's prompts to the adapter that solves them.
- GRPO: the training stage's own pieces, unchanged: `run_group` for rollouts (through the
  in-process `LocalMoEClient`, the composed model answering as a chat policy),
  `group_advantages` (constant groups dropped), `grpo_loss` (token-level, clip-higher) on
  `token_logprobs` of the gated model. Gradients reach only the gates, through the
  straight-through top-1 estimator; the environments are mixed round-robin so no single
  capability owns the gates.
- A small Switch-style load-balance term, (K+1) * sum_i f_i * P_i (f = share of tokens
  routed to slot i, P = mean gate probability), keeps the gates from collapsing onto one
  slot; routing entropy and per-slot shares are logged every step.
- Runs as a job kind (`train_gates`) of the training stage's job runner: a run directory
  with status.json, metrics.jsonl (same fields as adapter training, plus routing ones),
  log.txt, checkpoints/step_N/gates.safetensors and, at the end, a complete composed model
  folder `moe/` with the trained gates. It never opens the database; the app registers
  `moe/` when it sees the job succeed (`catalog.sync_gate_jobs`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trace_lib.compose.gated import GatedMoE, load_moe
from trace_lib.compose.local_client import LocalMoEClient, env_factory
from trace_lib.errors import UserInputError
from trace_lib.train.grpo import LossConfig

JOB_KIND = "train_gates"


@dataclass
class GateTrainConfig:
    moe: str  # composed model folder
    envs: list[str]  # capability environments (DOMAIN/CAPABILITY), mixed round-robin
    warm_seeds: int = 4
    warm_seed_start: int = 0
    warm_steps: int = 30
    warm_lr: float = 5e-2
    warm_temperature: float = 0.1  # tau of softmax(reward / tau): low = trust the best slot
    steps: int = 10
    groups_per_step: int = 2
    group: int = 4
    lr: float = 1e-3
    balance_coef: float = 0.01
    max_grad_norm: float = 1.0
    max_turns: int = 4
    max_tokens: int = 96
    max_sequence: int = 4096
    temperature: float = 1.0
    train_seed_start: int = 100  # training seeds are disjoint from warm and eval seeds
    eval_seeds: int = 0
    eval_seed_start: int = 10_000
    seed: int = 0
    torch_threads: int = 0  # 0 = torch's default; 1 is fastest for tiny models on a busy box
    loss: LossConfig = field(default_factory=LossConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "config") -> GateTrainConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        extra = sorted(set(data) - known)
        if extra:
            raise UserInputError(f"{where}: unknown fields {extra}; expected {sorted(known)}")
        for req in ("moe", "envs"):
            if req not in data:
                raise UserInputError(f"{where}: field `{req}` is required")
        data = dict(data)
        if isinstance(data["envs"], str):
            data["envs"] = [e for e in data["envs"].split(",") if e]
        if isinstance(data.get("loss"), dict):
            data["loss"] = LossConfig(**data["loss"])
        cfg = cls(**data)
        cfg.validate(where)
        return cfg

    def validate(self, where: str = "config") -> None:
        if not self.envs:
            raise UserInputError(f"{where}: field `envs` needs at least one environment")
        for name in ("warm_steps", "steps", "warm_seeds", "eval_seeds"):
            if getattr(self, name) < 0:
                raise UserInputError(f"{where}: field `{name}` must be >= 0")
        if self.group < 2 and self.steps > 0:
            raise UserInputError(f"{where}: field `group` must be >= 2 for GRPO")
        if self.warm_temperature <= 0:
            raise UserInputError(f"{where}: field `warm_temperature` must be > 0")


# --------------------------------------------------------------------------- pieces
def _prompt_ids(moe: GatedMoE, env: Any) -> list[int]:
    from trace_lib.runtime.chat_format import render_prompt

    text = render_prompt(env.messages, env.tool_schemas or None)
    return moe.tokenizer(text, add_special_tokens=False)["input_ids"]


def reward_table(moe: GatedMoE, makers: dict[str, Callable[[], Any]], seeds: list[int],
                 rollout_cfg: Any,
                 progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """rewards[env][seed] = [reward of slot 0..K], each slot forced, greedy rollouts."""
    from trace_lib.runtime.rollout import run_group

    table: dict[str, dict[str, list[float]]] = {}
    for env_name, make_env in makers.items():
        table[env_name] = {}
        for seed in seeds:
            row = []
            for slot in range(moe.k + 1):
                client = LocalMoEClient(moe, force=slot)
                r = run_group(make_env, seed, client, rollout_cfg, model="moe", group_size=1,
                              request_seed=seed)[0]
                row.append(float(r.reward))
            table[env_name][str(seed)] = row
            if progress:
                progress(f"warm rewards {env_name} seed {seed}: {row}")
    return table


def soft_targets(rewards: list[float], tau: float) -> torch.Tensor:
    r = torch.tensor(rewards, dtype=torch.float32)
    return torch.softmax(r / tau, dim=0)


def routing_stats(collected: list[tuple[int, torch.Tensor, torch.Tensor]], k1: int,
                  mask: torch.Tensor | None = None) -> dict[str, Any]:
    """Load-balance loss (with grad), mean entropy and per-slot share over collected layers."""
    balance = torch.zeros(())
    ent_sum, n = 0.0, 0
    share = torch.zeros(k1)
    for _layer, probs, chosen in collected:
        p = probs.reshape(-1, k1)
        c = chosen.reshape(-1)
        if mask is not None:
            keep = mask.reshape(-1).bool()
            p, c = p[keep], c[keep]
        if p.shape[0] == 0:
            continue
        f = torch.bincount(c, minlength=k1).float() / c.numel()
        balance = balance + k1 * (f * p.mean(0)).sum()
        ent = -(p.detach().clamp_min(1e-12).log() * p.detach()).sum(-1)
        ent_sum += float(ent.sum())
        n += p.shape[0]
        share += f
    layers = max(len(collected), 1)
    return {"balance": balance / layers, "entropy": ent_sum / max(n, 1),
            "share": (share / layers).tolist()}


def warm_start(moe: GatedMoE, prompts: list[tuple[list[int], torch.Tensor]], steps: int,
               lr: float, log: Callable[[dict[str, Any]], None] | None = None) -> list[float]:
    """Fit the gates to soft targets by KL(target || p) on every prompt token and layer."""
    opt = torch.optim.Adam(moe.gate_parameters(), lr=lr)
    device = next(moe.model.parameters()).device
    losses = []
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for ids, target in prompts:
            moe.collect = []
            try:
                moe.model(input_ids=torch.tensor([ids], device=device), use_cache=False)
                collected = moe.collect
            finally:
                moe.collect = None
            tgt = target.to(device)
            loss = torch.zeros((), device=device)
            for _layer, probs, _chosen in collected:
                logp = probs.reshape(-1, moe.k + 1).clamp_min(1e-12).log()
                loss = loss + (tgt * (tgt.clamp_min(1e-12).log() - logp)).sum(-1).mean()
            loss = loss / (len(collected) * len(prompts))
            loss.backward()
            total += float(loss.detach())
        opt.step()
        losses.append(total)
        if log:
            log({"phase": "warm", "step": 0, "warm_step": step + 1, "kl": total})
    return losses


def _save_gates(moe: GatedMoE, folder: Path) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file(moe.gate_state(), str(folder / "gates.safetensors"))
    return folder


# ---------------------------------------------------------------------------- the loop
def train_gates(cfg: GateTrainConfig, run_dir: str | Path,
                should_stop: Callable[[], bool] | None = None,
                progress: bool = False,
                env_makers: dict[str, Callable[[], Any]] | None = None) -> dict[str, Any]:
    """Warm start + GRPO on the gates of `cfg.moe`; everything goes into `run_dir`.

    `env_makers` maps names in `cfg.envs` to constructors (your own environments from a
    notebook); names not in it are resolved by `env_factory`.
    """
    from trace_lib.jobs import Cancelled
    from trace_lib.runtime.rollout import RolloutConfig, evaluate, run_group
    from trace_lib.train.grpo import group_advantages, grpo_loss, token_logprobs

    cfg.validate()
    stop = should_stop or (lambda: False)
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    (run / "gate_config.json").write_text(json.dumps(cfg.to_dict(), indent=2, default=str))
    metrics_path = run / "metrics.jsonl"
    metrics_path.unlink(missing_ok=True)
    t_start = time.perf_counter()
    torch.manual_seed(cfg.seed)
    if cfg.torch_threads > 0:
        torch.set_num_threads(cfg.torch_threads)
    moe = load_moe(cfg.moe)
    k1 = moe.k + 1
    makers = {name: (env_makers or {}).get(name) or env_factory(name) for name in cfg.envs}

    bar = None
    if progress:  # the CLI's foreground run: one bar over warm-start and GRPO steps
        from tqdm import tqdm

        warm_total = cfg.warm_steps if cfg.warm_seeds else 0
        bar = tqdm(total=warm_total + cfg.steps, desc="gates", unit="step")

    def write(row: dict[str, Any]) -> None:
        row = {**row, "elapsed_s": time.perf_counter() - t_start}
        with metrics_path.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        if bar is not None:
            bar.update(1)
            shown = {k: round(v, 4) for k, v in row.items()
                     if k in ("kl", "reward_mean", "routing_entropy") and v is not None}
            bar.set_postfix(phase=row["phase"], **shown)

    greedy = RolloutConfig(cfg.max_turns, cfg.max_tokens, cfg.max_sequence, temperature=0.0)
    evals: dict[str, Any] = {}
    eval_seeds = [cfg.eval_seed_start + i for i in range(cfg.eval_seeds)]

    def run_eval(tag: str) -> None:
        client = LocalMoEClient(moe)
        evals[tag] = {name: dataclasses.asdict(evaluate(makers[name], eval_seeds, client, greedy,
                                                        model="moe"))
                      for name in cfg.envs}
        (run / "eval.json").write_text(json.dumps(evals, indent=2))

    if eval_seeds:
        run_eval("before")
    # ---- warm start
    table: dict[str, Any] = {}
    if cfg.warm_seeds and cfg.warm_steps:
        seeds = [cfg.warm_seed_start + i for i in range(cfg.warm_seeds)]
        table = reward_table(moe, makers, seeds, greedy,
                             progress=(lambda m: print(m, flush=True)))
        (run / "warm_rewards.json").write_text(json.dumps({"slots": moe.slots, "rewards": table},
                                                          indent=2))
        prompts = []
        for name in cfg.envs:
            for seed in seeds:
                env = makers[name]()
                env.reset(seed)
                prompts.append((_prompt_ids(moe, env),
                                soft_targets(table[name][str(seed)], cfg.warm_temperature)))
        if stop():
            raise Cancelled()
        warm_start(moe, prompts, cfg.warm_steps, cfg.warm_lr, log=write)
        _save_gates(moe, run / "checkpoints" / "warm")
    # ---- GRPO on the gates
    rollout_cfg = RolloutConfig(cfg.max_turns, cfg.max_tokens, cfg.max_sequence, cfg.temperature)
    opt = torch.optim.AdamW(moe.gate_parameters(), lr=cfg.lr, weight_decay=0.0)
    client = LocalMoEClient(moe)
    last_reward = None
    for step in range(cfg.steps):
        if stop():
            raise Cancelled()
        t0 = time.perf_counter()
        groups = []
        for g in range(cfg.groups_per_step):
            index = step * cfg.groups_per_step + g
            name = cfg.envs[index % len(cfg.envs)]
            seed = cfg.train_seed_start + index
            groups.append(run_group(makers[name], seed, client, rollout_cfg, model="moe",
                                    group_size=cfg.group,
                                    request_seed=cfg.seed * 7_919 + index))
        t_roll = time.perf_counter() - t0
        flat = [r for grp in groups for r in grp]
        adv = group_advantages([[r.reward for r in grp] for grp in groups], cfg.loss.scale,
                               cfg.loss.eps)
        kept = [flat[i] for i in adv.kept]
        total_tokens = sum(r.n_sampled for r in kept)
        opt.zero_grad(set_to_none=True)
        loss_sum, bal_sum, ent_sum, share = 0.0, 0.0, 0.0, [0.0] * k1
        for r, a in zip(kept, adv.advantages, strict=True):
            ids = torch.tensor([r.token_ids])
            att = torch.ones_like(ids)
            moe.collect = []
            # trajectory mode pools over the prompt: everything before the first sampled token
            first = r.loss_mask.index(1) if 1 in r.loss_mask else len(r.loss_mask)
            moe.prompt_mask = (torch.arange(ids.shape[1]) < max(first, 1)).float()[None]
            try:
                new = token_logprobs(moe.model, ids, att)
                collected = moe.collect
            finally:
                moe.collect = None
                moe.prompt_mask = None
            mask = torch.tensor([r.loss_mask])[:, 1:]
            loss, st = grpo_loss(new, new.detach(), torch.tensor([a]), mask, cfg.loss,
                                 total_tokens=max(total_tokens, 1))
            stats = routing_stats(collected, k1)
            loss = loss + cfg.balance_coef * stats["balance"] / max(len(kept), 1)
            loss.backward()
            loss_sum += st.loss
            bal_sum += float(stats["balance"].detach())
            ent_sum += stats["entropy"]
            share = [s + v for s, v in zip(share, stats["share"], strict=True)]
        norm = torch.nn.utils.clip_grad_norm_(moe.gate_parameters(), cfg.max_grad_norm) \
            if kept else torch.tensor(0.0)
        if kept:
            opt.step()
        rewards = torch.tensor([r.reward for r in flat])
        nk = max(len(kept), 1)
        row = {"phase": "grpo", "step": step + 1, "reward_mean": float(rewards.mean()),
               "reward_std": float(rewards.std(unbiased=False)),
               "pass_rate": sum(r.passed for r in flat) / len(flat), "loss": loss_sum,
               "balance": bal_sum / nk, "routing_entropy": ent_sum / nk,
               **{f"share_{moe.slots[i]}": share[i] / nk for i in range(k1)},
               "grad_norm": float(norm), "groups_kept": adv.n_groups - adv.n_dropped_groups,
               "groups_dropped": adv.n_dropped_groups, "rollouts": len(flat),
               "sampled_tokens": sum(r.n_sampled for r in flat), "rollout_s": t_roll,
               "wall_s": time.perf_counter() - t0}
        write(row)
        last_reward = row["reward_mean"]
        _save_gates(moe, run / "checkpoints" / f"step_{step + 1}")
    if eval_seeds:
        run_eval("after")
    if bar is not None:
        bar.close()
    out = moe.save(run / "moe", extra={"trained_by": run.name})
    return {"moe_path": str(out.resolve()), "run_dir": str(run), "steps": cfg.steps,
            "warm_steps": cfg.warm_steps if table else 0, "final_reward": last_reward,
            "warm_rewards": table, "slots": moe.slots, "envs": cfg.envs,
            "eval_before": evals.get("before"), "eval_after": evals.get("after"),
            "gate_params": moe.gate_param_count(), "wall_s": time.perf_counter() - t_start}


def _job(spec: Any, run_dir: Path, should_stop: Callable[[], bool]) -> dict[str, Any]:
    cfg = GateTrainConfig.from_dict(spec.config, where=f"{run_dir / 'spec.json'}: config")
    return train_gates(cfg, run_dir, should_stop=should_stop)


def register_job_kind() -> None:
    """Make `train_gates` a kind of the training stage's job runner (idempotent)."""
    from trace_lib.jobs import register_job_kind as register

    register(JOB_KIND, _job)


def submit_gate_job(cfg: GateTrainConfig, backend: str = "local") -> Any:
    """Start gate training in the background; returns the JobSpec (run dir, id)."""
    from trace_lib.jobs import JobSpec, submit

    cfg.validate()
    register_job_kind()
    config = cfg.to_dict()
    config["moe"] = str(Path(cfg.moe).resolve())
    return submit(JobSpec(kind=JOB_KIND, config=config, backend=backend))


register_job_kind()
