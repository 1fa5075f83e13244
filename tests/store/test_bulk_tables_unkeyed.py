"""The bulk tables without keys (schema 15, issue 35): a store written at version 14
migrates with every trajectory, message and tool call as it was, in the order it was
written, and no index left for an import's transaction to hold in memory. (What the keys
cost, 490 MiB of DuckDB memory per 2M trajectories in one transaction, is measured in the
migration's comment and bench/README, not here.)"""

from __future__ import annotations

from pathlib import Path

import duckdb

from trace_lib import store
from trace_lib.store import migrations

TABLES = ("trajectories", "messages", "tool_calls")


def _columns(con: duckdb.DuckDBPyConnection, table: str) -> list[tuple]:
    return con.execute("SELECT column_name, data_type, is_nullable FROM "
                       "information_schema.columns WHERE table_name = ? "
                       "ORDER BY ordinal_position", [table]).fetchall()


def test_a_version_14_store_migrates_with_its_rows_in_order_and_no_keys(
        tmp_path: Path) -> None:
    path = tmp_path / "v14.duckdb"
    con = duckdb.connect(str(path))
    migrations.apply_from(con, migrations.current_version(con),
                          target=migrations.MIGRATIONS.index(migrations.BULK_TABLES_UNKEYED))
    # Written out of key order, so "in the order written" and "sorted" differ.
    con.execute("""INSERT INTO trajectories (id, dataset_id, source_id, reward, success,
                       outcome, n_messages, content_sha256, meta) VALUES
                   ('t_b', 'd1', 's2', 0.0, false, 'failure', 2, 'bb', '{"k": 1}'),
                   ('t_a', 'd1', 's1', 1.0, true, 'success', 1, 'aa', NULL)""")
    con.execute("""INSERT INTO messages (trajectory_id, idx, role, content, meta) VALUES
                   ('t_b', 1, 'assistant', 'x', '{"tokens": 3}'),
                   ('t_b', 0, 'user', 'hi', NULL), ('t_a', 0, 'user', 'yo', NULL)""")
    con.execute("""INSERT INTO tool_calls (trajectory_id, message_idx, call_idx, name,
                       arguments, error) VALUES ('t_b', 1, 0, 'f', '{"a": 1}', 'boom')""")
    rows = {t: con.execute(f"SELECT * FROM {t} ORDER BY rowid").fetchall() for t in TABLES}
    columns = {t: _columns(con, t) for t in TABLES}
    con.close()

    with store.connect(path) as con:
        assert store.schema_version(con) == store.SCHEMA_VERSION
        for t in TABLES:
            assert con.execute(f"SELECT * FROM {t} ORDER BY rowid").fetchall() == rows[t]
            assert _columns(con, t) == columns[t]
            kinds = {r[0] for r in con.execute("SELECT constraint_type FROM "
                                               "duckdb_constraints() WHERE table_name = ?",
                                               [t]).fetchall()}
            assert kinds == {"NOT NULL"}, (t, kinds)
        assert con.execute("SELECT count(*) FROM duckdb_indexes() WHERE table_name IN "
                           "('trajectories', 'messages', 'tool_calls')").fetchone() == (0,)
