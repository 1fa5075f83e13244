"""The job system's two tables of names: job kinds and backends (names -> lazy "module:attr").

Design decisions
- The tables sit below everything else in `jobs`, so `JobSpec.from_dict` can check a
  spec's `kind` and `backend` against them while `kinds.py` and `backends.py` (which
  speak in terms of `JobSpec`) import the spec module: no import circle between a spec
  and the tables that name what it may ask for.
- Both are typed `Registry` instances of `trace_lib.registry`, the project's one
  registration mechanism: values are "module:attr" strings imported on first `get`, so
  listing or checking names (every spec load) imports no torch and no stage. The value
  types are spelled loosely here (a job function, a backend factory) because their
  precise types mention `JobSpec`; `kinds.job_function` and `backends.get_backend` are
  the typed ways to get one.
- Add a kind by adding one line to `JOB_KINDS`; its function lives with its stage and is
  `(spec, run_dir, should_stop) -> result dict` (`kinds.JobFn`). Backends also come from
  the `trace_workbench.job_backends` entry-point group.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trace_lib.registry import Registry

# The kinds' names, for code that asks "is this a gate job?" (one spelling each).
TRAIN_ADAPTER = "train_adapter"
TRAIN_GATES = "train_gates"
EVALUATE = "evaluate"
LABEL = "label"
ROUTING_DEMO = "routing_demo"

JOB_KINDS: Registry[Callable[..., dict[str, Any]]] = Registry("job kind", builtins={
    TRAIN_ADAPTER: "trace_lib.train.trainer:run_job",
    TRAIN_GATES: "trace_lib.compose.gate_training:run_job",
    EVALUATE: "trace_lib.evaluate.runner:run_job",
    LABEL: "trace_lib.diagnose.label_job:run_job",
    ROUTING_DEMO: "trace_lib.compose.demo:run_job",
})

BACKENDS: Registry[Callable[[], Any]] = Registry(
    "job backend", group="trace_workbench.job_backends",
    builtins={"local": "trace_lib.jobs.local:LocalBackend",
              "ray": "trace_lib.jobs.ray:RayBackend"},
)
