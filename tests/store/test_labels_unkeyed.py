"""`labels` without a primary key (schema 14, issue 35): a store written at version 13
migrates with every label row and every view over them as they were; a write that holds
one pair twice is refused whole; a run given a capability or trajectory twice labels
each pair once. (What the key cost, memory and time at 1M trajectories, is measured in
the migration's comment and bench/README, not here.)"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pandas as pd
import pytest

from trace_lib import store
from trace_lib.diagnose.labeling import run_labeling
from trace_lib.errors import UserInputError
from trace_lib.store import labels as store_labels
from trace_lib.store import migrations


def _views(con: duckdb.DuckDBPyConnection) -> dict[str, list[tuple]]:
    return {v: con.execute(f"SELECT * FROM {v} ORDER BY ALL").fetchall()
            for v in ("counted_labels", "majority_labels", "effective_labels",
                      "effective_run_labels")}


def test_a_version_13_store_migrates_with_its_rows_and_views_unchanged(tmp_path: Path
                                                                       ) -> None:
    path = tmp_path / "v13.duckdb"
    con = duckdb.connect(str(path))
    migrations.apply_from(con, migrations.current_version(con),
                          target=migrations.MIGRATIONS.index(migrations.LABELS_UNKEYED))
    con.execute("INSERT INTO label_runs (id, labeler, finished_at, status) VALUES "
                "('r1', 'h', current_timestamp, 'finished'), "
                "('r2', 'h', current_timestamp, 'finished')")
    con.execute("""INSERT INTO labels (run_id, trajectory_id, capability, value, evidence,
                       confidence, error, cut_messages, cut_tokens, evidence_dropped,
                       unsupported) VALUES
                   ('r2', 't2', 'c', 'present', '[{"message": 1}]', 0.9, NULL, 0, 0, 1, false),
                   ('r1', 't1', 'c', 'lacking', '[]', NULL, NULL, NULL, NULL, NULL, NULL),
                   ('r1', 't2', 'c', NULL, NULL, NULL, 'timeout', 3, 120, NULL, true),
                   ('r2', 't1', 'c', 'lacking', '[]', NULL, NULL, NULL, NULL, NULL, NULL)""")
    con.execute("INSERT INTO label_edits (trajectory_id, capability, old, new, editor) "
                "VALUES ('t2', 'c', 'present', 'na', 'me')")
    rows = con.execute("SELECT * FROM labels ORDER BY ALL").fetchall()
    columns = con.execute("SELECT column_name, data_type, is_nullable FROM "
                          "information_schema.columns WHERE table_name = 'labels' "
                          "ORDER BY ordinal_position").fetchall()
    views = _views(con)
    con.close()

    with store.connect(path) as con:
        assert store.schema_version(con) == store.SCHEMA_VERSION
        assert con.execute("SELECT * FROM labels ORDER BY ALL").fetchall() == rows
        assert con.execute("SELECT column_name, data_type, is_nullable FROM "
                           "information_schema.columns WHERE table_name = 'labels' "
                           "ORDER BY ordinal_position").fetchall() == columns
        assert _views(con) == views
        kinds = {r[0] for r in con.execute("SELECT constraint_type FROM duckdb_constraints() "
                                           "WHERE table_name = 'labels'").fetchall()}
        assert kinds == {"NOT NULL"}  # no PRIMARY KEY, no index to hold in memory
        assert con.execute("SELECT count(*) FROM duckdb_indexes() "
                           "WHERE table_name = 'labels'").fetchall() == [(0,)]


def _batch(rows: list[tuple[str, str, str, str]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["run_id", "trajectory_id", "capability", "value"])


def test_a_write_holding_one_pair_twice_is_refused_whole(db_path: Path) -> None:
    with store.connect(db_path) as con:
        con.execute("INSERT INTO label_runs (id, labeler) VALUES ('r', 'h')")
        store_labels.insert_labels(con, _batch([("r", "t0", "c", "na")]))
        with pytest.raises(UserInputError, match=r"run r, trajectory t1, capability c: 2 "
                                                 r"rows\); nothing was written"):
            store_labels.insert_labels(con, _batch([("r", "t1", "c", "lacking"),
                                                    ("r", "t2", "c", "present"),
                                                    ("r", "t1", "c", "present")]))
        assert con.execute("SELECT trajectory_id FROM labels").fetchall() == [("t0",)]
        # the same pair in another run is another row, not a repeat
        store_labels.insert_labels(con, _batch([("r2", "t0", "c", "lacking")]))
        assert con.execute("SELECT count(*) FROM labels").fetchall() == [(2,)]


def test_a_run_given_a_name_twice_labels_each_pair_once(tmp_path: Path) -> None:
    from trace_lib.demo import build_demo

    demo_db = tmp_path / "demo.duckdb"
    build_demo(tmp_path / "files", n=6, seed=0, db=demo_db)
    with store.connect(demo_db, read_only=True) as con:
        tids = [r[0] for r in con.execute("SELECT id FROM trajectories ORDER BY id LIMIT 3"
                                          ).fetchall()]
    caps = ["tool_calling_precision", "precondition_verification"]
    [summary] = run_labeling(demo_db, "heuristic", capabilities=caps + caps[:1],
                             trajectory_ids=tids + tids[:2], run_prefix="twice")
    with store.connect(demo_db, read_only=True) as con:
        counts = con.execute("SELECT count(*), count(DISTINCT (trajectory_id, capability)) "
                             "FROM labels WHERE run_id = ?", [summary.run_id]).fetchall()
    assert counts == [(6, 6)]
