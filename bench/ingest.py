"""Bulk import: time, CPU and peak memory of `ingest_paths` at 100k / 300k / 1M trajectories,
beside DuckDB's own `read_json` on the same file and a row-by-row executemany import.

Run:  nice -n 10 python bench/ingest.py [--n 100000,300000,1000000] [--baseline-n 5000]
      [--queries] [--core]

What it measures, on the same machine and the same synthetic JSONL file per size
(N trajectories, ~3.5 messages each, 1-2 tool calls, ~10% tool errors, 4 domains):
  1. `ingest_paths` end to end (read + parse + validate + hash + write in Arrow batches,
     one transaction) into a fresh store, in a fresh child process: wall time, CPU time
     (user + system of the process) and peak RSS (`ru_maxrss`).
  2. The reference peer: DuckDB's own `read_json(format='newline_delimited')` of the same
     file into a table of the same fresh kind (one statement, DuckDB's C++ JSON reader,
     all cores), in its own child process: wall, CPU, peak RSS. It parses and stores the
     JSON as it is (no validation, no normalisation into messages/tool calls, no
     dedup), so it is the floor for "read this file into DuckDB".
  3. The row-by-row peer: the same parsed trajectories written with DuckDB's
     `executemany` (one INSERT per row) inside one transaction, on `--baseline-n`
     trajectories and extrapolated linearly (too slow to run on 100k; said so).
  4. With `--queries`: latency of every public query of trace_lib/explore/queries.py at
     the first N (target < 200 ms each).
  5. With `--core`: the same import with the store's `derived.on_import` hook
     (derived columns and search documents of the new rows, computed at commit) switched
     off, to show the importer's own share of the time and memory.
Goals (issue 10): CPU <= 10 s per 100k trajectories; peak memory <= 1.5 GiB at 300k and 1M.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trace_lib import store  # noqa: E402
from trace_lib.data_model import Trajectory  # noqa: E402
from trace_lib.ingest import ingest_paths  # noqa: E402
from trace_lib.ingest.formats import ParseContext, load  # noqa: E402
from trace_lib.ingest.rows import TrajectoryRows  # noqa: E402
from trace_lib.ingest.source import Source  # noqa: E402
from trace_lib.ingest.writer import Writer  # noqa: E402

GiB = 1 << 30

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
        writer = Writer(lambda: con, {parsed.name: parsed.name})
        writer.write_file(parsed)
        writer.finish()
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


def _usage() -> dict[str, float]:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return {"cpu": ru.ru_utime + ru.ru_stime, "peak_mib": ru.ru_maxrss / 1024}


def child(kind: str, data: Path, db: Path) -> int:
    """One measured run in this (fresh) process; prints one JSON line."""
    with store.connect(db):
        pass  # schema creation is not part of the import
    base = _usage()
    t0 = time.perf_counter()
    if kind in ("ingest", "core"):
        if kind == "core":
            import contextlib

            from trace_lib.ingest import pipeline

            pipeline.derived.on_import = lambda con, path: contextlib.nullcontext()
        report = ingest_paths([data], db=db)
        n = report.trajectories
    else:
        import duckdb

        con = duckdb.connect(str(db))
        con.execute("SET enable_progress_bar = false")
        con.execute(f"CREATE TABLE raw AS SELECT * FROM read_json('{data}', "
                    "format = 'newline_delimited', maximum_object_size = 67108864)")
        n = con.execute("SELECT count(*) FROM raw").fetchone()[0]
        con.close()
    wall = time.perf_counter() - t0
    end = _usage()
    print(json.dumps({"n": n, "wall": wall, "cpu": end["cpu"] - base["cpu"],
                      "peak_mib": end["peak_mib"]}))
    return 0


def measure(kind: str, data: Path, db: Path) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, "--child", kind, str(data), str(db)],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{kind} child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="100000,300000,1000000",
                    help="comma-separated sizes (default 100000,300000,1000000)")
    ap.add_argument("--baseline-n", type=int, default=5_000)
    ap.add_argument("--queries", action="store_true", help="also time explore queries")
    ap.add_argument("--core", action="store_true",
                    help="also measure the import without the derived-columns hook")
    ap.add_argument("--child", nargs=3, metavar=("KIND", "DATA", "DB"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, data, db = args.child
        return child(kind, Path(data), Path(db))
    sizes = [int(x) for x in args.n.split(",") if x.strip()]
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} "
          f"(wall times grow with load; CPU time much less)")
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        per_100k = None
        for n in sizes:
            data = tmpdir / f"synthetic_{n}.jsonl"
            write_dataset(data, n)
            print(f"\n== {n:,} trajectories, {data.stat().st_size / 1e6:.0f} MB JSONL")
            ours = measure("ingest", data, tmpdir / f"ours_{n}.duckdb")
            ref = measure("read_json", data, tmpdir / f"ref_{n}.duckdb")
            runs = [("trace_lib ingest_paths", ours), ("DuckDB read_json (peer)", ref)]
            if args.core:
                core = measure("core", data, tmpdir / f"core_{n}.duckdb")
                (tmpdir / f"core_{n}.duckdb").unlink(missing_ok=True)
                runs.insert(1, ("  without derived hook", core))
            for name, r in runs:
                print(f"  {name:26s} {r['wall']:7.1f} s wall {r['cpu']:7.1f} s CPU  "
                      f"peak RSS {r['peak_mib']:6.0f} MiB  ({r['n']:,} rows)")
            print(f"  ratio ingest_paths / read_json: {ours['wall'] / ref['wall']:.1f}x wall, "
                  f"{ours['cpu'] / max(ref['cpu'], 1e-9):.1f}x CPU, "
                  f"{ours['peak_mib'] / max(ref['peak_mib'], 1):.1f}x peak memory")
            cpu_100k = ours["cpu"] * 100_000 / n
            per_100k = per_100k or cpu_100k
            print(f"  goals: CPU {cpu_100k:.1f} s per 100k (<= 10: "
                  f"{'PASS' if cpu_100k <= 10 else 'MISS'}); peak "
                  f"{ours['peak_mib'] / 1024:.2f} GiB (<= 1.5 GiB: "
                  f"{'PASS' if ours['peak_mib'] * (1 << 20) <= 1.5 * GiB else 'MISS'})")
            (tmpdir / f"ours_{n}.duckdb").unlink(missing_ok=True)
            (tmpdir / f"ref_{n}.duckdb").unlink(missing_ok=True)
            if n != sizes[0] or not args.queries:
                data.unlink()

        # Write step alone, both sides on the same parsed subset, then extrapolated.
        n0 = sizes[0]
        sub = tmpdir / "subset.jsonl"
        write_dataset(sub, args.baseline_n, seed=1)
        parsed = load(Source.from_path(sub), "auto", ParseContext())
        parsed.sha256 = "0" * 64
        # The executemany peer reads models (the OpenAI importer yields rows): one way back.
        trajectories = [r.to_trajectory() if isinstance(r, TrajectoryRows) else r
                        for r in parsed.records]
        parsed = load(Source.from_path(sub), "auto", ParseContext())
        parsed.sha256 = "0" * 64
        t_arrow_sub = arrow_write(tmpdir / "arrow_sub.duckdb", parsed)
        t_base_sub = executemany_baseline(tmpdir / "base_sub.duckdb", trajectories)
        print(f"\npeer executemany row-by-row, write step, {args.baseline_n} trajectories: "
              f"{t_base_sub:.2f} s -> extrapolated to {n0:,}: {t_base_sub * n0 / args.baseline_n:.1f}"
              f" s (too slow to run on all; linear)")
        print(f"trace_lib parse + Arrow write, same {args.baseline_n}: {t_arrow_sub:.2f} s; "
              f"ratio (executemany write / trace_lib parse+write): {t_base_sub / t_arrow_sub:.1f}x")

        if args.queries:
            db = tmpdir / "q.duckdb"
            ingest_paths([tmpdir / f"synthetic_{n0}.jsonl"], db=db)
            rows = time_queries(db, n0)
            print(f"explore.queries latency at {n0:,} trajectories (best of 3; unfiltered / "
                  f"failures only):")
            for name, a, b in rows:
                flag = "ok" if max(a, b) < 0.2 else "OVER 200 ms"
                print(f"  {name:28s} {a * 1000:7.1f} ms  {b * 1000:7.1f} ms  {flag}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
