"""Bulk import speed: trace_lib's Arrow writer vs a row-by-row executemany baseline.

Run:  python bench/ingest.py [--n 100000] [--baseline-n 5000]

What it measures, side by side on the same machine and the same synthetic JSONL file
(N trajectories, ~3.5 messages each, 1-2 tool calls, ~10% tool errors, 4 domains):
  1. `ingest_paths` end to end (read + parse + normalise + hash + write) into a fresh store.
  2. The peer: the same parsed trajectories written row by row with DuckDB's
     `executemany` (one INSERT per row, the usual first implementation), inside one
     transaction. It is run on `--baseline-n` trajectories and extrapolated linearly to N
     (it is too slow to run on 100k; say so in the output). Both sides are timed on the
     write step alone as well, so the ratio is not hidden by shared parsing costs.
  3. Latency of every public query function of trace_lib/explore/queries.py at N
     (unfiltered and with a failure filter), target < 200 ms each.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trace_lib import store  # noqa: E402
from trace_lib.data_model import Trajectory  # noqa: E402
from trace_lib.ingest import ingest_paths  # noqa: E402
from trace_lib.ingest.formats import ParseContext, load  # noqa: E402
from trace_lib.ingest.source import Source  # noqa: E402
from trace_lib.ingest.writer import write_files  # noqa: E402

DOMAINS = ("airline", "retail", "telecom", "shop")
TOOLS = (
    "get_user_details",
    "get_reservation_details",
    "search_flights",
    "cancel_reservation",
    "update_order",
    "refund",
)


def synth_record(i: int, rng: random.Random) -> dict:
    domain = DOMAINS[i % len(DOMAINS)]
    tool = TOOLS[rng.randrange(len(TOOLS))]
    call_id = f"call_{i}"
    failed = rng.random() < 0.1
    messages = [
        {
            "role": "user",
            "content": f"Hi, I need help with order {i}. My user id is user_{i % 997}.",
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {
                        "name": tool,
                        "arguments": json.dumps({"user_id": f"user_{i % 997}", "n": i % 7}),
                    },
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": call_id,
            "content": f"Error: order {i} not found"
            if failed
            else json.dumps({"status": "ok", "id": i}),
        },
    ]
    if i % 2 == 0:
        messages.append({"role": "assistant", "content": f"Your request {i} is done."})
    return {
        "id": f"s{i}",
        "task_id": f"task_{i % 500}",
        "trial": i % 4,
        "agent_model": "synthetic-1",
        "domain": domain,
        "reward": float(rng.random() < 0.6),
        "messages": messages,
    }


def write_dataset(path: Path, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            fh.write(json.dumps(synth_record(i, rng)) + "\n")


def executemany_baseline(db: Path, trajectories: list[Trajectory]) -> float:
    """The peer: one INSERT per row through executemany, same tables, one transaction."""
    t0 = time.perf_counter()
    traj_rows, msg_rows, call_rows = [], [], []
    for t in trajectories:
        sha = t.content_sha256()
        tid = Trajectory.id_from_sha(sha)
        n_err = sum(c.error is not None for m in t.messages for c in m.tool_calls)
        traj_rows.append(
            (
                tid,
                "d_bench",
                t.source_id,
                t.task_id,
                t.trial,
                t.agent_model,
                t.domain,
                t.reward,
                t.success,
                t.termination,
                len(t.messages),
                t.n_tool_calls,
                n_err,
                sha,
                json.dumps(t.meta),
            )
        )
        for idx, m in enumerate(t.messages):
            msg_rows.append((tid, idx, m.role, m.content, m.tool_call_id, m.name, m.turn_idx))
            for ci, c in enumerate(m.tool_calls):
                call_rows.append(
                    (tid, idx, ci, c.call_id, c.name, json.dumps(c.arguments), c.requestor, c.error)
                )
    with store.connect(db) as con, store.transaction(con):
        con.executemany(
            "INSERT INTO trajectories (id, dataset_id, source_id, task_id, trial, agent_model, domain, "
            "reward, success, termination, n_messages, n_tool_calls, n_tool_errors, content_sha256, "
            "meta) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            traj_rows,
        )
        con.executemany("INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?, ?)", msg_rows)
        con.executemany("INSERT INTO tool_calls VALUES (?, ?, ?, ?, ?, ?, ?, ?)", call_rows)
    return time.perf_counter() - t0


def arrow_write(db: Path, parsed) -> float:
    t0 = time.perf_counter()
    with store.connect(db) as con, store.transaction(con):
        write_files(con, [parsed], {parsed.name: parsed.name})
    return time.perf_counter() - t0


def time_queries(db: Path, n: int) -> list[tuple[str, float, float]]:
    try:
        from trace_lib.explore import queries
    except ImportError as exc:
        print(f"explore queries: not available ({exc})")
        return []
    failure = queries.TrajectoryFilter(outcomes=("failure",))
    out = []
    with store.connect(db, read_only=True) as con:
        for name, fn in inspect.getmembers(queries, inspect.isfunction):
            if name.startswith("_") or fn.__module__ != queries.__name__:
                continue
            params = list(inspect.signature(fn).parameters)
            if not params or params[0] != "con":
                continue
            timings = []
            for flt in (None, failure):
                fn(con, flt) if len(params) > 1 else fn(con)  # warm-up
                best = float("inf")
                for _ in range(3):
                    t0 = time.perf_counter()
                    fn(con, flt) if len(params) > 1 else fn(con)
                    best = min(best, time.perf_counter() - t0)
                timings.append(best)
            out.append((name, *timings))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--baseline-n", type=int, default=5_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        data = tmpdir / "synthetic.jsonl"
        write_dataset(data, args.n)
        print(f"dataset: {args.n} trajectories, {data.stat().st_size / 1e6:.1f} MB JSONL")

        db = tmpdir / "arrow.duckdb"
        with store.connect(db):
            pass  # schema creation is not part of the import
        t0, c0 = time.perf_counter(), time.process_time()
        report = ingest_paths([data], db=db)
        t_ingest, cpu_ingest = time.perf_counter() - t0, time.process_time() - c0
        with store.connect(db, read_only=True) as con:
            n_msgs = con.execute("SELECT count(*) FROM messages").fetchone()[0]
        print(
            f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} (wall times grow with load; "
            f"CPU time much less)"
        )
        print(
            f"trace_lib ingest_paths (end to end): {report.trajectories} trajectories, {n_msgs} messages "
            f"in {t_ingest:.2f} s wall, {cpu_ingest:.2f} s CPU ({report.trajectories / t_ingest:,.0f} traj/s), "
            f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB"
        )

        # Write step alone, both sides on the same parsed subset, then extrapolated.
        sub = tmpdir / "subset.jsonl"
        write_dataset(sub, args.baseline_n, seed=1)
        parsed = load(Source.from_path(sub), "auto", ParseContext())
        t_arrow_sub = arrow_write(tmpdir / "arrow_sub.duckdb", parsed)
        t_base_sub = executemany_baseline(tmpdir / "base_sub.duckdb", parsed.trajectories)
        scale = args.n / args.baseline_n
        t_parse_sub = t_ingest * args.baseline_n / args.n - t_arrow_sub  # rough: ingest minus write
        print(
            f"peer executemany row-by-row, write step, {args.baseline_n} trajectories: {t_base_sub:.2f} s "
            f"-> extrapolated to {args.n}: {t_base_sub * scale:.1f} s (too slow to run on all; linear)"
        )
        print(f"trace_lib Arrow writer, write step, same {args.baseline_n}: {t_arrow_sub:.3f} s")
        print(f"ratio write step (executemany / arrow): {t_base_sub / t_arrow_sub:.1f}x")
        base_total = t_base_sub * scale + max(t_parse_sub, 0.0) * scale
        print(
            f"ratio end to end at {args.n} (executemany-based import, extrapolated / ingest_paths): "
            f"{base_total / t_ingest:.1f}x"
        )
        print(
            f"target ingest < 10 s: {'PASS' if t_ingest < 10 else 'MISS'} ({t_ingest:.2f} s wall, "
            f"{cpu_ingest:.2f} s CPU)"
        )

        rows = time_queries(db, args.n)
        if rows:
            print(
                f"explore.queries latency at {args.n} trajectories (best of 3; unfiltered / failures only):"
            )
            for name, a, b in rows:
                flag = "ok" if max(a, b) < 0.2 else "OVER 200 ms"
                print(f"  {name:28s} {a * 1000:7.1f} ms  {b * 1000:7.1f} ms  {flag}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
