"""Honest label runs: a run killed with SIGKILL is left out (and named) by rank, the review
queue and exports, `label --resume` completes it, and a labeler with no server fails fast,
marks the run failed and exits non-zero. Real subprocesses, real DuckDB files, real ports."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from wire_server import Reply, WireServer

from trace_lib import store
from trace_lib.diagnose import label_csv, label_runs
from trace_lib.diagnose import labels as lb
from trace_lib.diagnose.labeling import FAIL_FAST_AFTER, LabelRunFailed, run_labeling
from trace_lib.diagnose.ranking import RankConfig, rank
from trace_lib.store import migrations

REPO = Path(__file__).resolve().parents[2]
COPIES = 24  # 36 demo trajectories x 25 = 900: chunks of 200 are written well before the end


def _grow(db: Path, copies: int = COPIES) -> int:
    """Copy every demo trajectory (messages, tool calls) `copies` times under new ids."""
    with store.connect(db) as con, store.transaction(con):
        for k in range(1, copies + 1):
            con.execute(f"""INSERT INTO trajectories SELECT * REPLACE (id || '-c{k}' AS id,
                            content_sha256 || '-c{k}' AS content_sha256)
                            FROM trajectories WHERE id NOT LIKE '%-c%'""")
            for table in ("messages", "tool_calls"):
                con.execute(f"""INSERT INTO {table} SELECT * REPLACE
                                (trajectory_id || '-c{k}' AS trajectory_id) FROM {table}
                                WHERE trajectory_id NOT LIKE '%-c%'""")
        return con.execute("SELECT count(*) FROM trajectories").fetchone()[0]


def _cli(db: Path, *argv: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "trace_lib", *argv, "--db", str(db)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _kill_after(proc: subprocess.Popen, done: int) -> int:
    """SIGKILL `proc` once its progress bar reports at least `done` trajectories; returns
    the count it had reported. Chunks are written before progress moves past them, so by
    then every completed chunk of 200 is in the file."""
    buf = b""
    while True:
        chunk = os.read(proc.stderr.fileno(), 4096)
        assert chunk, f"label ended before {done} trajectories: {buf[-2000:]!r}"
        buf += chunk
        counts = [int(m) for m in re.findall(rb"\| *(\d+)/\d+ \[", buf)]
        if counts and max(counts) >= done:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return max(counts)


def _export(db: Path, path: Path) -> list[tuple[str, str, str]]:
    label_csv.export_labels(db, path)
    with open(path, newline="", encoding="utf-8") as fh:
        return [tuple(r) for r in list(csv.reader(fh))[1:]]


def test_a_killed_run_is_left_out_and_resume_completes_it(demo_db: Path, tmp_path: Path):
    n = _grow(demo_db)
    run_labeling(demo_db, "heuristic", run_prefix="done")
    ranked_before = {r.capability: r for r in rank(demo_db).rows}
    export_before = _export(demo_db, tmp_path / "before.csv")

    proc = _cli(demo_db, "label", "--labeler", "heuristic", "--run", "killed")
    reported = _kill_after(proc, 401)
    assert proc.returncode == -signal.SIGKILL and reported < n
    with store.connect(demo_db) as con:
        status, = con.execute("SELECT status FROM label_runs WHERE id = 'killed'").fetchone()
        written = con.execute("SELECT count(DISTINCT trajectory_id) FROM labels "
                              "WHERE run_id = 'killed'").fetchone()[0]
    assert status == "running" and 400 <= written < n  # partial, and still says so

    # rank: the partial run is not counted, and is named
    ranking = rank(demo_db)
    assert ranking.n_runs == 1 and [r["run"] for r in ranking.left_out] == ["killed"]
    assert "killed" in ranking.note and "--resume" in ranking.note
    for row in ranking.rows:
        assert row.n_runs_total == 1
        assert row.mean_delta == ranked_before[row.capability].mean_delta
    # an explicit --runs naming it leaves it out too
    assert rank(demo_db, RankConfig(runs=["done", "killed"])).n_runs == 1
    # review queue and export: finished runs only, and they say which were left out
    queue = lb.review_queue(demo_db)
    assert [r["run"] for r in queue.attrs["left_out"]] == ["killed"]
    assert _export(demo_db, tmp_path / "during.csv") == export_before
    note = label_runs.left_out_note(label_runs.left_out_runs(demo_db))
    # its writer is gone: shown as interrupted, with what to do (issue 33)
    assert note is not None and f"killed (interrupted, {written} trajectories labeled" in note
    assert "label --resume" in note

    # resume completes it: every trajectory labeled once, status finished, counted
    proc = _cli(demo_db, "label", "--resume", "killed", "--json")
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err.decode()[-2000:]
    [summary] = json.loads(out)
    assert summary["run_id"] == "killed" and summary["n_trajectories"] == n - written
    with store.connect(demo_db) as con:
        status, = con.execute("SELECT status FROM label_runs WHERE id = 'killed'").fetchone()
        per_traj = con.execute("SELECT count(*), count(DISTINCT trajectory_id) FROM labels "
                               "WHERE run_id = 'killed'").fetchone()
        same = con.execute("""SELECT count(*) FROM labels a JOIN labels b
                              USING (trajectory_id, capability)
                              WHERE a.run_id = 'killed' AND b.run_id = 'done'
                                AND a.value IS NOT DISTINCT FROM b.value""").fetchone()[0]
    assert status == "finished" and per_traj[1] == n
    assert same == per_traj[0]  # the heuristic is deterministic: the same labels as a full run
    ranking = rank(demo_db)
    assert ranking.n_runs == 2 and not ranking.left_out
    assert label_runs.left_out_runs(demo_db) == []
    with pytest.raises(Exception, match="already finished"):
        run_labeling(demo_db, resume="killed")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket closes


def test_no_server_fails_fast_marks_the_run_failed_and_exits_nonzero(demo_db: Path):
    port = _closed_port()
    proc = _cli(demo_db, "label", "--labeler", "openai", "--model", "m", "--run", "dead",
                "--base-url", f"http://127.0.0.1:{port}/v1")
    out, err = proc.communicate(timeout=120)
    text = err.decode()
    assert proc.returncode == 1, text
    assert text.count("connection refused") == 1 and "label run dead failed" in text
    assert "Traceback" not in text
    with store.connect(demo_db) as con:
        status, reason = con.execute("SELECT status, status_reason FROM label_runs "
                                     "WHERE id = 'dead'").fetchone()
        n_labels = con.execute("SELECT count(*) FROM labels WHERE run_id = 'dead'").fetchone()[0]
    assert status == "failed" and f"127.0.0.1:{port}" in reason and n_labels == 0
    ranking = rank(demo_db)
    assert ranking.n_runs == 0 and [r["run"] for r in ranking.left_out] == ["dead"]


def test_a_server_that_goes_away_mid_run_stops_the_run(demo_db: Path):
    """Preflight passes, then the port closes: the first refused call ends the run."""
    with WireServer(lambda p, b, n: Reply(status=500, body={"error": "x"})) as srv:
        url = srv.url
    # The server is gone; preflight sees it too, so bypass preflight with a labeler
    # whose server answered once.
    from trace_lib.diagnose.labelers import get_labeler

    lab = get_labeler("openai", model="m", base_url=url + "/v1", max_retries=0,
                      concurrency=1)
    lab.preflight = lambda: None  # type: ignore[method-assign]
    with pytest.raises(LabelRunFailed, match="connection refused"):
        run_labeling(demo_db, lab, run_prefix="gone")
    with store.connect(demo_db) as con:
        assert con.execute("SELECT status FROM label_runs").fetchone()[0] == "failed"


def test_every_call_failing_stops_after_the_first_few(demo_db: Path):
    with WireServer(lambda p, b, n: Reply(status=500, body={"error": {"message": "down"}})
                    ) as srv:
        with pytest.raises(LabelRunFailed, match=f"first {FAIL_FAST_AFTER} trajectories"):
            run_labeling(demo_db, "openai", model="m", base_url=srv.url + "/v1",
                         max_retries=0, concurrency=2, run_prefix="down")
        calls = len(srv.requests)
    # the runner keeps at most 2 x concurrency calls ahead: 36 trajectories, not all tried
    assert FAIL_FAST_AFTER <= calls <= FAIL_FAST_AFTER + 2 * 2
    with store.connect(demo_db) as con:
        status, reason = con.execute("SELECT status, status_reason FROM label_runs").fetchone()
    assert status == "failed" and "500" in reason


def test_migration_marks_unfinished_old_runs_running(tmp_path: Path):
    path = tmp_path / "old.duckdb"
    con = duckdb.connect(str(path))
    migrations.apply_from(con, migrations.current_version(con),
                          target=migrations.MIGRATIONS.index(migrations.LABEL_RUN_STATUS))
    con.execute("INSERT INTO label_runs (id, labeler, finished_at) VALUES "
                "('complete', 'h', current_timestamp), ('partial', 'h', NULL)")
    con.execute("INSERT INTO labels (run_id, trajectory_id, capability, value) VALUES "
                "('complete', 't', 'c', 'lacking'), ('partial', 't', 'c', 'present')")
    con.close()
    with store.connect(path) as con:
        rows = dict(con.execute("SELECT id, status FROM label_runs").fetchall())
        majority = con.execute("SELECT value, n_runs FROM majority_labels").fetchall()
    assert rows == {"complete": "finished", "partial": "running"}
    assert majority == [("lacking", 1)]
