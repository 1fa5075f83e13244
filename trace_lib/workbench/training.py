"""Training use cases: the one training config, a foreground run, the adapters trained.

Design decisions
- The training config is assembled in one place, `build_config`, from `TrainConfig`'s own
  fields and defaults: the CLI's flags, the page's widgets and a notebook's keywords are
  flat keyword arguments (`lora_rank`, `kl_coef`, ...) and all come out as the same
  validated `TrainConfig.to_dict()`.
- Every way to start training (`train_foreground` here; in the background
  `workbench.jobs.submit_training` or a spec file through `jobs.submit_spec_file`) goes
  through `environments.job_environment`: the approval rule is checked there, and a
  generated environment's code goes into the config because a job never opens the store.
- A foreground run records its adapter at once (`record_adapter`); a background job's
  adapter is recorded by the one job sync (`workbench.jobs.sync`). Either way the row's id
  is `a_<job id>` (`store.jobs`), so recording twice never duplicates.
- `context_check` warns before a launch when the environment's prompt does not fit the
  model's context (every rollout would be refused).
"""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path
from typing import Any

from trace_lib import jobs, store
from trace_lib.errors import UserInputError
from trace_lib.store import jobs as job_rows
from trace_lib.workbench import environments

Db = str | Path | None
_TOKENIZER_LOCK = threading.Lock()

# Flat names for nested TrainConfig fields: what a CLI flag or a widget sets.
_LORA = {"lora_rank": "rank", "lora_alpha": "alpha", "lora_targets": "targets",
         "lora_dropout": "dropout"}
_LOSS = {"kl_coef": "kl_coef", "adv_scale": "scale", "clip_low": "clip_low",
         "clip_high": "clip_high"}


def defaults():
    """A TrainConfig with every default (what forms show before a person changes them)."""
    from trace_lib.train.config import TrainConfig

    return TrainConfig(env="")


def build_config(env: str, model: str = "tiny", **fields: Any) -> dict[str, Any]:
    """The one training config: flat keyword fields -> a validated `TrainConfig.to_dict()`.

    `lora_targets` may be a comma-separated string or a list; None means "the default"."""
    from trace_lib.train.config import TrainConfig

    flat: dict[str, Any] = {"env": env, "model": model}
    lora: dict[str, Any] = {}
    loss: dict[str, Any] = {}
    for key, value in fields.items():
        if value is None:
            continue
        if key in _LORA:
            if key == "lora_targets" and isinstance(value, str):
                value = [t.strip() for t in value.split(",") if t.strip()]
            lora[_LORA[key]] = value
        elif key in _LOSS:
            loss[_LOSS[key]] = value
        else:
            flat[key] = value
    base = defaults()
    flat["lora"] = {**dataclasses.asdict(base.lora), **lora}
    flat["loss"] = {**dataclasses.asdict(base.loss), **loss}
    return TrainConfig.from_dict(flat, where="training settings").to_dict()


def train_foreground(db: Db, config: dict[str, Any], run_dir: str | Path | None = None,
                     progress: bool = True) -> dict[str, Any]:
    """Train in this process (`train` without --background) and record the adapter."""
    from trace_lib.train.config import TrainConfig
    from trace_lib.train.trainer import train

    TrainConfig.from_dict(config, where="train arguments")
    config = environments.job_environment(config, db=db)
    job_id = jobs.new_job_id("train")
    path = Path(run_dir) if run_dir else jobs.runs_dir() / job_id
    result = train(TrainConfig.from_dict(config), path, resume=True, progress=progress)
    adapter_id = record_adapter(db, result.to_dict(), path.name)
    return {"adapter_id": adapter_id, "adapter_path": result.adapter_path, "metrics_path": result.metrics_path,
            "steps": result.steps, "final_reward": result.final_reward,
            "eval_before": result.eval_before, "eval_after": result.eval_after,
            "wall_s": round(result.wall_s, 2)}


def adapter_metrics(result: dict[str, Any]) -> dict[str, Any]:
    """What an adapter's row keeps of a training result (a foreground run's or a job's)."""
    return {k: result.get(k) for k in ("final_reward", "steps", "eval_before", "eval_after",
                                       "wall_s")}


def record_adapter(db: Db, result: dict[str, Any], job_id: str) -> str:
    """Record a foreground run's adapter (`train` without --background); returns its id."""
    metrics = adapter_metrics(result)
    with store.connect(db) as con:
        return job_rows.insert_adapter(
            con, job_id=job_id, capability=result["capability"], environment=result["env"],
            path=result["adapter_path"], base_model=result["base_model"], metrics=metrics)


def list_adapters(db: Db) -> list[dict[str, Any]]:
    """Adapters with their before/after held-out pass rate, newest first ([] without a db)."""
    if not store.resolve_db_path(db).exists():
        return []
    with store.connect(db) as con:
        rows = job_rows.adapters(con)
    out = []
    for row in rows:
        m = row["metrics"]
        out.append({
            "id": row["id"], "capability": row["capability"],
            "environment": row["environment"], "job_id": row["job_id"], "path": row["path"],
            "base_model": row["base_model"], "final_reward": m.get("final_reward"),
            "steps": m.get("steps"),
            "pass_rate_before": (m.get("eval_before") or {}).get("pass_rate"),
            "pass_rate_after": (m.get("eval_after") or {}).get("pass_rate"),
            "created_at": row["created_at"],
        })
    return out


def max_tokens_default(db: Db, env: str, model: str, options: dict[str, Any] | None = None,
                       max_turns: int = 8) -> dict[str, Any] | None:
    """What a run with no `max_tokens` will use (`trainer.turn_budget`): the environment's
    longest reference turn in `model`'s tokens + 25%, rounded up to 32. None when the model
    is not built yet or the environment cannot be opened here (the job still derives it)."""
    from trace_lib.runtime.base_models import list_models, load_tokenizer, resolve_model
    from trace_lib.train.local_rollouts import reference_turn_budget

    ready = {m["name"]: m["ready"] for m in list_models()}
    if model in ready and not ready[model]:
        return None
    try:
        with _TOKENIZER_LOCK:
            tokenizer = load_tokenizer(resolve_model(model))
        with environments.open_environment(env, db=db, options=options) as handle:
            measured = reference_turn_budget({env: lambda: handle}, tokenizer, max_turns)
    except Exception:  # noqa: BLE001 - a hint for the form: the job measures it again
        return None
    if measured.unmeasured:
        return None
    return {"longest_reference_turn": measured.longest_reference_turn,
            "max_tokens": measured.max_tokens}


def context_check(db: Db, env: str, model: str, options: dict[str, Any] | None = None,
                  max_tokens: int = 0) -> dict[str, Any] | None:
    """Does the environment's prompt fit the model's context? `prompt_tokens` (in the
    model's tokenizer and chat template), `context` (the model's max positions) and a
    `warning` when prompt + `max_tokens` is longer. None when the model is not built yet or
    has no recorded context (nothing to compare; training would build it)."""
    from trace_lib.runtime.base_models import list_models, resolve_model

    ready = {m["name"]: m["ready"] for m in list_models()}
    if model in ready and not ready[model]:
        return None
    try:
        path = Path(resolve_model(model))
    except UserInputError:
        return None
    config = path / "config.json"
    if not config.is_file():
        return None
    context = json.loads(config.read_text()).get("max_position_embeddings")
    if not context:
        return None
    if environments.resolve(env, db=db).source != "builtin":
        options = None  # build options (tools, policy, difficulty) are the built-ins' only
    # One at a time: a page rerun starts a new script thread while the old one may still be
    # importing transformers, and its lazy module is not safe to import from two threads.
    with _TOKENIZER_LOCK:
        sample = environments.sample(env, seed=0, db=db, options=options, model=str(path))
    prompt = int(sample["prompt_tokens"]["total"])
    warning = None
    if prompt + max_tokens > int(context):
        warning = (f"The prompt of {env} is {prompt} tokens in {model}'s tokenizer"
                   + (f" (+{max_tokens} to generate)" if max_tokens else "")
                   + f", longer than the model's context of {context} tokens: every rollout "
                   "would be refused. Choose a model with a longer context, or the "
                   "capability tools and the policy excerpt.")
    return {"prompt_tokens": prompt, "context": int(context), "warning": warning}
