"""`python -m trace_lib explore ...`: the Trajectories page from the command line (over
`trace_lib.workbench.explore`).

Design decisions
- One verb, `explore`, with sub-verbs that mirror the page's parts: overview, stats,
  list, signatures, embed, semantic, show, compare (and reindex). Every sub-verb takes the same filter
  flags, compiled into the same `TrajectoryFilter` the page builds from its widgets.
- Reads open the store read-only; `embed` writes the embeddings cache, `reindex` the
  derived columns and the full-text index (both also kept by every import).
- Tables print with pandas' plain formatter; `--json` prints one JSON document.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from trace_lib.cli.output import print_json


def _filter_parent() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("filter")
    g.add_argument("--dataset", action="append", default=[], help="dataset id (repeatable)")
    g.add_argument("--domain", action="append", default=[])
    g.add_argument("--agent-model", action="append", default=[])
    g.add_argument("--outcome", action="append", default=[],
                   choices=["success", "failure", "unknown"])
    g.add_argument("--termination", action="append", default=[])
    g.add_argument("--tool", action="append", default=[], help="trajectory used this tool")
    g.add_argument("--tool-error", dest="tool_error", action="store_true", default=None,
                   help="only trajectories with a tool error")
    g.add_argument("--no-tool-error", dest="tool_error", action="store_false",
                   help="only trajectories without tool errors")
    g.add_argument("--error-kind", action="append", default=[])
    g.add_argument("--task", action="append", default=[])
    g.add_argument("--text", default="",
                   help="text search over the conversation: every word starts a word of "
                        "the trajectory (\"quoted phrases\" kept together)")
    g.add_argument("--text-mode", choices=["words", "substring"], default="words",
                   help="words: the full-text index (default); substring: exact "
                        "case-insensitive substring scan (identifiers, fragments)")
    g.add_argument("--text-system", action="store_true",
                   help="search the system prompt too (default: the conversation only: "
                        "user, assistant and tool messages)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    return p


def _flt(args: argparse.Namespace):
    from trace_lib.workbench.explore import TrajectoryFilter

    return TrajectoryFilter(
        datasets=tuple(args.dataset), domains=tuple(args.domain),
        agent_models=tuple(args.agent_model), outcomes=tuple(args.outcome),
        terminations=tuple(args.termination), tools_used=tuple(args.tool),
        tool_error=args.tool_error, error_kinds=tuple(args.error_kind),
        task_ids=tuple(args.task), text=args.text, text_mode=args.text_mode,
        text_system=args.text_system,
    )


def _emit(args: argparse.Namespace, payload: Any, frames: dict[str, Any]) -> None:
    if args.json:
        print_json(payload)
        return
    import pandas as pd

    with pd.option_context("display.width", 200, "display.max_columns", 20,
                           "display.max_colwidth", 60, "display.max_rows", 200):
        for title, df in frames.items():
            print(f"# {title}")
            print(df.to_string(index=False) if len(df) else "(none)")
            print()


def _records(df) -> list[dict[str, Any]]:
    return df.astype(object).where(df.notna(), None).to_dict(orient="records")


def _overview(args: argparse.Namespace) -> int:
    from trace_lib.workbench import data

    df = data.pipeline_counts(args.db, missing_ok=False)
    _emit(args, _records(df), {"pipeline": df})
    return 0


def _stats(args: argparse.Namespace) -> int:
    from trace_lib.workbench import explore

    ov = explore.overview(args.db, _flt(args))
    frames = {
        "summary": ov.summary,
        "success by domain and agent": ov.by_domain,
        "terminations": ov.terminations,
        "tools": ov.tool_usage,
        "tool error kinds": ov.error_kinds,
    }
    _emit(args, {k: _records(v) for k, v in frames.items()}, frames)
    return 0


def _list(args: argparse.Namespace) -> int:
    from trace_lib.workbench import explore

    df = explore.list_trajectories(args.db, _flt(args), limit=args.limit)
    _emit(args, _records(df), {"trajectories": df})
    return 0


def _signatures(args: argparse.Namespace) -> int:
    from trace_lib.workbench import explore

    flt = _flt(args)
    if args.members is not None:
        path = [p.strip() for p in args.members.split("/")] if args.members else []
        df = explore.signature_members(args.db, flt, path=path, limit=args.limit)
        title = "members of " + (" / ".join(path) or "all failures")
    else:
        df = explore.signature_counts(args.db, flt).drop(columns=["path"])
        title = "failure signatures"
    _emit(args, _records(df), {title: df})
    return 0


def _embed(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from trace_lib.workbench import explore

    bar = tqdm(total=0, unit="traj", desc="embedding", file=sys.stderr)

    def tick(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    rep = explore.embed(args.db, _flt(args), failures_only=not args.all,
                        batch_size=args.batch_size, progress=tick)
    bar.close()
    out = {"model": rep.model, "in_scope": rep.n_in_scope, "computed": rep.n_computed,
           "cached": rep.n_cached}
    if args.json:
        print_json(out)
    else:
        print(f"{rep.model}: embedded {rep.n_computed}, reused {rep.n_cached} "
              f"of {rep.n_in_scope} in scope")
    return 0


def _semantic(args: argparse.Namespace) -> int:
    from trace_lib.workbench import explore

    smap = explore.semantic_clusters(args.db, _flt(args), k=args.k,
                                     failures_only=not args.all)
    pts = smap.points.drop(columns=["text"], errors="ignore")
    payload = {"k": smap.k, "silhouette": smap.silhouette,
               "clusters": _records(smap.clusters), "points": _records(pts)}
    _emit(args, payload, {f"clusters (k={smap.k}, silhouette={smap.silhouette})":
                          smap.clusters})
    if not args.json and smap.points.empty:
        print("nothing embedded in scope: run `explore embed` first", file=sys.stderr)
    return 0


def _reindex(args: argparse.Namespace) -> int:
    from trace_lib.workbench import explore

    out = explore.reindex(args.db)
    if args.json:
        print_json(out)
    else:
        print(f"derived columns for {out['derived']} trajectories; full-text index rebuilt "
              f"with {out['indexed']} trajectories")
    return 0


def _show(args: argparse.Namespace) -> int:
    from trace_lib.workbench import explore

    view = explore.transcript(args.db, args.trajectory_id)
    t, aligned = view.transcript, explore.call_alignment
    rows = aligned.alignment_frame(aligned.expected_vs_actual(t), "expected", "agent")
    if args.json:
        print_json({"trajectory": t.trajectory, "messages": [
            {**{k: v for k, v in m.items() if k != "tool_calls"},
             "tool_calls": [vars(c) for c in m["tool_calls"]]} for m in t.messages],
            "expected_vs_actual": _records(rows)})
        return 0
    print(explore.transcript_render.transcript_text(t))
    print()
    _emit(args, None, {"expected vs actual": rows})
    return 0


def _compare(args: argparse.Namespace) -> int:
    from trace_lib.workbench import explore

    other = getattr(args, "other_id", None)
    cmp = explore.compare(args.db, args.trajectory_id, other)
    if other is None:
        names, title = (f"passed {cmp.left.id}", f"failed {cmp.right.id}"), "passed vs failed"
        ids = {"passed": cmp.left.id, "failed": cmp.right.id}
    else:
        names, title = (cmp.left.id, cmp.right.id), f"{cmp.left.id} vs {cmp.right.id}"
        ids = {}
    rows = explore.call_alignment.alignment_frame(cmp.alignment, *names)
    _emit(args, {**ids, "left": cmp.left.id, "right": cmp.right.id,
                 "alignment": _records(rows)},
          {f"{title}, aligned on tool calls": rows})
    return 0


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add `explore` and its sub-verbs to the CLI."""
    filt = _filter_parent()
    p = sub.add_parser("explore", help="query, cluster and read trajectories")
    verbs = p.add_subparsers(dest="explore_verb", metavar="SUBVERB")
    verbs.required = True

    def add(name: str, func, help_: str) -> argparse.ArgumentParser:
        q = verbs.add_parser(name, parents=[common, filt], help=help_)
        q.set_defaults(func=func)
        return q

    add("overview", _overview, "counts per pipeline stage")
    add("stats", _stats, "success rates, terminations, tools, error kinds")
    add("list", _list, "list trajectories").add_argument("--limit", type=int, default=50)
    q = add("signatures", _signatures, "failure clusters by signature")
    q.add_argument("--members", default=None, metavar="PATH",
                   help="list failures under 'termination/tool/kind/deviation' (a prefix)")
    q.add_argument("--limit", type=int, default=100)
    q = add("embed", _embed, "embed trajectories (cached by text hash)")
    q.add_argument("--all", action="store_true", help="embed successes too")
    q.add_argument("--batch-size", type=int, default=64)
    q = add("semantic", _semantic, "semantic clusters of embedded trajectories")
    q.add_argument("--k", type=int, default=None, help="clusters (default: by silhouette)")
    q.add_argument("--all", action="store_true", help="include successes")
    add("show", _show, "print one transcript").add_argument("trajectory_id")
    q = verbs.add_parser("reindex", parents=[common], help="backfill derived columns and "
                         "rebuild the full-text search index from the store")
    q.add_argument("--json", action="store_true", help="print one JSON document")
    q.set_defaults(func=_reindex)
    cmp = add("compare", _compare, "align two trajectories on tool calls (default: a passed "
              "and a failed trial of the task)")
    cmp.add_argument("trajectory_id")
    cmp.add_argument("--with", dest="other_id", default=None, metavar="ID",
                     help="compare with this trajectory (any trial, any task)")
