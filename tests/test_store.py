"""The store: schema, migrations, lock handling, views."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trace_lib import store


def test_fresh_file_gets_current_schema(db_path: Path) -> None:
    with store.connect(db_path) as con:
        assert store.schema_version(con) == store.SCHEMA_VERSION
        counts = store.table_counts(con)
    for table in ("datasets", "trajectories", "messages", "tool_calls", "labels", "label_edits",
                  "capabilities", "environments", "jobs", "adapters", "moe_models", "routing_traces"):
        assert counts[table] == 0


def test_reopen_does_not_migrate_twice(db_path: Path) -> None:
    with store.connect(db_path):
        pass
    with store.connect(db_path) as con:
        n = con.execute("SELECT count(*) FROM schema_version").fetchone()[0]
    assert n == store.SCHEMA_VERSION


def test_newer_schema_is_refused(db_path: Path) -> None:
    with store.connect(db_path) as con:
        con.execute("INSERT INTO schema_version VALUES (?)", [store.SCHEMA_VERSION + 5])
    with pytest.raises(store.StoreError, match="newer than this trace_lib"):
        with store.connect(db_path):
            pass


def test_env_var_overrides_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRACE_DB", str(tmp_path / "x.duckdb"))
    assert store.default_db_path() == tmp_path / "x.duckdb"


def test_locked_file_fails_with_clear_message(db_path: Path) -> None:
    with store.connect(db_path):
        pass
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import duckdb, sys, time
            con = duckdb.connect({str(db_path)!r})
            print("ready", flush=True)
            time.sleep(30)
        """)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(store.StoreLockedError) as info:
            with store.connect(db_path, timeout_s=0.5):
                pass
        message = str(info.value)
        assert str(db_path) in message and "locked" in message
    finally:
        holder.kill()
        holder.wait()


def test_effective_labels_edit_beats_majority(db_path: Path) -> None:
    with store.connect(db_path) as con:
        for run, value in (("r1", "lacking"), ("r2", "lacking"), ("r3", "present")):
            con.execute("INSERT INTO labels (run_id, trajectory_id, capability, value) "
                        "VALUES (?, 't1', 'cap', ?)", [run, value])
        row = con.execute("SELECT value, origin, n_runs, n_agree FROM effective_labels").fetchone()
        assert row == ("lacking", "majority", 3, 2)
        con.execute("INSERT INTO label_edits (trajectory_id, capability, old, new, editor) "
                    "VALUES ('t1', 'cap', 'lacking', 'present', 'ann')")
        assert con.execute("SELECT value, origin FROM effective_labels").fetchone() == ("present", "edit")
        per_run = con.execute("SELECT DISTINCT value FROM effective_run_labels").fetchall()
        assert per_run == [("present",)]


def test_transaction_rolls_back(db_path: Path) -> None:
    with store.connect(db_path) as con:
        with pytest.raises(RuntimeError):
            with store.transaction(con):
                con.execute("INSERT INTO capabilities (name, description, source, status) "
                            "VALUES ('x', 'd', 'user', 'proposed')")
                raise RuntimeError("boom")
        assert con.execute("SELECT count(*) FROM capabilities").fetchone()[0] == 0


def test_trace_db_memory_limits_every_store_connection(tmp_path, monkeypatch):
    """`TRACE_DB_MEMORY` caps DuckDB per store connection (a 10M store's label finish
    otherwise takes 80% of the machine); a value that is no amount is a clear error."""
    db = tmp_path / "m.duckdb"
    monkeypatch.setenv("TRACE_DB_MEMORY", "300MB")
    with store.connect(db) as con:
        assert con.execute("SELECT current_setting('memory_limit')").fetchone()[0] \
            == "286.1 MiB"
    with store.connect(db, read_only=True) as con:
        assert con.execute("SELECT current_setting('memory_limit')").fetchone()[0] \
            == "286.1 MiB"
    monkeypatch.setenv("TRACE_DB_MEMORY", "lots")
    with pytest.raises(store.StoreError, match=r"TRACE_DB_MEMORY='lots': expected an "
                                               r"amount of memory such as 4GB"):
        with store.connect(db):
            pass
