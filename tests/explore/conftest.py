"""Fixtures for the explore tests: a hand-built store whose every answer is known, and the
real tau-bench / tau2 files imported through `trace_lib.ingest`."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from trace_lib import store

# Browser fixtures (`streamlit_server`, `browser`, `browser_page`, `wait_for_app`): the one
# harness in tests/e2e/conftest.py, loaded from its file (test folders are not packages).
_NAME = "_e2e_harness"
if _NAME not in sys.modules:
    _spec = importlib.util.spec_from_file_location(
        _NAME, Path(__file__).resolve().parents[1] / "e2e" / "conftest.py")
    sys.modules[_NAME] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules[_NAME])
streamlit_server = sys.modules[_NAME].streamlit_server
browser = sys.modules[_NAME].browser
browser_page = sys.modules[_NAME].browser_page
wait_for_app = sys.modules[_NAME].wait_for_app


def _traj(tid, task, trial, success, termination, calls, *, domain="airline",
          model="gpt-x", dataset="ds1", user="help me please"):
    """calls: list of (name, args, error)."""
    return {
        "id": tid, "dataset_id": dataset, "task_id": task, "trial": trial, "success": success,
        "termination": termination, "domain": domain, "agent_model": model, "calls": calls,
        "user": user,
    }


KNOWN = [
    # task 1: expected get_user(u1) then book(f1)
    _traj("t_ok1", "1", 0, True, "user_stop",
          [("get_user", {"id": "u1"}, None), ("book", {"flight": "f1", "n": 1}, None)]),
    _traj("t_f1", "1", 1, False, "user_stop",
          [("get_user", {"id": "u1"}, None), ("book", {"n": 2, "flight": "f1"}, None)]),
    _traj("t_f2", "1", 2, False, "too_many_errors",
          [("get_user", {"id": "u9"}, "Error: User u9 not found"),
           ("get_user", {"id": "u1"}, None)]),
    # key order differs from the expected action: still an exact match
    _traj("t_f3", "1", 3, False, "agent_stop",
          [("get_user", {"id": "u1"}, None), ("book", {"n": 1, "flight": "f1"}, None)]),
    _traj("t_f4", "2", 0, False, "user_stop",
          [("search", {"q": "x"}, "Error: Reservation ZFA04Y not found")],
          domain="retail", model="gpt-y", dataset="ds2",
          user="<script>window.__xss=1</script> cancel order"),
    _traj("t_u1", "3", 0, None, None, [], domain="retail", model="gpt-y", dataset="ds2"),
]
EXPECTED = [
    ("ds1", "1", 0, "get_user", {"id": "u1"}),
    ("ds1", "1", 1, "book", {"flight": "f1", "n": 1}),
]


def build_known_store(db: Path) -> Path:
    with store.connect(db) as con, store.transaction(con):
        for ds in ("ds1", "ds2"):
            con.execute(
                "INSERT INTO datasets (id, name, format, source, content_sha256, n_records) "
                "VALUES (?, ?, 'test', 'fixture', ?, 0)", [ds, f"{ds}.json", ds])
        for t in KNOWN:
            msgs = [("system", "policy"), ("user", t["user"])]
            rows_calls = []
            for name, args, err in t["calls"]:
                msgs.append(("assistant", None))
                rows_calls.append((len(msgs) - 1, name, args, err))
                msgs.append(("tool", err or json.dumps({"ok": True})))
            msgs.append(("assistant", "done"))
            n_err = sum(1 for c in t["calls"] if c[2])
            con.execute(
                "INSERT INTO trajectories VALUES (?, ?, NULL, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
                "'{}', NULL)",
                [t["id"], t["dataset_id"], t["task_id"], t["trial"], t["agent_model"],
                 t["domain"], None if t["success"] is None else float(t["success"]),
                 t["success"], t["termination"], len(msgs), len(t["calls"]), n_err,
                 "sha_" + t["id"]])
            for idx, (role, content) in enumerate(msgs):
                con.execute(
                    "INSERT INTO messages (trajectory_id, idx, role, content, turn_idx) "
                    "VALUES (?, ?, ?, ?, ?)",
                    [t["id"], idx, role, content, idx])
            for midx, name, args, err in rows_calls:
                con.execute(
                    "INSERT INTO tool_calls VALUES (?, ?, 0, ?, ?, ?, 'assistant', ?)",
                    [t["id"], midx, f"c{midx}", name, json.dumps(args), err])
        for ds, task, idx, name, args in EXPECTED:
            con.execute("INSERT INTO expected_actions VALUES (?, ?, ?, ?, ?, NULL)",
                        [ds, task, idx, name, json.dumps(args)])
    return db


@pytest.fixture
def known_db(db_path: Path) -> Path:
    return build_known_store(db_path)


# ----------------------------------------------------------------------------- real data

XSS_RECORD = {
    "id": "xss-1", "task_id": "xss", "domain": "airline", "agent_model": "evil-model",
    "reward": 0.0,
    "messages": [
        {"role": "system", "content": "policy"},
        {"role": "user", "content": "<script>window.__xss=1</script> please help"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {
                "name": "get_user_details",
                "arguments": json.dumps({"user_id": "<img src=x onerror=\"window.__xss=2\">"}),
            }}]},
        {"role": "tool", "tool_call_id": "c1", "name": "get_user_details",
         "content": "Error: user <img src=x onerror=\"window.__xss=2\"> not found"},
        {"role": "assistant", "content": "<img src=x onerror=\"window.__xss=2\"> sorry"},
    ],
}


def real_files(shared: Path) -> list[Path]:
    return [shared / "tau-bench" / "historical_trajectories" / "gpt-4o-airline.json",
            *sorted((shared / "tau2-bench" / "results").glob("*/*.json"))]


@pytest.fixture(scope="session")
def real_db(tmp_path_factory, shared_data: Path) -> Path:
    """tau-bench + every tau2 results file, imported once per session by the real importer,
    plus one hostile trajectory (markup in its messages). Tests only read it."""
    from trace_lib.ingest import ingest_bytes, ingest_paths

    db = tmp_path_factory.mktemp("real") / "trace.duckdb"
    ingest_paths([str(p) for p in real_files(shared_data)], db=db)
    ingest_bytes("xss.jsonl", (json.dumps(XSS_RECORD) + "\n").encode(), db=db)
    return db
