"""Background jobs: one entry point, a run directory per job, pluggable backends.

    from trace_lib import jobs
    spec = jobs.submit(jobs.JobSpec(kind="train_adapter", config={...}))
    jobs.job_status(spec.id).state; jobs.read_metrics(spec.path); jobs.cancel(spec.id)

Design decisions
- One concept per module: `registries` (the tables of kind and backend names, at the
  bottom so nothing circles back to them), `spec` (JobSpec, ids, the runs directory),
  `run_dir` (the file contract between a job and everything else), `kinds` (what a job
  function is; the typed lookup of a kind's function),
  `runner` (the entry point every backend starts: `python -m trace_lib.jobs.runner
  SPEC.json`), `backends` (protocol + registry), `local` and `ray` (the two built-in
  backends), `control` (submit / status / cancel / wait for callers).
- This package re-exports the names callers use, so `jobs.submit(...)` reads as before.
  `run_job` is re-exported lazily: importing the package must not import the runner,
  because `python -m trace_lib.jobs.runner` imports the package first and runpy warns
  when the module it is about to run is already in `sys.modules`.
- Nothing in this package imports the store, DuckDB or the CLI. Submitting a job for a
  person (checks, recording its row, syncing its results into the store) is
  `trace_lib.workbench.jobs`; stages only provide the functions that run inside a job.
"""

from __future__ import annotations

from typing import Any

from trace_lib.jobs.backends import BACKENDS, Backend, get_backend
from trace_lib.jobs.control import (
    JobStatus,
    cancel,
    find_spec,
    job_status,
    list_jobs,
    submit,
    wait,
)
from trace_lib.jobs.kinds import JOB_KINDS, Cancelled, JobFn, job_function
from trace_lib.jobs.local import LocalBackend, pid_alive
from trace_lib.jobs.ray import RayBackend
from trace_lib.jobs.registries import EVALUATE, LABEL, TRAIN_ADAPTER, TRAIN_GATES
from trace_lib.jobs.run_dir import (
    ACTIVE,
    HEARTBEAT_S,
    TERMINAL,
    read_log,
    read_metrics,
    read_result,
    read_samples,
    read_status,
    update_status,
)
from trace_lib.jobs.spec import RUNS_ENV, JobSpec, new_job_id, runs_dir

_pid_alive = pid_alive  # the name tests and older callers used


def __getattr__(name: str) -> Any:
    if name == "run_job":
        from trace_lib.jobs.runner import run_job

        return run_job
    raise AttributeError(f"module 'trace_lib.jobs' has no attribute {name!r}")


__all__ = [
    "ACTIVE", "BACKENDS", "EVALUATE", "HEARTBEAT_S", "JOB_KINDS", "LABEL", "RUNS_ENV",
    "TERMINAL", "TRAIN_ADAPTER", "TRAIN_GATES", "Backend",
    "Cancelled", "JobFn", "JobSpec", "JobStatus", "LocalBackend", "RayBackend", "cancel",
    "find_spec", "get_backend", "job_function", "job_status", "list_jobs", "new_job_id",
    "pid_alive", "read_log", "read_metrics", "read_result", "read_samples", "read_status",
    "run_job", "runs_dir", "submit", "update_status", "wait",
]
