"""The run-directory contract: atomic status, append-only streams read while being written."""

from __future__ import annotations

import json
import threading

from trace_lib.jobs import run_dir as rd


def test_status_updates_merge_and_are_atomic(tmp_path):
    assert rd.read_status(tmp_path) == {}
    rd.update_status(tmp_path, state="queued", kind="k")
    assert rd.update_status(tmp_path, state="running", pid=7) == {
        "state": "running", "kind": "k", "pid": 7}
    # Many writers in one process: every read sees a whole document, none is lost.
    errors: list[Exception] = []

    def writer(i: int) -> None:
        try:
            for j in range(30):
                rd.update_status(tmp_path, **{f"w{i}": j})
                json.loads((tmp_path / rd.STATUS).read_text())
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    status = rd.read_status(tmp_path)
    assert all(status[f"w{i}"] == 29 for i in range(4)) and status["pid"] == 7
    assert not list(tmp_path.glob(".*.tmp"))  # no temp file left behind


def test_streams_skip_the_line_being_written(tmp_path):
    assert rd.read_metrics(tmp_path) == [] and rd.steps_done(tmp_path) == 0
    (tmp_path / rd.METRICS).write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "rew')
    assert [r["step"] for r in rd.read_metrics(tmp_path)] == [1, 2]
    assert rd.steps_done(tmp_path) == 2
    (tmp_path / rd.SAMPLES).write_text("".join(json.dumps({"i": i}) + "\n" for i in range(5)))
    assert rd.read_samples(tmp_path) == [{"i": 4}]
    assert [s["i"] for s in rd.read_samples(tmp_path, last=3)] == [2, 3, 4]


def test_log_tail_and_result(tmp_path):
    assert rd.read_log(tmp_path) == "" and rd.read_result(tmp_path) == {}
    (tmp_path / rd.LOG).write_text("\n".join(f"line {i}" for i in range(10)))
    assert rd.read_log(tmp_path, tail=2) == "line 8\nline 9"
    rd.write_result(tmp_path, {"adapter_path": "/x"})
    assert rd.read_result(tmp_path) == {"adapter_path": "/x"}
