"""Re-ranking after one label edit: our DuckDB SQL vs a pandas groupby, side by side.

    python bench/rank.py                  # 10k and 100k trajectories x 14 capabilities x 10 runs
    python bench/rank.py --sizes 10000    # one size
    python bench/rank.py --label 20000    # heuristic labeler throughput, before/after issue 15

What is timed, for both: apply the latest human edits to every run's labels, count
LF/PF/NF/LP/PP/NP per (run, capability), and pool the majority per (trajectory,
capability) for Fisher/Wilson -- i.e. everything `rank` recomputes after an edit.
DuckDB reads the store file (`trace_lib.diagnose.ranking.rank_con`, including Python
post-processing: after the first rank, counts over the raw labels are cached and an edit
patches them); pandas works on DataFrames already in memory with categorical columns
(its best case: no load time counted). Each figure is the median of 5 edit+rank rounds
after one warm-up. Goal: < 1 s at 100k, < 100 ms at 10k. Also printed: the cold first rank
(builds the materialised tables from scratch: a store written before issue 15), "run
finish" (adding one more finished run to the tables, as the labeler does when a run ends),
the first rank after it (issue 15 goal < 1 s at 100k x 10 runs) and the direct SQL over
`effective_run_labels` (the definition, what every rank cost without materialisation).

`--label N`: the heuristic labeler over N trajectories (the demo's, copied under new ids):
trajectories/s end to end (transcripts read, labeled, written, run finished), with the
writes as before issue 15 (a pandas DataFrame per 200-trajectory chunk, each through its
own connection: the peer) and as now (Arrow batches over one held connection; the run's
finish also materialises it). Ratio = now / before.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

from trace_lib import store
from trace_lib.diagnose import materialise
from trace_lib.diagnose.capability_curation import BUILTIN, ensure_builtin
from trace_lib.diagnose.ranking import RankConfig, rank_con

CAPS = [b.name for b in BUILTIN]
RUNS = 10


def build(db: Path, n: int) -> None:
    with store.connect(db) as con:
        ensure_builtin(con)
        con.execute("SELECT setseed(0.42)")
        con.execute("INSERT INTO datasets (id, name, format, content_sha256) VALUES "
                    "('d', 'bench', 'bench', 'x')")
        con.execute(f"""INSERT INTO trajectories (id, dataset_id, success, content_sha256)
                        SELECT 't' || i, 'd', random() < 0.6, 'sha' || i FROM range({n}) r(i)""")
        for r in range(RUNS):
            con.execute("INSERT INTO label_runs (id, labeler) VALUES (?, 'bench')", [f"r{r}"])
        # Lacking more often on failures for the first four capabilities (a real signal).
        con.execute(f"""
            INSERT INTO labels (run_id, trajectory_id, capability, value)
            SELECT 'r' || r.i, t.id, c.name,
                   CASE WHEN random() < CASE WHEN c.k < 4 AND NOT t.success THEN 0.5 ELSE 0.15 END
                        THEN 'lacking' WHEN random() < 0.3 THEN 'na' ELSE 'present' END
            FROM trajectories t, range({RUNS}) r(i),
                 (SELECT unnest(?::VARCHAR[]) AS name, generate_subscripts(?::VARCHAR[], 1) - 1 AS k) c
        """, [CAPS, CAPS])


def time_sql(db: Path, n: int, rounds: int = 5) -> tuple[float, ...]:
    """(cold first rank: full materialisation, adding one more finished run to the tables,
    the first rank after it, median edit+rank, direct SQL)."""
    times = []
    with store.connect(db) as con:
        t0 = time.perf_counter()
        rank_con(con, RankConfig())  # a store from before issue 15: builds the tables
        cold = time.perf_counter() - t0
        # One more label run finishes (written as the labeler writes it: status running,
        # labels, then finished + materialise), then the first rank after it.
        con.execute("INSERT INTO label_runs (id, labeler, status) VALUES ('extra', 'bench', "
                    "'running')")
        con.execute("INSERT INTO labels (run_id, trajectory_id, capability, value) "
                    "SELECT 'extra', trajectory_id, capability, value FROM labels "
                    "WHERE run_id = 'r0'")
        con.execute("UPDATE label_runs SET status = 'finished' WHERE id = 'extra'")
        t0 = time.perf_counter()
        materialise.sync(con)  # what `set_run_status(..., 'finished')` does at the run's end
        finish = time.perf_counter() - t0
        t0 = time.perf_counter()
        rank_con(con, RankConfig())
        after_run = time.perf_counter() - t0
        t0 = time.perf_counter()
        rank_con(con, RankConfig(), incremental=False)
        direct = time.perf_counter() - t0
        for i in range(rounds):
            t0 = time.perf_counter()
            con.execute("INSERT INTO label_edits (trajectory_id, capability, old, new, editor) "
                        "VALUES (?, 'tool_calling_precision', 'lacking', 'present', 'bench')",
                        [f"t{(i * 7919) % n}"])
            rank_con(con, RankConfig())
            times.append(time.perf_counter() - t0)
    return cold, finish, after_run, statistics.median(times), direct


def load_frames(db: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    with duckdb.connect(str(db), read_only=True) as con:
        labels = con.execute("SELECT run_id, trajectory_id, capability, value FROM labels").df()
        traj = con.execute("SELECT id AS trajectory_id, success FROM trajectories").df()
    for c in ("run_id", "trajectory_id", "capability", "value"):
        labels[c] = labels[c].astype("category")
    traj["trajectory_id"] = pd.Categorical(traj["trajectory_id"],
                                           categories=labels["trajectory_id"].cat.categories)
    return labels, traj


def pandas_rank(labels: pd.DataFrame, traj: pd.DataFrame, edits: pd.DataFrame) -> pd.DataFrame:
    latest = edits.drop_duplicates(["trajectory_id", "capability"], keep="last")
    df = labels.merge(latest, on=["trajectory_id", "capability"], how="left", suffixes=("", "_e"))
    value = df["new"].astype(object).where(df["new"].notna(), df["value"].astype(object))
    df = df.assign(value=value).merge(traj, on="trajectory_id")
    per_run = df.groupby(["run_id", "capability", "success", "value"], observed=True).size(
        ).unstack(["success", "value"], fill_value=0)
    votes = df.groupby(["trajectory_id", "capability", "value"], observed=True).size().unstack(
        "value", fill_value=0)
    majority = votes.idxmax(axis=1).rename("maj").reset_index().merge(traj, on="trajectory_id")
    pooled = majority.groupby(["capability", "success", "maj"], observed=True).size()
    return per_run if len(pooled) else per_run


def time_pandas(db: Path, n: int, rounds: int = 5) -> float:
    labels, traj = load_frames(db)
    edits = pd.DataFrame({"trajectory_id": pd.Series([], dtype=labels["trajectory_id"].dtype),
                          "capability": pd.Series([], dtype=labels["capability"].dtype),
                          "new": pd.Series([], dtype=object)})
    pandas_rank(labels, traj, edits)  # warm-up
    times = []
    for i in range(rounds):
        t0 = time.perf_counter()
        row = pd.DataFrame({"trajectory_id": pd.Categorical(
            [f"t{(i * 7919) % n}"], categories=labels["trajectory_id"].cat.categories),
            "capability": pd.Categorical(["tool_calling_precision"],
                                         categories=labels["capability"].cat.categories),
            "new": ["present"]})
        edits = pd.concat([edits, row], ignore_index=True)
        pandas_rank(labels, traj, edits)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ------------------------------------------------------------------ labeler writes

def grow_demo(db: Path, n: int) -> int:
    """A store of about `n` trajectories: the 300 demo ones copied under new ids."""
    from trace_lib.demo import build_demo

    build_demo(db.parent / "demo", n=300, seed=0, db=db)
    with store.connect(db) as con, store.transaction(con):
        base = con.execute("SELECT count(*) FROM trajectories").fetchone()[0]
        for k in range(1, max(1, -(-n // base))):
            con.execute(f"""INSERT INTO trajectories SELECT * REPLACE (id || '-c{k}' AS id,
                            content_sha256 || '-c{k}' AS content_sha256)
                            FROM trajectories WHERE id NOT LIKE '%-c%'""")
            for table in ("messages", "tool_calls"):
                con.execute(f"""INSERT INTO {table} SELECT * REPLACE
                                (trajectory_id || '-c{k}' AS trajectory_id) FROM {table}
                                WHERE trajectory_id NOT LIKE '%-c%'""")
        return con.execute("SELECT count(*) FROM trajectories").fetchone()[0]


def _labeled(db: Path) -> tuple[list, list, list]:
    """(capabilities, transcripts, the heuristic labeler's results), labeled once."""
    from trace_lib.diagnose.capability_curation import capabilities_on
    from trace_lib.diagnose.labelers.heuristic import HeuristicLabeler
    from trace_lib.trajectories import load_transcripts

    lab = HeuristicLabeler()
    with store.connect(db) as con:
        caps = [c for c in capabilities_on(con) if c.status == "accepted"]
        tids = [r[0] for r in con.execute("SELECT id FROM trajectories ORDER BY id").fetchall()]
        transcripts = load_transcripts(con, tids)
    return caps, transcripts, [lab.label(t, caps) for t in transcripts]


def write_before(db: Path, run_id: str, results: list) -> None:
    """The writes as before issue 15 (the peer): a pandas DataFrame per chunk of 200
    trajectories, each chunk through its own connection (nothing was materialised then)."""
    from trace_lib.diagnose.label_runs import create_run

    with store.connect(db) as con:
        create_run(con, run_id, "heuristic", status="running")
    for i in range(0, len(results), 200):
        rows = [[run_id, r.trajectory_id, p.capability, p.value, json.dumps(p.evidence),
                 p.confidence, p.error] for r in results[i:i + 200] for p in r.labels]
        df = pd.DataFrame(rows, columns=["run_id", "trajectory_id", "capability", "value",
                                         "evidence", "confidence", "error"]).astype(
            {"value": "object", "evidence": "object", "confidence": "float64",
             "error": "object"})
        with store.connect(db) as con, store.transaction(con):
            con.register("_new_labels", df)
            con.execute("INSERT INTO labels (run_id, trajectory_id, capability, value, "
                        "evidence, confidence, error) SELECT * FROM _new_labels")
            con.unregister("_new_labels")
    with store.connect(db) as con:
        con.execute("UPDATE label_runs SET status = 'finished', finished_at = current_timestamp "
                    "WHERE id = ?", [run_id])


def write_now(db: Path, run_id: str, results: list) -> None:
    """The writes as `labeling._label_loop` does them for a fast labeler: Arrow batches of
    200 trajectories over one held connection, the run finished and materialised."""
    from trace_lib.diagnose.label_runs import create_run
    from trace_lib.diagnose.labeling import WRITE_CHUNK, _Sink

    with store.connect(db) as con:
        create_run(con, run_id, "heuristic", status="running")
    sink = _Sink(db, hold=True)
    try:
        for i in range(0, len(results), WRITE_CHUNK):
            sink.write(run_id, results[i:i + WRITE_CHUNK])
        sink.status(run_id, "finished")
    finally:
        sink.close()


def bench_label(n: int, rounds: int = 3) -> None:
    from trace_lib.diagnose.labeling import run_labeling

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "label.duckdb"
        n = grow_demo(db, n)
        t0 = time.perf_counter()
        _caps, _ts, results = _labeled(db)
        label_s = time.perf_counter() - t0
        # Alternate before/now and keep each one's best: the shared box's load moves
        # between runs, the order should not decide the ratio. "now" includes adding its
        # run to the materialised tables; the peer's run is added untimed.
        best = {"before": float("inf"), "now": float("inf"), "e2e": float("inf")}
        for i in range(rounds):
            t0 = time.perf_counter()
            write_before(db, f"before{i}", results)
            best["before"] = min(best["before"], time.perf_counter() - t0)
            with store.connect(db) as con:  # untimed: the next "now" run adds only itself
                materialise.sync(con)
            t0 = time.perf_counter()
            write_now(db, f"now{i}", results)
            best["now"] = min(best["now"], time.perf_counter() - t0)
        t0 = time.perf_counter()
        run_labeling(db, "heuristic", run_prefix="e2e")
        best["e2e"] = time.perf_counter() - t0
    print(f"heuristic labeler, {n:,} trajectories x 14 capabilities; writes best of {rounds}:")
    print(f"  labeling alone (read transcripts + rules), no writes: {n / label_s:8.0f} traj/s")
    print(f"  writes before (pandas chunks, a connection each; the peer): "
          f"{n / best['before']:8.0f} traj/s")
    print(f"  writes now (Arrow batches, one held connection, + materialise the run): "
          f"{n / best['now']:8.0f} traj/s   ratio now/before: "
          f"{best['before'] / best['now']:.2f}x")
    print(f"  end to end now (run_labeling): {n / best['e2e']:8.0f} traj/s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--label", type=int, metavar="N",
                    help="time the heuristic labeler over N trajectories instead")
    args = ap.parse_args()
    if args.label:
        bench_label(args.label)
        return
    print(f"{'trajectories':>12} {'label rows':>11} {'edit+rank':>10} {'pandas':>9} "
          f"{'pandas/ours':>11} {'cold rank':>10} {'run finish':>10} {'rank after run':>14} "
          f"{'direct SQL':>11}")
    for n in (int(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            db = Path(tmp) / "bench.duckdb"
            build(db, n)
            cold, finish, after_run, sql_s, direct = time_sql(db, n, args.rounds)
            pd_s = time_pandas(db, n, args.rounds)
        rows = n * len(CAPS) * RUNS
        print(f"{n:>12,} {rows:>11,} {sql_s * 1000:>8.0f}ms {pd_s * 1000:>7.0f}ms "
              f"{pd_s / sql_s:>10.1f}x {cold * 1000:>8.0f}ms {finish * 1000:>8.0f}ms "
              f"{after_run * 1000:>12.0f}ms "
              f"{direct * 1000:>9.0f}ms", flush=True)
    _ = np  # numpy is pandas' engine here; imported so the environment check is explicit


if __name__ == "__main__":
    main()
