"""Re-ranking after one label edit: our DuckDB SQL vs a pandas groupby, side by side.

    python bench/rank.py                  # 10k and 100k trajectories x 14 capabilities x 10 runs
    python bench/rank.py --sizes 10000    # one size

What is timed, for both: apply the latest human edits to every run's labels, count
LF/PF/NF/LP/PP/NP per (run, capability), and pool the majority per (trajectory,
capability) for Fisher/Wilson -- i.e. everything `rank` recomputes after an edit.
DuckDB reads the store file (`trace_lib.diagnose.ranking.rank_con`, including Python
post-processing: after the first rank, counts over the raw labels are cached and an edit
patches them); pandas works on DataFrames already in memory with categorical columns
(its best case: no load time counted). Each figure is the median of 5 edit+rank rounds
after one warm-up. Goal: < 1 s at 100k, < 100 ms at 10k. Also printed: the cold first rank
(fills the cache) and the direct SQL over `effective_run_labels` without any cache.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

from trace_lib import store
from trace_lib.diagnose.capabilities import BUILTIN, ensure_builtin
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


def time_sql(db: Path, n: int, rounds: int = 5) -> tuple[float, float, float]:
    """(cold first rank that fills the cache, median edit+rank, direct SQL without cache)."""
    times = []
    with store.connect(db) as con:
        t0 = time.perf_counter()
        rank_con(con, RankConfig())  # first rank after labeling: fills the count cache
        cold = time.perf_counter() - t0
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
    return cold, statistics.median(times), direct


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    print(f"{'trajectories':>12} {'label rows':>11} {'edit+rank':>10} {'pandas':>9} "
          f"{'pandas/ours':>11} {'cold rank':>10} {'direct SQL':>11}")
    for n in (int(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            db = Path(tmp) / "bench.duckdb"
            build(db, n)
            cold, sql_s, direct = time_sql(db, n, args.rounds)
            pd_s = time_pandas(db, n, args.rounds)
        rows = n * len(CAPS) * RUNS
        print(f"{n:>12,} {rows:>11,} {sql_s * 1000:>8.0f}ms {pd_s * 1000:>7.0f}ms "
              f"{pd_s / sql_s:>10.1f}x {cold * 1000:>8.0f}ms {direct * 1000:>9.0f}ms", flush=True)
    _ = np  # numpy is pandas' engine here; imported so the environment check is explicit


if __name__ == "__main__":
    main()
