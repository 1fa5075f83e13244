"""`store compact`, through the real CLI on real DuckDB files: after a delete the file
shrinks, every table keeps its rows (row for row), the label-edit sequence keeps its
position, the search index still answers, and a store held by another process is waited
for, then refused, with nothing replaced."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "e2e"))
from journey_helpers import table_fingerprint  # noqa: E402
from store_faults import cli, ok  # noqa: E402

from trace_lib import store  # noqa: E402
from trace_lib.ingest import ingest_paths  # noqa: E402
from trace_lib.store import backup  # noqa: E402


def synth(i: int) -> dict:
    """A bench-like record (bench/ingest.py's shape), with text the search index finds."""
    call = {"id": f"call_{i}", "type": "function", "function": {
        "name": ("lookup", "refund")[i % 2],
        "arguments": json.dumps({"user_id": f"user_{i % 7}", "n": i % 5})}}
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": f"Where is my order {i}? I want a refund."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"call_{i}",
         "content": f"Error: order {i} not found" if i % 5 == 0 else "{\"status\": \"ok\"}"},
        {"role": "assistant", "content": f"Done {i}."},
    ]
    return {"id": f"s{i}", "task_id": f"task_{i % 4}", "agent_model": "m",
            "domain": ("airline", "retail")[i % 2], "messages": messages,
            "reward": (1.0, 0.0, 0.25)[i % 3]}


def test_compact_gives_back_deleted_space_and_keeps_every_row(store_copy: Path,
                                                              tmp_path: Path) -> None:
    extra = tmp_path / "extra.jsonl"
    extra.write_text("".join(json.dumps(synth(i)) + "\n" for i in range(3000)))
    ingest_paths([extra], db=store_copy)
    with store.connect(store_copy) as con:
        con.execute("SELECT nextval('label_edit_seq')").fetchall()
        seq = con.execute("SELECT last_value FROM duckdb_sequences() "
                          "WHERE sequence_name = 'label_edit_seq'").fetchall()
    ok(cli("datasets", "delete", "extra.jsonl", "--yes", db=store_copy))
    before = table_fingerprint(store_copy)
    size = store_copy.stat().st_size
    hits = json.loads(ok(cli("explore", "list", "--text", "refund", "--json",
                             db=store_copy)).stdout)

    done = json.loads(ok(cli("store", "compact", "--json", db=store_copy)).stdout)
    assert done["bytes_before"] == size and done["bytes_after"] == store_copy.stat().st_size
    assert done["bytes_after"] < 0.7 * size  # the deleted dataset's blocks are gone
    assert table_fingerprint(store_copy) == before  # every table, row for row
    with store.connect(store_copy, read_only=True) as con:
        assert con.execute("SELECT last_value FROM duckdb_sequences() "
                           "WHERE sequence_name = 'label_edit_seq'").fetchall() == seq
    assert json.loads(ok(cli("explore", "list", "--text", "refund", "--json",
                             db=store_copy)).stdout) == hits and hits
    ok(cli("store", "check", db=store_copy))
    assert not [p for p in store_copy.parent.iterdir() if ".compacting-" in p.name]


def test_compact_waits_for_a_writer_then_refuses(store_copy: Path) -> None:
    before = table_fingerprint(store_copy)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time, duckdb
        con = duckdb.connect({str(store_copy)!r})
        print("held", flush=True)
        time.sleep(30)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        try:
            backup.compact(store_copy, timeout_s=1.0)
            raise AssertionError("compact should refuse a store another process holds")
        except store.StoreLockedError as exc:
            assert str(store_copy) in str(exc)
    finally:
        holder.kill()
        holder.wait()
    assert table_fingerprint(store_copy) == before
    assert not [p for p in store_copy.parent.iterdir() if ".compacting-" in p.name]
