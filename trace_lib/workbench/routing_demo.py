"""The routing demo use cases: build it (here or as a job), find the last build, read it.

    report = routing_demo.build(db, "smollm2-135m", background=True)   # the button
    demo = routing_demo.find("smollm2-135m")      # None until a build completed
    demo["what_you_see"], demo["examples"][0]["replies"]["composed"]["reward"]

Design decisions
- The stage (`trace_lib.compose.demo`) does the work and writes one folder; this module
  decides where (`demo_dir`: `<models folder>/routing-demo/<model>`, kept across `make
  demo` like a prepared base model), what a model's settings are (`demo_config`: the
  benches' settings for a real model; a seconds-long preset for `tiny`, which learns
  nothing and exists for tests and for trying the flow) and whether anything needs doing:
  a completed build with the same settings is found and reported (`skipped`), a build job
  already running on that folder is reported instead of starting a twin, anything else
  starts (or resumes: the stage continues from the folder's files).
- In the background the build is a job like every other kind, submitted through
  `workbench.jobs.submit_routing_demo`; the one job sync registers its composed model
  when it succeeded, a foreground build registers it at once. Either way the Routing
  page's model picker holds it.
- The page reads `demo.json` (examples, replies, verdicts, the "what you are seeing"
  text, written by the build): nothing is recomputed per view.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from trace_lib.compose.demo import DemoConfig

Db = str | Path | None
DEFAULT_MODEL = "smollm2-135m"
DEMO_DIR_ENV = "TRACE_ROUTING_DEMO_DIR"
MODELS = ("smollm2-135m", "tiny")

# `tiny` is random-initialised: the flow in seconds, nothing learned (tests, a first look).
_TINY = {"sft_steps": 2, "sft_seeds": 4, "sft_batch": 2, "warm_seeds": 1, "warm_steps": 10,
         "examples": 1, "lora_rank": 4,
         "max_tokens": {"tool_calling_precision": 8, "precondition_verification": 8},
         "max_turns": {"tool_calling_precision": 1, "precondition_verification": 1}}


def demo_root() -> Path:
    """Where demos are kept: `$TRACE_ROUTING_DEMO_DIR`, else `<models folder>/routing-demo`
    (the test suite points the variable at an empty folder, so a demo built on the machine
    never changes what another test's Routing page shows)."""
    from trace_lib.runtime.base_models import models_dir

    env = os.environ.get(DEMO_DIR_ENV)
    return Path(env) if env else models_dir() / "routing-demo"


def demo_dir(model: str = DEFAULT_MODEL) -> Path:
    """Where the demo of `model` is kept: `demo_root()/<model>`."""
    return demo_root() / re.sub(r"[^A-Za-z0-9._-]+", "_", model)


def demo_config(model: str = DEFAULT_MODEL, out: str | Path | None = None,
                **overrides: Any) -> DemoConfig:
    """The build's settings for `model` (None-valued overrides are ignored)."""
    fields: dict[str, Any] = {"model": model, "out": str(out or demo_dir(model))}
    if model == "tiny":
        fields.update(_TINY)
    fields.update({k: v for k, v in overrides.items() if v is not None})
    return DemoConfig.from_dict(fields, where="routing demo")


def find(model: str | None = None) -> dict[str, Any] | None:
    """The last completed build (demo.json, with `path`), of `model` or else of any model
    (the default model first); None when none has completed."""
    names = [model] if model else [DEFAULT_MODEL, *[m for m in MODELS if m != DEFAULT_MODEL]]
    for name in names:
        found = read(demo_dir(name))
        if found is not None:
            return found
    if model is None:
        root = demo_root()
        for folder in sorted(root.iterdir()) if root.is_dir() else []:
            found = read(folder)
            if found is not None:
                return found
    return None


def read(folder: str | Path) -> dict[str, Any] | None:
    path = Path(folder) / "demo.json"
    if not path.is_file():
        return None
    out = json.loads(path.read_text())
    out["path"] = str(Path(folder).resolve())
    return out


def trace_path(demo: dict[str, Any], example: dict[str, Any]) -> Path:
    return Path(demo["path"]) / example["trace"]


def load_trace(demo: dict[str, Any], example: dict[str, Any]):
    """The composed reply's per-token routing (a `RoutingTrace`)."""
    from trace_lib.compose.traces import RoutingTrace

    return RoutingTrace.load(trace_path(demo, example))


def is_current(cfg: DemoConfig) -> bool:
    """Whether `cfg.out` holds a completed build of exactly these settings."""
    recipe = Path(cfg.out) / "recipe.json"
    return ((Path(cfg.out) / "demo.json").is_file() and recipe.is_file()
            and json.loads(recipe.read_text()) == cfg.recipe())


def active_job(db: Db, cfg: DemoConfig | None = None, statuses: list[Any] | None = None):
    """The queued or running build job (on `cfg.out`), else None."""
    from trace_lib.jobs import ACTIVE, list_jobs
    from trace_lib.jobs.registries import ROUTING_DEMO

    for st in statuses if statuses is not None else list_jobs():
        if st.kind != ROUTING_DEMO or st.state not in ACTIVE:
            continue
        if cfg is None or Path(st.config.get("out", "")).resolve() == Path(cfg.out).resolve():
            return st
    return None


def build(db: Db, model: str = DEFAULT_MODEL, *, background: bool = False,
          progress: bool = True, out: str | Path | None = None,
          **overrides: Any) -> dict[str, Any]:
    """Build the demo (`demo adapters`, the "Build the routing demo" button): `state` is
    `built` (now, or found: `skipped`), `running` (a build job on that folder already
    runs) or `submitted` (a background job started: `job`)."""
    from trace_lib.workbench import composition, jobs

    cfg = demo_config(model, out=out, **overrides)
    base = {"model": model, "path": str(Path(cfg.out).resolve())}
    if is_current(cfg):
        demo = read(cfg.out) or {}
        composition.register_moe(db, demo["moe_path"])  # idempotent: the row by its folder
        return {**base, "state": "built", "skipped": True,
                "what_you_see": demo.get("what_you_see", "")}
    running = active_job(db, cfg)
    if running is not None:
        return {**base, "state": "running", "skipped": True, "job": running.id,
                "run_dir": running.run_dir}
    if background:
        spec = jobs.submit_routing_demo(db, cfg)
        return {**base, "state": "submitted", "skipped": False, "job": spec.id,
                "run_dir": spec.run_dir}
    from trace_lib.compose.demo import build as _build

    result = _build(cfg, progress=progress)
    result["moe_id"] = composition.register_moe(db, result["moe_path"])
    return {**base, "state": "built", "skipped": False, **result}


def progress(status: Any) -> dict[str, Any]:
    """A build job's progress from its run directory: done/total units, the last line."""
    from trace_lib.jobs import read_metrics

    rows = read_metrics(status.run_dir)
    last = rows[-1] if rows else {}
    return {"done": int(last.get("step", 0)), "total": int(last.get("total", 0) or 0),
            "phase": last.get("phase", "starting"), "message": last.get("message", ""),
            "cpu_s": last.get("cpu_s")}
