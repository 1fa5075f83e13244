"""A label run's write at scale: `labels` without a key (schema 14) vs with its old primary
key (schema 13), side by side.

    nice -n 10 python bench/label_write.py [--n 1000000] [--capabilities 14] [--repeats 1]

What it measures, each in a fresh child process on a fresh DuckDB file: N trajectory ids,
then one label run's N x K rows written the way a label run writes them
(`store.labels.insert_labels`, Arrow batches of `--batch` trajectories, a transaction
each, as `diagnose.labeling` commits its chunks of `WRITE_CHUNK`),
then a CHECKPOINT; wall time, CPU time (user + system, DuckDB's threads included), peak
RSS and the file's used size (`pragma_database_size`: used blocks, not the file's length,
which keeps freed blocks). The peer is the same write into the table as schema 13 made
it, `PRIMARY KEY (run_id, trajectory_id, capability)`, with the same memory limit as
the store's connections (none: DuckDB's default, 80% of RAM).

Design decisions
- The rows are the bench's, not a labeler's: the heuristic labeler's own CPU is the same
  on both sides and would only dilute the write's ratio; `bench/pages.py` times a label
  run's finish end to end.
- Why the key went (issue 35): DuckDB writes the key's ART index into the file beside
  the rows, and at 14 rows per trajectory per run it outweighs them; the keys one
  statement adds are held in memory until it commits (a single 14M-row INSERT: 2.3 GiB,
  and it fails under a 1 GiB `memory_limit`), which chunked commits avoid.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

KEYED = "ALTER TABLE labels ADD PRIMARY KEY (run_id, trajectory_id, capability)"


def child(kind: str, db: Path, n: int, k: int, batch: int) -> dict[str, float]:
    import pyarrow as pa

    from trace_lib import store
    from trace_lib.store import labels as store_labels

    with store.connect(db) as con:
        if kind == "keyed":  # schema 13's table: the same columns, with the key
            empty = _empty(con)
            con.execute("CREATE TABLE labels_keyed AS " + empty)
            con.execute("DROP TABLE labels")
            con.execute("ALTER TABLE labels_keyed RENAME TO labels")
            con.execute(KEYED)
        con.execute("INSERT INTO label_runs (id, labeler) VALUES ('r0', 'bench')")
        caps = [f"capability_{j:02d}" for j in range(k)]
        t0, c0 = time.perf_counter(), _cpu()
        for start in range(0, n, batch):
            m = min(batch, n - start)
            tids = [f"t_{i:012d}" for i in range(start, start + m) for _ in caps]
            with store.transaction(con):  # one per chunk, as a label run commits
                store_labels.insert_labels(con, pa.table({
                    "run_id": pa.array(["r0"] * len(tids)),
                    "trajectory_id": pa.array(tids),
                    "capability": pa.array(caps * m),
                    "value": pa.array([("lacking", "present", "na")[i % 3]
                                       for i in range(len(tids))]),
                    "evidence": pa.array(["[]"] * len(tids))}))
        con.execute("CHECKPOINT")
        used = con.execute("SELECT used_blocks * block_size FROM pragma_database_size()"
                           ).fetchall()[0][0]
        return {"wall_s": time.perf_counter() - t0, "cpu_s": _cpu() - c0,
                "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "used_mib": used / 2**20, "rows": n * k}


def _empty(con) -> str:
    cols = [r[0] for r in con.execute("SELECT column_name FROM information_schema.columns "
                                      "WHERE table_name = 'labels' ORDER BY ordinal_position"
                                      ).fetchall()]
    return f"SELECT {', '.join(cols)} FROM labels LIMIT 0"


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def measure(kind: str, n: int, k: int, batch: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="label_write_") as tmp:
        proc = subprocess.run(
            [sys.executable, __file__, "--child", kind, str(Path(tmp) / "s.duckdb"),
             "--n", str(n), "--capabilities", str(k), "--batch", str(batch)],
            capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        if proc.returncode:
            return {"error": proc.stderr.strip().splitlines()[-1][:300]}
        return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="trajectories")
    ap.add_argument("--capabilities", type=int, default=14)
    ap.add_argument("--batch", type=int, default=2_000,
                    help="trajectories per write (a label run: 200; larger here to time "
                         "the table, not 5,000 commits)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--child", nargs=2, metavar=("KIND", "DB"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], Path(args.child[1]), args.n,
                               args.capabilities, args.batch)))
        return 0
    print(f"label write: {args.n:,} trajectories x {args.capabilities} capabilities "
          f"(load {os.getloadavg()[0]:.1f})")
    print("| labels table | wall s | CPU s | peak MiB | file used MiB |")
    print("|---|---|---|---|---|")
    got: dict[str, list[dict[str, float]]] = {"unkeyed": [], "keyed": []}
    for _ in range(args.repeats):
        for kind in ("unkeyed", "keyed"):  # alternated: the same window for both
            r = measure(kind, args.n, args.capabilities, args.batch)
            got[kind].append(r)
            name = "no key (schema 14, ours)" if kind == "unkeyed" else \
                "primary key (schema 13, peer)"
            print(f"| {name} | " + (" | ".join(f"{r[f]:.1f}" for f in
                                               ("wall_s", "cpu_s", "peak_mib", "used_mib"))
                                   if "error" not in r else f"failed: {r['error']}") + " |",
                  flush=True)
    ok = [(a, b) for a, b in zip(got["unkeyed"], got["keyed"], strict=True)
          if "error" not in a and "error" not in b]
    for a, b in ok:
        print(f"ratio ours / peer: wall {a['wall_s'] / b['wall_s']:.2f}x, CPU "
              f"{a['cpu_s'] / b['cpu_s']:.2f}x, peak memory {a['peak_mib'] / b['peak_mib']:.2f}x,"
              f" file {a['used_mib'] / b['used_mib']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
