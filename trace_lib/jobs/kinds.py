"""Job kinds: what a job function is, and the one typed way to get the function of a kind.

Design decisions
- The table itself (`JOB_KINDS`, kind -> "module:function") lives in `registries.py`,
  below `spec.py`, so a spec can check its kind without importing this module (which
  speaks of `JobSpec`): no import circle. It is an explicit table, not registration by
  import side effect: the job process knows every kind without importing the CLI or the
  stage that submits it. Add a kind by adding one line there; the function lives with
  its stage (stages provide job functions; `trace_lib.workbench.jobs` submits them).
- A job function is `(spec, run_dir, should_stop) -> result dict`. It validates its own
  `spec.config`, writes only into `run_dir` (see `run_dir.py`), polls `should_stop()` at
  safe points and raises `Cancelled` there; its return value becomes result.json.
- Functions are resolved lazily, so listing or checking kinds (every `JobSpec.from_dict`)
  imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from trace_lib.jobs.registries import JOB_KINDS
from trace_lib.jobs.spec import JobSpec

JobFn = Callable[[JobSpec, Path, Callable[[], bool]], dict[str, Any]]


class Cancelled(Exception):
    """Raised inside a job when a stop was requested; the job ends as `cancelled`."""


def job_function(kind: str) -> JobFn:
    """The function that runs jobs of `kind` (a UserInputError lists the known kinds)."""
    fn: JobFn = JOB_KINDS.get(kind)
    return fn


__all__ = ["JOB_KINDS", "Cancelled", "JobFn", "job_function"]
