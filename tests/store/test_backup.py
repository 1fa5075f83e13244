"""`store backup PATH` / `store restore PATH` and `datasets delete --backup`, through the
real CLI on real DuckDB files: the round trip keeps every table's rows, the search index
and the label-edit sequence; a backup is taken under the store's lock (a writer makes it
wait, then fail clearly); restore verifies the backup first, keeps the store it replaces,
and brings back a damaged store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trace_lib import store

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "e2e"))
from journey_helpers import table_fingerprint  # noqa: E402
from store_faults import cli, index_of, ok, sha256  # noqa: E402


def _search(db: Path, text: str) -> list[str]:
    rows = json.loads(ok(cli("explore", "list", "--text", text, "--json", db=db)).stdout)
    return sorted(r["id"] for r in rows)


def _kept(folder: Path) -> Path:
    """The store file a restore set aside (not its index)."""
    return next(p for p in folder.iterdir()
                if ".before-restore-" in p.name and "search" not in p.name)


def test_backup_then_restore_round_trips_rows_index_and_sequence(store_copy: Path,
                                                                  tmp_path: Path) -> None:
    before = table_fingerprint(store_copy)
    hits = _search(store_copy, "refund")
    with store.connect(store_copy, read_only=True) as con:
        last_edit = con.execute("SELECT coalesce(max(id), 0) FROM label_edits").fetchall()[0][0]
    out = ok(cli("store", "backup", str(tmp_path / "bk"), db=store_copy)).stdout
    assert "with its search index" in out and "store restore" in out
    manifest = json.loads((tmp_path / "bk" / "manifest.json").read_text())
    assert set(manifest["files"]) == {"trace.duckdb", "trace.duckdb.search.sqlite"}
    assert manifest["schema_version"] == store.SCHEMA_VERSION
    assert manifest["tables"] == {t: n for t, (n, _) in before.items()}

    # Work after the backup that a restore undoes: a deleted dataset.
    ok(cli("datasets", "delete", "airline_demo.jsonl", "--yes", db=store_copy))
    assert table_fingerprint(store_copy)["trajectories"][0] == 0
    restored = ok(cli("store", "restore", str(tmp_path / "bk"), db=store_copy)).stdout
    assert "The store it replaced is kept as" in restored
    assert table_fingerprint(store_copy) == before  # every table, row for row
    assert _search(store_copy, "refund") == hits and hits
    assert table_fingerprint(_kept(tmp_path))["trajectories"][0] == 0  # nothing lost
    ok(cli("store", "check", db=store_copy))
    # The edit sequence continues past the backup's last edit (no id is reused).
    from trace_lib.workbench import diagnose as wb

    grid = wb.label_grid(store_copy, wb.LabelFilter())
    cap = [c for c in grid.columns if c in wb.CORE][0]
    new_id = wb.edit_label(store_copy, grid.iloc[0]["trajectory_id"], cap, "na",
                           editor="t", note="after restore")
    assert int(new_id) > last_edit


def test_backup_refuses_to_overwrite_and_restore_refuses_a_changed_backup(
        store_copy: Path, tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    proc = cli("store", "backup", str(target), db=store_copy)
    assert proc.returncode == 1 and "not an empty folder" in proc.stderr
    assert (target / "notes.txt").read_text() == "mine"

    ok(cli("store", "backup", str(tmp_path / "bk"), db=store_copy))
    with open(tmp_path / "bk" / "trace.duckdb", "r+b") as fh:
        fh.seek(100_000)
        fh.write(b"\xff" * 64)
    before = sha256(store_copy)
    proc = cli("store", "restore", str(tmp_path / "bk"), db=store_copy)
    assert proc.returncode == 1 and "does not match the SHA-256" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert sha256(store_copy) == before  # nothing touched
    proc = cli("store", "restore", str(tmp_path / "nothing-here"), db=store_copy)
    assert proc.returncode == 1 and "not a store backup" in proc.stderr


def test_restore_brings_back_a_damaged_store_and_keeps_the_damaged_file(
        store_copy: Path, tmp_path: Path) -> None:
    before = table_fingerprint(store_copy)
    ok(cli("store", "backup", str(tmp_path / "bk"), db=store_copy))
    os.truncate(store_copy, 5000)
    damaged = sha256(store_copy)
    proc = cli("datasets", "list", db=store_copy)
    assert proc.returncode == 1 and "damaged" in proc.stderr
    ok(cli("store", "restore", str(tmp_path / "bk"), db=store_copy))
    assert table_fingerprint(store_copy) == before
    assert sha256(_kept(tmp_path)) == damaged


def test_backup_waits_for_the_stores_lock_then_fails_clearly(store_copy: Path,
                                                              tmp_path: Path) -> None:
    from trace_lib.store import backup
    from trace_lib.workbench import store_admin

    ok(cli("store", "backup", str(tmp_path / "bk"), db=store_copy))
    before = sha256(store_copy)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import duckdb, time
        con = duckdb.connect({str(store_copy)!r})
        print("holding", flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        with pytest.raises(store.StoreLockedError, match="locked"):
            backup.backup(store_copy, tmp_path / "bk2", timeout_s=1.0)
        assert not (tmp_path / "bk2").exists()
        assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]
        with pytest.raises(store.StoreLockedError, match="in use"):
            backup.restore(tmp_path / "bk", store_copy, timeout_s=1.0)
        assert not [p for p in tmp_path.iterdir() if ".restoring-" in p.name]
    finally:
        holder.kill()
        holder.wait()
    assert sha256(store_copy) == before
    assert store_admin.check_store(store_copy).ok


def test_datasets_delete_offers_a_backup_and_takes_it(store_copy: Path,
                                                       tmp_path: Path) -> None:
    refused = cli("datasets", "delete", "airline_demo.jsonl", db=store_copy)
    assert refused.returncode == 1
    assert "--backup PATH" in refused.stderr and "store restore PATH" in refused.stderr
    before = table_fingerprint(store_copy)
    # A wrong name makes no copy.
    wrong = cli("datasets", "delete", "no-such", "--yes", "--backup", str(tmp_path / "x"),
                db=store_copy)
    assert wrong.returncode == 1 and "no dataset named" in wrong.stderr
    assert not (tmp_path / "x").exists()
    done = ok(cli("datasets", "delete", "airline_demo.jsonl", "--yes", "--backup",
                  str(tmp_path / "before-delete"), db=store_copy))
    assert "backed up in" in done.stderr and "store restore" in done.stderr
    assert table_fingerprint(store_copy)["trajectories"][0] == 0
    ok(cli("store", "restore", str(tmp_path / "before-delete"), db=store_copy))
    assert table_fingerprint(store_copy) == before
    assert index_of(store_copy).exists()


def test_restore_onto_a_new_machine_and_a_backup_without_an_index(store_copy: Path,
                                                                   tmp_path: Path) -> None:
    before = table_fingerprint(store_copy)
    index_of(store_copy).unlink()
    out = ok(cli("store", "backup", str(tmp_path / "bk"), db=store_copy)).stdout
    assert "without its search index" in out
    fresh = tmp_path / "elsewhere" / "trace.duckdb"
    done = json.loads(ok(cli("store", "restore", str(tmp_path / "bk"), "--json",
                             db=fresh)).stdout)
    assert done["kept"] is None and not done["search_index"]
    assert table_fingerprint(fresh) == before
    repaired = ok(cli("store", "check", "--repair", db=fresh)).stdout
    assert "search index rebuilt (24 documents)" in repaired
