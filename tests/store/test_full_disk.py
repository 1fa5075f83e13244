"""Full disks (issue 33, "nothing lost under faults"): on a real tmpfs of a few megabytes,
each writer meets a device that refuses the write. Each must end in one clear error that
names what could not be written (never a traceback), leave the store's rows exactly as
they were (a hash per table), leave no half-written file a resume would trust, and finish
once space is back.

The writers: an import, a label run, a label edit (the CLI, as a person runs them, with
the store on the small disk), a training checkpoint and an evaluation shard (the library,
with the run directory on the small disk: a tiny model built from its config, and the
reference-policy HTTP server of tests/evaluate as the policy).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from trace_lib.store.file_memo import MEMO_SUFFIX

sys.path.insert(0, str(Path(__file__).parent))
from store_faults import (  # noqa: E402
    INDEX_SUFFIX,
    changed_tables,
    cli,
    count,
    index_of,
    ok,
    table_hashes,
)

# What the CLI must say: the error line, the device's state, never Python's traceback.
FULL = "no space left on the device"


def _clear_error(proc, names: str) -> None:
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, f"exit {proc.returncode}\n{text[-3000:]}"
    assert "Traceback" not in text, text[-3000:]
    assert "error:" in proc.stderr and FULL in proc.stderr, proc.stderr[-2000:]
    assert names in proc.stderr, (names, proc.stderr[-2000:])


def _store_on(disk, pristine: Path) -> Path:
    """A copy of the pristine store (and its search index) on the small disk."""
    db = disk.root / "trace.duckdb"
    shutil.copyfile(pristine, db)
    shutil.copyfile(index_of(pristine), index_of(db))
    return db


def _disk_for_store(small_disk, pristine: Path):
    # the store and its index, plus 3 MiB the filler takes (DuckDB grows the file in
    # 256 KiB blocks; a WAL and a checkpoint need a few of them)
    size = pristine.stat().st_size + index_of(pristine).stat().st_size
    return small_disk(size // 1024 + 3 * 1024)


def _left_behind(folder: Path) -> list[str]:
    """Files other than the store, its index, its memo and the filler: a temp file or a WAL that
    a failed write left. (SQLite's own -wal/-shm beside the index are its journal, which
    SQLite itself replays or discards on the next open: not a file anyone else trusts.)"""
    keep = {"trace.duckdb", "trace.duckdb" + INDEX_SUFFIX,
            "trace.duckdb" + INDEX_SUFFIX + "-wal", "trace.duckdb" + INDEX_SUFFIX + "-shm",
            "trace.duckdb" + MEMO_SUFFIX}  # a cache, replaced whole (store.file_memo)
    return sorted(p.name for p in folder.iterdir()
                  if p.name not in keep and not p.name.startswith(".filler"))


@pytest.fixture(scope="module")
def new_trajectories(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A demo file none of whose 40 trajectories is in the pristine store (another seed)."""
    folder = tmp_path_factory.mktemp("newdemo")
    ok(cli("demo", "build", "--n", "40", "--seed", "7", "--out", str(folder),
           db=folder / "scratch.duckdb"))
    return next(folder.glob("*.jsonl"))


def test_import_on_a_full_disk(small_disk, pristine_store: Path,
                               new_trajectories: Path) -> None:
    """Full at the start (the search index's WAL cannot open); room for the index, not
    the store (DuckDB's commit fails writing its WAL); room for the store's commit. Either
    the import fails with the store unchanged, or it stands whole (a search index whose
    own commit then found no room is a note, and is rebuilt); never part of it."""
    before = table_hashes(pristine_store)
    n_before = count(pristine_store, "SELECT count(*) FROM trajectories")
    outcomes = {}
    for leave_kb in (0, 256, 1024):
        disk = _disk_for_store(small_disk, pristine_store)
        db = _store_on(disk, pristine_store)
        disk.fill(leave_kb)
        proc = cli("ingest", str(new_trajectories), db=db)
        disk.free()
        n = count(db, "SELECT count(*) FROM trajectories")
        if proc.returncode == 1:
            _clear_error(proc, str(disk.root))
            assert changed_tables(before, table_hashes(db)) == [], leave_kb
            assert _left_behind(disk.root) in ([], ["trace.duckdb.wal"]), _left_behind(disk.root)
            outcomes[leave_kb] = "refused, unchanged"
            disk.grow(disk.size_kb + 32 * 1024)  # space is back: the import goes in whole
            ok(cli("ingest", str(new_trajectories), db=db))
        else:  # room for DuckDB's commit (its checkpoint may wait for the next open)
            ok(proc)
            assert n == n_before + 40, (leave_kb, n)
            said = proc.stdout + proc.stderr
            outcomes[leave_kb] = "whole"
            if "search index" in said:  # the index's own commit found no room
                assert FULL in said, said[-2000:]
                outcomes[leave_kb] = "whole, index behind"
                repaired = cli("store", "check", db=db)
                assert repaired.returncode != 0 and "index" in repaired.stdout + repaired.stderr
                disk.grow(disk.size_kb + 32 * 1024)
                ok(cli("store", "check", "--repair", db=db))
        assert count(db, "SELECT count(*) FROM trajectories") == n_before + 40, leave_kb
        ok(cli("store", "check", db=db))  # rows, counts and the search index agree
    print("import on a full disk:", outcomes)
    assert "refused, unchanged" in outcomes.values(), outcomes


def test_label_run_on_a_full_disk(small_disk, pristine_store: Path) -> None:
    disk = _disk_for_store(small_disk, pristine_store)
    db = _store_on(disk, pristine_store)
    before = table_hashes(db)
    disk.fill()
    proc = cli("label", "--labeler", "heuristic", "--run", "full", db=db)
    # a check on the full device cannot open the index's WAL even to read: it says so
    # (not "stale"), with what to do
    check = cli("store", "check", db=db)
    assert check.returncode == 1 and "Traceback" not in check.stdout + check.stderr
    assert "could not be read (SQLite: disk I/O error)" in check.stdout, check.stdout
    assert "free some space and check again" in check.stdout, check.stdout
    disk.free()
    _clear_error(proc, str(db))
    assert changed_tables(before, table_hashes(db)) == []
    # space is back (a finished run writes its labels and its stored rankings: more than
    # the filler's 3 MiB; a check that then cannot even open the index's WAL reads it as
    # unreadable)
    disk.grow(disk.size_kb + 32 * 1024)
    # no run row was left for a resume to trust: the run starts again whole
    ok(cli("label", "--labeler", "heuristic", "--run", "full", db=db))
    assert count(db, "SELECT count(*) FROM label_runs WHERE id LIKE 'full%' "
                     "AND status = 'finished'") == 1
    assert count(db, "SELECT count(*) FROM labels WHERE run_id LIKE 'full%'") == \
        count(db, "SELECT count(*) FROM labels") // 2
    ok(cli("store", "check", db=db))


def test_label_edit_on_a_full_disk(small_disk, pristine_store: Path) -> None:
    disk = _disk_for_store(small_disk, pristine_store)
    db = _store_on(disk, pristine_store)
    traj = count(db, "SELECT min(id) FROM trajectories")
    before = table_hashes(db)
    disk.fill()
    proc = cli("labels", "edit", traj, "tool_calling_precision", "lacking", db=db)
    disk.free()
    _clear_error(proc, str(db))
    assert changed_tables(before, table_hashes(db)) == []
    ok(cli("labels", "edit", traj, "tool_calling_precision", "lacking", db=db))
    assert count(db, "SELECT count(*) FROM label_edits") == 1


def test_training_checkpoint_on_a_full_disk(small_disk, tmp_path: Path) -> None:
    from trace_lib.errors import DiskFullError
    from trace_lib.runtime.base_models import load_model
    from trace_lib.runtime.lora import attach_lora
    from trace_lib.train.config import LoraSettings
    from trace_lib.train.trainer import latest_checkpoint, write_checkpoint

    base, _ = load_model("tiny")  # built from its config: no download
    model = attach_lora(base, LoraSettings(rank=4, alpha=4, targets=["q_proj", "v_proj"]))
    disk = small_disk(2048)
    run_dir = disk.root / "run"
    first = write_checkpoint(run_dir, 1, model, "tiny", {"step": 1})
    disk.fill(leave_kb=8)  # a checkpoint is ~32 KiB: it starts, and runs out part way
    with pytest.raises(DiskFullError, match=FULL) as err:
        write_checkpoint(run_dir, 2, model, "tiny", {"step": 2})
    assert "step_2" in str(err.value)
    # what a resume reads: the last whole checkpoint, and no half one beside it
    assert latest_checkpoint(run_dir) == first
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_1"]
    disk.free()
    assert latest_checkpoint(run_dir) == first  # unchanged once space is back
    second = write_checkpoint(run_dir, 2, model, "tiny", {"step": 2})
    assert latest_checkpoint(run_dir) == second


def test_evaluation_shard_on_a_full_disk(small_disk) -> None:
    from trace_lib.errors import DiskFullError
    from trace_lib.evaluate import shards
    from trace_lib.evaluate.policy import EvalConfig
    from trace_lib.evaluate.runner import run_evaluation
    from trace_lib.evaluate.tasks import load_task_set

    sys.path.insert(0, str(Path(__file__).parents[1] / "evaluate"))
    from reference_policy import ReferencePolicyServer

    disk = small_disk(512)
    out = disk.root / "eval"
    ts = load_task_set("airline", 4)
    with ReferencePolicyServer(ts) as srv:
        cfg = EvalConfig(server_url=srv.url, served_model=srv.model, tasks=4, concurrency=1,
                         run_id="full", shard_episodes=2)
        folder = shards.shard_dir(out, "full")
        folder.mkdir(parents=True)
        disk.fill()
        with pytest.raises(DiskFullError, match=FULL) as err:
            run_evaluation(cfg, out)
        assert "shard-0000" in str(err.value)
        assert list(folder.iterdir()) == []  # no shard, no temp file: nothing to trust
        disk.free()
        result = run_evaluation(cfg, out)  # space is back: the run finishes
    lines = Path(result["episodes_path"]).read_text().splitlines()
    assert [json.loads(line)["id"].split("/", 1)[0] for line in lines] == ["full"] * 4
    assert sorted(p.name for p in folder.iterdir()) == ["shard-0000.jsonl", "shard-0001.jsonl"]
