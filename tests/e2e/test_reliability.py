"""Reliability under the four things that go wrong in real use, each measured for real.

1. Two browser sessions edit labels on the Labels page at the same time: every edit typed
   once is stored once (no edit is typed again; each save is awaited on the page's own
   save signal; the counts are asserted exactly).
2. An import is killed with SIGKILL at 12 timings across its run: every
   table's rows are unchanged (the file may grow and keep a WAL until the next open).
3. A training job is killed with SIGKILL: it is shown as failed, its checkpoints load.
4. The app is restarted while a job runs: the new app still tracks (and can cancel) it.

Each test appends its figures to `artifacts/reliability.json` (counts, timings), which is
where the `## Reliability` section of bench/README.md takes its numbers from.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from journey_helpers import (  # noqa: E402
    ARTIFACTS,
    GRID_ID_COLUMNS,
    REPO_ROOT,
    edit_grid_cell,
    goto,
    run_cli,
    screenshot,
    shot_dir,
    table_fingerprint,
    wait_until,
)

TOY_ENV = "trace_lib.train.smoke_envs:TargetLetterEnv"
TAU2_RESULTS = "tau2-bench/results"


def _record(name: str, figures: dict) -> None:
    """Merge one test's figures into artifacts/reliability.json (read by the bench notes)."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / "reliability.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[name] = {**figures, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path.write_text(json.dumps(data, indent=2))
    print(f"{name}: {json.dumps(figures)}")


def _edits(db: Path) -> dict[tuple[str, str], str]:
    """The latest edit's value per (trajectory, capability)."""
    from trace_lib import store

    with store.connect(db, read_only=True) as con:
        rows = con.execute("SELECT trajectory_id, capability, new FROM label_edits ORDER BY id"
                           ).fetchall()
    return {(t, c): v for t, c, v in rows}


def _toy_env_store(db: Path) -> None:
    from trace_lib.envs.catalog import save_environment
    from trace_lib.envs.registry import EnvSpec

    save_environment(EnvSpec(name=TOY_ENV, capability="toy_target_letter", domain="toy",
                             version=1, source="file", code="# smoke env, trace_lib.train"),
                     status="approved", db=db)


def _toy_config(steps: int) -> dict:
    return {"env": TOY_ENV, "model": "tiny", "steps": steps, "group": 4, "groups_per_step": 1,
            "max_tokens": 3, "eval_seeds": 0, "checkpoint_every": 1,
            "lora": {"rank": 4, "targets": ["q_proj", "v_proj"]}}


# --------------------------------------------------------- 1. concurrent label edits
# The save's own signal: the Labels page toasts "saved N edit(s): #ID ..." (naming the
# edits) right after the edit is committed (pages/2_Labels.py), then reruns. A toast shows for seconds, so each page records
# every toast the moment it enters the DOM (a MutationObserver installed before the page's
# own scripts run): a slow poll on a loaded machine cannot miss one.
SAVE_RECORDER = """
window.__saves = [];
new MutationObserver(() => {
  for (const t of document.querySelectorAll('[data-testid="stToast"]')) {
    const text = (t.textContent || '').trim();
    if (text && !t.__recorded) { t.__recorded = true; window.__saves.push(text); }
  }
}).observe(document, {subtree: true, childList: true, characterData: true});
"""
SAVED_ONE = "saved 1 edit(s)"


def _saves(page) -> list[str]:
    return page.evaluate("() => window.__saves")


@pytest.mark.e2e
def test_two_sessions_edit_labels_at_once(streamlit_server, browser, wait_for_app,
                                          db_path: Path, tmp_path: Path) -> None:
    """Every edit typed once is stored once: no edit is typed again, each page's save
    signal is awaited (never the database), and the counts are asserted exactly."""
    from trace_lib import store
    from trace_lib.diagnose import capability_curation as capmod
    from trace_lib.diagnose import labels as lb

    run_cli("demo", "build", "--n", "24", "--out", str(tmp_path / "demo"), db=db_path)
    run_cli("label", "--labeler", "heuristic", db=db_path)
    all_caps = [c.name for c in capmod.list_capabilities(db_path) if c.status != "rejected"]
    shown = [c for c in capmod.CORE if c in all_caps] or all_caps
    grid = lb.label_grid(db_path, lb.LabelFilter(capabilities=shown))
    server = streamlit_server(db_path)
    shots = shot_dir("reliability")
    with store.connect(db_path, read_only=True) as con:
        edits_before = con.execute("SELECT count(*) FROM label_edits").fetchall()[0][0]
    assert edits_before == 0

    pages = []
    for _ in range(2):
        ctx = browser.new_context(viewport={"width": 1500, "height": 1000})
        ctx.add_init_script(SAVE_RECORDER)
        page = ctx.new_page()
        page.set_default_timeout(60_000)
        goto(page, server.url + "/Labels", wait_for_app)
        pages.append(page)

    rounds = 4  # each session edits its own column, row by row, both in flight at once
    wanted: dict[tuple[str, str], str] = {}
    latencies: list[float] = []
    signal_s: list[float] = []
    signals = 0
    started = time.monotonic()
    for row in range(rounds):
        t0 = time.monotonic()
        typed = []
        for who, page in enumerate(pages):
            col = GRID_ID_COLUMNS + who
            cap = grid.columns[col]
            tid = grid.iloc[row]["trajectory_id"]
            new = "present" if grid.iloc[row][cap] == "lacking" else "lacking"
            wanted[(tid, cap)] = new
            assert _saves(page) == []  # a fresh page: no save signalled yet
            edit_grid_cell(page, page.get_by_test_id("stDataFrame").first, row=row, col=col,
                           value=new)
            typed.append((page, col, (tid, cap), new, time.monotonic()))
        for page, col, key, new, typed_at in typed:
            try:
                page.wait_for_function(
                    "text => window.__saves.some(s => s.includes(text))", arg=SAVED_ONE,
                    timeout=120_000)
            except Exception:
                screenshot(page, shots, f"labels_unsaved_{row}_{col}")
                raise AssertionError(
                    f"round {row}: the edit {key} -> {new} was typed (the grid showed it) "
                    f"but the page never signalled its save; toasts seen: {_saves(page)}; "
                    f"stored: {_edits(db_path).get(key)!r}") from None
            signal_s.append(time.monotonic() - typed_at)
            # The toast follows the commit: the edit is in the store now, no polling.
            assert _edits(db_path).get(key) == new, (row, key)
        for page, _, key, new, _ in typed:
            wait_for_app(page)
            saved = [s for s in _saves(page) if s.startswith("saved")]
            # one edit, saved once, and the confirmation names it
            assert [s.split(":")[0] for s in saved] == [SAVED_ONE], (row, saved)
            assert f" {key[0]} · {key[1]} → {new}, " in saved[0], (row, saved)
            signals += len(saved)
        latencies.append(time.monotonic() - t0)
        for page in pages:  # each round starts from a settled page, as after a refresh
            goto(page, server.url + "/Labels", wait_for_app)
    for i, page in enumerate(pages):
        screenshot(page, shots, f"labels_session_{i}")
        page.context.close()

    with store.connect(db_path, read_only=True) as con:
        rows = con.execute("SELECT trajectory_id, capability, new FROM label_edits").fetchall()
    got = {(t, c): v for t, c, v in rows}
    effective = lb.label_grid(db_path, lb.LabelFilter(capabilities=shown)).set_index(
        "trajectory_id")
    lost = [k for k, v in wanted.items() if got.get(k) != v or effective.loc[k[0], k[1]] != v]
    _record("concurrent_label_edits", {
        "sessions": 2, "edits_typed": len(wanted), "save_signals": signals,
        "edits_saved": len(rows), "edits_lost": len(lost), "edits_retyped": 0,
        "save_signal_s_max": round(max(signal_s), 2),
        "round_s_max": round(max(latencies), 2),
        "round_s_mean": round(sum(latencies) / len(latencies), 2),
        "total_s": round(time.monotonic() - started, 1)})
    assert len(wanted) == 2 * rounds  # every edit typed once, each on its own pair
    assert signals == len(wanted)  # each one signalled as saved, once
    assert not lost, lost  # each one stored with its value and effective in the grid
    assert len(rows) == len(wanted)  # and nothing stored twice


# -------------------------------------------------------------- 2. import killed
# Kill points: the import's own progress (the percent of bytes read on its tqdm bar, and the
# "committing" step), each on a fresh copy of the same store. Progress, not wall-clock
# fractions of a timed run: a run's speed varies with the machine's load, and a timing past
# the end of a fast run kills nothing. The import streams every file into ONE transaction,
# so these cover the whole write. What holds at every point is the content: each table's
# rows (count and content hash) are unchanged. What does NOT hold is byte-for-byte: DuckDB
# may already have written blocks of the uncommitted transaction into the file (it grows;
# the blocks are unreferenced and reused by later writes) and a small .wal may stay until
# the next read-write open, which replays it (nothing committed) and removes it.
KILL_AT_PERCENT = (0, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90)
KILL_AT_COMMIT = "committing"


def _file_state(db: Path) -> dict:
    wal = db.with_name(db.name + ".wal")
    return {"size": db.stat().st_size, "wal": wal.stat().st_size if wal.exists() else None}


class _ImportWatch:
    """What the import's progress bar last said: the percent read, and whether it commits."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.started = threading.Event()
        self.percent = -1
        self.committing = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        # tqdm redraws with \r, so read raw chunks rather than lines
        while chunk := self.proc.stderr.read1(4096):
            if b"importing" in chunk:
                self.started.set()
            if KILL_AT_COMMIT.encode() in chunk:
                self.committing.set()
            for m in re.finditer(rb"(\d+)%\|", chunk):
                self.percent = max(self.percent, int(m.group(1)))

    def wait_for(self, point: int | str, timeout: float = 240) -> None:
        """Until the bar reaches `point` (a percent, or KILL_AT_COMMIT) or the import ends."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            if point == KILL_AT_COMMIT and self.committing.is_set():
                return
            if point != KILL_AT_COMMIT and self.percent >= point:
                return
            time.sleep(0.005)


def _start_import(db: Path, files: list[str]) -> _ImportWatch:
    """The CLI import in a subprocess, its progress bar watched."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "trace_lib", "ingest", "--db", str(db), *files],
        cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return _ImportWatch(proc)


def test_import_killed_half_way_leaves_store_unchanged(db_path: Path, tmp_path: Path,
                                                        shared_data: Path) -> None:
    import shutil

    from trace_lib import store
    from trace_lib.ingest import ingest_paths

    files = sorted(str(p) for p in (shared_data / TAU2_RESULTS).rglob("*.json"))
    run_cli("demo", "build", "--n", "24", "--out", str(tmp_path / "demo"), db=db_path)
    before = table_fingerprint(db_path)
    base = _file_state(db_path)
    assert base["wal"] is None
    # What a finished import leaves (and how long it runs here, now, for the record).
    timed = tmp_path / "timed.duckdb"
    shutil.copy(db_path, timed)
    watch = _start_import(timed, files)
    assert watch.started.wait(240)
    t0 = time.monotonic()
    assert watch.proc.wait(timeout=600) == 0
    duration = time.monotonic() - t0
    complete = table_fingerprint(timed)
    assert complete != before
    kills = []
    for point in (*KILL_AT_PERCENT, KILL_AT_COMMIT):
        copy = tmp_path / f"kill-{point}.duckdb"
        shutil.copy(db_path, copy)
        watch = _start_import(copy, files)
        assert watch.started.wait(240)
        t_start = time.monotonic()
        watch.wait_for(point)
        alive = watch.proc.poll() is None
        watch.proc.send_signal(signal.SIGKILL)
        watch.proc.wait(timeout=30)
        state = _file_state(copy)
        record = {"at": point, "read_percent": watch.percent,
                  "after_s": round(time.monotonic() - t_start, 2),
                  "was_running": alive, "size_after": state["size"],
                  "wal_after": state["wal"]}
        if alive:  # all or nothing, even under SIGKILL: none of the import, or all of it
            content = table_fingerprint(copy)
            # complete: the row counts of a finished import (its timestamps differ)
            counts = {t: n for t, (n, _) in content.items()}
            record["content"] = ("unchanged" if content == before else "complete"
                                 if counts == {t: n for t, (n, _) in complete.items()}
                                 else "PARTIAL")
            with store.connect(copy):  # the next read-write open replays/removes the WAL
                pass
            reopened = _file_state(copy)
            record["wal_after_reopen"] = reopened["wal"]
            record["same_after_reopen"] = table_fingerprint(copy) == content
        kills.append(record)
        copy.unlink()
        copy.with_name(copy.name + ".wal").unlink(missing_ok=True)
    killed = [k for k in kills if k["was_running"]]
    # A kill after the commit (the process still printing its report) finds it complete.
    uncommitted = [k for k in killed if k["content"] == "unchanged"]
    grew = [k for k in uncommitted if k["size_after"] > base["size"]]
    wal_left = [k for k in uncommitted if k["wal_after"] is not None]
    # The store is still healthy: the same import, unkilled, goes through.
    t0 = time.monotonic()
    report = ingest_paths(files, db=db_path)
    full_s = time.monotonic() - t0
    after = table_fingerprint(db_path)
    _record("import_killed", {
        "files": len(files), "tables": len(before), "import_s": round(duration, 2),
        "n_timings": len(kills), "n_killed_while_running": len(killed),
        "n_content_unchanged": len(uncommitted),
        "n_content_complete": sum(k["content"] == "complete" for k in killed),
        "n_content_partial": sum(k["content"] == "PARTIAL" for k in killed),
        "n_uncommitted_file_grew": len(grew), "n_uncommitted_wal_left": len(wal_left),
        "base_size_mb": round(base["size"] / 2**20, 2),
        "max_uncommitted_size_mb": round(max([k["size_after"] for k in uncommitted]
                                             or [base["size"]]) / 2**20, 2),
        "wal_sizes": sorted({k["wal_after"] for k in wal_left}),
        "n_wal_after_reopen": sum(k["wal_after_reopen"] is not None for k in killed),
        "kills": kills,
        "full_import_trajectories": report.trajectories, "full_import_s": round(full_s, 1)})
    assert len(killed) >= 10, kills
    assert all(k["content"] != "PARTIAL" and k["same_after_reopen"] for k in killed), kills
    assert len(uncommitted) >= 8, kills  # most timings fall inside the transaction
    assert all(k["wal_after_reopen"] is None for k in killed), kills
    assert after["trajectories"][0] == before["trajectories"][0] + report.trajectories > 0


# ------------------------------------------------------------- 3. job SIGKILLed
def test_job_killed_is_failed_with_checkpoints_intact(db_path: Path, tmp_path: Path,
                                                       monkeypatch) -> None:
    from safetensors.torch import load_file
    from streamlit.testing.v1 import AppTest

    from trace_lib import jobs
    from trace_lib.train.trainer import latest_checkpoint
    from trace_lib.workbench import jobs as records

    monkeypatch.setenv(jobs.RUNS_ENV, str(tmp_path / "runs"))
    monkeypatch.setenv("TRACE_DB", str(db_path))
    _toy_env_store(db_path)
    spec = records.submit_training(db_path, _toy_config(steps=400))
    ckpts = spec.path / "checkpoints"
    wait_until(lambda: len(list(ckpts.glob("step_*"))) >= 3, 240, "three checkpoints")
    status = jobs.read_status(spec.path)
    pid, pgid = int(status["pid"]), int(status["pgid"])
    t_kill = time.monotonic()
    os.kill(pid, signal.SIGKILL)  # what the OOM killer does: the job gets no say
    seen_failed = wait_until(lambda: jobs.job_status(spec.id).state == "failed", 30,
                             "the killed job to read as failed")
    detect_s = time.monotonic() - t_kill
    # children of the job (its policy server) must not outlive it for long
    try:
        os.killpg(pgid, signal.SIGKILL)
        leftover = True
    except ProcessLookupError:
        leftover = False

    statuses = {s.id: s for s in records.sync(db_path).statuses}
    assert seen_failed and statuses[spec.id].state == "failed"
    at = AppTest.from_file(str(REPO_ROOT / "pages" / "5_Training.py"), default_timeout=60).run()
    assert not at.exception
    assert at.metric[0].value == "failed"

    steps = sorted(ckpts.glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    loaded = 0
    for ck in steps:
        cfg = json.loads((ck / "adapter_config.json").read_text())
        tensors = load_file(str(ck / "adapter_model.safetensors"))
        assert cfg["r"] == 4 and tensors and all(t.isfinite().all() for t in tensors.values())
        loaded += 1
    assert latest_checkpoint(spec.path) == steps[-1]
    _record("job_sigkill", {
        "checkpoints": len(steps), "checkpoints_loaded": loaded, "shown_as": "failed",
        "failed_detected_s": round(detect_s, 2), "children_left_after_kill": leftover})


# ------------------------------------------------------- 4. app restart during a job
@pytest.mark.e2e
def test_app_restart_keeps_tracking_the_job(streamlit_server, browser_page, wait_for_app,
                                            db_path: Path, tmp_path: Path,
                                            monkeypatch) -> None:
    from playwright.sync_api import expect

    from trace_lib import jobs
    from trace_lib.workbench import jobs as records

    monkeypatch.setenv(jobs.RUNS_ENV, str(tmp_path / "runs"))
    _toy_env_store(db_path)
    page = browser_page
    first = streamlit_server(db_path)
    spec = records.submit_training(db_path, _toy_config(steps=400))
    wait_until(lambda: jobs.read_metrics(spec.path), 240, "the job's first step")
    goto(page, first.url + "/Training", wait_for_app)
    state = page.get_by_test_id("stMetric").filter(has_text="State")
    expect(state).to_contain_text("running")

    t0 = time.monotonic()
    first.stop()  # SIGTERM to streamlit; the job lives in its own session
    steps_at_stop = jobs.job_status(spec.id).steps_done
    second = streamlit_server(db_path)
    restart_s = time.monotonic() - t0
    assert jobs.job_status(spec.id).state == "running"
    goto(page, second.url + "/Training", wait_for_app)
    expect(state).to_contain_text("running")
    step = page.get_by_test_id("stMetric").filter(has_text="Step")
    # the live panel keeps advancing from the run directory after the restart
    wait_until(lambda: jobs.job_status(spec.id).steps_done > steps_at_stop + 1, 120,
               "progress after the restart")
    expect(step).not_to_contain_text(f"{steps_at_stop}/", timeout=30_000)
    screenshot(page, shot_dir("reliability"), "training_after_restart")
    page.get_by_role("button", name="Cancel").click()
    expect(state).to_contain_text("cancelled", timeout=60_000)
    final = jobs.job_status(spec.id)
    _record("app_restart_during_job", {
        "restart_s": round(restart_s, 1), "steps_at_stop": steps_at_stop,
        "steps_when_cancelled": final.steps_done, "state_after_restart": "running",
        "final_state": final.state})
    assert final.state == "cancelled"
    assert {s.id: s.state for s in records.sync(db_path).statuses}[spec.id] == "cancelled"
