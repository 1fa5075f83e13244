"""Evaluation use cases: run a policy on the target tasks, record it, compare two runs.

    result = evaluate(db, {"model": "tiny", "tasks": 3, "tools": "capability"})
    report = compare(db, "base run", result["dataset"])

Design decisions
- One config (`evaluate.policy.EvalConfig`) for every front end: the page's form, the CLI's
  flags and a notebook's dict all become it here and are validated once, before anything
  starts, so a bad option is the same clear error everywhere.
- Provenance the job cannot know is added here, from the store, before the run starts:
  for an adapter, the capability and environment it was trained on and its job (the
  `adapters` row); for a composed model, its row's adapters. The run directory's own
  files (an adapter's `result.json`, a composed folder's `moe.json`) fill the rest, so a
  run started without a store still says what it evaluated.
- Foreground `evaluate` runs in this process and imports the episodes at once;
  `launch_evaluation` submits an `evaluate` job (it never opens the store: it writes its
  episodes file and result.json into its run directory; on Ray its entry point reserves
  no CPU, the shard tasks do) and `sync_evaluations` imports finished jobs' files,
  idempotently, when a page or verb looks at jobs.
- Comparison and the one-task view are read-only (`trace_lib.compare`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from trace_lib import compare as compare_views  # noqa: F401  (pure renderers for the page)
from trace_lib import store
from trace_lib.errors import UserInputError
from trace_lib.explore import (  # noqa: F401  (pure renderers for the page)
    transcript_render,
    untrusted_text,
)
from trace_lib.store import capabilities as store_capabilities

Db = str | Path | None
JOB_KIND = "evaluate"


def make_config(config: Any) -> Any:
    """An `EvalConfig` from a dict (page, notebook) or an `EvalConfig` (CLI), validated."""
    from trace_lib.evaluate.policy import EvalConfig

    if isinstance(config, EvalConfig):
        config.validate()
        return config
    return EvalConfig.from_dict(dict(config), where="evaluate")


def store_provenance(db: Db, cfg: Any) -> dict[str, Any]:
    """What the store knows about the policy's parts (adapter row, composed model row)."""
    path = store.resolve_db_path(db)
    if not path.exists() or not (cfg.adapter or cfg.moe):
        return {}
    out: dict[str, Any] = {}
    with store.connect(db, read_only=True) as con:
        if cfg.adapter:
            folder = str(Path(cfg.adapter).expanduser().resolve())
            row = con.execute(
                "SELECT id, capability, environment, job_id FROM adapters WHERE path = ? "
                "ORDER BY created_at DESC LIMIT 1", [folder]).fetchone()
            if row:
                out.update(adapter_id=row[0], capability=row[1], environment=row[2],
                           job_id=row[3])
        if cfg.moe:
            folder = str(Path(cfg.moe).expanduser().resolve())
            row = con.execute("SELECT id, job_id FROM moe_models WHERE path = ? LIMIT 1",
                              [folder]).fetchone()
            if row:
                out.update(moe_id=row[0], moe_job_id=row[1])
        cap = out.get("capability")
        if cap:
            status = store_capabilities.status_of(con, cap)
            if status:
                out["capability_status"] = status
    return out


def _with_provenance(db: Db, cfg: Any) -> Any:
    extra = store_provenance(db, cfg)
    cfg.provenance = {**extra, **cfg.provenance}
    return cfg


def evaluate(db: Db, config: Any, *, out_dir: str | Path | None = None,
             on_progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Run the evaluation here and import it; returns the `evaluate --json` document."""
    from trace_lib import jobs
    from trace_lib.evaluate.policy import new_run_id
    from trace_lib.evaluate.results import import_episodes
    from trace_lib.evaluate.runner import run_evaluation

    cfg = _with_provenance(db, make_config(config))
    cfg.run_id = cfg.run_id or new_run_id()
    folder = Path(out_dir) if out_dir else jobs.runs_dir() / cfg.run_id
    result = run_evaluation(cfg, folder, on_progress=on_progress)
    return import_episodes(db, result)


def launch_evaluation(db: Db, config: Any, backend: str = "local",
                      backend_options: dict[str, Any] | None = None) -> Any:
    """Submit an `evaluate` job and record it; returns its JobSpec."""
    from trace_lib import jobs
    from trace_lib.workbench.training import record_job

    cfg = _with_provenance(db, make_config(config))
    options = dict(backend_options or {})
    if backend == "ray":
        options.setdefault("num_cpus", 0)  # the driver only waits; the shard tasks work
    spec = jobs.JobSpec(kind=JOB_KIND, config=cfg.to_dict(), backend=backend,
                        backend_options=options)
    cfg.run_id = cfg.run_id or spec.id
    spec.config = cfg.to_dict()
    jobs.submit(spec)
    record_job(db, spec)
    return spec


def sync_evaluations(db: Db) -> list[dict[str, Any]]:
    """Import finished `evaluate` jobs' episodes not yet in the store."""
    from trace_lib.evaluate.results import sync_evaluations as _sync

    return _sync(db)


def wait_and_record(db: Db, job_id: str, timeout_s: float = 3600.0) -> dict[str, Any]:
    """Block until an `evaluate` job ends, import it; returns its `evaluate --json` document."""
    from trace_lib import jobs
    from trace_lib.evaluate.results import import_episodes

    st = jobs.wait(job_id, timeout_s=timeout_s)
    if st.state != "succeeded":
        raise UserInputError(f"evaluation job {job_id} ended {st.state}: {st.error or ''}")
    sync_evaluations(db)
    result = jobs.read_result(st.run_dir)
    return import_episodes(db, result, job_id=job_id)


def datasets(db: Db) -> list[dict[str, Any]]:
    """Every dataset with its outcome counts and provenance, newest first (pickers)."""
    from trace_lib.evaluate.results import evaluation_datasets

    return evaluation_datasets(db)


def policies(db: Db) -> dict[str, list[dict[str, Any]]]:
    """What the Evaluate form can run: recorded adapters and composed models."""
    path = store.resolve_db_path(db)
    if not path.exists():
        return {"adapters": [], "moe": []}
    from trace_lib.workbench.composition import list_moe_models
    from trace_lib.workbench.training import list_adapters

    return {"adapters": list_adapters(db), "moe": list_moe_models(db)}


def task_set_domains() -> list[str]:
    from trace_lib.evaluate.tasks import task_set_domains as _domains

    return _domains()


def task_splits() -> list[dict[str, Any]]:
    """The target-task splits a policy can be evaluated on (name, size, what it is for)."""
    from trace_lib.evaluate.tasks import SPLITS

    return [{"name": s.name, "size": s.size, "purpose": s.purpose} for s in SPLITS.values()]


def compare(db: Db, a: str, b: str) -> dict[str, Any]:
    """The two runs side by side (`compare --json`)."""
    from trace_lib.compare import compare_datasets

    return compare_datasets(db, a, b)


def task_pair(db: Db, a: str, b: str, task_id: str) -> Any:
    """One task's two transcripts aligned on tool calls, with its expected actions."""
    from trace_lib.compare import task_pair as _pair

    return _pair(db, a, b, task_id)


def evaluation_jobs() -> list[dict[str, Any]]:
    """`evaluate` jobs, newest first: state, episodes done, error (the page's job list)."""
    from trace_lib import jobs

    out = []
    for st in jobs.list_jobs():
        if st.kind != JOB_KIND:
            continue
        metrics = jobs.read_metrics(st.run_dir)
        total = metrics[-1].get("total") if metrics else None
        out.append({"job_id": st.id, "state": st.state, "episodes_done": st.steps_done,
                    "episodes_total": total, "policy": _policy_label(st.config),
                    "created_at": st.created_at, "error": st.error})
    return out


def _policy_label(config: dict[str, Any]) -> str:
    try:
        return make_config(config).policy_label()
    except UserInputError:  # e.g. an adapter folder removed since: still list the job
        return str(config.get("label") or config.get("model"))
