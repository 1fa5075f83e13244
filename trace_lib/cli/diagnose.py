"""CLI verbs of the diagnose stage: capabilities, label, labels, rank (over
`trace_lib.workbench.diagnose`).

    python -m trace_lib capabilities list --json | add NAME --description TEXT
                                     | accept NAME | reject NAME | edit NAME ...
                                     | propose --provider anthropic|openai
    python -m trace_lib label --labeler heuristic|anthropic|openai [--runs N]
                              [--capabilities a,b] [--max-context TOKENS] [--tokenizer PATH]
                              [--fence-key KEY]
                              [--background [--backend local|ray] [--wait]] | --record JOB
    python -m trace_lib labels export FILE.csv | import FILE.csv --run NAME
                              | edit TRAJ CAP VALUE | undo ... | history | queue | runs
                              | evaluate
    python -m trace_lib rank --json [--rho R --delta D --k K --runs a,b] [--export FILE]
                             [--stability runs|auto|bootstrap --bootstrap B --seed S]
    python -m trace_lib agreement --json [--runs a,b]
    python -m trace_lib review-queue --json [--order disagreement|sensitivity] [--limit N]
                             [--stability auto|runs|bootstrap ...] [--rho --delta --k --runs]

Scope (label, labels export|queue, rank): `--dataset NAME` (repeatable), `--agent-model M`
and `--domain D` (repeatable) restrict the verb to those trajectories, e.g.
`rank --dataset my-results --json` ranks over that dataset's trajectories only.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from typing import Any

from trace_lib.cli.output import csv_list, print_json

_csv = csv_list


def _editor(args: argparse.Namespace) -> str:
    if args.editor:
        return args.editor
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "cli"


def _cap_json(c: Any) -> dict[str, Any]:
    return c.model_dump()


def _scope(args: argparse.Namespace) -> Any:
    from trace_lib.workbench.diagnose import Scope

    return Scope(datasets=getattr(args, "dataset", None) or (),
                 agent_models=getattr(args, "agent_model", None) or (),
                 domains=getattr(args, "domain", None) or ())


def _add_scope(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("scope (default: every trajectory)")
    g.add_argument("--dataset", action="append", metavar="NAME",
                   help="a dataset name (or id); repeat for several")
    g.add_argument("--agent-model", action="append", metavar="MODEL",
                   help="an agent model; repeat for several")
    g.add_argument("--domain", action="append", metavar="DOMAIN",
                   help="a domain; repeat for several")


# ------------------------------------------------------------------- capabilities

def _capabilities(args: argparse.Namespace) -> int:
    from trace_lib.workbench import diagnose as wb

    if args.action == "list":
        rows = wb.list_capabilities(args.db, status=args.status)
        if args.json:
            print_json([_cap_json(c) for c in rows])
        else:
            for c in rows:
                print(f"{c.name:34s} {c.status:9s} {c.source:8s} {c.description[:70]}")
        return 0
    if args.action == "propose":
        added = wb.propose_capabilities(args.db, args.provider, model=args.model,
                                        base_url=args.base_url, max_pairs=args.pairs)
        if args.json:
            print_json([_cap_json(c) for c in added])
        else:
            print(f"{len(added)} capabilities proposed: {', '.join(c.name for c in added)}")
        return 0
    if not args.name:
        raise SystemExit(f"capabilities {args.action}: NAME is required")
    if args.action == "add":
        if not args.description:
            from trace_lib.errors import UserInputError
            raise UserInputError("capabilities add: --description TEXT is required")
        c = wb.add_capability(args.db, args.name, args.description,
                                applies_when=args.applies_when, status=args.status or "accepted")
    elif args.action == "edit":
        c = wb.update_capability(args.db, args.name, description=args.description,
                                   applies_when=args.applies_when)
    else:
        status = {"accept": "accepted", "reject": "rejected", "propose-status": "proposed"}
        c = wb.set_status(args.db, args.name, status[args.action])
    if args.json:
        print_json(_cap_json(c))
    else:
        print(f"{c.name}: {c.status}")
    return 0


# -------------------------------------------------------------------------- label

def _label(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from trace_lib.workbench import diagnose as wb

    if args.background or args.record:
        return _label_background(args)
    labeler = args.labeler or (None if args.resume else "heuristic")
    what = f"resume {args.resume}" if args.resume else labeler
    bar = tqdm(total=None, desc=f"label ({what})", unit="traj", file=sys.stderr)

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    try:
        summaries = wb.label(args.db, labeler, runs=args.runs, resume=args.resume,
                             capabilities=_csv(args.capabilities), run_prefix=args.run,
                             progress=progress, model=args.model, base_url=args.base_url,
                             concurrency=args.concurrency, temperature=args.temperature,
                             batch=args.batch, scope=_scope(args),
                             max_context=args.max_context, tokenizer=args.tokenizer,
                             fence_key=args.fence_key)
    finally:
        bar.close()
    out = [s.__dict__ for s in summaries]
    if args.json:
        print_json(out)
    else:
        for s in summaries:
            print(f"run {s.run_id}: {s.n_trajectories} trajectories, {s.n_labels} labels, "
                  f"{s.n_failed} failed pairs, {s.n_cut} trajectories cut to fit, "
                  f"{s.n_unsupported} unsupported labels")
            for note in s.notes:
                print(f"  note: {note}")
            if s.unsupported_rate:
                print("  unsupported (of lacking/present), per capability: " + ", ".join(
                    f"{c} {r:.0%}" for c, r in s.unsupported_rate.items()))
    return 0


def _label_background(args: argparse.Namespace) -> int:
    """`label --background` submits one `label` job per run; `--wait` waits and records
    them; `label --record JOB` records an ended job's labels into the store (once)."""
    from trace_lib.errors import UserInputError
    from trace_lib.workbench import jobs

    if args.resume:
        raise UserInputError("label --resume runs in-process; rerun a label job with "
                             "`job run RUN_DIR/spec.json` (it labels only missing shards)")
    if args.record:
        out: Any = jobs.record_label_job(args.db, args.record)
    else:
        options = {"address": args.ray_address} if args.ray_address else {}
        specs = jobs.submit_labeling(
            args.db, args.labeler or "heuristic", runs=args.runs,
            capabilities=_csv(args.capabilities), run_prefix=args.run, model=args.model,
            base_url=args.base_url, concurrency=args.concurrency,
            temperature=args.temperature, scope=_scope(args), backend=args.backend,
            backend_options=options, shard_size=args.shard_size,
            max_context=args.max_context, tokenizer=args.tokenizer,
            fence_key=args.fence_key)
        out = [{"job_id": s.id, "run_id": s.config["run_id"], "run_dir": s.run_dir,
                "backend": s.backend} for s in specs]
        if args.wait:
            recorded = jobs.wait_label_jobs(args.db, [o["job_id"] for o in out])
            for o, outcome in zip(out, recorded, strict=True):
                o.update(outcome)
    if args.json:
        print_json(out)
    else:
        for o in out if isinstance(out, list) else [out]:
            print("  ".join(f"{k}={v}" for k, v in o.items()))
    failed = [o for o in (out if isinstance(out, list) else [out])
              if o.get("outcome") == "failed"]
    return 1 if failed else 0


# ------------------------------------------------------------------------- labels

def _labels(args: argparse.Namespace) -> int:
    from trace_lib.workbench import diagnose as lb

    a = args.action
    if a in ("export", "queue"):  # finished runs only: say which runs were left out
        note = lb.left_out_note(lb.left_out_runs(args.db))
        if note:
            print(f"note: {note}", file=sys.stderr)
    if a == "export":
        n = lb.export_labels(args.db, args.file, scope=_scope(args))
        print_json({"file": args.file, "rows": n}) if args.json else print(f"{n} labels -> {args.file}")
    elif a == "import":
        if not args.run:
            from trace_lib.errors import UserInputError
            raise UserInputError("labels import: --run NAME is required")
        n = lb.import_labels(args.db, args.file, args.run)
        print_json({"run": args.run, "rows": n}) if args.json else print(f"{n} labels imported as run {args.run}")
    elif a == "edit":
        tid, cap, value = args.rest
        eid = lb.edit_label(args.db, tid, cap, value, editor=_editor(args), note=args.note)
        print_json({"edit_id": eid}) if args.json else print(f"edit {eid}")
    elif a == "undo":
        eid = lb.undo_edit(args.db, editor=_editor(args), edit_id=args.edit_id,
                           trajectory_id=args.rest[0] if args.rest else None,
                           capability=args.rest[1] if len(args.rest) > 1 else None)
        print_json({"undo_id": eid}) if args.json else print(f"undo {eid}")
    elif a in ("history", "queue", "runs"):
        df = {"history": lambda: lb.edit_history(args.db, limit=args.limit),
              "queue": lambda: lb.review_queue(args.db, limit=args.limit,
                                               scope=_scope(args)),
              "runs": lambda: lb.label_runs(args.db)}[a]()
        if args.json:
            print_json(df.to_dict(orient="records"))
        else:
            print(df.to_string(index=False) if not df.empty else "(none)")
    elif a == "evaluate":
        report = lb.evaluate_labels(args.db, runs=_csv(args.runs))
        if args.json:
            print_json(report)
        else:
            for k, v in report.items():
                print(f"{k}: {v}")
    return 0


# --------------------------------------------------------------------------- rank

def _rank(args: argparse.Namespace) -> int:
    from trace_lib.workbench import diagnose as wb

    cfg = wb.RankConfig(rho=args.rho, delta=args.delta, k=args.k, runs=_csv(args.runs))
    view = wb.rankings(args.db, cfg, details=False, stability=_stability(args),
                       scope=_scope(args))
    if args.export:
        wb.write_selected(args.export, view.document)
        if not args.json:
            print(f"{len(view.document)} selected capabilities -> {args.export}",
                  file=sys.stderr)
    ranking = view.ranking
    if args.json:
        print_json(wb.ranking_json(ranking))
        return 0
    if ranking.note:
        print(f"note: {ranking.note}")

    def f(x: float | None) -> str:
        return "  n/a" if x is None else f"{x:5.2f}"

    print(f"{'capability':34s} kept  cov   delta  passed  fisher_p")
    for r in ranking.rows:
        p = wb.format_p(r.fisher_p) or "n/a"
        print(f"{r.capability:34s} {'yes ' if r.selected else '    '} {f(r.mean_cov)} "
              f"{f(r.mean_delta)}  {r.n_runs_passed}/{r.n_runs_total}    {p}")
    return 0


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add this stage's verbs to the CLI."""
    p = sub.add_parser("capabilities", parents=[common],
                       help="list, add, accept, reject or propose capabilities")
    p.add_argument("action", choices=["list", "add", "edit", "accept", "reject", "propose"])
    p.add_argument("name", nargs="?")
    p.add_argument("--description")
    p.add_argument("--applies-when")
    p.add_argument("--status", choices=["proposed", "accepted", "rejected"])
    p.add_argument("--provider", default="anthropic", help="propose: anthropic or openai")
    p.add_argument("--model")
    p.add_argument("--base-url")
    p.add_argument("--pairs", type=int, default=8, help="propose: contrastive pairs to show")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_capabilities)

    p = sub.add_parser("label", parents=[common], help="label trajectories x capabilities")
    p.add_argument("--labeler", choices=["heuristic", "anthropic", "openai"],
                   help="default: heuristic (with --resume: the run's own labeler)")
    p.add_argument("--resume", metavar="RUN",
                   help="complete a partial (running or failed) run instead of starting one")
    p.add_argument("--runs", type=int, default=1, help="independent runs (reference: 10)")
    p.add_argument("--capabilities", help="comma-separated (default: accepted ones)")
    p.add_argument("--run", help="run name (default: LABELER-xxxxxx; -rI appended per run)")
    p.add_argument("--model", help="LLM model (else TRACE_ANTHROPIC_MODEL / TRACE_OPENAI_MODEL)")
    p.add_argument("--base-url", help="OpenAI-compatible base URL (else TRACE_OPENAI_BASE_URL)")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--temperature", type=float)
    p.add_argument("--batch", action="store_true", help="anthropic: use Message Batches")
    p.add_argument("--max-context", type=int, metavar="TOKENS",
                   help="LLM labelers: the model's context in tokens, when the server's "
                        "/v1/models does not report it (transcripts are cut to fit)")
    p.add_argument("--tokenizer", metavar="PATH_OR_ID",
                   help="LLM labelers: a local tokenizer to count prompt tokens with "
                        "(default: the served model's, where it is on this machine; "
                        "else characters / 4)")
    p.add_argument("--fence-key", metavar="KEY",
                   help="LLM labelers: the key the transcript's fence tag is derived with "
                        "(default: drawn per run and kept in its params); the same key, "
                        "seed and capabilities send byte-identical prompts, to reproduce a "
                        "run")
    p.add_argument("--background", action="store_true",
                   help="run as a `label` job (see `job status`); --wait records it")
    p.add_argument("--backend", default="local", choices=("local", "ray"),
                   help="--background: where the job runs (ray: one task per shard)")
    p.add_argument("--ray-address", default=None, help="Ray dashboard URL (else RAY_ADDRESS)")
    p.add_argument("--shard-size", type=int, default=None,
                   help="--background: trajectories per shard (default 500)")
    p.add_argument("--wait", action="store_true",
                   help="--background: wait for the jobs and record their labels")
    p.add_argument("--record", metavar="JOB",
                   help="record an ended label job's labels into the store (once)")
    p.add_argument("--json", action="store_true")
    _add_scope(p)
    p.set_defaults(func=_label)

    p = sub.add_parser("labels", parents=[common],
                       help="export/import CSV, edit/undo, history, review queue, evaluate")
    p.add_argument("action", choices=["export", "import", "edit", "undo", "history", "queue",
                                      "runs", "evaluate"])
    p.add_argument("file", nargs="?", help="export/import: the CSV file")
    p.add_argument("rest", nargs="*", help="edit: TRAJ CAP VALUE; undo: TRAJ CAP")
    p.add_argument("--run", help="import: the label run name to create")
    p.add_argument("--runs", help="evaluate: comma-separated label runs")
    p.add_argument("--editor")
    p.add_argument("--note")
    p.add_argument("--edit-id", type=int)
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--json", action="store_true")
    _add_scope(p)
    p.set_defaults(func=_labels_dispatch)

    p = sub.add_parser("rank", parents=[common], help="rank capabilities; select K of N")
    p.add_argument("--rho", type=float, default=0.10)
    p.add_argument("--delta", type=float, default=0.20)
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--runs", help="comma-separated label run ids (default: all)")
    p.add_argument("--export", help="write selected_capabilities.json here")
    _stability_args(p, "runs")
    p.add_argument("--json", action="store_true")
    _add_scope(p)
    p.set_defaults(func=_rank)
    register_agreement(sub, common)


def _stability(args: argparse.Namespace) -> Any:
    if args.stability == "runs" and args.bootstrap is None and args.seed is None:
        return None  # the plain run ranking, as before `--stability` existed
    return _stability_config(args)


def _stability_config(args: argparse.Namespace) -> Any:
    from trace_lib.workbench import diagnose as wb

    return wb.StabilityConfig(method=args.stability,
                              b=200 if args.bootstrap is None else args.bootstrap,
                              seed=0 if args.seed is None else args.seed)


def _agreement(args: argparse.Namespace) -> int:
    from trace_lib.workbench import diagnose as wb

    report = wb.agreement(args.db, _csv(args.runs), scope=_scope(args))
    if args.json:
        print_json(report.to_json())
        return 0

    def f(x: float | None) -> str:
        return "  n/a" if x is None else f"{x:5.2f}"

    print(f"Fleiss' kappa across {len(report.runs)} label run(s), per capability:")
    for r in report.fleiss:
        print(f"  {r.capability:34s} {f(r.kappa)}  ({r.n_trajectories} trajectories)"
              + (f"  {r.why}" if r.why else ""))
    print(f"Cohen's kappa ({report.n_human_decisions} human decisions):")
    for c in report.cohen:
        print(f"  {c.rater_a} vs {c.rater_b}: {f(c.kappa)}  (n={c.n})"
              + (f"  {c.why}" if c.why else ""))
    return 0


def _review_queue(args: argparse.Namespace) -> int:
    from trace_lib.workbench import diagnose as wb

    cfg = wb.RankConfig(rho=args.rho, delta=args.delta, k=args.k, runs=_csv(args.runs))
    df = wb.review_queue_ranked(args.db, cfg, _stability_config(args), limit=args.limit,
                                order=args.order, scope=_scope(args))
    if args.json:
        print_json({"stability": df.attrs["stability"], "k_effective": df.attrs["k_effective"],
                    "queue": df.to_dict(orient="records")})
    else:
        print(f"note: {df.attrs['stability']['sentence']}", file=sys.stderr)
        print(df.to_string(index=False) if not df.empty else "(nothing to review)")
    return 0


def _stability_args(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument("--stability", choices=["auto", "runs", "bootstrap"], default=default,
                   help="K-of-N over label runs, over bootstrap resamples of trajectories, "
                        "or auto: resamples when the runs cannot differ (one run, or all "
                        f"identical) (default: {default})")
    p.add_argument("--bootstrap", type=int, metavar="B", help="resamples (default 200)")
    p.add_argument("--seed", type=int, help="bootstrap seed (default 0)")


def register_agreement(sub: argparse._SubParsersAction, common: argparse.ArgumentParser
                       ) -> None:
    """The `agreement` and `review-queue` verbs (called by `register`)."""
    p = sub.add_parser("agreement", parents=[common],
                       help="Fleiss' kappa across runs, Cohen's kappa vs people's edits")
    p.add_argument("--runs", help="comma-separated label run ids (default: all finished)")
    p.add_argument("--json", action="store_true")
    _add_scope(p)
    p.set_defaults(func=_agreement)

    p = sub.add_parser("review-queue", parents=[common],
                       help="pairs to review, by disagreement and by ranking sensitivity")
    p.add_argument("--order", choices=["disagreement", "sensitivity"], default="disagreement")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--rho", type=float, default=0.10)
    p.add_argument("--delta", type=float, default=0.20)
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--runs", help="comma-separated label run ids (default: all)")
    _stability_args(p, "auto")
    p.add_argument("--json", action="store_true")
    _add_scope(p)
    p.set_defaults(func=_review_queue)


def _labels_dispatch(args: argparse.Namespace) -> int:
    # edit/undo take positional TRAJ CAP [VALUE]; argparse puts the first one in `file`.
    if args.action in ("edit", "undo") and args.file:
        args.rest = [args.file, *args.rest]
        args.file = None
    if args.action == "edit" and len(args.rest) != 3:
        from trace_lib.errors import UserInputError
        raise UserInputError("labels edit: expected TRAJECTORY_ID CAPABILITY VALUE")
    if args.action in ("export", "import") and not args.file:
        from trace_lib.errors import UserInputError
        raise UserInputError(f"labels {args.action}: expected FILE.csv")
    return _labels(args)
