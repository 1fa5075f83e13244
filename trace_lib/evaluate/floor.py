"""The do-nothing floor: what a policy that makes no call and says nothing passes.

    verdicts = task_verdicts([TaskOrigin("airline_0_000", "airline", EVALUATE_SOURCE, 0)])
    floor_summary(verdicts)  # {"status": "known", "tasks": 1, "passes": ..., ...}

Design decisions
- Computed, never assumed: a task's verdict is its own verifier run on an empty episode
  (`tasks.passes_by_doing_nothing`: the target-task environment reset, one empty reply,
  the task's code verdict). No count of refusals is written down anywhere.
- Known only where the workbench itself scored the run, because "the same verifier" is
  the point: a record's `meta.source` says who scored it. `SCORED_HERE` maps the sources
  that score with the target tasks' verifier to the task set they played: an evaluation
  (`trace_lib.evaluate`) names its task set in every record (domain, `task_set_seed`);
  the demo's scripted agents (`...airline.scripted_agent`) play the demo split's tasks
  (`demo.build_records` draws them with the same generator and seed) and are scored by
  the same `tasks.score`. Anything else (a tau2 log, an OpenAI JSONL someone made) was
  scored by a verifier the workbench does not have, even when its task ids match: its
  floor is unknown, and the reason says so. A task id that is not in the named task set
  is unknown too.
- Recorded verdicts first: evaluation records carry the verdict (`passes_by_doing_nothing`,
  computed by the same function inside the job), so only records without one (the demo,
  evaluations older than the field) are run here, memoised per process by (domain, seed,
  task id): an empty episode costs 60-110 ms on two shared cores (copying and hashing the
  domain database), and the Compare page reruns on every click.
- Nothing here opens the store: the job computes the same verdicts (runner.py imports
  `floor_summary`), and compare reads the records' fields and hands them in.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from trace_lib.errors import UserInputError

EVALUATE_SOURCE = "trace_lib.evaluate"
SCRIPTED_AGENT_SOURCE = "trace_lib.envs.domains.airline.scripted_agent"
# meta.source -> the split whose task set the records played when they name none
# (None: the records name it themselves, `meta.task_set_seed`).
SCORED_HERE: dict[str, str | None] = {EVALUATE_SOURCE: None, SCRIPTED_AGENT_SOURCE: "demo"}
RULE = ("the do-nothing floor is the share of tasks that a policy making no tool call and "
        "saying nothing passes, by the verifier that scored the run (its empty episode is "
        "really run); unknown where the workbench did not score the run")
NOT_SCORED_HERE = ("no verifier: these runs were not scored by the workbench (imported "
                   "logs), so what doing nothing would get is unknown")

_MEMO: dict[tuple[str, int, str], bool] = {}
_LOCK = threading.Lock()  # two page sessions may ask at once; the task-set cache is global


@dataclass(frozen=True)
class TaskOrigin:
    """What a run's records say about one task: who scored it, on which task set."""

    task_id: str
    domain: str | None
    source: str | None
    task_set_seed: int | None = None
    recorded: bool | None = None  # the verdict the scoring run recorded, if it did


def task_set_of(origin: TaskOrigin) -> tuple[str, int] | None:
    """(domain, task-set seed) whose verifier scored this task, None when unknown."""
    from trace_lib.envs.splits import SPLITS

    if origin.source not in SCORED_HERE or not origin.domain:
        return None
    if origin.task_set_seed is not None:
        return origin.domain, int(origin.task_set_seed)
    split = SCORED_HERE[origin.source]
    return (origin.domain, SPLITS[split].seed) if split else None


def _run_empty_episodes(domain: str, seed: int, task_ids: set[str]) -> dict[str, bool | None]:
    """The verifier on an empty episode for each of `task_ids` in the (domain, seed) task
    set; None for an id the set does not have (or a domain without a task set)."""
    from trace_lib.evaluate.tasks import load_task_set, passes_by_doing_nothing

    out: dict[str, bool | None] = {}
    with _LOCK:
        missing = {t for t in task_ids if (domain, seed, t) not in _MEMO}
        if missing:
            try:
                ts = load_task_set(domain, seed=seed)
            except UserInputError:
                ts = None
            by_id = {t.task_id: t for t in ts.tasks} if ts else {}
            for task_id in sorted(missing & set(by_id)):
                _MEMO[(domain, seed, task_id)] = passes_by_doing_nothing(ts, by_id[task_id])
        for task_id in task_ids:
            out[task_id] = _MEMO.get((domain, seed, task_id))
    return out


def task_verdicts(origins: Iterable[TaskOrigin]) -> dict[str, bool | None]:
    """{task id: whether doing nothing passes it} for every task; None where unknown (not
    scored here, or not a task of the task set its records name)."""
    out: dict[str, bool | None] = {}
    to_run: dict[tuple[str, int], set[str]] = {}
    for o in origins:
        where = task_set_of(o)
        if where is None:
            out[o.task_id] = None
        elif o.recorded is not None:
            out[o.task_id] = bool(o.recorded)
        else:
            to_run.setdefault(where, set()).add(o.task_id)
    for (domain, seed), ids in to_run.items():
        out.update(_run_empty_episodes(domain, seed, ids))
    return out


def unknown_reason(origins: Iterable[TaskOrigin]) -> str:
    """Why some of these tasks have no do-nothing verdict, in a sentence's words."""
    origins = list(origins)
    if any(task_set_of(o) is None for o in origins):
        return NOT_SCORED_HERE
    return ("some task ids are not tasks of the task set the records name, so no "
            "verifier is known for them")


def floor_summary(verdicts: Mapping[str, bool | None]) -> dict[str, Any]:
    """The floor of a set of tasks: `status` (known | partial | unknown), `tasks` (with a
    verdict), `passes`, `pass_rate` (over those tasks), `task_ids` (the ones doing nothing
    passes) and `unknown_tasks`."""
    known = {t: ok for t, ok in verdicts.items() if ok is not None}
    passed = sorted(t for t, ok in known.items() if ok)
    unknown = len(verdicts) - len(known)
    status = "unknown" if not known else ("partial" if unknown else "known")
    return {"status": status, "tasks": len(known), "passes": len(passed),
            "pass_rate": len(passed) / len(known) if known else None,
            "task_ids": passed, "unknown_tasks": unknown}
