"""SIGKILL at a chosen point of a real writer process (issue 33, "nothing lost under
faults"), cheaply enough to try ten points per writer.

Each writer runs in a process forked from a multiprocessing *forkserver* that imported
trace_lib, torch and transformers once: a fresh `python -m trace_lib ...` costs seconds
of imports per point on 2 CPU cores, a fork costs milliseconds. The child is a real,
separate process with its own DuckDB connection and file locks; the parent kills it with
SIGKILL (no handler, no cleanup, what the OOM killer does).

A point is deterministic: the parent counts the writer's own progress messages (one per
progress tick of the library call) and kills right after the Nth, plus a seeded jitter
of a few milliseconds so the kill also lands inside the writes between two ticks. The
(seed, point) is in every assertion message, so a failure replays.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CTX = multiprocessing.get_context("forkserver")
# Imported once, in the forkserver, before any child is forked (no torch op runs there,
# so no OpenMP pool is forked half-used).
CTX.set_forkserver_preload([
    "trace_lib.ingest.pipeline", "trace_lib.diagnose.labeling", "trace_lib.diagnose.labels",
    "trace_lib.jobs.runner", "trace_lib.train.trainer", "trace_lib.evaluate.runner",
])
# The interpreter's own `__main__` (pytest's), kept at import: a page script a test ran
# in-process (streamlit's AppTest) can be left as `__main__`, and a forkserver child
# re-runs whatever `__main__` is when it starts (seen: pages/8_Improve.py failing in
# every child when the workbench tests ran before these).
_MAIN = sys.modules["__main__"]


@dataclass
class Kill:
    point: int  # kill after this many progress messages
    jitter_s: float  # then this long (seeded): a kill between two ticks
    killed: bool = False  # False: the writer finished before the point
    acked: list[Any] = field(default_factory=list)  # what the writer reported done
    exitcode: int | None = None
    wall_s: float = 0.0
    first_tick_s: float | None = None  # when the first progress message came


def points(seed: int, n: int, lo: int, hi: int, max_jitter_s: float = 0.02) -> list[Kill]:
    """`n` kill points, each after lo..hi progress messages, from `seed`."""
    rng = random.Random(seed)
    return [Kill(rng.randint(lo, hi), round(rng.uniform(0, max_jitter_s), 4))
            for _ in range(n)]


def run(target: Callable[..., None], args: tuple, kill: Kill | None = None, *,
        poll: Callable[[], int] | None = None, timeout_s: float = 120.0) -> Kill:
    """Run `target(conn, *args)` in a forked process; with `kill`, SIGKILL it after
    `kill.point` progress messages (sent on `conn`, or counted by `poll()` for a writer
    whose progress is a file, like a job's metrics). Returns what happened."""
    kill = kill or Kill(point=0, jitter_s=0.0)
    parent, child = CTX.Pipe(duplex=False)
    proc = CTX.Process(target=_child, args=(target, child, *args), daemon=True)
    t0 = time.monotonic()
    current, sys.modules["__main__"] = sys.modules["__main__"], _MAIN
    try:
        proc.start()
    finally:
        sys.modules["__main__"] = current
    child.close()
    seen = 0
    while proc.is_alive() and time.monotonic() - t0 < timeout_s:
        if parent.poll(0.005):
            try:
                kill.acked.append(parent.recv())
            except EOFError:
                break
            seen = len(kill.acked)
            if kill.first_tick_s is None:
                kill.first_tick_s = round(time.monotonic() - t0, 3)
        elif poll is not None:
            seen = poll()
        if kill.point and seen >= kill.point:
            time.sleep(kill.jitter_s)
            try:
                os.kill(proc.pid, signal.SIGKILL)
                kill.killed = True
            except ProcessLookupError:
                pass  # it finished (and was reaped) first
            break
    proc.join(timeout_s)
    while parent.poll():  # acknowledgements sent before the kill landed
        try:
            kill.acked.append(parent.recv())
        except EOFError:
            break
    parent.close()
    if proc.is_alive():
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        raise AssertionError(f"writer still running after {timeout_s}s ({kill})")
    kill.exitcode = proc.exitcode
    kill.killed = kill.killed and proc.exitcode == -signal.SIGKILL
    kill.wall_s = round(time.monotonic() - t0, 2)
    return kill


def _child(target: Callable[..., None], conn: Any, *args: Any) -> None:
    target(conn, *args)
    conn.close()


# ------------------------------------------------------------------------- writers
# Module-level, so the forkserver's children can unpickle them by name.

def ingest(conn: Any, db: str, path: str) -> None:
    from trace_lib.ingest.pipeline import ingest_paths

    ingest_paths([path], db=db, progress=lambda *_: conn.send("tick"))


def label(conn: Any, db: str, run: str, resume: bool) -> None:
    from trace_lib.diagnose.labeling import run_labeling

    if resume:
        run_labeling(db, resume=run, progress=lambda *_: conn.send("tick"))
    else:
        run_labeling(db, "heuristic", run_prefix=run, progress=lambda *_: conn.send("tick"))


def edit(conn: Any, db: str, edits: list[tuple[str, str, str]]) -> None:
    """One edit per call, as the Labels page saves a cell: each acknowledged (sent to the
    parent) only once `edit_labels` returned, i.e. committed."""
    from trace_lib.diagnose.labels import edit_labels

    for e in edits:
        edit_labels(db, [e], editor="kill-test")
        conn.send(e)


def job(conn: Any, spec_path: str) -> None:
    """A job's own entry point (`python -m trace_lib.jobs.runner SPEC`), in this process."""
    from trace_lib.jobs import runner

    runner.run_job(spec_path)


def steps_done(run_dir: Path) -> Callable[[], int]:
    from trace_lib.jobs.run_dir import steps_done as done

    return lambda: done(run_dir)
