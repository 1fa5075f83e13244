"""Bulk import: time, CPU and peak memory of `ingest_paths` at 100k / 300k / 1M trajectories,
beside DuckDB's own `read_json` on the same file and a row-by-row executemany import.

Run:  nice -n 10 python bench/ingest.py [--n 100000,300000,1000000] [--baseline-n 5000]
      [--queries] [--core] [--compact N] [--json bench/results/ingest.json]

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
  6. With `--otel-spans 25000,100000`: `ingest_paths` of a synthetic OTLP JSON file
     (`--format otel`: OpenInference agent traces of 10 spans, 8 running at once, exported
     in requests of up to 512 spans as the SDK's batch processor does): wall, CPU, peak
     RSS per size. Bounded memory shows as a peak that does not grow with the file
     (`--n ''` skips the trajectory sizes).
  7. With `--compact`: the store's size per trajectory beside the source file's, after a
     second file is imported and deleted again (DuckDB keeps the file's size after a
     DELETE) and after `store compact`.
  8. With `--json PATH`: every figure above as one document (cpu_s, read_json_cpu_s,
     ratio_to_read_json, peak_mib per size; the compaction's sizes).
Goals (issue 10): CPU <= 10 s per 100k trajectories; peak memory <= 1.5 GiB at 300k and 1M.
Goals (issue 35): CPU within 3x of read_json's at 100k; peak memory flat in the file size.
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
from trace_lib.ingest.formats import load  # noqa: E402
from trace_lib.ingest.importer import ParseContext  # noqa: E402
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
        con.executemany("INSERT INTO messages (trajectory_id, idx, role, content, tool_call_id, "
                        "name, turn_idx) VALUES (?, ?, ?, ?, ?, ?, ?)", msg_rows)
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


def _attr(key: str, value: object) -> dict:
    kind = "intValue" if isinstance(value, int) else "stringValue"
    return {"key": key, "value": {kind: str(value) if kind == "intValue" else value}}


def _oi_message(prefix: str, k: int, role: str, content: str | None,
                call: tuple[str, str, int] | None) -> list[dict]:
    """One OpenInference message as flattened attributes (`call`: id, tool, order id)."""
    base = f"{prefix}.{k}.message"
    out = [_attr(f"{base}.role", role)]
    if content is not None:
        out.append(_attr(f"{base}.content", content))
    if call is not None and role == "assistant":
        cid, tool, order = call
        tc = f"{base}.tool_calls.0.tool_call"
        out += [_attr(f"{tc}.id", cid), _attr(f"{tc}.function.name", tool),
                _attr(f"{tc}.function.arguments", json.dumps({"order_id": order}))]
    elif call is not None:
        out.append(_attr(f"{base}.tool_call_id", call[0]))
    return out


def write_otel(path: Path, n_spans: int) -> int:
    """A synthetic OTLP file of `n_spans` spans (see the docstring); returns the traces."""
    t0 = 1_700_000_000_000_000_000
    per_trace, concurrent, batch = 10, 8, 512
    n_traces = n_spans // per_trace
    pending: list[tuple[int, dict]] = []  # (end time, span) of the traces running now

    def span(trace: str, sid: str, parent: str | None, name: str, start: int, end: int,
             attrs: list[dict]) -> dict:
        out = {"traceId": trace, "spanId": sid, "name": name, "startTimeUnixNano": str(start),
               "endTimeUnixNano": str(end), "attributes": attrs}
        if parent:
            out["parentSpanId"] = parent
        return out

    with path.open("w") as fh:
        for t in range(n_traces):
            trace, root = f"{t + 1:032x}", f"{t + 1:08x}00000000"
            start = t0 + t * 1_000_000
            spans = [span(trace, root, None, "agent", start, start + 60_000, [
                _attr("openinference.span.kind", "AGENT"), _attr("trace_workbench.reward",
                                                                 t % 2)])]
            history: list[tuple[str, str | None, tuple[str, str, int] | None]] = [
                ("system", "You are a shop agent.", None), ("user", f"Refund order {t}.", None)]
            for step in range(5):
                s0 = start + step * 10_000
                call = (f"call_{t}_{step}", TOOLS[step], t) if step < 4 else None
                attrs = [_attr("openinference.span.kind", "LLM"), _attr("llm.model_name", "m")]
                for k, (role, content, c) in enumerate(history):
                    attrs += _oi_message("llm.input_messages", k, role, content, c)
                attrs += _oi_message("llm.output_messages", 0, "assistant",
                                     None if call else "Refunded.", call)
                spans.append(span(trace, f"{t + 1:08x}{step * 2 + 1:08x}", root,
                                  "ChatCompletion", s0, s0 + 4000, attrs))
                if call is None:
                    continue
                result = f"result {step} of order {t}"
                spans.append(span(trace, f"{t + 1:08x}{step * 2 + 2:08x}", root, TOOLS[step],
                                  s0 + 5000, s0 + 9000, [
                                      _attr("openinference.span.kind", "TOOL"),
                                      _attr("tool.name", TOOLS[step]),
                                      _attr("tool_call.id", call[0]),
                                      _attr("output.value", result)]))
                history += [("assistant", None, call), ("tool", result, call)]
            pending += [(int(s["endTimeUnixNano"]), s) for s in spans]
            if (t + 1) % concurrent == 0 or t == n_traces - 1:
                pending.sort(key=lambda p: p[0])  # exported as they end: children first
                spans = [s for _, s in pending]
                for i in range(0, len(spans), batch):
                    fh.write(json.dumps({"resourceSpans": [{
                        "resource": {"attributes": [_attr("service.name", "bench-agent")]},
                        "scopeSpans": [{"scope": {"name": "bench"},
                                        "spans": spans[i:i + batch]}],
                    }]}) + "\n")
                pending = []
    return n_traces


def compaction(tmpdir: Path, n: int) -> dict[str, float]:
    """Store bytes per trajectory beside the source's: after importing two files of `n`,
    after deleting the second (DuckDB keeps the space), after `store compact`."""
    from trace_lib.store import backup
    from trace_lib.workbench import data as wb_data

    a, b = tmpdir / "compact_a.jsonl", tmpdir / "compact_b.jsonl"
    write_dataset(a, n, seed=2)
    write_dataset(b, n, seed=3)
    db = tmpdir / "compact.duckdb"
    ingest_paths([a], db=db)
    ingest_paths([b], db=db)
    with store.connect(db, read_only=True) as con:
        n_both = con.execute("SELECT count(*) FROM trajectories").fetchone()[0]
    two = db.stat().st_size
    wb_data.delete_dataset(b.name, db=db)
    with store.connect(db, read_only=True) as con:
        n_left = con.execute("SELECT count(*) FROM trajectories").fetchone()[0]
    deleted = db.stat().st_size
    t0 = time.process_time()
    done = backup.compact(db)
    cpu = time.process_time() - t0
    out = {"n_per_file": n, "source_bytes_per_trajectory": a.stat().st_size / n,
           "store_bytes_per_trajectory_two_files": two / n_both,
           "store_bytes_per_trajectory_after_delete": deleted / n_left,
           "store_bytes_per_trajectory_after_compact": done["bytes_after"] / n_left,
           "store_mib_two_files": two / 2**20, "store_mib_after_delete": deleted / 2**20,
           "store_mib_after_compact": done["bytes_after"] / 2**20, "compact_cpu_s": cpu}
    for f in (a, b, db, db.with_name(db.name + ".search.sqlite")):
        f.unlink(missing_ok=True)
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
    if kind == "otel":
        n = ingest_paths([data], db=db, fmt="otel").trajectories
    elif kind in ("ingest", "core"):
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
    ap.add_argument("--compact", type=int, default=0, metavar="N",
                    help="measure store size per trajectory around a delete and `store "
                         "compact`, with two files of N trajectories")
    ap.add_argument("--json", default=None, metavar="PATH", help="write the figures here")
    ap.add_argument("--otel-spans", default="",
                    help="also import OTLP files of these span counts (e.g. 25000,100000)")
    ap.add_argument("--child", nargs=3, metavar=("KIND", "DATA", "DB"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, data, db = args.child
        return child(kind, Path(data), Path(db))
    sizes = [int(x) for x in args.n.split(",") if x.strip()]
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} "
          f"(wall times grow with load; CPU time much less)")
    results: dict = {"measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                     "cores": os.cpu_count(), "load_average_start": os.getloadavg()[0],
                     "cpu": "user + system of the importing child process (DuckDB's "
                            "threads included)", "sizes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        for n_spans in [int(x) for x in args.otel_spans.split(",") if x.strip()]:
            data = tmpdir / f"otel_{n_spans}.json"
            n_traces = write_otel(data, n_spans)
            r = measure("otel", data, tmpdir / f"otel_{n_spans}.duckdb")
            print(f"\n== OTLP {n_spans:,} spans ({n_traces:,} traces), "
                  f"{data.stat().st_size / 1e6:.0f} MB: ingest_paths --format otel "
                  f"{r['wall']:.1f} s wall {r['cpu']:.1f} s CPU  peak RSS {r['peak_mib']:.0f} MiB "
                  f"({r['n']:,} trajectories, {n_spans / max(r['cpu'], 1e-9):,.0f} spans/s CPU)")
            data.unlink()
        if not sizes:
            return 0
        per_100k = None
        for n in sizes:
            data = tmpdir / f"synthetic_{n}.jsonl"
            write_dataset(data, n)
            print(f"\n== {n:,} trajectories, {data.stat().st_size / 1e6:.0f} MB JSONL")
            ours = measure("ingest", data, tmpdir / f"ours_{n}.duckdb")
            ref = measure("read_json", data, tmpdir / f"ref_{n}.duckdb")
            runs = [("trace_lib ingest_paths", ours), ("DuckDB read_json (peer)", ref)]
            row = {"cpu_s": ours["cpu"], "wall_s": ours["wall"], "peak_mib": ours["peak_mib"],
                   "read_json_cpu_s": ref["cpu"], "read_json_wall_s": ref["wall"],
                   "read_json_peak_mib": ref["peak_mib"],
                   "ratio_to_read_json": ours["cpu"] / max(ref["cpu"], 1e-9),
                   "file_mb": data.stat().st_size / 1e6}
            results["sizes"][str(n)] = row
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

        if args.compact:
            results["compaction"] = c = compaction(tmpdir, args.compact)
            print(f"\nstore size per trajectory (two files of {args.compact:,}): source "
                  f"{c['source_bytes_per_trajectory']:.0f} B; store "
                  f"{c['store_bytes_per_trajectory_two_files']:.0f} B, after deleting one "
                  f"file {c['store_bytes_per_trajectory_after_delete']:.0f} B "
                  f"({c['store_mib_after_delete']:.1f} MiB), after compact "
                  f"{c['store_bytes_per_trajectory_after_compact']:.0f} B "
                  f"({c['store_mib_after_compact']:.1f} MiB, {c['compact_cpu_s']:.1f} s CPU)")
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
            print(f"figures written to {args.json}")
        if args.baseline_n <= 0:
            return 0
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
