"""One trajectory as the viewer loads it, and the other trials it can be compared with.

Design decisions
- `Call` and `Transcript` are the shared model (`trace_lib.transcript_model`, also what
  the labelers read), read by the one store reader (`trace_lib.trajectories`); the viewer
  adds its extras on each message: its `tool_calls` and `is_error`.
- A comparison partner is another trial of the same task in the same dataset:
  `task_trials` lists them, `contrast_pair` picks a passed and a failed one.
"""

from __future__ import annotations

import pandas as pd

from trace_lib import store
from trace_lib.store import trajectories as store_trajectories
from trace_lib.trajectories import load_transcripts
from trace_lib.transcript_model import Call, Transcript


def load_transcript(con: store.Connection, trajectory_id: str) -> Transcript:
    """Everything the viewer shows about one trajectory: the one store reader's transcript
    (`trace_lib.trajectories.load_transcripts`) plus the viewer's extras on each message,
    its `tool_calls` and `is_error`."""
    t = load_transcripts(con, [trajectory_id])[0]
    by_msg: dict[int | None, list[Call]] = {}
    for c in t.calls:
        by_msg.setdefault(c.message_idx, []).append(c)
    errors_by_call_id = {c.call_id: c.error for c in t.calls if c.error is not None and c.call_id}
    error_texts = {c.error for c in t.calls if c.error}
    for m in t.messages:
        tcid = m["tool_call_id"]
        m["tool_calls"] = by_msg.get(m["idx"], [])
        # A tool message is an error when the call it answers carries one; files without
        # call ids are matched on the error text itself.
        m["is_error"] = m["role"] == "tool" and (
            tcid in errors_by_call_id if tcid else (m["content"] or "") in error_texts)
    return t


def task_trials(con: store.Connection, trajectory_id: str) -> pd.DataFrame:
    """Every trial of the trajectory's task in its dataset (itself included), by trial:
    id, trial, outcome (passed | failed | unknown), reward, termination. One row for a task
    run once; none when the trajectory has no task id."""
    return store_trajectories.task_trials(con, trajectory_id)


def contrast_pair(
    con: store.Connection, trajectory_id: str
) -> tuple[str, str] | None:
    """(passed id, failed id) of the same task and dataset as `trajectory_id`, or None.

    The given trajectory is one of the two when its outcome allows; otherwise the first
    passed and first failed trial (by trial number) are used.
    """
    row = store_trajectories.task_of(con, trajectory_id)
    if row is None or row[1] is None:
        return None
    dataset_id, task_id, success = row
    trials = store_trajectories.known_outcome_trials(con, dataset_id, task_id)
    passed = [i for i, s in trials if s]
    failed = [i for i, s in trials if not s]
    if not passed or not failed:
        return None
    p = trajectory_id if success else passed[0]
    f = trajectory_id if success is False else failed[0]
    return p, f
