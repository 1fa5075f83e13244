"""Run a policy on the target tasks: one episode per (task, trial), written as a JSONL file.

    result = run_evaluation(EvalConfig(model="tiny", tasks=3), out_dir)

Design decisions
- The entry points only: the policy, its endpoint and an episode's record are policy.py;
  the episodes run in shards (shards.py), so a foreground run and an `evaluate` job, on
  the local or the ray backend, write the same file.
- Nothing here opens the store: a job runs this and the app imports the file.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trace_lib.evaluate import shards
from trace_lib.evaluate.floor import floor_summary
from trace_lib.evaluate.policy import EvalConfig, episodes_name, new_run_id, provenance

ProgressFn = Callable[[int, int], None]


def run_evaluation(cfg: EvalConfig, out_dir: str | Path, *,
                   should_stop: Callable[[], bool] | None = None,
                   on_progress: ProgressFn | None = None, backend: str = "local",
                   log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Evaluate the policy on the target tasks; write `<out_dir>/<name>.jsonl`; return the
    summary (also what an `evaluate` job writes as its result.json). The episodes run in
    shards (`shards.py`) kept in `<out_dir>/episodes/<run id>/`: those already there are not run
    again; `backend="ray"` runs each missing shard as a Ray task."""
    cfg.validate()
    budget = None
    if cfg.max_tokens is None:  # derived here, so a job and its resumption agree
        budget = turn_budget(cfg)
        cfg = dataclasses.replace(cfg, max_tokens=budget["max_tokens"])
        if log:
            log(f"[evaluate] --max-tokens {cfg.max_tokens}: the longest reference turn of "
                f"these tasks is {budget['longest_reference_turn']} tokens "
                f"({budget['counted_with']}), + 25%")
    stop = should_stop or (lambda: False)
    run_id = cfg.run_id or new_run_id()
    prov = provenance(cfg, run_id)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / episodes_name(cfg, run_id)
    eps = shards.Episodes(cfg, prov, shards.shard_dir(out, run_id))
    t0 = time.perf_counter()

    have = eps.done()
    for s in have:
        eps.read(s)  # a folder of another run or shard size is refused before any work
    todo = [s for s in range(len(eps.shards)) if s not in have]
    total = len(eps.pairs)
    done = sum(len(eps.shards[s]) for s in have)
    if log:
        log(f"[evaluate] run {run_id}: {len(todo)} of {len(eps.shards)} shards to run "
            f"({backend})")

    def tick(n: int) -> None:
        nonlocal done
        done += n
        if on_progress:
            on_progress(done, total)

    if backend == "ray":
        ran = shards.run_ray(eps, todo, stop, lambda d: tick(d["episodes"]))
    else:
        ran = shards.run_local(eps, todo, stop, lambda: tick(1))
    if stop():
        from trace_lib.jobs import Cancelled

        raise Cancelled()
    finished = eps.merge(path)
    successes = sum(1 for r in finished if r["success"])
    writes = [r for r in finished if r["meta"]["write_required"]]
    return {
        "episodes_path": str(path),
        "run_id": run_id,
        "policy": prov["policy"],
        "domain": cfg.domain,
        "split": eps.ts.split,
        "tasks": len(eps.ts.tasks),
        "trials": cfg.trials,
        "trajectories": len(finished),
        "successes": successes,
        "failures": len(finished) - successes,
        "pass_rate": successes / len(finished) if finished else None,
        # the part a policy that does nothing cannot pass (see tasks.py)
        "write_tasks": {"trajectories": len(writes),
                        "successes": sum(1 for r in writes if r["success"])},
        # what the policy that makes no call and says nothing passes on the same tasks
        # (shards written before records carried the verdict count as unknown tasks)
        "floor": floor_summary({r["task_id"]: r["meta"].get("passes_by_doing_nothing")
                                for r in finished}),
        "wall_s": round(time.perf_counter() - t0, 2),
        "provenance": prov,
        "config": cfg.to_dict(),
        # how config.max_tokens was derived (None: it was given)
        "turn_budget": budget,
        # which process ran each shard (None: there from an earlier attempt)
        "shard_pids": {shards.shard_name(s): None for s in have}
        | {d["shard"]: d["pid"] for d in ran},
    }


def turn_budget(cfg: EvalConfig) -> dict[str, Any]:
    """The tokens per turn of an evaluation given no `max_tokens`: the longest assistant
    turn of the reference policy on the selected tasks (`tasks.reference_turn_texts`),
    counted with the policy's tokenizer when it is a local model (chars/4 for a served
    endpoint, whose tokenizer is not here), through the one rule
    (`runtime.turn_budget.derived_max_tokens`). The record says how it was counted."""
    from trace_lib.evaluate.tasks import load_task_set, reference_turn_texts
    from trace_lib.runtime.turn_budget import RULE, derived_max_tokens

    ts = load_task_set(cfg.domain, cfg.tasks, seed=cfg.task_seed, offset=cfg.task_offset)
    texts = reference_turn_texts(ts)
    model = None if cfg.server_url else provenance(cfg, "").get("model")
    counted_with = "chars/4: a served model's tokenizer is not here"
    count: Callable[[str], int] = lambda text: math.ceil(len(text) / 4)  # noqa: E731
    if model:
        try:
            from trace_lib.runtime.base_models import load_tokenizer, resolve_model

            tokenizer = load_tokenizer(resolve_model(model))
            count = lambda text: len(tokenizer(  # noqa: E731
                text, add_special_tokens=False)["input_ids"])
            counted_with = f"{model}'s tokenizer"
        except Exception as exc:  # noqa: BLE001 - a default: chars/4 rather than no run
            counted_with = f"chars/4: {model}'s tokenizer did not load ({type(exc).__name__})"
    longest = max((count(t) for t in texts), default=0)
    return {"max_tokens": derived_max_tokens(longest), "longest_reference_turn": longest,
            "counted_with": counted_with, "rule": RULE}


def run_job(spec: Any, run_dir: Path, should_stop: Callable[[], bool]) -> dict[str, Any]:
    """The `evaluate` job kind: the spec's config, episodes into the run directory; the
    shards missing there run in this process (local) or as Ray tasks (ray)."""
    cfg = EvalConfig.from_dict(spec.config, where=f"{Path(run_dir) / 'spec.json'}: config")
    cfg.run_id = cfg.run_id or spec.id
    metrics = Path(run_dir) / "metrics.jsonl"
    lock = threading.Lock()

    def progress(done: int, total: int) -> None:
        # a line per finished episode (local) or shard (ray): `step` is what `job status`
        # and the pages show
        with lock, metrics.open("a") as fh:
            fh.write(json.dumps({"step": done, "total": total, "time": time.time()}) + "\n")

    return run_evaluation(cfg, run_dir, should_stop=should_stop, on_progress=progress,
                          backend=spec.backend, log=lambda line: print(line, flush=True))
