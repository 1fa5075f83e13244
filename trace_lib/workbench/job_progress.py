"""How far a job is and whether it learned: what a page's live panel and `job status` show.

Design decisions
- Everything here reads run directories only, never the store: the pages' live panels
  redraw every two seconds while a job writes, and must not hold the store's lock (the
  full page render records through `workbench.jobs.sync`).
- A finished job that learned nothing (every GRPO step had constant reward in every group,
  or a gate run whose gates did not move) is not a plain "succeeded": `learning_signal`
  derives the state a person sees, "succeeded — no learning signal", with the reason, from
  the run's metrics rows (the pages, `job status` and `job list` show the same).
- The same reading follows an adapter wherever it goes (`adapter_signal`): composing an
  adapter whose run learned nothing warns (issue 34), because its slot in a mixture is
  the base model under another name. The run is found from the adapter's recorded job
  (its row's run directory) or above the folder itself (`<run>/adapter`,
  `<run>/checkpoints/step_N`, `<run>/live/step_N`); an adapter from elsewhere has no
  run here and gets no verdict rather than a guessed one.
- `phase` says where an active training job is (the held-out evaluation before the first
  step can take minutes; without it a page says "0/N steps" the whole time).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from trace_lib import jobs

NO_SIGNAL_STATE = "succeeded — no learning signal"
_EVAL_LINE = re.compile(r"\[eval (before|after)\] (\d+)/(\d+) held-out seeds")
_SFT_LINE = re.compile(r"\[train\] SFT step (\d+)/(\d+)")


def is_active(state: str) -> bool:
    return state in jobs.ACTIVE


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """A run directory's metrics.jsonl rows (a foreground run's too)."""
    return jobs.read_metrics(run_dir)


def metrics_figure(rows: list[dict[str, Any]], **kwargs: Any):
    """The training metrics chart (reward, loss, KL, ... per step)."""
    from trace_lib.train import metrics_charts

    return metrics_charts.metrics_figure(rows, **kwargs)


def gate_movement(run_dir: str | Path, finished: bool = False) -> dict[str, Any]:
    """Have a gate-training run's gates moved? Norm, distance moved, routing entropy,
    share per slot and a warning when they have not (the Routing page and `job status`)."""
    from trace_lib.compose.movement import gate_movement as _movement

    return _movement(jobs.read_metrics(run_dir), finished=finished)


def grpo_signal(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A training run's GRPO steps from its metrics rows: `steps`, `no_signal_steps` (every
    group had constant reward) and `learned` (False when no step had a signal; None when
    there was no GRPO step)."""
    grpo = [r for r in rows if "no_signal" in r]
    quiet = sum(bool(r["no_signal"]) for r in grpo)
    return {"steps": len(grpo), "no_signal_steps": quiet,
            "learned": None if not grpo else quiet < len(grpo)}


def adapter_run_dir(adapter: str | Path) -> Path | None:
    """The training run directory that wrote this adapter folder, found above it (its
    metrics.jsonl), or None (an adapter trained elsewhere)."""
    folder = Path(adapter).expanduser().resolve()
    for run in (folder.parent, folder.parent.parent):
        if (run / "metrics.jsonl").is_file():
            return run
    return None


def adapter_signal(adapter: str | Path, run_dir: str | Path | None = None
                   ) -> dict[str, Any] | None:
    """Did the run that trained this adapter learn anything? `grpo_signal` of its run
    (`run_dir`, else found above the folder) plus `sft_steps` (a supervised warm start
    changes the adapter even when GRPO had no signal), `run_dir` and `warning` (a sentence
    when it learned nothing, else None). None when no run is known."""
    run = Path(run_dir) if run_dir and (Path(run_dir) / "metrics.jsonl").is_file() \
        else adapter_run_dir(adapter)
    if run is None:
        return None
    signal = grpo_signal(jobs.read_metrics(run))
    sft = run / "sft.jsonl"
    sft_steps = sum(1 for line in sft.read_text().splitlines() if line.strip()) \
        if sft.is_file() else 0
    warning = None
    if signal["learned"] is False:
        tail = (f"only its {sft_steps}-step SFT warm start changed it" if sft_steps else
                "it is the base model under another name")
        warning = (f"its training run ({run.name}) reported no learning signal: in all "
                   f"{signal['steps']} GRPO steps every group's rollouts got the same "
                   f"reward, so {tail}. Composing it adds a slot that cannot help.")
    return {**signal, "sft_steps": sft_steps, "run_dir": str(run), "warning": warning}


def learning_signal(status: jobs.JobStatus, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Did the job learn anything? From its metrics rows: `steps` (GRPO steps run),
    `no_signal_steps` (steps where every group had constant reward, so GRPO had nothing to
    learn from), `learned` (False when none had a signal, or a gate run's gates did not
    move; None while unknown), `state` (the job state a person should read: a succeeded job
    that learned nothing is "succeeded — no learning signal") and `warning`."""
    finished = status.state in jobs.TERMINAL
    if status.kind == jobs.TRAIN_GATES:
        from trace_lib.compose.movement import gate_movement as _movement

        moved = _movement(rows, finished=finished)
        learned, warning = moved["moved"], moved["warning"]
        steps, quiet = moved["steps"], moved["steps"] - moved["informative_steps"]
        if finished and learned is None:
            learned = False
    else:
        grpo = grpo_signal(rows)
        steps, quiet, learned = grpo["steps"], grpo["no_signal_steps"], grpo["learned"]
        warning = None
        if learned is False:
            warning = (f"No learning signal: in all {steps} GRPO steps every group's rollouts "
                       "got the same reward, so the adapter learned nothing. Try SFT "
                       "warm-start steps, hints, a lower difficulty or a larger group.")
    state = status.state
    if state == "succeeded" and learned is False:
        state = NO_SIGNAL_STATE
    return {"steps": steps, "no_signal_steps": quiet, "learned": learned, "state": state,
            "warning": warning}


def phase(status: jobs.JobStatus, rows: list[dict[str, Any]], log: str) -> dict[str, Any]:
    """Where an active training job is: `name` (starting | sft | eval before | training |
    eval after | ended), `done`/`total` for a progress bar and a `text` for it."""
    total_steps = int(status.config.get("steps") or 0)
    eval_seeds = int(status.config.get("eval_seeds") or 0)
    if status.state in jobs.TERMINAL:
        return {"name": "ended", "done": status.steps_done, "total": total_steps,
                "text": f"{status.steps_done}/{total_steps} steps"}
    grpo = [r for r in rows if "no_signal" in r]
    sft_steps = int(status.config.get("sft_steps") or 0)
    if sft_steps and not grpo and status.state != "queued":
        # The warm start comes first and, on long episodes, takes most of the run.
        seen = [int(m.group(1)) for m in _SFT_LINE.finditer(log)]
        done = max(seen, default=0)
        if done < sft_steps and "SFT warm start:" not in log:
            return {"name": "sft", "done": done, "total": sft_steps,
                    "text": f"SFT warm start: {done}/{sft_steps} steps"}
    evals = {m.group(1): (int(m.group(2)), int(m.group(3))) for m in _EVAL_LINE.finditer(log)}
    if eval_seeds and not grpo:
        if "before" not in evals and status.state == "queued":
            return {"name": "starting", "done": 0, "total": eval_seeds,
                    "text": "starting: loading the model"}
        done, total = evals.get("before", (0, eval_seeds))
        return {"name": "eval before", "done": done, "total": total,
                "text": f"evaluating before training: {done}/{total} held-out seeds"}
    if eval_seeds and status.steps_done >= total_steps > 0:
        done, total = evals.get("after", (0, eval_seeds))
        return {"name": "eval after", "done": done, "total": total,
                "text": f"evaluating the adapter: {done}/{total} held-out seeds"}
    return {"name": "training", "done": status.steps_done, "total": total_steps,
            "text": f"training: {status.steps_done}/{total_steps} steps"}


def live_status(job: str | jobs.JobStatus) -> dict[str, Any]:
    """What the page's live panel redraws every two seconds, from the run directory only:
    status, metrics, samples, log, the learning signal and the phase. Given a JobStatus
    (the page's `workbench.jobs.job_views` snapshot), that status is used as it is, so the
    panel and the table agree."""
    status = job if isinstance(job, jobs.JobStatus) else jobs.job_status(job)
    rows = jobs.read_metrics(status.run_dir)
    log = jobs.read_log(status.run_dir, tail=60)
    return {"status": status, "metrics": rows, "samples": jobs.read_samples(status.run_dir),
            "log": log, "signal": learning_signal(status, rows),
            "phase": phase(status, rows, log)}


def job_report(st: Any) -> dict[str, Any]:
    """What `job status` shows for a job: its `learning_signal` and, for a gate-training
    job, its `gate_movement` with the one-line `movement_line` (None for other kinds)."""
    movement = None
    if getattr(st, "kind", None) == jobs.TRAIN_GATES:  # composition: have the gates moved?
        movement = gate_movement(st.run_dir, finished=st.state in jobs.TERMINAL)
    line = None
    if movement is not None:
        from trace_lib.compose.movement import movement_line

        line = movement_line(movement)
    return {"learning_signal": learning_signal(st, jobs.read_metrics(st.run_dir)),
            "gate_movement": movement, "movement_line": line}
