"""Training the gates: a KL warm start from per-seed rewards, then GRPO on the gates only.

Design decisions
- Warm start: every slot (base and each adapter, by forcing the routing) is rolled out
  greedily on `warm_seeds` seeds of every capability environment. Per seed the rewards
  become a soft target over slots, softmax(r / tau), and the gates fit it by KL on the
  request tokens (the user's turn, the tokens trajectory routing pools over; every prompt
  token when there is no user turn) of every layer.
- The reward table can come from elsewhere (`train_gates(..., warm_rewards=)`, checked
  against the envs, warm seeds and slots): greedy episodes of the base and of each
  adapter served by vLLM as merged models cost ~1 CPU-s each on SmolLM2 where the
  in-process composed model takes 15-30 s (`bench/compose_real.py --engine vllm`).
- The warm start never overshoots: it fits on hidden states computed once, each prompt
  routed to its target slot (a convex softmax regression per layer, each step a few
  small matrix products, consistent at the optimum), with Adam at `warm_lr` (0.1) and a
  backtracking guard: each step's KL is compared with the last accepted one, and a step
  that raised it is undone and the learning rate halved. Before, plain Adam at 5e-2 on
  live routing drove the KL on `tiny` from 1.1 up to 6-7 (a routing flip at one layer
  changes the next layer's inputs, so the objective jumped); now the logged KL is
  non-increasing at any starting rate (tested from 1e-1 to 50), and on `tiny` 0.1 takes
  the KL from 1.10 to 0.04 in 30 steps where 1e-2 reaches 0.52.
- Gates learn from zero: routing in rollouts is the hard top-1 (zero gates = the base),
  and the loss pass uses the straight-through estimator over the softmax
  (`estimator="full"`), which gives every slot d loss / d w_i = <dL/dy, adapter_i(x)>, so
  a group with reward variance moves the gates even when every token went to the base.
  `estimator="chosen"` would give zero-initialised gates no gradient at all (slot 0
  carries no adapter), so training uses `full` unless told otherwise (tested: gates
  move from zero on the smoke environments with no warm start and no balance term).
- GRPO: the project's one GRPO step, `trace_lib.train.step.GRPOStep`, with the gate
  parameters as what trains and `GateForward` as its forward (log-probabilities of the
  gated model plus the balance loss and routing statistics); rollouts are the training
  stage's `run_group` through the in-process `LocalMoEClient`. So advantages, dropped
  constant groups, the token-level clip-higher loss, the no-signal count and warning and
  the sampler-temperature log-probs are exactly adapter training's. Gradients reach only
  the gates; the environments are mixed round-robin so no single capability owns them.
- A small Switch-style load-balance term, (K+1) * sum_i f_i * P_i (f = share of tokens
  routed to slot i, P = mean gate probability), keeps the gates from collapsing onto one
  slot.
- Gate movement is measured, not assumed: every metrics.jsonl row carries `gate_norm`
  (L2 norm of all gate weights and biases; 0 at init), `gate_delta` (its distance from
  the gates the phase started with), `routing_entropy` and `share_<slot>`; a run whose
  gates end where they started says so (`gates_moved: false` in the result and a line in
  log.txt), and the Routing page and `job status` show the same warning.
- Runs as a job kind (`train_gates`) of the job runner: a run directory with
  status.json, metrics.jsonl, log.txt, checkpoints/step_N/gates.safetensors and, at the
  end, a complete composed model folder `moe/` with the trained gates. It never opens
  the database: each environment arrives as its serialised spec in the config
  (`env_specs`, name -> `EnvSpec.to_json()`, filled by `workbench.jobs.submit_gates` on the
  app side: this stage provides the job function, it never submits);
  generated ones carry their code and run in the sandbox.
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
from trace_lib.errors import UserInputError, check_fields, config_from_dict
from trace_lib.runtime.base_models import DEVICE_NAMES, DTYPE_NAMES, is_device_name
from trace_lib.train.grpo import LossConfig

JOB_KIND = "train_gates"


@dataclass
class GateTrainConfig:
    moe: str  # composed model folder
    envs: list[str]  # capability environments (DOMAIN/CAPABILITY), mixed round-robin
    warm_seeds: int = 4
    warm_seed_start: int = 0
    warm_steps: int = 100  # cheap: fixed features, a few matrix products per step
    warm_lr: float = 1e-1  # Adam, with a backtracking guard: a step that raises the KL is undone
    warm_temperature: float = 0.1  # tau of softmax(reward / tau): low = trust the best slot
    steps: int = 10
    groups_per_step: int = 2
    group: int = 4
    lr: float = 1e-3
    balance_coef: float = 0.01
    max_grad_norm: float = 1.0
    max_turns: int = 4
    max_tokens: int | None = None  # None: from the envs' longest reference turn (+25%)
    max_sequence: int = 4096
    temperature: float = 1.0
    train_seed_start: int = 100  # training seeds are disjoint from warm and eval seeds
    eval_seeds: int = 0
    eval_seed_start: int = 10_000
    seed: int = 0
    torch_threads: int = 0  # 0 = torch's default; 1 is fastest for tiny models on a busy box
    # Where the composed model runs, as `TrainConfig.device`: "auto" is CUDA when torch sees
    # a GPU. Rollouts decode in-process with the gated model, so on a GPU both the rollouts
    # and the gate update move there. The gates stay float32 whatever `dtype` the base has.
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto (bfloat16 on CUDA, float32 on the CPU) | float32 | bfloat16
    estimator: str = "full"  # straight-through over every slot: gates learn from zero
    micro_batch: int = 4  # rollouts per loss forward
    env_specs: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> EnvSpec json
    loss: LossConfig = field(default_factory=LossConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "config") -> GateTrainConfig:
        check_fields(data, (f.name for f in dataclasses.fields(cls)), where)
        for req in ("moe", "envs"):
            if req not in data:
                raise UserInputError(f"{where}: field `{req}` is required")
        data = dict(data)
        if isinstance(data["envs"], str):
            data["envs"] = [e for e in data["envs"].split(",") if e]
        if isinstance(data.get("loss"), dict):
            data["loss"] = config_from_dict(LossConfig, data["loss"], f"{where}.loss")
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
        if not is_device_name(self.device):
            raise UserInputError(f"{where}: field `device` is {self.device!r}; expected "
                                 f"{DEVICE_NAMES}")
        if self.dtype not in DTYPE_NAMES:
            raise UserInputError(f"{where}: field `dtype` is {self.dtype!r}; expected "
                                 f"{', '.join(DTYPE_NAMES)}")
        if self.estimator not in ("full", "chosen"):
            raise UserInputError(f"{where}: field `estimator` must be full or chosen, got "
                                 f"{self.estimator!r}")


# --------------------------------------------------------------------------- pieces
def _prompt_ids(moe: GatedMoE, make_env: Callable[[], Any], seed: int) -> list[int]:
    from trace_lib.runtime.chat_format import render_prompt

    env = make_env()
    try:
        env.reset(seed)
        text = render_prompt(env.messages, env.tool_schemas or None)
    finally:
        if hasattr(env, "close"):  # sandboxed environments hold a worker process
            env.close()
    return moe.tokenizer(text, add_special_tokens=False)["input_ids"]


def gate_norm(moe: GatedMoE) -> float:
    """L2 norm of every gate weight and bias (0 for freshly composed gates)."""
    return float(torch.sqrt(sum((p.detach().float() ** 2).sum() for p in moe.gate_parameters())))


def gate_delta(moe: GatedMoE, start: list[torch.Tensor]) -> float:
    """L2 distance of the gates from `start` (a snapshot of `gate_parameters()`)."""
    return float(torch.sqrt(sum(((p.detach() - s) ** 2).sum()
                                for p, s in zip(moe.gate_parameters(), start, strict=True))))


def _snapshot(moe: GatedMoE) -> list[torch.Tensor]:
    return [p.detach().clone() for p in moe.gate_parameters()]


def reward_table(moe: GatedMoE, makers: dict[str, Callable[[], Any]], seeds: list[int],
                 rollout_cfg: Any = None,
                 progress: Callable[[str], None] | None = None,
                 episode: Callable[[str, int, int], float] | None = None) -> dict[str, Any]:
    """rewards[env][seed] = [reward of slot 0..K], each slot forced, greedy rollouts.

    `episode(env, seed, slot) -> reward` replaces the default rollout (a `LocalMoEClient`
    forced to the slot, `rollout_cfg`): the routing demo passes its own, which keeps each
    episode in its resumable file and decodes them batched."""
    from trace_lib.runtime.rollout import run_group

    def forced(env_name: str, seed: int, slot: int) -> float:
        client = LocalMoEClient(moe, force=slot)
        r = run_group(makers[env_name], seed, client, rollout_cfg, model="moe", group_size=1,
                      request_seed=seed)[0]
        return float(r.reward)

    run = episode or forced
    table: dict[str, dict[str, list[float]]] = {}
    for env_name in makers:
        table[env_name] = {}
        for seed in seeds:
            row = [float(run(env_name, seed, slot)) for slot in range(moe.k + 1)]
            table[env_name][str(seed)] = row
            if progress:
                progress(f"warm rewards {env_name} seed {seed}: {row}")
    return table


def check_reward_table(table: Any, envs: list[str], seeds: list[int], slots: int
                       ) -> dict[str, dict[str, list[float]]]:
    """`table` as `reward_table` returns it, or a UserInputError naming what is missing."""
    if not isinstance(table, dict):
        raise UserInputError(f"warm_rewards: expected a mapping env -> seed -> rewards, got "
                             f"{type(table).__name__}")
    out: dict[str, dict[str, list[float]]] = {}
    for env in envs:
        if env not in table:
            raise UserInputError(f"warm_rewards: no rewards for environment {env!r}")
        out[env] = {}
        for seed in seeds:
            row = table[env].get(str(seed))
            if (not isinstance(row, list) or len(row) != slots
                    or not all(isinstance(r, int | float) for r in row)):
                raise UserInputError(f"warm_rewards[{env!r}][{str(seed)!r}]: expected "
                                     f"{slots} rewards (one per slot), got {row!r}")
            out[env][str(seed)] = [float(r) for r in row]
    return out


def soft_targets(rewards: list[float], tau: float) -> torch.Tensor:
    r = torch.tensor(rewards, dtype=torch.float32)
    return torch.softmax(r / tau, dim=0)


def routing_stats(collected: list[tuple[int, torch.Tensor, torch.Tensor]], k1: int,
                  mask: torch.Tensor | None = None) -> dict[str, Any]:
    """Load-balance loss (with grad), mean entropy and per-slot share over collected layers."""
    device = collected[0][1].device if collected else torch.device("cpu")
    balance = torch.zeros((), device=device)
    ent_sum, n = 0.0, 0
    share = torch.zeros(k1, device=device)
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


def warm_features(moe: GatedMoE, prompts: list[tuple[list[int], torch.Tensor]]
                  ) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """The warm start's fixed problem: per layer the gate inputs [N, H] of every prompt's
    request tokens with the routing forced to the prompt's target slot (one forward per
    prompt), the soft target of each row [N, K+1] and a weight per row (each prompt counts
    equally). Forcing the target slot makes the features the ones the model will see once
    the gates do what the target asks (later layers read what earlier layers' adapters
    produced), so the fit is consistent at its optimum."""
    device = next(moe.model.parameters()).device
    per_layer: list[list[torch.Tensor]] = [[] for _ in range(moe.layers)]
    targets, weights = [], []
    for ids, target in prompts:
        keep = moe.request_tokens(ids).to(device)
        with torch.no_grad(), moe.force(int(target.argmax())):
            out = moe.model(input_ids=torch.tensor([ids], device=device), use_cache=False,
                            output_hidden_states=True)
            # hidden_states[l] is the input of block l: exactly what gate l reads.
            for layer in range(moe.layers):
                per_layer[layer].append(out.hidden_states[layer][0][keep].float())
            n = int(keep.sum())
            targets.append(target.to(device).float().expand(n, -1))
            weights.append(torch.full((n,), 1.0 / (n * len(prompts)), device=device))
    return [torch.cat(x) for x in per_layer], torch.cat(targets), torch.cat(weights)


def warm_start(moe: GatedMoE, prompts: list[tuple[list[int], torch.Tensor]], steps: int,
               lr: float, log: Callable[[dict[str, Any]], None] | None = None,
               backtrack: bool = True,
               problem: tuple[list[torch.Tensor], torch.Tensor, torch.Tensor] | None = None
               ) -> list[float]:
    """Fit the gates to soft targets by KL(target || p) on the request tokens of every
    prompt and layer (`problem`: `warm_features`' output when the caller has it already). Returns the KL of every accepted step (non-increasing with
    `backtrack`: a step that raised it is undone and the learning rate halved).

    The features are computed once, with each prompt routed to its target slot
    (`warm_features`): with fixed features the fit is a convex softmax regression per
    layer, so a smaller step always lowers the KL and the guard is sound (with live top-1
    routing a flip at layer l changes layer l+1's inputs and the KL jumps). Each step is
    then a few small matrix products, not a forward pass. GRPO afterwards trains on the
    live routing.
    """
    feats, tgt, w = problem if problem is not None else warm_features(moe, prompts)
    log_tgt = tgt.clamp_min(1e-12).log()
    opt = torch.optim.Adam(moe.gate_parameters(), lr=lr)
    start = _snapshot(moe)
    losses: list[float] = []
    best = float("inf")
    kept = _snapshot(moe)
    rate = lr

    def kl() -> torch.Tensor:
        total = torch.zeros((), device=tgt.device)
        for layer, x in enumerate(feats):
            logp = torch.log_softmax(moe.gates[layer](x), dim=-1)
            total = total + (w * (tgt * (log_tgt - logp)).sum(-1)).sum()
        return total / len(feats)

    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = kl()
        total = float(loss.detach())
        rejected = backtrack and total > best
        if rejected:
            # The previous step overshot: go back to the last accepted gates, halve the
            # rate, and step again from there.
            with torch.no_grad():
                for p, s in zip(moe.gate_parameters(), kept, strict=True):
                    p.copy_(s)
            rate /= 2
            for group in opt.param_groups:
                group["lr"] = rate
            opt.state.clear()
            loss = kl()
        else:
            best = total
            kept = _snapshot(moe)
            losses.append(total)
        loss.backward()
        opt.step()
        if log:
            log({"phase": "warm", "step": 0, "warm_step": step + 1, "kl": best,
                 "kl_tried": total, "rejected": rejected, "warm_lr": rate,
                 "gate_norm": gate_norm(moe), "gate_delta": gate_delta(moe, start)})
    if backtrack and losses:
        final = float(kl().detach())
        if final <= best:
            losses.append(final)
        else:
            with torch.no_grad():  # end on the best accepted gates, never on an overshoot
                for p, s in zip(moe.gate_parameters(), kept, strict=True):
                    p.copy_(s)
    return losses


def _save_gates(moe: GatedMoE, folder: Path) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file(moe.gate_state(), str(folder / "gates.safetensors"))
    return folder


# ---------------------------------------------------------------------------- the loop
def _turn_budget(moe: GatedMoE, makers: dict[str, Callable[[], Any]], max_turns: int) -> int:
    """Tokens per turn when the config gives none: the longest reference turn over the
    environments in the composed model's tokens + 25% (`reference_turn_budget`, the one
    home adapter training and `moe-eval` derive it from too)."""
    from trace_lib.train.local_rollouts import reference_turn_budget

    measured = reference_turn_budget(makers, moe.tokenizer, max_turns)
    for name, why in measured.unmeasured.items():
        print(f"[gates] turn budget of {name} not measured ({why})", flush=True)
    print(f"[gates] --max-tokens {measured.max_tokens}: the environments' longest reference "
          f"turn is {measured.longest_reference_turn} tokens, +25%", flush=True)
    return measured.max_tokens


def env_makers_for(cfg: GateTrainConfig,
                   given: dict[str, Callable[[], Any]] | None = None) -> dict[str, Callable[[], Any]]:
    """Constructors for `cfg.envs`: `given` first (a notebook's own classes), then the
    config's serialised `env_specs` (generated environments sandboxed), then built-ins,
    .py files and module:Class names. Never the database: this runs inside jobs."""
    return {name: (given or {}).get(name)
            or env_factory(name, env_spec=cfg.env_specs.get(name))
            for name in cfg.envs}


class GateForward:
    """The `Forward` of `trace_lib.train.step.GRPOStep` for the gated model: per-token
    log-probabilities (routing as in the rollouts: the same rule, the same request tokens),
    plus the load-balance loss and routing statistics over the sampled tokens."""

    def __init__(self, moe: GatedMoE, balance_coef: float, temperature: float):
        self.moe = moe
        self.balance_coef = balance_coef
        self.temperature = temperature
        self.n_kept = 1  # rollouts kept in the current step: the balance term is their mean

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, keep_from: int,
                 rollouts: list[Any]) -> Any:
        from trace_lib.train.grpo import token_logprobs
        from trace_lib.train.step import ForwardOut

        moe = self.moe
        device = next(moe.model.parameters()).device
        moe.collect = []
        try:
            lp = token_logprobs(moe.model, input_ids.to(device), attention_mask.to(device),
                                keep_from, temperature=self.temperature)
            collected = moe.collect
        finally:
            moe.collect = None
        width = input_ids.shape[1]
        sampled = torch.tensor([r.loss_mask + [0] * (width - len(r.loss_mask))
                                for r in rollouts], device=device).bool()
        stats = routing_stats(collected, moe.k + 1, mask=sampled)
        extra = self.balance_coef * stats["balance"] * len(rollouts) / max(self.n_kept, 1)
        out = {"balance": float(stats["balance"].detach()),
               "routing_entropy": stats["entropy"],
               **{f"share_{moe.slots[i]}": v for i, v in enumerate(stats["share"])}}
        return ForwardOut(lp, extra_loss=extra if extra.requires_grad else None, stats=out)


def gate_grpo(moe: GatedMoE, cfg: GateTrainConfig) -> tuple[Any, GateForward]:
    """The project's one GRPO step (`trace_lib.train.step.GRPOStep`) with the gate
    parameters as what trains."""
    from trace_lib.train.step import GRPOStep, StepSettings

    params = moe.gate_parameters()
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    forward = GateForward(moe, cfg.balance_coef, cfg.temperature)
    settings = StepSettings(loss=cfg.loss, micro_batch=cfg.micro_batch, epochs_per_step=1,
                            max_grad_norm=cfg.max_grad_norm, temperature=cfg.temperature)
    pad = moe.tokenizer.pad_token_id if moe.tokenizer is not None else 0
    return GRPOStep(params, opt, settings, forward=forward, pad_id=pad or 0), forward


def gate_grpo_step(step: Any, forward: GateForward, groups: list[list[Any]]) -> dict[str, Any]:
    """One update of the gates from rollout groups (the rollouts' routing was the gates'
    own); returns the step's metrics (GRPO's plus routing entropy, shares, balance)."""
    from trace_lib.train.grpo import group_advantages

    s = step.settings
    forward.n_kept = len(group_advantages([[r.reward for r in g] for g in groups],
                                          s.loss.scale, s.loss.eps).kept)
    metrics = step.update(groups).metrics
    # A step without signal runs no forward: its routing fields are present, and empty.
    for key in ("balance", "routing_entropy", *(f"share_{slot}" for slot in forward.moe.slots)):
        metrics.setdefault(key, None)
    return metrics


def train_gates(cfg: GateTrainConfig, run_dir: str | Path,
                should_stop: Callable[[], bool] | None = None,
                progress: bool = False,
                env_makers: dict[str, Callable[[], Any]] | None = None,
                warm_rewards: dict[str, dict[str, list[float]]] | None = None
                ) -> dict[str, Any]:
    """Warm start + GRPO on the gates of `cfg.moe`; everything goes into `run_dir`.

    `env_makers` maps names in `cfg.envs` to constructors (your own environments from a
    notebook); other names resolve through `env_makers_for`. `warm_rewards` is a reward
    table measured elsewhere (`reward_table`'s shape: env -> str(seed) -> one reward per
    slot, for every env of `cfg.envs` and every warm seed), e.g. greedy episodes of each
    adapter served by vLLM, which costs a fraction of the in-process rollouts on a CPU;
    without it the table is measured here.
    """
    from trace_lib.jobs import Cancelled
    from trace_lib.runtime.base_models import resolve_device, resolve_dtype
    from trace_lib.runtime.rollout import RolloutConfig, evaluate, run_group

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
    device = resolve_device(cfg.device)
    moe = load_moe(cfg.moe, device=device, dtype=resolve_dtype(cfg.dtype, device))
    print(f"[gates] model on {device} ({next(moe.model.parameters()).dtype})", flush=True)
    moe.config.estimator = cfg.estimator  # type: ignore[assignment]
    makers = env_makers_for(cfg, env_makers)
    if cfg.max_tokens is None:  # derived: recorded where the run keeps its settings
        cfg = dataclasses.replace(cfg, max_tokens=_turn_budget(moe, makers, cfg.max_turns))
        (run / "gate_config.json").write_text(json.dumps(cfg.to_dict(), indent=2, default=str))
    initial = _snapshot(moe)
    initial_norm = gate_norm(moe)

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
                     if k in ("kl", "reward_mean", "routing_entropy", "gate_norm")
                     and v is not None}
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
        if warm_rewards is not None:
            table = check_reward_table(warm_rewards, cfg.envs, seeds, moe.k + 1)
        else:
            table = reward_table(moe, makers, seeds, greedy,
                                 progress=(lambda m: print(m, flush=True)))
        (run / "warm_rewards.json").write_text(json.dumps({"slots": moe.slots, "rewards": table},
                                                          indent=2))
        prompts = [(_prompt_ids(moe, makers[name], seed),
                    soft_targets(table[name][str(seed)], cfg.warm_temperature))
                   for name in cfg.envs for seed in seeds]
        if stop():
            raise Cancelled()
        warm_start(moe, prompts, cfg.warm_steps, cfg.warm_lr, log=write)
        _save_gates(moe, run / "checkpoints" / "warm")
    # ---- GRPO on the gates
    rollout_cfg = RolloutConfig(cfg.max_turns, cfg.max_tokens, cfg.max_sequence, cfg.temperature)
    grpo, forward = gate_grpo(moe, cfg)
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
        stats = gate_grpo_step(grpo, forward, groups)
        row = {"phase": "grpo", "step": step + 1, **stats,
               "gate_norm": gate_norm(moe), "gate_delta": gate_delta(moe, initial),
               "rollout_s": t_roll, "wall_s": time.perf_counter() - t0}
        write(row)
        last_reward = row["reward_mean"]
        _save_gates(moe, run / "checkpoints" / f"step_{step + 1}")
    if eval_seeds:
        run_eval("after")
    if bar is not None:
        bar.close()
    moved = gate_delta(moe, initial)
    if moved <= 1e-8:
        print(f"WARNING: the gates did not move (norm {initial_norm:.4g} before and after): "
              "no group had reward variance, or every step was skipped. Routing is what it "
              "was; see docs/COMPOSE.md, 'Gates that learn'.", flush=True)
    out = moe.save(run / "moe", extra={"trained_by": run.name})
    return {"moe_path": str(out.resolve()), "run_dir": str(run), "steps": cfg.steps,
            "max_tokens": cfg.max_tokens,
            "warm_steps": cfg.warm_steps if table else 0, "final_reward": last_reward,
            "warm_rewards": table, "slots": moe.slots, "envs": cfg.envs,
            "eval_before": evals.get("before"), "eval_after": evals.get("after"),
            "gate_params": moe.gate_param_count(), "gate_norm": gate_norm(moe),
            "gate_delta": moved, "gates_moved": moved > 1e-8,
            "wall_s": time.perf_counter() - t_start}


def run_job(spec: Any, run_dir: Path, should_stop: Callable[[], bool]) -> dict[str, Any]:
    """The `train_gates` job kind (listed in `trace_lib.jobs.kinds`)."""
    cfg = GateTrainConfig.from_dict(spec.config, where=f"{run_dir / 'spec.json'}: config")
    return train_gates(cfg, run_dir, should_stop=should_stop)

