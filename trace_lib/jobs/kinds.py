"""The table of job kinds: kind -> "module:function", imported only when a job of that kind
runs.

Design decisions
- An explicit table, not registration by import side effect: the job process knows every
  kind without importing the CLI or the stage that submits it (before, `train_gates` was
  known to the job process only because building the CLI parser imported compose). Add a
  kind by adding one line here; the function lives with its stage.
- A job function is `(spec, run_dir, should_stop) -> result dict`. It validates its own
  `spec.config`, writes only into `run_dir` (see `run_dir.py`), polls `should_stop()` at
  safe points and raises `Cancelled` there; its return value becomes result.json.
- Functions are resolved lazily, so listing or checking kinds (every `JobSpec.from_dict`)
  imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trace_lib.registry import Registry

if TYPE_CHECKING:
    from trace_lib.jobs.spec import JobSpec

JobFn = Callable[["JobSpec", Path, Callable[[], bool]], dict[str, Any]]


class Cancelled(Exception):
    """Raised inside a job when a stop was requested; the job ends as `cancelled`."""


JOB_KINDS: Registry[JobFn] = Registry("job kind", builtins={
    "train_adapter": "trace_lib.train.trainer:run_job",
    "train_gates": "trace_lib.compose.gate_training:run_job",
    "evaluate": "trace_lib.evaluate.runner:run_job",
    "label": "trace_lib.diagnose.label_job:run_job",
})


def job_function(kind: str) -> JobFn:
    """The function that runs jobs of `kind` (a UserInputError lists the known kinds)."""
    return JOB_KINDS.get(kind)
