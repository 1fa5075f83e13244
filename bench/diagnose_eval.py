"""Does the offline diagnose stage find what is there? Heuristic labeler + ranking, measured.

    python bench/diagnose_eval.py [--n 300] [--data ../shared/data/tau2-bench/results]

1. Demo data (scripted airline agents, `meta.planted_deficits`): precision/recall of the
   kept set against the planted capabilities, and of per-trajectory `lacking` labels.
2. Real tau2-bench results (494 trajectories): what the ranking keeps (reference TRACE
   found structured data reasoning, multi-step task completion, precondition
   verification, tool calling precision), and how labels agree with tau2's own reward
   breakdown (action checks, DB check).
"""

from __future__ import annotations

import argparse
import glob
import tempfile
from pathlib import Path

from trace_lib.demo import build_demo
from trace_lib.diagnose.label_quality import evaluate
from trace_lib.diagnose.labeling import run_labeling
from trace_lib.diagnose.ranking import rank
from trace_lib.ingest import ingest_paths

REPO = Path(__file__).resolve().parent.parent


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def show_rank(db: Path) -> None:
    r = rank(db)
    print(f"  {'capability':32s} kept  mean Cov  mean Delta  Fisher p")
    for row in r.rows:
        if row.mean_delta is None:
            continue
        p = "n/a" if row.fisher_p is None else f"{row.fisher_p:.1e}"
        print(f"  {row.capability:32s} {'yes ' if row.selected else '    '} {_f(row.mean_cov):>8} "
              f"{_f(row.mean_delta):>11}  {p}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--data", default=str(REPO.parent / "shared/data/tau2-bench/results"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "demo.duckdb"
        build_demo(Path(tmp) / "demo", n=args.n, seed=0, db=db)
        run_labeling(db, "heuristic", run_prefix="heuristic")
        p = evaluate(db)["planted"]
        print(f"DEMO ({args.n} trajectories, seed 0)")
        show_rank(db)
        kp = p["kept_vs_planted"]
        print(f"  kept vs planted: precision {_f(kp['precision'])}, recall {_f(kp['recall'])}")
        m = p["per_trajectory_micro"]
        print(f"  per-trajectory lacking labels (micro): precision {_f(m['precision'])}, "
              f"recall {_f(m['recall'])}, F1 {_f(m['f1'])}")
        for cap, v in p["per_trajectory"].items():
            print(f"    {cap:32s} P {_f(v['precision'])}  R {_f(v['recall'])}  "
                  f"(tp {v['tp']}, fp {v['fp']}, fn {v['fn']})")

        db2 = Path(tmp) / "tau2.duckdb"
        files = sorted(glob.glob(f"{args.data}/**/*.json", recursive=True))
        ingest_paths(files, db=db2)
        run_labeling(db2, "heuristic", run_prefix="heuristic")
        r = evaluate(db2)["reward_breakdown"]
        print(f"\nTAU2 ({r['n_trajectories']} trajectories, {len(files)} files)")
        show_rank(db2)
        print("  P(lacking | tau2 check failed) vs P(lacking | check passed):")
        for cap in sorted(r["by_action_checks"]):
            a, d = r["by_action_checks"][cap], r["by_db_check"][cap]
            if a["n_fail"] + a["n_pass"] == 0:
                continue
            print(f"    {cap:32s} action checks {_f(a['rate_fail'])} vs {_f(a['rate_pass'])}"
                  f"   DB check {_f(d['rate_fail'])} vs {_f(d['rate_pass'])}")
        for key, v in r["any_core_lacking_predicts_failure"].items():
            print(f"  any core capability lacking -> {key} failed: precision "
                  f"{_f(v['precision'])}, recall {_f(v['recall'])}, accuracy {_f(v['accuracy'])}")


if __name__ == "__main__":
    main()
