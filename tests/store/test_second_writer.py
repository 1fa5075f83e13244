"""A second writer (issue 33, "nothing lost under faults"): label edits through the
library call the Labels page makes (`workbench.edit_labels`, one save per edit) while
`ingest` imports a large-ish file from the CLI in another process and a heuristic label
run writes its results from a third. DuckDB lets one process write at a time, so each
edit meets a busy store: the wait is bounded and said once on stderr, then it is a clear
`StoreLockedError` (which the page shows, and the person saves again). No edit is lost
or stored twice, no process prints a traceback, and the new data is there once the
writers finished.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).parent))
from store_faults import REPO_ROOT, count  # noqa: E402

N_IMPORT = 60_000  # ~30 MB of JSONL: an import that holds the write lock for seconds
N_EDITS = 20
EDIT_TIMEOUT_S = 10.0  # store.connect's wait: a save waits this long, then says busy


def _cli(*args: str, db: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "trace_lib", *args, "--db", str(db)],
                            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def _finish(proc: subprocess.Popen, what: str) -> str:
    out, err = proc.communicate(timeout=300)
    assert "Traceback" not in out + err, f"{what}:\n{err[-3000:]}"
    # a writer that waited past its own limit ends in the one clear error line
    assert proc.returncode == 0 or ("error:" in err and "locked" in err), \
        f"{what}: exit {proc.returncode}\n{err[-3000:]}"
    return err if proc.returncode else ""


def _until_locked(db: Path, timeout_s: float = 60.0) -> float:
    """Seconds until another process holds the store's write lock."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            duckdb.connect(str(db), read_only=True).close()
        except duckdb.Error as exc:
            if "lock" in str(exc).lower():
                return time.monotonic() - t0
        time.sleep(0.02)
    raise AssertionError(f"no writer took the lock of {db} in {timeout_s}s")


def test_edits_while_an_import_and_a_label_run_write(store_copy: Path, tmp_path: Path,
                                                     capfd, monkeypatch) -> None:
    from trace_lib import store
    from trace_lib.store import connection
    from trace_lib.workbench import diagnose as wb
    from trace_lib.workbench.errors import ActionError

    # The bound is on waiting for the lock, each time a save opens the store: from its
    # first attempt to the start of the attempt that got the lock. What comes after (that
    # attempt replaying a 30 MB write-ahead log the import left, the save's own work)
    # grows with the machine's load: one whole save took 15.7 s at load 10.
    opens: list[float] = []
    attempts: list[tuple[float, bool]] = []
    real_open, real_connect = connection.open_connection, duckdb.connect

    def timed_connect(*args, **kwargs):
        t = time.monotonic()
        try:
            con = real_connect(*args, **kwargs)
        except duckdb.Error:
            attempts.append((t, False))
            raise
        attempts.append((t, True))
        return con

    def timed_open(*args, **kwargs):
        attempts.clear()
        try:
            return real_open(*args, **kwargs)
        finally:
            if attempts:
                last = attempts[-1][0] if attempts[-1][1] else time.monotonic()
                opens.append(last - attempts[0][0])

    monkeypatch.setattr(connection, "open_connection", timed_open)
    monkeypatch.setattr(connection.duckdb, "connect", timed_connect)

    sys.path.insert(0, str(REPO_ROOT / "bench"))
    from ingest import write_dataset  # the ingest bench's synthetic OpenAI-messages file

    big = tmp_path / "big.jsonl"
    write_dataset(big, N_IMPORT, seed=1)
    db = store_copy
    with store.connect(db, read_only=True) as con:
        dataset = con.execute("SELECT name FROM datasets").fetchall()[0][0]
        todo = [(t, c, "lacking") for t, c in con.execute(
            "SELECT trajectory_id, capability FROM effective_labels WHERE value <> 'lacking' "
            f"ORDER BY ALL LIMIT {N_EDITS}").fetchall()]
    n_before = count(db, "SELECT count(*) FROM trajectories")

    importer = _cli("ingest", str(big), db=db)
    labeler = _cli("label", "--labeler", "heuristic", "--run", "second", "--dataset",
                   dataset, db=db)
    saved, busy, waits = [], [], []
    pending = list(todo)
    held_after = _until_locked(db)  # the edits start once a writer holds the store
    t0 = time.monotonic()
    while pending and time.monotonic() - t0 < 240:
        time.sleep(0.25)  # a person's pace: the edits spread over both writers' work
        edit = pending[0]
        t = time.monotonic()
        try:
            # the page's save: one grid edit, `skip_unchanged` as the grid saves it
            ids = wb.edit_labels(db, [edit], editor="second", note="grid edit",
                                 skip_unchanged=True)
        except ActionError as exc:  # busy: a clear message, then the person saves again
            waits.append(time.monotonic() - t)
            busy.append(str(exc))
            continue
        waits.append(time.monotonic() - t)
        saved.append((edit, ids))
        pending.pop(0)
    writers_running = [importer.poll() is None, labeler.poll() is None]
    import_err = _finish(importer, "ingest")
    label_err = _finish(labeler, "label")
    said = capfd.readouterr().err

    # every edit acknowledged once, stored once
    assert not pending, (len(pending), busy[-3:])
    with store.connect(db, read_only=True) as con:
        stored = con.execute("SELECT trajectory_id, capability, new FROM label_edits "
                             "WHERE editor = 'second' ORDER BY id").fetchall()
    assert sorted(stored) == sorted(todo)
    assert all(len(ids) == 1 for _, ids in saved)
    # a busy store: a bounded wait (said once on stderr), then the clear error
    assert all("locked" in m and str(db) in m for m in busy), busy[:3]
    # the retry loop's last sleep (at most 2 s, jittered) may end past the deadline
    assert opens and max(opens) < EDIT_TIMEOUT_S + 2.5, max(opens)
    if busy or max(opens) > 1.0:  # a wait a person notices is said, with its limit
        assert "the store is busy" in said and "waiting up to 10s" in said, said[-2000:]
    # the writers' data is there once they finished (a writer refused the lock is run
    # again, as its error says)
    if import_err:
        _finish(_cli("ingest", str(big), db=db), "ingest again")
    if label_err:  # refused: resumed where its run row exists, else run again as typed
        started = count(db, "SELECT count(*) FROM label_runs WHERE id = 'second'")
        _finish(_cli("label", "--resume", "second", db=db) if started else
                _cli("label", "--labeler", "heuristic", "--run", "second", "--dataset",
                     dataset, db=db), "label again")
    assert count(db, "SELECT count(*) FROM trajectories") == n_before + N_IMPORT
    assert count(db, "SELECT count(*) FROM label_runs WHERE id = 'second' "
                     "AND status = 'finished'") == 1
    print(f"second writer: lock held after {held_after:.1f}s; {len(saved)} edits saved, {len(busy)} busy refusals, max wait "
          f"{max(waits):.1f}s (longest lock wait {max(opens):.1f}s), writers still running after the edits: {writers_running}, "
          f"import refused: {bool(import_err)}, label run refused: {bool(label_err)}")
