"""Where a job runs: the Backend protocol, the entry point every backend starts, the registry.

Design decisions
- One entry point for every backend: `python -m trace_lib.jobs.runner SPEC.json`. A backend
  only decides where that command runs; the job writes everything into its run directory,
  so the app reads any job the same way whichever backend ran it.
- The entry point is the runner module itself, not the CLI: a job process imports neither
  the CLI nor the store nor DuckDB (`tests/jobs/test_runner.py` checks the imports of a
  real job).
- Backends are a typed registry (`trace_lib.registry.Registry`, `BACKENDS` in
  `registries.py`, below the spec so a spec checks its backend name without importing
  this module): `local` and `ray` built in, others from the `trace_workbench.job_backends`
  entry-point group; a backend is a class (or factory) called with no arguments, whose
  options come from `spec.backend_options`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Protocol

from trace_lib.jobs.registries import BACKENDS
from trace_lib.jobs.spec import REPO_ROOT, JobSpec

RUNNER_MODULE = "trace_lib.jobs.runner"


class Backend(Protocol):
    name: str

    def submit(self, spec: JobSpec) -> str:
        """Start the entry point for `spec` (already written to its run directory);
        returns the backend's id for it."""
        ...

    def is_gone(self, spec: JobSpec, status: dict[str, Any]) -> bool:
        """True when the job's process no longer exists although its status is active."""
        ...

    def cancel(self, spec: JobSpec, status: dict[str, Any], grace_s: float) -> None:
        """Stop the job: ask first (SIGTERM), force after `grace_s`."""
        ...


def entrypoint(spec_path: Path) -> list[str]:
    """The command every backend runs for a job."""
    return [sys.executable, "-m", RUNNER_MODULE, str(spec_path)]


def job_env() -> dict[str, str]:
    """The environment of a job process: the caller's, with the checkout importable."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def get_backend(name: str) -> Backend:
    """A fresh backend object for `name` (UserInputError listing the known ones)."""
    backend: Backend = BACKENDS.get(name)()
    return backend


__all__ = ["BACKENDS", "RUNNER_MODULE", "Backend", "entrypoint", "get_backend", "job_env"]
