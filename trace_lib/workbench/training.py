"""Training use cases: build a config, launch / run / cancel / watch jobs, record adapters.

Design decisions
- The training config is assembled in one place, `build_config`, from `TrainConfig`'s own
  fields and defaults: the CLI's flags, the page's widgets and a notebook's keywords are
  flat keyword arguments (`lora_rank`, `kl_coef`, ...) and all come out as the same
  validated `TrainConfig.to_dict()`.
- Every way to start training (`launch` in the background, `train_foreground`, a spec file
  through `submit_spec_file`) goes through `environments.job_environment`: the approval
  rule is checked there, and a generated environment's code goes into the job's config
  because a job never opens the store.
- This module is where job outcomes reach the store (jobs never open the DuckDB file; one
  writer at a time). `sync_jobs` is idempotent and cheap: it reads each run directory's
  status.json (and result.json once), updates the `jobs` row, and inserts the `adapters`
  row the first time it sees a succeeded training job. Adapter ids are derived from the job
  id (`a_<job id>`), so re-syncing never duplicates. A run directory not yet in the store
  (submitted from a notebook without a database, or another machine's CLI) is picked up.
- A finished job that learned nothing (every GRPO step had constant reward in every group,
  or a gate run whose gates did not move) is not a plain "succeeded": `learning_signal`
  derives the state a person sees, "succeeded — no learning signal", with the reason, from
  the run's metrics rows (the page, `job status` and `job list` show the same).
- The page's jobs table, watch selector and live panel read one snapshot, `job_views`
  (run directories only), so they always agree on the step count.
- A job's run directory is the one its row recorded: `job_status`, `cancel`, `wait` and
  `job_log` read the `jobs` row, not today's `TRACE_RUNS_DIR`, so moving the runs folder
  does not lose jobs. (The page's live panel, which must not open the store, reads the
  runs folder.)
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trace_lib import jobs, store
from trace_lib.errors import UserInputError
from trace_lib.workbench import environments

Db = str | Path | None
JOB_KIND = "train_adapter"
GATES_KIND = "train_gates"
NO_SIGNAL_STATE = "succeeded — no learning signal"
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


def list_models() -> list[dict[str, Any]]:
    """Registered base models with their cache state (`model list`)."""
    from trace_lib.runtime.base_models import list_models as _list

    return _list()


def model_names() -> list[str]:
    return [m["name"] for m in list_models()]


def prepare_model(name: str, rebuild: bool = False) -> Path:
    """Build a registered model into the models folder once (`model prepare`)."""
    from trace_lib.runtime.base_models import ensure_model_dir

    return ensure_model_dir(name, rebuild=rebuild)


def serve_policy(model: str = "tiny", port: int = 8000, served_model_name: str | None = None,
                 max_tokens: int = 256, threads: int | None = None,
                 **limits: int | None) -> None:
    """Run the CPU policy server on 127.0.0.1 in the foreground (`serve`). `limits`:
    the server's `kv_cache_mb`, `max_n`, `max_body_bytes` (None: its default)."""
    from trace_lib.runtime.policy_server import ServerConfig, serve

    serve(ServerConfig(model=model, host="127.0.0.1", port=port,
                       served_model_name=served_model_name, default_max_tokens=max_tokens,
                       torch_threads=threads,
                       **{k: v for k, v in limits.items() if v is not None}))


# ----------------------------------------------------------------------------- launch


def launch(db: Db, config: dict[str, Any], backend: str = "local",
           backend_options: dict[str, Any] | None = None,
           allow_unreviewed_builtin: bool = False) -> jobs.JobSpec:
    """Validate, check the approval rule, submit as a job and record it (`train
    --background`, the page's Launch button)."""
    from trace_lib.train.config import TrainConfig

    TrainConfig.from_dict(config, where="training settings")  # fail before anything starts
    config = environments.job_environment(config, db=db,
                                          allow_unreviewed_builtin=allow_unreviewed_builtin)
    spec = jobs.submit(jobs.JobSpec(kind=JOB_KIND, config=config, backend=backend,
                                    backend_options=backend_options or {}))
    record_job(db, spec)
    return spec


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
    record_adapter(db, result.to_dict(), path.name)
    return {"adapter_path": result.adapter_path, "metrics_path": result.metrics_path,
            "steps": result.steps, "final_reward": result.final_reward,
            "eval_before": result.eval_before, "eval_after": result.eval_after,
            "wall_s": round(result.wall_s, 2)}


def submit_spec_file(db: Db, path: str | Path, backend: str = "local") -> jobs.JobSpec:
    """Submit SPEC.json ({kind, config[, backend_options]}) (`job submit`)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise UserInputError(f"{path}: no such spec file") from exc
    except json.JSONDecodeError as exc:
        raise UserInputError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise UserInputError(f"{path}: expected an object with `kind` and `config`")
    data = {k: v for k, v in data.items() if k in ("kind", "config", "backend_options")}
    data["backend"] = backend
    spec = jobs.JobSpec.from_dict(data, str(path))
    if spec.kind == JOB_KIND:
        from trace_lib.train.config import TrainConfig

        TrainConfig.from_dict(spec.config, where=f"{path}: config")
        spec.config = environments.job_environment(spec.config, db=db)
    elif spec.kind == "train_gates":  # gates train on environments too: the same rule
        envs = spec.config.get("envs") or []
        for name in envs.split(",") if isinstance(envs, str) else envs:
            environments.require_trainable(str(name), db=db)
    jobs.submit(spec)
    record_job(db, spec)
    return spec


# ------------------------------------------------------------------------------- jobs


def _stored_spec(db: Db, job_id: str) -> jobs.JobSpec:
    """The job's spec from the run directory its `jobs` row recorded (else the runs dir)."""
    row = None
    if store.resolve_db_path(db).exists():
        with store.connect(db, read_only=True) as con:
            row = con.execute("SELECT run_dir FROM jobs WHERE id = ?", [job_id]).fetchone()
    if row and row[0] and (Path(row[0]) / "spec.json").exists():
        return jobs.JobSpec.load(Path(row[0]) / "spec.json")
    return jobs.find_spec(job_id)


def job_status(db: Db, job_id: str) -> jobs.JobStatus:
    """The job's state, read from the run directory stored in the database (`job status`)."""
    status = jobs.job_status(_stored_spec(db, job_id))
    sync_jobs(db)
    return status


def cancel(db: Db, job_id: str, grace_s: float = 10.0, record: bool = True
           ) -> jobs.JobStatus:
    """SIGTERM, then SIGKILL after `grace_s` (`job cancel`, the page's Cancel). The page's
    live panel passes `record=False`: it never touches the store, its next full rerun does."""
    status = jobs.cancel(_stored_spec(db, job_id) if record else job_id, grace_s=grace_s)
    if record:
        sync_jobs(db)
    return status


def wait(db: Db, job_id: str, timeout_s: float = 3600.0) -> jobs.JobStatus:
    """Block until the job ends, then record it (`job wait`)."""
    status = jobs.wait(_stored_spec(db, job_id), timeout_s=timeout_s)
    sync_jobs(db)
    return status


def job_log(db: Db, job_id: str, tail: int | None = None) -> str:
    """The job's log.txt, from the run directory its row recorded (`job logs`)."""
    return jobs.read_log(_stored_spec(db, job_id).path, tail=tail)


def follow_log(db: Db, job_id: str, poll_s: float = 1.0) -> Iterator[str]:
    """New log text as the job writes it, until the job ends (`job logs --follow`)."""
    import time

    spec = _stored_spec(db, job_id)
    shown = 0
    while True:
        text = jobs.read_log(spec.path)
        if len(text) > shown:
            yield text[shown:]
            shown = len(text)
        if jobs.job_status(spec).state in jobs.TERMINAL:
            return
        time.sleep(poll_s)


def live_status(job: str | jobs.JobStatus) -> dict[str, Any]:
    """What the page's live panel redraws every two seconds, from the run directory only
    (no database: it must never hold the store's lock): status, metrics, samples, log,
    the learning signal and the phase. Given a JobStatus (the page's `job_views`
    snapshot), that status is used as it is, so the panel and the table agree."""
    status = job if isinstance(job, jobs.JobStatus) else jobs.job_status(job)
    rows = jobs.read_metrics(status.run_dir)
    log = jobs.read_log(status.run_dir, tail=60)
    return {"status": status, "metrics": rows, "samples": jobs.read_samples(status.run_dir),
            "log": log, "signal": learning_signal(status, rows),
            "phase": phase(status, rows, log)}


def job_views(kind: str | None = JOB_KIND) -> list[dict[str, Any]]:
    """One snapshot of every job (of `kind`; None: all) for a page's table and selector,
    from the run directories only: id, state (as a person should read it), steps, config."""
    out = []
    for st in jobs.list_jobs():
        if kind is not None and st.kind != kind:
            continue
        rows = jobs.read_metrics(st.run_dir)
        out.append({"status": st, "state": learning_signal(st, rows)["state"],
                    "steps": f"{st.steps_done}/{st.config.get('steps') or '?'}"})
    return out


def learning_signal(status: jobs.JobStatus, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Did the job learn anything? From its metrics rows: `steps` (GRPO steps run),
    `no_signal_steps` (steps where every group had constant reward, so GRPO had nothing to
    learn from), `learned` (False when none had a signal, or a gate run's gates did not
    move; None while unknown), `state` (the job state a person should read: a succeeded job
    that learned nothing is "succeeded — no learning signal") and `warning`."""
    finished = status.state in jobs.TERMINAL
    if status.kind == GATES_KIND:
        from trace_lib.compose.movement import gate_movement

        moved = gate_movement(rows, finished=finished)
        learned, warning = moved["moved"], moved["warning"]
        steps, quiet = moved["steps"], moved["steps"] - moved["informative_steps"]
        if finished and learned is None:
            learned = False
    else:
        grpo = [r for r in rows if "no_signal" in r]
        steps, quiet = len(grpo), sum(bool(r["no_signal"]) for r in grpo)
        learned = None if not grpo else quiet < len(grpo)
        warning = None
        if learned is False:
            warning = (f"No learning signal: in all {steps} GRPO steps every group's rollouts "
                       "got the same reward, so the adapter learned nothing. Try SFT "
                       "warm-start steps, hints, a lower difficulty or a larger group.")
    state = status.state
    if state == "succeeded" and learned is False:
        state = NO_SIGNAL_STATE
    return {"steps": steps, "no_signal_steps": quiet, "learned": learned, "state": state,
            "warning": warning}


_EVAL_LINE = re.compile(r"\[eval (before|after)\] (\d+)/(\d+) held-out seeds")


def phase(status: jobs.JobStatus, rows: list[dict[str, Any]], log: str) -> dict[str, Any]:
    """Where an active training job is: `name` (starting | eval before | training | eval
    after | ended), `done`/`total` for a progress bar and a `text` for it. The held-out
    evaluation before the first step can take minutes: without this a page says "0/N
    steps" the whole time."""
    total_steps = int(status.config.get("steps") or 0)
    eval_seeds = int(status.config.get("eval_seeds") or 0)
    if status.state in jobs.TERMINAL:
        return {"name": "ended", "done": status.steps_done, "total": total_steps,
                "text": f"{status.steps_done}/{total_steps} steps"}
    grpo = [r for r in rows if "no_signal" in r]
    evals = {m.group(1): (int(m.group(2)), int(m.group(3))) for m in _EVAL_LINE.finditer(log)}
    if eval_seeds and not grpo:
        if "before" not in evals and status.state == "queued":
            return {"name": "starting", "done": 0, "total": eval_seeds,
                    "text": "starting: loading the model"}
        done, total = evals.get("before", (0, eval_seeds))
        return {"name": "eval before", "done": done, "total": total,
                "text": f"evaluating before training: {done}/{total} held-out seeds"}
    if eval_seeds and status.steps_done >= total_steps > 0:
        done, total = evals.get("after", (0, eval_seeds))
        return {"name": "eval after", "done": done, "total": total,
                "text": f"evaluating the adapter: {done}/{total} held-out seeds"}
    return {"name": "training", "done": status.steps_done, "total": total_steps,
            "text": f"training: {status.steps_done}/{total_steps} steps"}


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


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """A run directory's metrics.jsonl rows (a foreground run's too)."""
    return jobs.read_metrics(run_dir)


def metrics_figure(rows: list[dict[str, Any]], **kwargs: Any):
    from trace_lib.train import metrics_charts

    return metrics_charts.metrics_figure(rows, **kwargs)


def is_active(state: str) -> bool:
    return state in jobs.ACTIVE


# -------------------------------------------------------------------- store recording


def record_job(db: Db, spec: jobs.JobSpec, external_id: str | None = None) -> None:
    with store.connect(db) as con:
        con.execute(
            "INSERT INTO jobs (id, kind, spec, backend, run_dir, external_id, status) "
            "VALUES (?, ?, ?, ?, ?, ?, 'queued') ON CONFLICT (id) DO NOTHING",
            [spec.id, spec.kind, json.dumps(spec.to_dict()), spec.backend, spec.run_dir,
             external_id],
        )


def _adapter_row(status: jobs.JobStatus) -> dict[str, Any] | None:
    result = jobs.read_result(status.run_dir)
    if status.kind != JOB_KIND or not result.get("adapter_path"):
        return None
    metrics = {
        "final_reward": result.get("final_reward"),
        "steps": result.get("steps"),
        "eval_before": result.get("eval_before"),
        "eval_after": result.get("eval_after"),
        "wall_s": result.get("wall_s"),
        "config": status.config,
    }
    return {
        "id": f"a_{status.id}",
        "capability": result.get("capability") or status.config.get("env", ""),
        "environment": result.get("env") or status.config.get("env"),
        "job_id": status.id,
        "path": result["adapter_path"],
        "base_model": result.get("base_model") or status.config.get("model", ""),
        "metrics": json.dumps(metrics, default=str),
    }


def sync_jobs(db: Db) -> list[jobs.JobStatus]:
    """Bring the store's jobs/adapters up to date with the run directories; return them."""
    statuses = jobs.list_jobs()
    with store.connect(db) as con:
        known = {r[0]: r[1] for r in con.execute("SELECT id, status FROM jobs").fetchall()}
        have_adapter = {r[0] for r in con.execute("SELECT job_id FROM adapters").fetchall()}
        with store.transaction(con):
            for st in statuses:
                if st.id not in known:
                    spec = jobs.JobSpec.load(Path(st.run_dir) / "spec.json")
                    con.execute(
                        "INSERT INTO jobs (id, kind, spec, backend, run_dir, status) "
                        "VALUES (?, ?, ?, ?, ?, ?)",
                        [st.id, st.kind, json.dumps(spec.to_dict()), st.backend, st.run_dir,
                         st.state],
                    )
                elif known[st.id] != st.state:
                    con.execute(
                        "UPDATE jobs SET status = ?, finished_at = CASE WHEN ? THEN "
                        "current_timestamp ELSE finished_at END WHERE id = ?",
                        [st.state, st.state in jobs.TERMINAL, st.id],
                    )
                if st.state == "succeeded" and st.id not in have_adapter:
                    row = _adapter_row(st)
                    if row:
                        con.execute(
                            "INSERT INTO adapters (id, capability, environment, job_id, path, "
                            "base_model, metrics) VALUES (?, ?, ?, ?, ?, ?, ?) "
                            "ON CONFLICT (id) DO NOTHING",
                            list(row.values()),
                        )
    return statuses


def record_adapter(db: Db, result: dict[str, Any], job_id: str) -> str:
    """Record a foreground run's adapter (`train` without --background)."""
    adapter_id = f"a_{job_id}"
    metrics = {k: result.get(k) for k in ("final_reward", "steps", "eval_before",
                                          "eval_after", "wall_s")}
    with store.connect(db) as con:
        con.execute(
            "INSERT INTO adapters (id, capability, environment, job_id, path, base_model, "
            "metrics) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
            [adapter_id, result["capability"], result["env"], job_id, result["adapter_path"],
             result["base_model"], json.dumps(metrics, default=str)],
        )
    return adapter_id


def list_adapters(db: Db) -> list[dict[str, Any]]:
    """Adapters with their before/after held-out pass rate, newest first ([] without a db)."""
    if not store.resolve_db_path(db).exists():
        return []
    with store.connect(db) as con:
        rows = con.execute(
            "SELECT id, capability, environment, job_id, path, base_model, metrics, created_at "
            "FROM adapters ORDER BY created_at DESC"
        ).fetchall()
    out = []
    for id_, cap, env, job_id, path, base, metrics, created in rows:
        m = json.loads(metrics) if isinstance(metrics, str) else (metrics or {})
        before = (m.get("eval_before") or {}).get("pass_rate")
        after = (m.get("eval_after") or {}).get("pass_rate")
        out.append({
            "id": id_, "capability": cap, "environment": env, "job_id": job_id, "path": path,
            "base_model": base, "final_reward": m.get("final_reward"), "steps": m.get("steps"),
            "pass_rate_before": before, "pass_rate_after": after, "created_at": created,
        })
    return out
