"""Close the loop, measured: base vs each adapter vs the composed model on the target tasks.

    nice -n 5 python bench/loop.py --model smollm2-135m --tasks all --tools capability
    python bench/loop.py --model smollm2-135m --adapters A,B --moe DIR --tasks 20

Every policy is evaluated by `workbench.evaluation.evaluate` (the use case behind
`python -m trace_lib evaluate`: the domain's target tasks, the training stage's rollout
code, each task's code verdict) into a scratch store, then compared with the base by
`workbench.evaluation.compare` (Wilson intervals; tasks paired by id, exact McNemar on the
discordant ones). The table it prints is what bench/README.md quotes.

Design decisions
- Adapters and composed models are found, unless given, under the runs directory and
  `data/`: PEFT folders (a run's final adapter, not its `checkpoints/` or `live/` states;
  `bench/learning.py`'s `sft/` and `grpo/` ones too) and composed folders (`moe.json`)
  whose base is `--model`.
- `--budget-min` bounds the wall time: before each policy, the mean time per policy so far
  decides whether the next one fits; a policy left out is listed as such, never silently
  dropped.
- Nothing is timed against a peer here: the figures are pass rates, not speed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _base_of(adapter: Path) -> str:
    try:
        cfg = json.loads((adapter / "adapter_config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return ""
    return str(cfg.get("base_model_name_or_path") or "")


def discover(model: str) -> tuple[list[Path], list[Path]]:
    """(adapter folders, composed folders) whose base is `model`, newest first."""
    from trace_lib import jobs

    roots = [jobs.runs_dir(), REPO / "data"]
    adapters, moes = [], []
    for root in roots:
        if not root.exists():
            continue
        for cfg in root.rglob("adapter_config.json"):
            folder = cfg.parent
            if {"checkpoints", "live"} & set(folder.parts):  # a run's intermediate states
                continue
            if Path(_base_of(folder)).name == Path(model).name:
                adapters.append(folder)
        for meta in root.rglob("moe.json"):
            try:
                base = json.loads(meta.read_text()).get("base_model", "")
            except (OSError, json.JSONDecodeError):
                continue
            if Path(str(base)).name == Path(model).name:
                moes.append(meta.parent)
    key = lambda p: p.stat().st_mtime  # noqa: E731
    return sorted(set(adapters), key=key, reverse=True), sorted(set(moes), key=key, reverse=True)


def _stored_row(db: Path, dataset: str) -> dict:
    """The base row from an evaluation already in the store."""
    import duckdb

    from trace_lib.compare import wilson

    con = duckdb.connect(str(db), read_only=True)
    try:
        ds_id, agent, n, k, wn, wk, wall = con.execute(
            "SELECT d.id, any_value(t.agent_model), count(*), count(*) FILTER (t.success), "
            "count(*) FILTER (CAST(t.meta->>'write_required' AS BOOLEAN)), "
            "count(*) FILTER (t.success AND CAST(t.meta->>'write_required' AS BOOLEAN)), NULL "
            "FROM datasets d JOIN trajectories t ON t.dataset_id = d.id "
            "WHERE d.id = ? OR d.name = ? GROUP BY d.id", [dataset, dataset]).fetchone()
    finally:
        con.close()
    return {"policy": "base", "agent_model": agent, "dataset": ds_id, "n": n, "successes": k,
            "pass_rate": k / n, "ci95": list(wilson(k, n)), "wall_s": float("nan"),
            "write_tasks": {"trajectories": wn, "successes": wk}, "reused": True}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--adapters", default=None, help="comma-separated adapter folders")
    ap.add_argument("--moe", default=None, help="composed model folder")
    ap.add_argument("--no-discover", action="store_true")
    ap.add_argument("--tasks", default="all", help="N or all")
    ap.add_argument("--trials", type=int, default=1)
    ap.add_argument("--tools", default="capability", choices=("all", "capability"))
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--max-turns", type=int, default=6)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-model-len", type=int, default=None, help="local server context")
    ap.add_argument("--budget-min", type=float, default=None, help="stop adding policies "
                    "when the next one would not fit")
    ap.add_argument("--db", default=None, help="store (default: a scratch one)")
    ap.add_argument("--base-dataset", default=None, help="an evaluation of the base already "
                    "in --db (e.g. `evaluate --model M --tasks all`): reuse it, do not rerun")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args(argv)

    from trace_lib.compare import wilson
    from trace_lib.workbench import evaluation

    work = Path(tempfile.mkdtemp(prefix="trace_loop_"))
    os.environ.setdefault("TRACE_RUNS_DIR", str(work / "runs"))
    db = Path(args.db) if args.db else work / "loop.duckdb"
    adapters = [Path(a) for a in args.adapters.split(",")] if args.adapters else []
    moes = [Path(args.moe)] if args.moe else []
    if not args.no_discover and not adapters and not moes:
        adapters, moes = discover(args.model)
    policies: list[tuple[str, dict]] = [("base", {})]
    for a in adapters:
        name = a.parent.name if a.name == "adapter" else f"{a.parent.name}/{a.name}"
        policies.append((f"adapter {name}", {"adapter": str(a)}))
    for m in moes[:1]:
        policies.append((f"composed {m.name}", {"moe": str(m)}))
    tasks = None if args.tasks == "all" else int(args.tasks)
    common = {"model": args.model, "tasks": tasks, "trials": args.trials, "tools": args.tools,
              "max_tokens": args.max_tokens, "max_turns": args.max_turns,
              "concurrency": args.concurrency, "max_model_len": args.max_model_len}
    print(f"policies: {[p for p, _ in policies]}; tasks {args.tasks} x {args.trials} trials, "
          f"tools {args.tools}, max_tokens {args.max_tokens}, max_turns {args.max_turns}",
          file=sys.stderr, flush=True)
    rows, skipped, t0 = [], [], time.perf_counter()
    if args.base_dataset:
        rows.append(_stored_row(db, args.base_dataset))
        policies = policies[1:]
    for label, extra in policies:
        spent = time.perf_counter() - t0
        ran = len(rows) - bool(args.base_dataset)
        if args.budget_min and ran and spent + spent / ran > args.budget_min * 60:
            skipped.append(label)
            continue
        out = evaluation.evaluate(db, {**common, **extra},
                                  on_progress=lambda d, n, _l=label: print(f"\r{_l}: {d}/{n}",
                                                                 end="", file=sys.stderr,
                                                                 flush=True))
        print(file=sys.stderr)
        row = {"policy": label, "agent_model": out["policy"], "dataset": out["dataset_id"],
               "n": out["trajectories"], "successes": out["successes"],
               "pass_rate": out["pass_rate"], "ci95": out["ci95"], "wall_s": out["wall_s"],
               "write_tasks": out["write_tasks"]}
        if rows:
            cmp = evaluation.compare(db, rows[0]["dataset"], out["dataset_id"])
            row["vs_base"] = {k: cmp["paired"][k] for k in ("a_only", "b_only", "p_value")}
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)

    print("| policy | passed | pass rate | 95% CI | tasks with a write: passed (95% CI) "
          "| vs base: base only / this only, McNemar p | wall s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        lo, hi = r["ci95"]
        vs = r.get("vs_base")
        vs_text = f"{vs['a_only']} / {vs['b_only']}, p = {vs['p_value']:.3g}" if vs else "—"
        wt = r["write_tasks"]
        wlo, whi = wilson(wt["successes"], wt["trajectories"])
        w_text = (f"{wt['successes']}/{wt['trajectories']} ({wlo:.1%}–{whi:.1%})"
                  if wt["trajectories"] else "—")
        print(f"| {r['agent_model']} | {r['successes']}/{r['n']} | {r['pass_rate']:.1%} | "
              f"{lo:.1%}–{hi:.1%} | {w_text} | {vs_text} | "
              f"{'earlier run' if r.get('reused') else format(r['wall_s'], '.0f')} |")
    for label in skipped:
        print(f"| {label} | not run: the time budget ({args.budget_min} min) was spent "
              "| | | | | |")
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "skipped": skipped,
                                              "settings": common}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
