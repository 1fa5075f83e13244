"""Label runs as people see them: creating one, listing them, and which ones do not count.

Design decisions
- A label run is a row with a status, running | finished | failed (store migration
  `LABEL_RUN_STATUS`). Only finished runs count: rank, the review queue and exports read
  finished runs only, and say which runs they left out (`left_out_note`), so a run that
  is still going or failed never silently changes or hides a result.
- A run killed while it labels (SIGKILL, the OOM killer, a power cut) cannot write its
  own end: while it runs, its `status_reason` names its writer (`writing: pid N on
  HOST`), and a listing shows a 'running' run whose writer is gone from this host as
  `interrupted` (issue 33), with what to do (`label --resume RUN`). Nothing is written
  for it: the same run resumed records its new writer. A run another host writes (a
  shared store on a network disk) is shown as it stands.
- Run names are chosen by people (`label --run NAME`) and never reused: creating a run
  whose name exists is an error, not an overwrite.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Any

import pandas as pd

from trace_lib import store
from trace_lib.errors import UserInputError
from trace_lib.store import labels as store_labels


def create_run(con: store.Connection, run_id: str, labeler: str, *,
               model: str | None = None, prompt_sha256: str | None = None,
               params: dict[str, Any] | None = None, status: str = "running") -> None:
    """A new label run row; the labeler writes 'running' and finishes it (see labeling)."""
    if store_labels.run_exists(con, run_id):
        raise UserInputError(f"label run {run_id!r} already exists; choose another --run name")
    store_labels.insert_run(con, run_id, labeler, model=model, prompt_sha256=prompt_sha256,
                            params=params or {}, status=status)


_WRITER = re.compile(r"^writing: pid (\d+) on (\S+)$")


def writer_tag() -> str:
    """What a run's `status_reason` holds while this process writes it."""
    return f"writing: pid {os.getpid()} on {socket.gethostname()}"


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:  # a zombie (an exited child not yet reaped) is gone too
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def shown_status(status: str | None, reason: str | None) -> tuple[str | None, str | None]:
    """(status, reason) as a listing shows them: a 'running' run whose writer process is
    gone from this host is 'interrupted'."""
    match = _WRITER.match(reason or "") if status == "running" else None
    if match and match.group(2) == socket.gethostname() and _pid_gone(int(match.group(1))):
        return "interrupted", (f"its writer (pid {match.group(1)}) ended before the run "
                               f"finished (killed or crashed); `label --resume RUN` "
                               f"completes it")
    return status, reason


def label_runs(db: str | Path | None = None) -> pd.DataFrame:
    """Every run, oldest first, with its status, cost and label and failed-pair counts."""
    with store.connect(db) as con:
        df = store_labels.label_runs(con)
    if len(df):
        shown = [shown_status(s, r) for s, r in zip(df["status"], df["status_reason"],
                                                   strict=True)]
        df["status"] = [s for s, _ in shown]
        df["status_reason"] = [r for _, r in shown]
    return df


def left_out_runs(db: str | Path | None = None) -> list[dict[str, Any]]:
    """The runs that rank, the review queue and exports do not count (not finished)."""
    with store.connect(db) as con:
        runs = store_labels.left_out_runs(con)
    for run in runs:
        run["status"], run["reason"] = shown_status(run["status"], run["reason"])
    return runs


def left_out_note(runs: list[dict[str, Any]]) -> str | None:
    """One sentence naming the runs left out, or None when every run finished."""
    if not runs:
        return None
    parts = [f"{r['run']} ({r['status']}, {r['n_trajectories_labeled']} trajectories labeled"
             + (f": {r['reason']}" if r.get("reason") else "") + ")" for r in runs]
    return ("left out (not finished; `label --resume RUN` completes one): "
            + "; ".join(parts))
