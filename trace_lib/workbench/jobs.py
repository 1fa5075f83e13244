"""Jobs, every kind: submit, record, sync, status, cancel, wait, list.

    spec = jobs.submit_training(db, training.build_config("retail/x", steps=5))
    jobs.sync(db)                       # run directories -> the store, every kind, once
    jobs.job_status(db, spec.id).state; jobs.cancel(db, spec.id)

Design decisions
- One home for jobs. Every kind (`train_adapter`, `train_gates`, `evaluate`, `label`,
  `routing_demo`) starts through `submit`: the kind's preparation (the approval rule and the
  environment's serialised spec for training and gates, the store's provenance for an
  evaluation), `trace_lib.jobs.submit`, then the job's row in the store. The typed
  entries (`submit_training`, `submit_gates`, `submit_evaluation`, `submit_labeling`)
  and a spec file (`submit_spec_file`, read with `JobSpec.load`) all end in it. Stages
  only provide the job functions that run inside the job process; they never submit.
- One sync, `sync`: it reads every run directory once, mirrors each job's state into its
  `jobs` row (a run directory the store has not seen, submitted from a notebook without
  a database or another machine's CLI, is picked up) and records what each ended job
  produced, once: a training job's adapter row, a gate job's (or a routing demo
  build's) composed model, an evaluation's episodes as a dataset, a label job's labels
  (or its label run marked failed). Every page and verb that shows a job's state shows the statuses this call
  returns, so the store and the screen never disagree (issue 34). Each kind's record
  is idempotent (adapter ids derive from the job id, a composed model's id from its
  folder, an evaluation is found by its episodes file, a label run by its status), so
  the sync runs on every page view. A job the store still holds as active but whose run
  directory is outside today's runs directory (submitted under another
  `TRACE_RUNS_DIR`) is read from the directory its row names, so it cannot stay
  "running" in the store after it ended.
- A view never shows a status kept from submission (a session's job id, the row written
  `queued` at submit): a full render shows `sync`'s statuses, and while a job it shows
  is active, the view polls (`poll`, `any_ended`: each watched job's own run directory,
  never the store, so polling every few seconds holds no lock) and reruns in full when
  one ended, which syncs and records it. Home, Training, Routing and Compare follow it.
- A job's run directory is the one its row recorded: `job_status`, `cancel`, `wait` and
  `job_log` read the `jobs` row, not today's `TRACE_RUNS_DIR`, so moving the runs folder
  does not lose jobs. The pages' live panels, which must not open the store, read run
  directories only (`job_views` without statuses, `job_progress`).
- The evaluation use cases (which import pandas-heavy renderers) are imported where an
  evaluation is handled, so `job list` and the other job verbs stay light.
- No SQL here: the job table family's statements are `trace_lib.store.jobs`; a label
  run's and an evaluation's rows belong to their stages (`diagnose.background_labeling`,
  `workbench.evaluation`), called with the store path.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_lib import jobs, store
from trace_lib.errors import UserInputError
from trace_lib.jobs.registries import EVALUATE, LABEL, ROUTING_DEMO, TRAIN_ADAPTER, TRAIN_GATES
from trace_lib.scope import Scope
from trace_lib.store import jobs as job_rows
from trace_lib.workbench import composition, environments, job_progress, training

Db = str | Path | None


# --------------------------------------------------------------------------- submit


def record_job(db: Db, spec: jobs.JobSpec, external_id: str | None = None) -> None:
    """The job's row in the store, 'queued' (once: recording twice changes nothing)."""
    with store.connect(db) as con:
        job_rows.insert_job(con, job_id=spec.id, kind=spec.kind, spec=spec.to_dict(),
                            backend=spec.backend, run_dir=spec.run_dir,
                            external_id=external_id)


def _prepare_training(db: Db, spec: jobs.JobSpec, where: str,
                      allow_unreviewed_builtin: bool) -> None:
    from trace_lib.train.config import TrainConfig

    TrainConfig.from_dict(spec.config, where=where)  # fail before anything starts
    spec.config = environments.job_environment(
        spec.config, db=db, allow_unreviewed_builtin=allow_unreviewed_builtin)


def _prepare_gates(db: Db, spec: jobs.JobSpec, where: str,
                   allow_unreviewed_builtin: bool) -> None:
    """Every environment must be trainable; each one's serialised spec (code included)
    travels in the config, because the job never opens the database."""
    from trace_lib.compose.gate_training import GateTrainConfig, env_makers_for

    cfg = GateTrainConfig.from_dict(spec.config, where=where)
    for name in cfg.envs:
        env = environments.require_trainable(name, db=db,
                                             allow_unreviewed_builtin=allow_unreviewed_builtin)
        cfg.env_specs.setdefault(name, env.to_json())
    env_makers_for(cfg)  # every name resolves before a job starts, or the error is here
    spec.config = {**cfg.to_dict(), "moe": str(Path(cfg.moe).resolve())}


def _prepare_evaluation(db: Db, spec: jobs.JobSpec, where: str,
                        allow_unreviewed_builtin: bool) -> None:
    """What the store knows about the policy's parts goes into the config (the job cannot
    ask); the run is named after the job unless the config names it."""
    from trace_lib.workbench import evaluation

    cfg = evaluation.with_provenance(db, evaluation.make_config(spec.config))
    cfg.run_id = cfg.run_id or spec.id
    spec.config = cfg.to_dict()


def _prepare_routing_demo(db: Db, spec: jobs.JobSpec, where: str,
                          allow_unreviewed_builtin: bool) -> None:
    """The demo's settings are checked before it starts; its environments are built-ins."""
    from trace_lib.compose.demo import DemoConfig

    spec.config = DemoConfig.from_dict(spec.config, where=where).to_dict()


def _prepare_nothing(db: Db, spec: jobs.JobSpec, where: str,
                     allow_unreviewed_builtin: bool) -> None:
    """A label job's inputs are staged by `submit_labeling` before it is submitted."""


_PREPARE = {TRAIN_ADAPTER: _prepare_training, TRAIN_GATES: _prepare_gates,
            EVALUATE: _prepare_evaluation, LABEL: _prepare_nothing,
            ROUTING_DEMO: _prepare_routing_demo}


def submit(db: Db, spec: jobs.JobSpec, *, where: str = "job config",
           allow_unreviewed_builtin: bool = False) -> jobs.JobSpec:
    """The one way a job starts: the kind's preparation, the backend, the job's row."""
    _PREPARE.get(spec.kind, _prepare_nothing)(db, spec, where, allow_unreviewed_builtin)
    jobs.submit(spec)
    record_job(db, spec)
    return spec


def submit_training(db: Db, config: dict[str, Any], backend: str = "local",
                    backend_options: dict[str, Any] | None = None,
                    allow_unreviewed_builtin: bool = False) -> jobs.JobSpec:
    """Train an adapter in the background (`train --background`, the Training page's
    Launch button); `config` is `training.build_config`'s."""
    spec = jobs.JobSpec(kind=TRAIN_ADAPTER, config=config, backend=backend,
                        backend_options=backend_options or {})
    return submit(db, spec, where="training settings",
                  allow_unreviewed_builtin=allow_unreviewed_builtin)


def submit_gates(db: Db, cfg: Any, backend: str = "local") -> jobs.JobSpec:
    """Train a composed model's gates in the background (`gates --background`, the
    Routing page's Start button); `cfg` is `composition.gate_config`'s."""
    spec = jobs.JobSpec(kind=TRAIN_GATES, config=cfg.to_dict(), backend=backend)
    return submit(db, spec, where="gates")


def submit_evaluation(db: Db, config: Any, backend: str = "local",
                      backend_options: dict[str, Any] | None = None) -> jobs.JobSpec:
    """Evaluate a policy in the background (`evaluate --background`, the Compare page's
    Launch button); `config` is an `EvalConfig` or its dict."""
    from trace_lib.workbench import evaluation

    options = dict(backend_options or {})
    if backend == "ray":
        options.setdefault("num_cpus", 0)  # the driver only waits; the shard tasks work
    spec = jobs.JobSpec(kind=EVALUATE, config=evaluation.make_config(config).to_dict(),
                        backend=backend, backend_options=options)
    return submit(db, spec, where="evaluate")


def submit_routing_demo(db: Db, cfg: Any, backend: str = "local") -> jobs.JobSpec:
    """Build the routing demo in the background (`demo adapters --background`, the "Build
    the routing demo" button); `cfg` is `routing_demo.demo_config`'s."""
    spec = jobs.JobSpec(kind=ROUTING_DEMO, config=cfg.to_dict(), backend=backend)
    return submit(db, spec, where="routing demo")


def submit_label_job(db: Db, labeler: str = "heuristic", *,
                     labeler_cfg: dict[str, Any] | None = None,
                     capabilities: list[str] | None = None, scope: Scope | None = None,
                     run_id: str | None = None, seed: int = 0, n_runs: int = 1,
                     backend: str = "local", backend_options: dict[str, Any] | None = None,
                     shard_size: int | None = None) -> jobs.JobSpec:
    """One `label` job: its label run is created 'running' with the scoped trajectories
    exported into the run directory (`background_labeling.stage_label_job`), then it is
    submitted like any job; `sync` records its labels once it ended. A submission that
    fails marks the run failed (it must not stay 'running' with no job behind it)."""
    from trace_lib.diagnose import background_labeling

    spec = background_labeling.stage_label_job(
        db, labeler, labeler_cfg=labeler_cfg, capabilities=capabilities, scope=scope,
        run_id=run_id, seed=seed, n_runs=n_runs, backend=backend,
        backend_options=backend_options,
        shard_size=shard_size or background_labeling.SHARD_SIZE)
    try:
        return submit(db, spec)
    except BaseException as exc:
        background_labeling.mark_failed(
            db, spec.config["run_id"],
            f"job {spec.id} could not start: {type(exc).__name__}: {exc}")
        raise


def submit_labeling(db: Db, labeler: str = "heuristic", *, runs: int = 1,
                    capabilities: list[str] | None = None, run_prefix: str | None = None,
                    model: str | None = None, base_url: str | None = None,
                    concurrency: int | None = None, temperature: float | None = None,
                    scope: Scope | None = None, backend: str = "local",
                    backend_options: dict[str, Any] | None = None,
                    shard_size: int | None = None, max_context: int | None = None,
                    tokenizer: str | None = None, fence_key: str | None = None
                    ) -> list[jobs.JobSpec]:
    """`label --background`, the Labels page's background run: one `label` job per run
    (seeds 0..runs-1) on `backend`, the labeler's settings as `workbench.diagnose.label`
    takes them."""
    from trace_lib.workbench.diagnose import LLM_LABELERS, labeler_settings

    if runs < 1:
        raise UserInputError(f"--runs {runs}: expected at least 1")
    cfg = labeler_settings(labeler, model, base_url, concurrency, temperature, False,
                           llm=labeler in LLM_LABELERS, max_context=max_context,
                           tokenizer=tokenizer, fence_key=fence_key)
    prefix = run_prefix or f"{labeler}-{uuid.uuid4().hex[:6]}"
    return [submit_label_job(db, labeler, labeler_cfg=cfg, capabilities=capabilities,
                             scope=scope, run_id=prefix if runs == 1 else f"{prefix}-r{r}",
                             seed=r, n_runs=runs, backend=backend,
                             backend_options=backend_options, shard_size=shard_size)
            for r in range(runs)]


def submit_spec_file(db: Db, path: str | Path, backend: str = "local") -> jobs.JobSpec:
    """Submit SPEC.json ({kind, config[, backend_options]}) (`job submit`): the same checks
    and preparation as the kind's own verb."""
    loaded = jobs.JobSpec.load(path)
    spec = jobs.JobSpec(kind=loaded.kind, config=loaded.config, backend=backend,
                        backend_options=loaded.backend_options)
    return submit(db, spec, where=f"{path}: config")


# ----------------------------------------------------------------------------- sync


@dataclass
class Synced:
    """What one `sync` saw and recorded."""

    statuses: list[jobs.JobStatus]  # every job under the runs directory, newest first
    adapters: list[str] = field(default_factory=list)  # adapter ids recorded now
    moe_models: list[str] = field(default_factory=list)  # composed-model ids recorded now
    evaluations: list[dict[str, Any]] = field(default_factory=list)  # imported now
    labels: list[dict[str, Any]] = field(default_factory=list)  # label jobs recorded now

    def of_kind(self, kind: str) -> list[jobs.JobStatus]:
        return [s for s in self.statuses if s.kind == kind]


def _record_adapter(con: Any, status: jobs.JobStatus) -> str | None:
    result = jobs.read_result(status.run_dir)
    if not result.get("adapter_path"):
        return None
    return job_rows.insert_adapter(
        con, job_id=status.id,
        capability=result.get("capability") or status.config.get("env", ""),
        environment=result.get("env") or status.config.get("env"),
        path=result["adapter_path"],
        base_model=result.get("base_model") or status.config.get("model", ""),
        metrics={**training.adapter_metrics(result), "config": status.config})


def _record_moe(db: Db, status: jobs.JobStatus, known: set[str]) -> str | None:
    result = jobs.read_result(status.run_dir)
    moe_path = result.get("moe_path")
    if not moe_path or str(Path(moe_path).resolve()) in known or not Path(moe_path).exists():
        return None
    return composition.register_moe(
        db, moe_path, job_id=status.id,
        metrics={"final_reward": result.get("final_reward"),
                 "warm_rewards": result.get("warm_rewards"),
                 "eval_before": result.get("eval_before"),
                 "eval_after": result.get("eval_after")})


def _record_evaluation(db: Db, status: jobs.JobStatus) -> dict[str, Any] | None:
    from trace_lib.workbench import evaluation

    result = jobs.read_result(status.run_dir)
    path = result.get("episodes_path")
    if not path or not Path(path).is_file() or evaluation.is_imported(db, path):
        return None
    return evaluation.import_episodes(db, result, job_id=status.id)


def sync(db: Db) -> Synced:
    """Bring the store up to date with the run directories, every kind (see the module's
    design notes); returns every job's status and what this call recorded."""
    from trace_lib.diagnose.background_labeling import waiting_label_jobs

    out = Synced(jobs.list_jobs())
    with store.connect(db) as con:
        known = job_rows.job_states(con)
        listed = {st.id for st in out.statuses}
        for job_id, run_dir in job_rows.active_job_run_dirs(con):
            if job_id not in listed:  # submitted under another runs directory
                elsewhere = _status_at(run_dir)
                if elsewhere is not None:
                    out.statuses.append(elsewhere)
        out.statuses.sort(key=lambda st: st.created_at, reverse=True)
        have_adapter = job_rows.adapter_job_ids(con)
        moe_paths = job_rows.moe_model_paths(con)
        with store.transaction(con):
            for st in out.statuses:
                if st.id not in known:
                    spec = jobs.JobSpec.load(Path(st.run_dir) / "spec.json")
                    job_rows.insert_job(con, job_id=st.id, kind=st.kind, spec=spec.to_dict(),
                                        backend=st.backend, run_dir=st.run_dir,
                                        state=st.state)
                elif known[st.id] != st.state:
                    job_rows.set_job_state(con, st.id, st.state,
                                           ended=st.state in jobs.TERMINAL)
                if (st.kind == TRAIN_ADAPTER and st.state == "succeeded"
                        and st.id not in have_adapter):
                    adapter = _record_adapter(con, st)
                    if adapter:
                        out.adapters.append(adapter)
    waiting = waiting_label_jobs(db) if out.of_kind(LABEL) else set()
    for st in out.statuses:
        if st.kind == LABEL and st.id in waiting and st.state in jobs.TERMINAL:
            out.labels.append(record_label_job(db, st.id, status=st))
        if st.state != "succeeded":
            continue
        if st.kind in (TRAIN_GATES, ROUTING_DEMO):  # a demo build ends in a composed model
            moe = _record_moe(db, st, moe_paths)
            if moe:
                out.moe_models.append(moe)
        elif st.kind == EVALUATE:
            doc = _record_evaluation(db, st)
            if doc:
                out.evaluations.append(doc)
    return out


def _status_at(run_dir: str | Path) -> jobs.JobStatus | None:
    """The status of the job whose run directory is `run_dir` (None: no job there now)."""
    try:
        return jobs.job_status(jobs.JobSpec.load(Path(run_dir) / "spec.json"))
    except (UserInputError, OSError):
        return None


def active(statuses: list[jobs.JobStatus] | None, kind: str | None = None
           ) -> list[jobs.JobStatus]:
    """The queued or running jobs (of `kind`; None: every kind) among `statuses`: what a
    view watches until they end."""
    return [st for st in statuses or [] if st.state in jobs.ACTIVE
            and (kind is None or st.kind == kind)]


def run_dir_statuses() -> list[jobs.JobStatus]:
    """Every job under today's runs directory, from the run directories only (a view
    whose sync could not open the store falls back to it)."""
    return jobs.list_jobs()


def poll(watched: list[jobs.JobStatus]) -> list[jobs.JobStatus]:
    """Each watched job's status now, read from its own run directory (never the store: a
    live view calls this every few seconds). A job whose directory is gone is left out."""
    return [now for now in (_status_at(st.run_dir) for st in watched) if now is not None]


def any_ended(watched: list[jobs.JobStatus]) -> bool:
    """Whether one of the watched (active) jobs has ended or gone since: the view must
    rerun in full, and its sync records what the job made."""
    now = poll(watched)
    return len(now) < len(watched) or any(st.state not in jobs.ACTIVE for st in now)


def record_label_job(db: Db, job_id: str, status: jobs.JobStatus | None = None
                     ) -> dict[str, Any]:
    """Record an ended label job into the store, once (`label --record JOB`); returns what
    happened: `recorded` (labels written now), `already` (finished before), `failed` (the
    run is marked failed), or `running` (the job has not ended: nothing done)."""
    from trace_lib.diagnose import background_labeling

    spec = jobs.find_spec(job_id)
    if spec.kind != LABEL:
        raise UserInputError(f"job {job_id} is a {spec.kind!r} job, not a label job")
    run_id = spec.config["run_id"]
    st = status or jobs.job_status(spec)
    out = {"job": job_id, "run_id": run_id, "job_state": st.state}
    if st.state in jobs.ACTIVE:
        return {**out, "outcome": "running"}
    if st.state != "succeeded":
        background_labeling.mark_failed(
            db, run_id, f"job {job_id} {st.state}: {st.error or 'no error recorded'}")
        return {**out, "outcome": "failed", "error": st.error}
    return {**out, **background_labeling.store_label_results(db, spec)}


# -------------------------------------------------------- status, cancel, wait, logs


def _stored_spec(db: Db, job_id: str) -> jobs.JobSpec:
    """The job's spec from the run directory its `jobs` row recorded (else the runs dir)."""
    run_dir = None
    if store.resolve_db_path(db).exists():
        with store.connect(db, read_only=True) as con:
            run_dir = job_rows.job_run_dir(con, job_id)
    if run_dir and (Path(run_dir) / "spec.json").exists():
        return jobs.JobSpec.load(Path(run_dir) / "spec.json")
    return jobs.find_spec(job_id)


def job_status(db: Db, job_id: str) -> jobs.JobStatus:
    """The job's state, read from the run directory stored in the database (`job status`);
    the store is synced on the way."""
    status = jobs.job_status(_stored_spec(db, job_id))
    sync(db)
    return status


def cancel(db: Db, job_id: str, grace_s: float = 10.0, record: bool = True
           ) -> jobs.JobStatus:
    """SIGTERM, then SIGKILL after `grace_s` (`job cancel`, the pages' Cancel). A live
    panel passes `record=False`: it never touches the store, its next full rerun syncs."""
    status = jobs.cancel(_stored_spec(db, job_id) if record else job_id, grace_s=grace_s)
    if record:
        sync(db)
    return status


def wait(db: Db, job_id: str, timeout_s: float = 3600.0) -> jobs.JobStatus:
    """Block until the job ends, then sync (`job wait`)."""
    status = jobs.wait(_stored_spec(db, job_id), timeout_s=timeout_s)
    sync(db)
    return status


def wait_evaluation(db: Db, job_id: str, timeout_s: float = 3600.0) -> dict[str, Any]:
    """Block until an `evaluate` job ends and sync; returns its `evaluate --json` document
    (`evaluate --background --wait`)."""
    from trace_lib.workbench import evaluation

    st = wait(db, job_id, timeout_s=timeout_s)
    if st.state != "succeeded":
        raise UserInputError(f"evaluation job {job_id} ended {st.state}: {st.error or ''}")
    # Imported by the sync (or before): this finds that dataset and imports nothing.
    return evaluation.import_episodes(db, jobs.read_result(st.run_dir), job_id=job_id)


def wait_label_jobs(db: Db, job_ids: list[str], timeout_s: float = 7 * 86400
                    ) -> list[dict[str, Any]]:
    """Block until every label job of `job_ids` ended, then sync once; returns, per job,
    what recording it did (`label --background --wait`): the sync's outcome, else
    `record_label_job`'s (`already` when an earlier call recorded it)."""
    for job_id in job_ids:
        jobs.wait(_stored_spec(db, job_id), timeout_s=timeout_s)
    outcomes = {o["job"]: o for o in sync(db).labels}
    return [outcomes.get(job_id) or record_label_job(db, job_id) for job_id in job_ids]


def job_log(db: Db, job_id: str, tail: int | None = None) -> str:
    """The job's log.txt, from the run directory its row recorded (`job logs`)."""
    return jobs.read_log(_stored_spec(db, job_id).path, tail=tail)


def follow_log(db: Db, job_id: str, poll_s: float = 1.0) -> Iterator[str]:
    """New log text as the job writes it, until the job ends (`job logs --follow`)."""
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


# ----------------------------------------------------------------------------- list


def job_views(kind: str | None = TRAIN_ADAPTER,
              statuses: list[jobs.JobStatus] | None = None) -> list[dict[str, Any]]:
    """One snapshot of every job (of `kind`; None: all) for a page's table and selector:
    status, state (as a person should read it), steps. Pass `sync(db).statuses` on a full
    render; a live panel passes nothing and reads the run directories (never the store)."""
    out = []
    for st in jobs.list_jobs() if statuses is None else statuses:
        if kind is not None and st.kind != kind:
            continue
        rows = jobs.read_metrics(st.run_dir)
        out.append({"status": st, "state": job_progress.learning_signal(st, rows)["state"],
                    "steps": f"{st.steps_done}/{st.config.get('steps') or '?'}"})
    return out


def evaluation_jobs(statuses: list[jobs.JobStatus] | None = None) -> list[dict[str, Any]]:
    """`evaluate` jobs, newest first: state, episodes done, error (the Compare page's job
    list). Pass `sync(db).statuses`; without a store, the run directories are read."""
    from trace_lib.workbench import evaluation

    out = []
    for st in jobs.list_jobs() if statuses is None else statuses:
        if st.kind != EVALUATE:
            continue
        metrics = jobs.read_metrics(st.run_dir)
        total = metrics[-1].get("total") if metrics else None
        out.append({"job_id": st.id, "state": st.state, "episodes_done": st.steps_done,
                    "episodes_total": total, "policy": evaluation.policy_label(st.config),
                    "created_at": st.created_at, "error": st.error})
    return out


def run_job_here(spec_path: str | Path) -> int:
    """Run a job spec in this process (`job run SPEC`: what a backend's worker runs),
    returning its exit status."""
    return jobs.run_job(spec_path)
