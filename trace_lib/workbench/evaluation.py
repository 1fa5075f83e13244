"""Evaluation use cases: run a policy on the target tasks, record it, compare two runs.

    result = evaluate(db, {"model": "tiny", "tasks": 3, "tools": "capability"})
    report = compare(db, "base run", result["dataset"])
    report = compare(db, Side("airline_demo.jsonl", "scripted-careful"),
                     "airline_demo.jsonl@scripted-hasty")

Design decisions
- One config (`evaluate.policy.EvalConfig`) for every front end: the page's form, the CLI's
  flags and a notebook's dict all become it here and are validated once, before anything
  starts, so a bad option is the same clear error everywhere.
- Provenance the job cannot know is added here, from the store, before the run starts:
  for an adapter, the capability and environment it was trained on and its job (the
  `adapters` row); for a composed model, its row's adapters. The run directory's own
  files (an adapter's `result.json`, a composed folder's `moe.json`) fill the rest, so a
  run started without a store still says what it evaluated.
- Foreground `evaluate` runs in this process and imports the episodes at once. In the
  background it is a job like any other (`workbench.jobs.submit_evaluation`, which adds
  the provenance through `with_provenance`): the job never opens the store, and the one
  job sync (`workbench.jobs.sync`) imports its episodes file, once, when a page or verb
  looks at jobs.
- Comparison and the one-task view are read-only (`trace_lib.compare`). A side is a
  dataset or one agent model's runs in it (`Side`, or `DATASET@AGENT_MODEL` as the CLI
  takes it), so the page's two pickers per side and the verb's argument are one value;
  `compare_choices` is where the page opens: a pair that shares tasks, else nothing.
- A finished run becomes a dataset like any import (`import_episodes`): its episodes file
  goes through the ingest stage (`ingest_paths`, format openai_jsonl), not row by row, so
  the same parser, all-or-nothing transaction, expected actions and tool schemas apply
  and explore, diagnose, rank and compare read it like a user's file. "Once" is the
  dataset whose `source` is that file (`is_imported`): re-syncing imports nothing.
- A result carries the pass rate's Wilson interval, so every front end prints the same.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trace_lib import compare as compare_views  # noqa: F401  (pure renderers for the page)
from trace_lib import store
from trace_lib.compare import Side, SideArg, wilson  # noqa: F401  (a side: dataset [+ agent model])
from trace_lib.errors import UserInputError
from trace_lib.explore import (  # noqa: F401  (pure renderers for the page)
    transcript_render,
    untrusted_text,
)
from trace_lib.store import capabilities as store_capabilities
from trace_lib.store import trajectories as store_trajectories

Db = str | Path | None


def make_config(config: Any) -> Any:
    """An `EvalConfig` from a dict (page, notebook) or an `EvalConfig` (CLI), validated."""
    from trace_lib.evaluate.policy import EvalConfig

    if isinstance(config, EvalConfig):
        config.validate()
        return config
    return EvalConfig.from_dict(dict(config), where="evaluate")


def store_provenance(db: Db, cfg: Any) -> dict[str, Any]:
    """What the store knows about the policy's parts (adapter row, composed model row)."""
    from trace_lib.store import jobs as job_rows

    path = store.resolve_db_path(db)
    if not path.exists() or not (cfg.adapter or cfg.moe):
        return {}
    out: dict[str, Any] = {}
    with store.connect(db, read_only=True) as con:
        if cfg.adapter:
            row = job_rows.adapter_at(con, str(Path(cfg.adapter).expanduser().resolve()))
            if row:
                out.update(adapter_id=row["id"], capability=row["capability"],
                           environment=row["environment"], job_id=row["job_id"])
        if cfg.moe:
            row = job_rows.moe_model_at(con, str(Path(cfg.moe).expanduser().resolve()))
            if row:
                out.update(moe_id=row["id"], moe_job_id=row["job_id"])
        cap = out.get("capability")
        if cap:
            status = store_capabilities.status_of(con, cap)
            if status:
                out["capability_status"] = status
    return out


def with_provenance(db: Db, cfg: Any) -> Any:
    """`cfg` with what the store knows added to its provenance (its own entries win)."""
    extra = store_provenance(db, cfg)
    cfg.provenance = {**extra, **cfg.provenance}
    return cfg


def evaluate(db: Db, config: Any, *, out_dir: str | Path | None = None,
             on_progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Run the evaluation here and import it; returns the `evaluate --json` document."""
    from trace_lib import jobs
    from trace_lib.evaluate.policy import new_run_id
    from trace_lib.evaluate.runner import run_evaluation

    cfg = with_provenance(db, make_config(config))
    cfg.run_id = cfg.run_id or new_run_id()
    folder = Path(out_dir) if out_dir else jobs.runs_dir() / cfg.run_id
    result = run_evaluation(cfg, folder, on_progress=on_progress)
    # the tokens per turn the run used, and how they were derived when none was given
    return {**import_episodes(db, result), "max_tokens": result["config"]["max_tokens"],
            "turn_budget": result.get("turn_budget")}


def import_episodes(db: Db, result: dict[str, Any],
                    job_id: str | None = None) -> dict[str, Any]:
    """Import a finished run's episodes file; return the `evaluate --json` document."""
    from trace_lib.ingest import ingest_paths

    path = Path(result["episodes_path"]).resolve()
    report = ingest_paths([path], db=db, fmt="openai_jsonl")
    from trace_lib.workbench.explore import store_overview

    store_overview(db)  # the Trajectories page's unfiltered view (issue 35)
    return summary(result, report.datasets[0], job_id)


def summary(result: dict[str, Any], ds: dict[str, Any], job_id: str | None) -> dict[str, Any]:
    """The `evaluate --json` document of a run (`result.json`) imported as dataset `ds`."""
    n, k = int(result["trajectories"]), int(result["successes"])
    lo, hi = wilson(k, n)
    keys = ("write_tasks", "floor", "policy", "domain", "split", "tasks", "trials",
            "run_id")
    return {"dataset": ds["name"], "dataset_id": ds["id"], "trajectories": n,
            "successes": k, "failures": n - k, "pass_rate": k / n if n else None,
            "ci95": [lo, hi], **{key: result.get(key) for key in keys}, "job_id": job_id,
            "episodes_path": result.get("episodes_path"), "wall_s": result.get("wall_s")}


def is_imported(db: Db, episodes_path: str | Path) -> bool:
    """Whether a dataset was imported from this episodes file already (its `source`)."""
    return imported_dataset(db, episodes_path) is not None


def imported_dataset(db: Db, episodes_path: str | Path) -> dict[str, str] | None:
    """{id, name} of the dataset imported from this episodes file, None when none was."""
    with store.connect(db) as con:
        row = store_trajectories.dataset_from_source(con, str(Path(episodes_path).resolve()))
    return {"id": row[0], "name": row[1]} if row else None


def datasets(db: Db) -> list[dict[str, Any]]:
    """Every dataset with its outcome counts, agent models and, for evaluations, the
    provenance: what the Compare page offers, newest first. `agent_model` is the one agent
    model when there is one (None for several or none: `agent_models` lists them)."""
    path = store.resolve_db_path(db)
    if not path.exists():
        return []
    with store.connect(db, read_only=True) as con:
        rows = store_trajectories.dataset_summaries(con)
    out = []
    for id_, name, fmt, at, n, k, tasks, agents, prov in rows:
        agents = list(agents or [])
        out.append({"id": id_, "name": name, "format": fmt, "imported_at": str(at),
                    "trajectories": n, "successes": k, "tasks": tasks,
                    "agent_model": agents[0] if len(agents) == 1 else None,
                    "agent_models": agents,
                    "provenance": json.loads(prov) if prov else None})
    return out


def policies(db: Db) -> dict[str, list[dict[str, Any]]]:
    """What the Evaluate form can run: recorded adapters and composed models."""
    path = store.resolve_db_path(db)
    if not path.exists():
        return {"adapters": [], "moe": []}
    from trace_lib.workbench.composition import list_moe_models
    from trace_lib.workbench.training import list_adapters

    return {"adapters": list_adapters(db), "moe": list_moe_models(db)}


def parse_task_slice(text: str | int | None) -> tuple[int, int | None]:
    """(offset, count) of `--tasks` N, START:END or all (`evaluate.tasks.parse_task_slice`)."""
    from trace_lib.evaluate.tasks import parse_task_slice as _parse

    return _parse(text)


def task_set_domains() -> list[str]:
    from trace_lib.evaluate.tasks import task_set_domains as _domains

    return _domains()


def task_splits() -> list[dict[str, Any]]:
    """The target-task splits a policy can be evaluated on (name, size, what it is for)."""
    from trace_lib.envs.splits import SPLITS

    return [{"name": s.name, "size": s.size, "purpose": s.purpose} for s in SPLITS.values()]


def compare(db: Db, a: SideArg, b: SideArg) -> dict[str, Any]:
    """The two runs side by side (`compare --json`); a side is `DATASET[@AGENT_MODEL]` or a
    `Side(dataset, agent_model)`."""
    from trace_lib.compare import compare_datasets

    return compare_datasets(db, a, b)


def compare_choices(db: Db) -> dict[str, Any]:
    """What the Compare page's pickers offer and where they open: `datasets` (newest first,
    each with its `agent_models`) and `default`, two sides that share a task, or None when
    no two sides do (the page then opens on an empty choice and says why)."""
    from trace_lib.compare import default_sides

    found = datasets(db)
    return {"datasets": found, "default": default_sides(db) if found else None}


def task_pair(db: Db, a: SideArg, b: SideArg, task_id: str) -> Any:
    """One task's two transcripts aligned on tool calls, with its expected actions."""
    from trace_lib.compare import task_pair as _pair

    return _pair(db, a, b, task_id)


def policy_label(config: dict[str, Any]) -> str:
    """How a job list names an evaluation's policy."""
    try:
        return make_config(config).policy_label()
    except UserInputError:  # e.g. an adapter folder removed since: still list the job
        return str(config.get("label") or config.get("model"))
