"""A damaged store through the real CLI: a truncated file, an overwritten one (whole and in
part), a store of a newer schema version and a store without its search index. Each gets
a message that says what happened and what to do, exit 1, never a traceback, and the
file is left byte for byte as it was (the index excepted, which is rebuilt on request)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from trace_lib import store

sys.path.insert(0, str(Path(__file__).parent))
from store_faults import cli, index_of, ok, sha256  # noqa: E402

# Verbs a person runs on a store: a read (datasets list), a search over messages (explore
# list --text, which reads the messages' blocks), and the check itself.
READS = (("datasets", "list"), ("explore", "list", "--text", "refund"), ("store", "check"))


def _no_traceback(proc) -> None:
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]


def _refused(proc, *needles: str) -> str:
    _no_traceback(proc)
    assert proc.returncode == 1, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    text = proc.stdout + proc.stderr
    for needle in needles:
        assert needle in text, (needle, text[-3000:])
    return text


def _zero(db: Path, lo: float, hi: float) -> None:
    size = db.stat().st_size
    with open(db, "r+b") as fh:
        fh.seek(int(size * lo))
        fh.write(b"\0" * int(size * (hi - lo)))


@pytest.mark.parametrize("damage", ["truncated", "overwritten", "emptied"])
def test_a_store_that_does_not_open_is_refused_with_what_to_do(store_copy: Path,
                                                               damage: str) -> None:
    if damage == "truncated":
        os.truncate(store_copy, 5000)  # the header survives, the catalog does not
        meaning = "truncated"
    elif damage == "overwritten":
        store_copy.write_bytes(b"a log line that a wrong redirect wrote here\n" * 200)
        meaning = "not a DuckDB database"
    else:
        os.truncate(store_copy, 0)
        meaning = "not a DuckDB database"
    before = sha256(store_copy)
    for verb in READS + (("ingest", "/nonexistent.jsonl"),):
        proc = cli(*verb, db=store_copy)
        if verb[0] == "ingest":  # the input is checked first: the store is never reached
            _no_traceback(proc)
            assert proc.returncode == 1
            continue
        _refused(proc, str(store_copy), "damaged", meaning, "store restore", "What to do")
    assert sha256(store_copy) == before  # nothing was written to the damaged file


def test_a_store_overwritten_in_part_is_found_by_check_and_by_a_read(store_copy: Path
                                                                     ) -> None:
    # Zeroes over the data blocks: the file opens (header and catalog intact) and fails
    # only where a lost block is read.
    _zero(store_copy, 0.1, 0.9)
    before = sha256(store_copy)
    text = _refused(cli("store", "check", db=store_copy), "FAIL", "cannot be read",
                    "restore your last backup")
    assert "every check passed" not in text
    # A read that touches the lost blocks: the same message the open gives, exit 1.
    _refused(cli("explore", "list", "--text", "refund", db=store_copy), "damaged",
             "checksum", "store restore")
    assert sha256(store_copy) == before


def _make_newer(db: Path) -> int:
    newer = store.SCHEMA_VERSION + 3
    with store.connect(db) as con:
        con.execute("INSERT INTO schema_version VALUES (?)", [newer])
    return newer


def test_a_newer_schema_is_refused_by_name_and_version(store_copy: Path) -> None:
    from importlib import metadata

    newer = _make_newer(store_copy)
    before = sha256(store_copy)
    name = f"trace-workbench {metadata.version('trace-workbench')}"
    for verb in READS + (("label", "--labeler", "heuristic"),):
        _refused(cli(*verb, db=store_copy), str(store_copy), f"schema version {newer}",
                 name, f"schema version {store.SCHEMA_VERSION} at most", "What to do")
    assert sha256(store_copy) == before


def test_a_read_only_open_refuses_a_newer_schema_before_anything_is_read(
        store_copy: Path) -> None:
    newer = _make_newer(store_copy)
    with pytest.raises(store.NewerSchemaError, match=f"schema version {newer}"):
        with store.connect(store_copy, read_only=True):
            pass


def test_a_missing_search_index_is_reported_then_rebuilt(store_copy: Path) -> None:
    index_of(store_copy).unlink()
    text = _refused(cli("store", "check", db=store_copy), "search index", "missing",
                    "store check --repair")
    assert "FAIL  search index" in text
    # Searches still answer meanwhile (the scan), the same trajectories.
    listed = ok(cli("explore", "list", "--text", "refund", "--json", db=store_copy)).stdout
    repaired = ok(cli("store", "check", "--repair", db=store_copy)).stdout
    assert "repaired  search index rebuilt (24 documents)" in repaired
    assert "every check passed" in repaired and index_of(store_copy).exists()
    assert ok(cli("explore", "list", "--text", "refund", "--json", db=store_copy)
              ).stdout == listed


def test_an_unreadable_search_index_is_reported_then_rebuilt(store_copy: Path) -> None:
    for suffix in ("-wal", "-shm"):
        index_of(store_copy).with_name(index_of(store_copy).name + suffix).unlink(
            missing_ok=True)
    index_of(store_copy).write_bytes(b"not sqlite at all" * 100)
    _refused(cli("store", "check", db=store_copy), "FAIL  search index")
    repaired = ok(cli("store", "check", "--repair", db=store_copy)).stdout
    assert "every check passed" in repaired
