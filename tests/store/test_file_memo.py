"""Values kept per state of the store's files (`store.file_memo`): computed once per state,
recomputed after any commit (another connection's, plain SQL's), never kept for an
in-memory store or (when asked) inside an explicit transaction, and read back from the
side file by a new process; a damaged or unwritable side file is only a cache miss."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from trace_lib import store
from trace_lib.explore import overview_stored
from trace_lib.store import explore_stored, file_memo


def _memo(persist: bool = True, committed_only: bool = False) -> file_memo.FileMemo[int]:
    return file_memo.FileMemo("test_count", 4, persist=persist,
                              committed_only=committed_only)


def _count(con, calls: list) -> int:
    calls.append(1)
    return int(con.execute("SELECT count(*) FROM trajectories").fetchall()[0][0])


def test_once_per_file_state_and_again_after_a_commit(store_copy: Path) -> None:
    memo, calls = _memo(), []
    with store.connect(store_copy) as con:
        n = memo.get(con, (), lambda: _count(con, calls))
        assert memo.get(con, (), lambda: _count(con, calls)) == n and len(calls) == 1
        assert memo.get(con, ("other key",), lambda: _count(con, calls)) == n
        assert len(calls) == 2
        with store.connect(store_copy) as second:  # another connection's commit
            second.execute("DELETE FROM trajectories WHERE id = (SELECT min(id) "
                           "FROM trajectories)")
        assert memo.get(con, (), lambda: _count(con, calls)) == n - 1 and len(calls) == 3


def test_inside_a_transaction_it_computes_every_time(store_copy: Path) -> None:
    memo, calls = _memo(committed_only=True), []
    with store.connect(store_copy) as con:
        n = memo.get(con, (), lambda: _count(con, calls))
        con.execute("BEGIN TRANSACTION")
        con.execute("DELETE FROM trajectories WHERE id = (SELECT min(id) FROM trajectories)")
        assert memo.get(con, (), lambda: _count(con, calls)) == n - 1  # its own write
        assert memo.get(con, (), lambda: _count(con, calls)) == n - 1
        con.execute("ROLLBACK")
        assert memo.get(con, (), lambda: _count(con, calls)) == n
        assert len(calls) == 3


def test_an_in_memory_store_keeps_nothing() -> None:
    memo, calls = _memo(), []
    con = duckdb.connect()
    con.execute("CREATE TABLE trajectories (id VARCHAR)")
    for _ in range(2):
        assert memo.get(con, (), lambda: _count(con, calls)) == 0
    assert len(calls) == 2 and not memo._items


def test_a_new_process_reads_the_side_file(store_copy: Path) -> None:
    memo, calls = _memo(), []
    with store.connect(store_copy, read_only=True) as con:
        n = memo.get(con, (), lambda: _count(con, calls))
        state = file_memo.file_state(con)
    side = file_memo.memo_path(store_copy)
    assert json.loads(side.read_text())["test_count"] == [[list(state), n]]
    memo.clear()  # what a new process starts with
    with store.connect(store_copy, read_only=True) as con:
        assert memo.get(con, (), lambda: _count(con, calls)) == n and len(calls) == 1


@pytest.mark.parametrize("damage", ["not json", "[1, 2]", '{"test_count": [[1], "x"]}',
                                    '{"test_count": 5}', '{"test_count": [[5, 1]]}'])
def test_a_damaged_side_file_is_a_miss_and_is_replaced(store_copy: Path, damage: str) -> None:
    side = file_memo.memo_path(store_copy)
    side.write_text(damage)
    memo, calls = _memo(), []
    with store.connect(store_copy, read_only=True) as con:
        n = memo.get(con, (), lambda: _count(con, calls))
    assert len(calls) == 1 and json.loads(side.read_text())["test_count"][0][1] == n


def test_an_unwritable_side_file_fails_nothing(store_copy: Path) -> None:
    side = file_memo.memo_path(store_copy)
    side.mkdir()  # a directory where the file would go: every write fails
    memo, calls = _memo(), []
    with store.connect(store_copy, read_only=True) as con:
        assert memo.get(con, (), lambda: _count(con, calls)) > 0
    assert side.is_dir() and not list(side.iterdir())


def test_the_explore_fingerprint_outlives_the_process(store_copy: Path) -> None:
    """The Trajectories page's first visit after a server start reads the fingerprint
    from the side file instead of hashing every trajectory again."""
    with store.connect(store_copy, read_only=True) as con:
        v = overview_stored.version(con)
        assert v == explore_stored.fingerprint(con)
        state = file_memo.file_state(con)
    side = file_memo.memo_path(store_copy)
    data = json.loads(side.read_text())
    assert data["explore_fingerprint"] == [[list(state), v]]
    data["explore_fingerprint"][0][1] = "only-the-side-file-knows"
    side.write_text(json.dumps(data))
    overview_stored._VERSIONS.clear()
    with store.connect(store_copy, read_only=True) as con:
        assert overview_stored.version(con) == "only-the-side-file-knows"
