"""The routing demo: two conflicting skills, their per-request router, and the replies that
show it, built by one job (`demo adapters`, the "Build the routing demo" button).

    cfg = DemoConfig(model="smollm2-135m", out="data/models/routing-demo/smollm2-135m")
    result = build(cfg)                         # or the `routing_demo` job kind
    json.loads((Path(cfg.out) / "demo.json").read_text())  # what the Routing page shows

Design decisions
- One folder holds everything (`out`, under the models folder by default: it is kept
  across `make demo` runs like a prepared base model): `adapters/<capability>/` (two SFT
  LoRA adapters), `moe/` (the composition, gates warm-started, trajectory mode),
  `per_request/` (`moe-merge --per-request`'s export: one merged adapter per capability
  and `router.json`), `episodes.jsonl` (every greedy episode, one line each), `traces/`
  (the composed replies' per-token routing) and, last, `demo.json` (the examples, the
  figures the page's "what you are seeing" text quotes). `demo.json` exists only when the
  build completed, so "is the demo built" is one file test.
- Resumable by its files, phase by phase: a saved adapter is not retrained, a composed
  folder with `gates.safetensors` is not re-warmed, an episode already in
  `episodes.jsonl` is not rolled out again. Running the job again (or a new job on the
  same folder) continues where the last one stopped; `should_stop` is polled between
  SFT steps and between batches of episodes.
- The settings are the benches' (bench/README.md, "Composition", sessions 10-14), cut
  toward 15 CPU-minutes (measured from a fresh models folder: 919 CPU-s, 15.3 CPU-min,
  on the 2-core box, bench/README.md "Routing demo build"): SFT on each environment's reference actions (the warm start that
  taught SmolLM2 `tool_calling_precision`; `precondition_verification`'s SFT adapter
  reads, then refuses, so the two conflict), the small built-in environments
  (difficulty 1, the capability's tools, the policy excerpt), gates warm-started on a
  reward table of greedy episodes of every slot (`gate_training.reward_table`) on
  `warm_seeds` training seeds per environment, one more while an environment's seeds
  score every slot the same (up to `warm_seeds_max`: such a seed has no preference to
  fit), each environment's row scaled so its best slot is 1 (KL fit on the request
  tokens, `gate_training.warm_start`), no gate GRPO (the benches' per-request routing
  came from the warm start alone), the per-request export. SFT is 8 steps (the 16-step
  adapters' losses were 0.13 / 0.17 at step 8) and one warm seed per environment: the
  cuts the 16-step, 2-seed build's measurement named.
- Greedy episodes of one policy on one environment (the 5 example seeds, a warm seed)
  are decoded together (`local_client.greedy_episodes`: each is `run_group`'s episode,
  its turns answered in one left-padded `generate` call with the others'), in-process,
  so the build needs only the project's venv (`make demo` builds no vLLM venv). Measured,
  it saves little on the CPU (56.9 vs 61.4 CPU-s for 5 base episodes,
  bench/README.md "Routing demo build", session 2); the build's cut came mostly from SFT
  8 and one warm seed.
- SFT keeps the shared prompt prefix (system + tools, the same for every seed of one
  environment) out of the gradient (`PrefixForward`): the prefix is ~90% of each demo,
  so a step costs one no-grad prefill plus the request and the reply.
- The example requests are held-out seeds (`example_seed_start`, disjoint from the SFT
  seeds 10**6-n.., the warm seeds 0.. and the gate-training seeds 100..). For each: the
  router's choice (`Router`, the exported per-request router: the gates' request-level
  choice matched to the nearest capability pattern), and greedy episodes of the base,
  each adapter, the uniform linear merge and the composed model, each with the
  environment's verdict (reward, passed, the verifier's reasons).
- The composed model's reply is the routed capability's merged adapter, as vLLM would
  serve it. When that adapter's pattern is its own adapter at every layer it *is* that
  adapter (the same forced slot of the same model, greedy), so its episode is reused
  (`reused_from` says so) instead of decoded twice; any other pattern is decoded with the
  pattern forced. The per-token colouring replays the composed reply under token-level
  `top1` routing: which slot each token's gate prefers, a view, not what decoded it.
- Never opens the database (it runs inside a job); the use case
  (`workbench.routing_demo`) and the one job sync record the composed model.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_lib.errors import UserInputError

JOB_KIND = "routing_demo"
DEFAULT_CAPABILITIES = ("tool_calling_precision", "precondition_verification")
FORMAT = "trace-routing-demo/1"


@dataclass
class DemoConfig:
    model: str = "smollm2-135m"
    out: str = ""  # the demo folder (the use case fills it: under the models folder)
    domain: str = "airline"
    capabilities: list[str] = field(default_factory=lambda: list(DEFAULT_CAPABILITIES))
    # The small built-in environments the benches trained on.
    env_options: dict[str, Any] = field(default_factory=lambda: {
        "tools": "capability", "policy": "excerpt", "difficulty": 1, "distractors": 0})
    # Turns per episode: precision writes then answers; precondition reads twice, then acts.
    max_turns: dict[str, int] = field(default_factory=lambda: {
        "tool_calling_precision": 2, "precondition_verification": 3})
    max_tokens: dict[str, int] = field(default_factory=dict)  # missing: reference turn +25%
    max_sequence: int = 4096
    lora_rank: int = 16
    # 8 steps: the 16-step adapters' losses were already 0.13 / 0.17 at step 8, and SFT
    # was half of the build's CPU (bench/README.md "Routing demo build").
    sft_steps: int = 8
    sft_batch: int = 2
    sft_seeds: int = 32
    sft_lr: float = 1e-3
    # One warm seed per environment; an environment whose seeds so far score every slot
    # the same (no preference to fit) gets the next seed, up to `warm_seeds_max`.
    warm_seeds: int = 1
    warm_seeds_max: int = 3
    warm_steps: int = 100
    warm_lr: float = 1e-1
    warm_temperature: float = 0.1
    examples: int = 5  # held-out requests per environment
    example_seed_start: int = 20_000
    torch_threads: int = 1
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "config") -> DemoConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        extra = sorted(set(data) - known)
        if extra:
            raise UserInputError(f"{where}: unknown fields {extra}; expected {sorted(known)}")
        cfg = cls(**data)
        cfg.validate(where)
        return cfg

    def validate(self, where: str = "config") -> None:
        if not self.out:
            raise UserInputError(f"{where}: field `out` (the demo folder) is required")
        if len(self.capabilities) != 2 or len(set(self.capabilities)) != 2:
            raise UserInputError(f"{where}: field `capabilities` needs two different "
                                 f"capabilities, got {self.capabilities}")
        for name in ("sft_steps", "sft_batch", "sft_seeds", "examples", "warm_seeds"):
            if getattr(self, name) < 1:
                raise UserInputError(f"{where}: field `{name}` must be >= 1")
        if self.warm_seeds_max < self.warm_seeds:
            raise UserInputError(f"{where}: field `warm_seeds_max` ({self.warm_seeds_max}) "
                                 f"must be >= `warm_seeds` ({self.warm_seeds})")

    def env_name(self, cap: str) -> str:
        return f"{self.domain}/{cap}"

    def recipe(self) -> dict[str, Any]:
        """What decides the result (the folder is where, not what): a built demo whose
        recipe differs is stale."""
        return {k: v for k, v in self.to_dict().items() if k not in ("out", "torch_threads")}


# --------------------------------------------------------------------------- pieces


def _makers(cfg: DemoConfig) -> dict[str, Callable[[], Any]]:
    from trace_lib.envs import registry

    out = {}
    for cap in cfg.capabilities:
        spec = registry.require_static(cfg.env_name(cap))
        out[cap] = registry.env_factory(spec, options=cfg.env_options)
    return out


def _close(env: Any) -> None:
    if hasattr(env, "close"):
        env.close()


class _Progress:
    """metrics.jsonl rows (`step` counts finished units: the job views' steps) + stderr
    (stdout stays the verb's, e.g. its --json document)."""

    def __init__(self, run_dir: Path | None, total: int, echo: bool):
        self.path = run_dir / "metrics.jsonl" if run_dir else None
        self.total = total
        self.step = 0
        self.echo = echo
        self.t0 = time.perf_counter()

    def __call__(self, phase: str, message: str, **extra: Any) -> None:
        self.step += 1
        row = {"step": self.step, "total": self.total, "phase": phase, "message": message,
               "elapsed_s": round(time.perf_counter() - self.t0, 1),
               "cpu_s": round(_cpu_s(), 1), **extra}
        if self.path is not None:
            with self.path.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
        if self.echo:
            print(f"[demo {self.step}/{self.total}] {phase}: {message} "
                  f"({row['cpu_s']:.0f} CPU-s)", file=sys.stderr, flush=True)


def _cpu_s() -> float:
    """CPU seconds of this process and its waited-for children."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def train_adapter(cfg: DemoConfig, cap: str, make_env: Callable[[], Any], folder: Path,
                  stop: Callable[[], bool]) -> dict[str, Any]:
    """SFT one LoRA adapter on `cap`'s reference episodes (training seeds 10**6-n..)."""
    import torch

    from trace_lib.jobs import Cancelled
    from trace_lib.runtime.base_models import load_model, resolve_model
    from trace_lib.runtime.lora import LoraSettings, attach_lora, save_adapter, trainable_parameters
    from trace_lib.train.local_rollouts import (
        PrefixForward,
        demo_prefix,
        reference_demos,
        sft,
    )

    t0 = time.perf_counter()
    model_path = resolve_model(cfg.model)
    base, tok = load_model(model_path)
    model = attach_lora(base, LoraSettings(rank=cfg.lora_rank, alpha=cfg.lora_rank),
                        seed=cfg.seed)
    demos = reference_demos(make_env, tok, cfg.sft_seeds, cfg.max_turns.get(cap, 3))
    if not demos:
        raise UserInputError(f"{cfg.env_name(cap)}: no reference actions to learn from")
    prefix = demo_prefix(demos)
    params = trainable_parameters(model)
    opt = torch.optim.AdamW(params, lr=cfg.sft_lr, weight_decay=0.0)
    losses: list[float] = []

    def log(row: dict[str, Any]) -> None:
        losses.append(float(row["loss"]))
        if stop():
            raise Cancelled()

    sft(params, opt, demos, PrefixForward(model, prefix, 1.0), steps=cfg.sft_steps,
        batch=cfg.sft_batch, pad_id=tok.pad_token_id or 0, seed=cfg.seed,
        train_mode=lambda on: model.train(on), log=log)
    save_adapter(model, folder, model_path)
    info = {"capability": cap, "steps": cfg.sft_steps, "demos": len(demos),
            "prefix_tokens": len(prefix), "loss_first": losses[0], "loss_last": losses[-1],
            "wall_s": round(time.perf_counter() - t0, 1)}
    (folder / "sft.json").write_text(json.dumps({**info, "losses": losses}, indent=2))
    return info


def _episode(moe: Any, make_env: Callable[[], Any], seed: int, cfg_roll: Any,
             **client_kw: Any) -> dict[str, Any]:
    from trace_lib.compose.local_client import LocalMoEClient
    from trace_lib.runtime.rollout import run_group

    t0 = time.perf_counter()
    r = run_group(make_env, seed, LocalMoEClient(moe, **client_kw), cfg_roll, model="moe",
                  group_size=1, request_seed=seed)[0]
    return {"reward": float(r.reward), "passed": bool(r.passed), "reasons": list(r.reasons),
            "turns": r.turns, "messages": r.messages, "wall_s": round(time.perf_counter() - t0, 2)}


def _rollout_row(r: Any, wall_s: float) -> dict[str, Any]:
    return {"reward": float(r.reward), "passed": bool(r.passed), "reasons": list(r.reasons),
            "turns": r.turns, "messages": r.messages, "wall_s": round(wall_s, 2)}


def _no_preference(rows: dict[str, list[float]]) -> bool:
    """Every slot has the same mean reward over these seeds: nothing for the gates to fit."""
    means = [sum(col) / len(col) for col in zip(*rows.values(), strict=True)]
    return max(means) == min(means)


def _opening(make_env: Callable[[], Any], seed: int) -> tuple[list[dict[str, Any]], Any]:
    env = make_env()
    try:
        env.reset(seed)
        return list(env.messages), env.tool_schemas or None
    finally:
        _close(env)


def _shared_opening(moe: Any, openings: list[tuple[list[dict[str, Any]], Any]]) -> list[int]:
    """The token ids every example of one environment opens with (system prompt and tool
    block): what their per-token traces share (`traces.trace_prefix`)."""
    from trace_lib.compose.traces import token_roles
    from trace_lib.train.local_rollouts import common_prefix

    rows = [token_roles(moe.tokenizer, m, t, add_generation_prompt=False)[0]
            for m, t in openings]
    return common_prefix(rows) if len(rows) > 1 else []


def _request_text(messages: list[dict[str, Any]]) -> str:
    return next((str(m.get("content") or "") for m in messages if m["role"] == "user"), "")


class _Episodes:
    """episodes.jsonl: one finished episode per line, keyed (kind, capability, seed, policy)."""

    def __init__(self, path: Path):
        self.path = path
        self.rows: dict[tuple[str, str, int, str], dict[str, Any]] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    row = json.loads(line)
                    self.rows[(row["kind"], row["capability"], row["seed"], row["policy"])] = row

    def get(self, key: tuple[str, str, int, str]) -> dict[str, Any] | None:
        return self.rows.get(key)

    def add(self, row: dict[str, Any]) -> None:
        self.rows[(row["kind"], row["capability"], row["seed"], row["policy"])] = row
        with self.path.open("a") as fh:
            fh.write(json.dumps(row) + "\n")


def policy_names(caps: list[str]) -> list[str]:
    return ["base", *[f"adapter:{c}" for c in caps], "linear merge", "composed"]


def _policy_kwargs(caps: list[str]) -> dict[str, dict[str, Any]]:
    k = len(caps)
    out: dict[str, dict[str, Any]] = {"base": {"force": 0}}
    out.update({f"adapter:{c}": {"force": i + 1} for i, c in enumerate(caps)})
    out["linear merge"] = {"mix": [0.0] + [1.0 / k] * k}
    return out


# ----------------------------------------------------------------------------- build


def total_units(cfg: DemoConfig) -> int:
    """Progress rows a full build writes (the job views' 'steps' denominator)."""
    k = len(cfg.capabilities)
    warm = k * cfg.warm_seeds * (k + 1)
    examples = k * cfg.examples * (k + 4)  # base, adapters, merge, composed, trace
    return k + 1 + warm + 1 + 1 + examples + 1


def build(cfg: DemoConfig, run_dir: str | Path | None = None,
          should_stop: Callable[[], bool] | None = None, progress: bool = True
          ) -> dict[str, Any]:
    """Build (or finish building) the demo in `cfg.out`; returns demo.json's summary."""
    import torch

    from trace_lib.compose.export import Router, export_per_request
    from trace_lib.compose.gate_training import (
        _prompt_ids,
        reward_table,
        soft_targets,
        warm_start,
    )
    from trace_lib.compose.gated import MoEConfig, compose, load_moe
    from trace_lib.compose.local_client import greedy_episodes
    from trace_lib.compose.traces import TracePrefix, replay_trajectory, trace_prefix
    from trace_lib.jobs import Cancelled
    from trace_lib.runtime.rollout import RolloutConfig
    from trace_lib.train.local_rollouts import derived_max_tokens, longest_reference_turn

    cfg.validate()
    stop = should_stop or (lambda: False)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    recipe_path = out / "recipe.json"
    if recipe_path.exists() and json.loads(recipe_path.read_text()) != cfg.recipe():
        raise UserInputError(f"{out}: holds a demo built with other settings; remove the "
                             "folder (or pick another) to build this one")
    recipe_path.write_text(json.dumps(cfg.recipe(), indent=2))
    if cfg.torch_threads > 0:
        torch.set_num_threads(cfg.torch_threads)
    torch.manual_seed(cfg.seed)
    run = Path(run_dir) if run_dir else None
    note = _Progress(run, total_units(cfg), progress)
    cpu0 = _cpu_s()
    costs: dict[str, float] = {}
    caps = list(cfg.capabilities)
    makers = _makers(cfg)

    def spent(phase: str, since: float) -> float:
        costs[phase] = round(costs.get(phase, 0.0) + _cpu_s() - since, 1)
        return _cpu_s()

    # ---- 0. the base model (prepared on first use: a fresh models folder converts
    # SmolLM2's GGUF here), its own line in the cost table rather than inside SFT
    t = _cpu_s()
    from trace_lib.runtime.base_models import resolve_model

    resolve_model(cfg.model)
    t = spent("base model", t)

    # ---- 1. adapters
    adapters = {}
    for cap in caps:
        folder = out / "adapters" / cap
        if (folder / "adapter_model.safetensors").exists() and (folder / "sft.json").exists():
            adapters[cap] = json.loads((folder / "sft.json").read_text())
            note("adapters", f"{cap}: kept from the last build")
            continue
        if stop():
            raise Cancelled()
        info = train_adapter(cfg, cap, makers[cap], folder, stop)
        adapters[cap] = info
        gc.collect()  # the trained model and its optimizer go before the next one loads
        note("adapters", f"{cap}: SFT {info['steps']} steps, loss {info['loss_first']:.3f} -> "
                         f"{info['loss_last']:.3f}")
    t = spent("sft", t)

    # ---- 2. compose (trajectory mode: one choice per request)
    moe_dir = out / "moe"
    gates_file = moe_dir / "gates.safetensors"
    warm_done = (out / "warm_rewards.json").exists() and gates_file.exists()
    if warm_done:
        moe = load_moe(moe_dir)
        note("compose", "kept from the last build")
    else:
        specs = [(cap, out / "adapters" / cap) for cap in caps]
        moe = compose(cfg.model, specs, out=moe_dir, config=MoEConfig(mode="trajectory"))
        note("compose", f"{len(caps)} adapters into {moe.layers} layers, "
                        f"{moe.gate_param_count():,} gate parameters")
    t = spent("compose", t)

    budgets = {}
    for cap in caps:
        if cap in cfg.max_tokens:
            budgets[cap] = int(cfg.max_tokens[cap])
            continue
        env = makers[cap]()
        try:
            longest = longest_reference_turn(env, range(4), moe.tokenizer,
                                             cfg.max_turns.get(cap, 3))
        finally:
            _close(env)
        budgets[cap] = derived_max_tokens(longest)
    rollout = {cap: RolloutConfig(cfg.max_turns.get(cap, 3), budgets[cap], cfg.max_sequence,
                                  temperature=0.0) for cap in caps}
    episodes = _Episodes(out / "episodes.jsonl")
    kwargs = _policy_kwargs(caps)

    def run_episode(kind: str, cap: str, seed: int, policy: str, **kw: Any) -> dict[str, Any]:
        key = (kind, cap, seed, policy)
        row = episodes.get(key)
        if row is None:
            if stop():
                raise Cancelled()
            row = {"kind": kind, "capability": cap, "seed": seed, "policy": policy,
                   **_episode(moe, makers[cap], seed, rollout[cap], **kw)}
            episodes.add(row)
        return row

    def decode(phase: str, keys: list[tuple[str, str, int, str]]) -> None:
        """Roll out the missing episodes among `keys`; those of one policy and one
        environment are decoded together (`greedy_episodes`), one progress row each."""
        groups: dict[tuple[str, str], list[tuple[str, str, int, str]]] = {}
        for key in keys:
            if episodes.get(key) is None:
                groups.setdefault((key[3], key[1]), []).append(key)
        for (pol, cap), group in groups.items():
            if stop():
                raise Cancelled()
            t0 = time.perf_counter()
            done = greedy_episodes(moe, [(makers[cap], seed, rollout[cap])
                                         for _, _, seed, _ in group], **kwargs[pol])
            wall = (time.perf_counter() - t0) / len(group)
            for (kind, _, seed, _), r in zip(group, done, strict=True):
                episodes.add({"kind": kind, "capability": cap, "seed": seed, "policy": pol,
                              **_rollout_row(r, wall), "batch": len(group)})
                note(phase, f"{cap} seed {seed} {pol}: reward {r.reward:.2f}"
                            + (f" (batch of {len(group)})" if len(group) > 1 else ""))

    # ---- 3. warm start from a small reward table (every slot forced, greedy)
    slot_policies = ["base", *[f"adapter:{c}" for c in caps]]

    def warm_reward(cap: str, seed: int, slot: int) -> float:  # decoded just before
        return float(run_episode("warm", cap, seed, slot_policies[slot],
                                 **kwargs[slot_policies[slot]])["reward"])

    if not warm_done:
        table: dict[str, dict[str, list[float]]] = {cap: {} for cap in caps}
        pending, seed = list(caps), 0
        while pending:
            decode("warm rewards", [("warm", c, seed, p) for c in pending for p in slot_policies])
            part = reward_table(moe, {c: makers[c] for c in pending}, [seed],
                                episode=warm_reward)
            for c in pending:
                table[c][str(seed)] = part[c][str(seed)]
            seed += 1
            # A seed where every slot scored the same (often 0 at this size) says nothing:
            # the first SmolLM2 build fitted such a uniform target as "no preference" and
            # exported one pattern for both capabilities. Such an environment gets the
            # next seed instead, up to warm_seeds_max.
            pending = [c for c in pending if seed < cfg.warm_seeds_max
                       and (seed < cfg.warm_seeds or _no_preference(table[c]))]
            if seed >= cfg.warm_seeds:  # seeds beyond the planned ones: more progress rows
                note.total += len(pending) * len(slot_policies)
        t = spent("warm rewards", t)
        # One target per capability: its environment's mean reward per slot over its warm
        # seeds, scaled so that the environment's best slot is 1. Unscaled, a low-reward
        # environment (precondition: best mean 0.125) got a soft target beside the
        # other's sharp one, block 0 (which sees single tokens) leaned to the sharp one's
        # slot and the later blocks followed (one pattern for both again). Scaled, every
        # held-out request of both chose its own adapter at all 30 layers.
        pooled = {}
        for cap in caps:
            rows = table[cap]
            mean = [sum(r[i] for r in rows.values()) / len(rows) for i in range(moe.k + 1)]
            top = max(mean)
            pooled[cap] = [m / top for m in mean] if top > 0 else mean
        prompts = [(_prompt_ids(moe, makers[cap], int(seed)),
                    soft_targets(pooled[cap], cfg.warm_temperature))
                   for cap in caps for seed in table[cap]]
        kl = warm_start(moe, prompts, cfg.warm_steps, cfg.warm_lr)
        moe.save(moe_dir, extra={"trained_by": "routing demo"})
        (out / "warm_rewards.json").write_text(json.dumps(
            {"slots": moe.slots, "rewards": table, "kl": kl}, indent=2))
        note("warm start", f"{cfg.warm_steps} KL steps on {len(prompts)} requests"
                           + (f", KL {kl[0]:.3f} -> {kl[-1]:.3f}" if kl else ""))
    else:
        note("warm start", "kept from the last build")
    warm = json.loads((out / "warm_rewards.json").read_text())
    warm_seeds = {cap: [int(s) for s in warm["rewards"][cap]] for cap in caps}
    t = spent("gates", t)

    # ---- 4. per-request export (patterns measured on the warm seeds' requests)
    router_dir = out / "per_request"
    moe.set_mode("trajectory")
    if not (router_dir / "router.json").exists():
        requests = {cap: [_opening(makers[cap], s) for s in warm_seeds[cap]] for cap in caps}
        export_per_request(moe, router_dir, requests)
    meta = json.loads((router_dir / "router.json").read_text())
    router = Router.over(moe, meta, router_dir)
    note("export", "router: " + ", ".join(
        f"{c} -> {sum(1 for s in e['layer_slots'] if s == caps.index(c) + 1)}/{moe.layers} "
        f"layers own adapter" for c, e in meta["routes"].items()))
    t = spent("export", t)

    # ---- 5. the example requests: route, every policy's reply, the composed colouring
    examples = []
    trace_dir = out / "traces"
    decoded = ["base", *[f"adapter:{c}" for c in caps], "linear merge"]
    decode("examples", [("example", cap, cfg.example_seed_start + i, pol) for pol in decoded
                        for cap in caps for i in range(cfg.examples)])
    for cap in caps:
        openings = [_opening(makers[cap], cfg.example_seed_start + i)
                    for i in range(cfg.examples)]
        shared: TracePrefix | None = None  # the environment's opening, run once (top1)
        for i in range(cfg.examples):
            seed = cfg.example_seed_start + i
            messages, tools = openings[i]
            choice = router.choice(messages, tools)  # over the cached opening
            routed = router.route_from_choice(choice)
            replies = {pol: run_episode("example", cap, seed, pol, **kwargs[pol])
                       for pol in decoded}  # decoded above: read back
            pattern = meta["routes"][routed]["layer_slots"]
            slot = caps.index(routed) + 1
            if all(s == slot for s in pattern):
                composed = {**replies[f"adapter:{routed}"], "policy": "composed",
                            "reused_from": f"adapter:{routed}"}
            else:
                composed = run_episode("example", cap, seed, f"composed:{routed}",
                                       force=list(pattern))
            replies["composed"] = composed
            note("examples", f"{cap} seed {seed} composed -> {routed}: reward "
                             f"{composed['reward']:.2f}")
            trace_file = trace_dir / f"{cap}-{seed}.npz"
            if not trace_file.exists():
                moe.set_mode("top1")
                try:
                    if shared is None:
                        shared = trace_prefix(moe, _shared_opening(moe, openings))
                    trace = replay_trajectory(moe, composed["messages"], tools,
                                              meta={"source": "routing demo", "env": cap,
                                                    "seed": seed, "routed_to": routed},
                                              prefix=shared)
                finally:
                    moe.set_mode("trajectory")
                trace.id = f"{cap}-{seed}"
                trace.save(trace_dir)
            note("traces", f"{cap} seed {seed}: per-token routing saved")
            examples.append({
                "capability": cap, "env": cfg.env_name(cap), "seed": seed,
                "request": _request_text(messages), "routed_to": routed,
                "right": routed == cap, "choice": choice, "pattern": pattern,
                "trace": str(trace_file.relative_to(out)),
                "replies": {p: {k: v for k, v in r.items()
                                if k not in ("kind", "capability", "seed")}
                            for p, r in replies.items()}})
    t = spent("examples", t)

    # ---- 6. the figures the page quotes
    policies = policy_names(caps)
    passes = {p: {c: sum(e["replies"][p]["passed"] for e in examples if e["capability"] == c)
                  for c in caps} for p in policies}
    rewards = {p: sum(e["replies"][p]["reward"] for e in examples) / len(examples)
               for p in policies}
    right = sum(e["right"] for e in examples)
    summary = {
        "format": FORMAT, "model": cfg.model, "capabilities": caps, "slots": moe.slots,
        "layers": moe.layers, "policies": policies,
        "routing": {"right": right, "total": len(examples)},
        "patterns": {c: e["layer_slots"] for c, e in meta["routes"].items()},
        "same_patterns": sorted(c for c in caps if any(
            meta["routes"][c]["layer_slots"] == meta["routes"][o]["layer_slots"]
            for o in caps if o != c)),
        "passes": passes, "per_env": len(examples) // len(caps), "mean_reward": rewards,
        "max_tokens": budgets, "adapters": adapters,
        "warm": {"seeds": warm_seeds, "rewards": warm["rewards"], "kl_first":
                 (warm.get("kl") or [None])[0], "kl_last": (warm.get("kl") or [None])[-1]},
        "cpu_s": {**costs, "total_this_run": round(_cpu_s() - cpu0, 1)},
        "config": cfg.to_dict(), "moe_path": str(moe_dir.resolve()),
        "router_path": str(router_dir.resolve()), "examples": examples,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    summary["what_you_see"] = what_you_see(summary)
    (out / "demo.json").write_text(json.dumps(summary, indent=2))
    note("done", summary["what_you_see"].splitlines()[0])
    return {k: v for k, v in summary.items() if k != "examples"}


def what_you_see(summary: dict[str, Any]) -> str:
    """The page's short text, from the figures of this build."""
    caps = summary["capabilities"]
    n = summary["per_env"]
    r = summary["routing"]
    lines = [f"The router sent {r['right']} of {r['total']} held-out requests to the adapter "
             f"of their own skill ({n} per environment)."]
    same = summary.get("same_patterns") or []
    if same:
        lines.append("Caution: the exported routes of " + " and ".join(same) + " are the "
                     "same layer pattern, so the router cannot tell them apart (the warm "
                     "start had no reward difference to learn from).")
    for p in summary["policies"]:
        cells = ", ".join(f"{summary['passes'][p][c]}/{n} {c}" for c in caps)
        lines.append(f"{p}: passed {cells} requests.")
    total = {p: sum(summary["passes"][p].values()) for p in summary["policies"]}
    lines.append(f"Composed (routed per request) passes {total['composed']} of {r['total']}; "
                 f"the linear merge of the same adapters passes {total['linear merge']}, "
                 f"the best single adapter {max(total[f'adapter:{c}'] for c in caps)}.")
    return "\n".join(lines)


def run_job(spec: Any, run_dir: Path, should_stop: Callable[[], bool]) -> dict[str, Any]:
    """The `routing_demo` job kind (listed in `trace_lib.jobs.registries`)."""
    cfg = DemoConfig.from_dict(spec.config, where=f"{run_dir / 'spec.json'}: config")
    (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    return {**build(cfg, run_dir, should_stop=should_stop, progress=True),
            "demo_path": str(Path(cfg.out).resolve())}
