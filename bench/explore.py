"""Explore stage benchmark: failure signatures in SQL vs pandas, embedding cache vs re-encode.

    python bench/explore.py [--scale 144] [--embed-n 200]
    python bench/explore.py --paths [--scale 144] [--text reservation]

1. Failure signatures (`clusters.signature_counts`) on the real tau-bench + tau2 files
   imported by `ingest_paths` and replicated `--scale` times inside DuckDB (x144 gives
   ~100k trajectories, ~1M tool calls). Peer: **pandas 3.1**, the way a notebook would do
   it: the needed columns already loaded as DataFrames (load time not counted: its best
   case), first error by sort + groupby, error kinds by `str.replace` regexes, expected
   actions matched on (trajectory, name, sorted-key JSON). Both answers are compared
   before any figure is printed.
2. Embeddings: `ensure_embeddings` on `--embed-n` failures twice; the second call finds
   every text hash cached. Peer: re-encoding the same texts with the same MiniLM encoder
   (what a tool without a cache does on every page load).
3. `--paths` (issue 15): the Trajectories page's queries on the old path (text scan as a
   subquery in each query, everything computed from raw tables) vs the new one (full-text
   index once, columns derived at import), same store, answers compared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from trace_lib import store  # noqa: E402
from trace_lib.explore import clusters, embeddings  # noqa: E402
from trace_lib.explore.queries import TrajectoryFilter  # noqa: E402
from trace_lib.store import derived as store_derived  # noqa: E402

SHARED = REPO.parent / "shared" / "data"


def build(db: Path, scale: int, messages: bool = False) -> int:
    from trace_lib.ingest import ingest_paths

    files = [SHARED / "tau-bench/historical_trajectories/gpt-4o-airline.json",
             *sorted((SHARED / "tau2-bench/results").glob("*/*.json"))]
    ingest_paths([str(f) for f in files], db=db)
    with store.connect(db) as con:
        con.execute("SET enable_progress_bar = false")
        if scale > 1:
            con.execute(f"CREATE TEMP TABLE r AS SELECT range AS k FROM range(1, {scale})")
            con.execute(
                "INSERT INTO trajectories SELECT id || '_' || k, dataset_id, source_id, "
                "task_id, trial + k * 10, agent_model, domain, reward, success, termination, "
                "n_messages, n_tool_calls, n_tool_errors, content_sha256 || '_' || k, meta, outcome "
                "FROM trajectories, r")
            con.execute(
                "INSERT INTO tool_calls SELECT trajectory_id || '_' || k, message_idx, call_idx, "
                "call_id, name, arguments, requestor, error FROM tool_calls, r")
            if messages:
                con.execute(
                    "INSERT INTO messages (trajectory_id, idx, role, content, tool_call_id, "
                    "name, turn_idx, meta) SELECT trajectory_id || '_' || k, idx, role, "
                    "content, tool_call_id, name, turn_idx, meta FROM messages, r")
            con.execute("CHECKPOINT")
        return con.execute("SELECT count(*) FROM trajectories").fetchone()[0]


def pandas_signatures(frames):
    import pandas as pd

    t, c, e = frames
    f = t[t.success == False]  # noqa: E712  (nullable boolean column)
    errs = c[c.error.notna() & c.trajectory_id.isin(f.id)].sort_values(
        ["trajectory_id", "message_idx", "call_idx"]).groupby("trajectory_id").first()
    kind = (errs.error.str.replace(r"^\s*(error|exception)?\s*[:\-]?\s*", "", regex=True,
                                   case=False)
            .str.replace(r"'[^']*'|\"[^\"]*\"", "<id>", regex=True)
            .str.replace(r"[^\s,.;:()]*[0-9][^\s,.;:()]*", "<id>", regex=True)
            .str.replace(r"\s+", " ", regex=True).str.lower().str.strip().str.slice(0, 60))

    def canon(s):
        try:
            return json.dumps(json.loads(s), sort_keys=True)
        except (TypeError, ValueError):
            return s
    x = f[["id", "dataset_id", "task_id"]].merge(e, on=["dataset_id", "task_id"])
    x["args"] = x.arguments.map(canon)
    cc = c[c.trajectory_id.isin(x.id) & c.name.isin(x.name)].copy()
    cc["args"] = cc.arguments.map(canon)
    made = set(zip(cc.trajectory_id, cc.name, cc.args, strict=True))
    named = set(zip(cc.trajectory_id, cc.name, strict=True))
    x["exact"] = [k in made for k in zip(x.id, x.name, x.args, strict=True)]
    x["named"] = [k in named for k in zip(x.id, x.name, strict=True)]
    miss = x[~x.exact].sort_values(["id", "idx"]).groupby("id").first()
    dev = pd.Series(store_derived.ALL_MADE, index=pd.Index(x.id.unique()))
    dev[miss.index] = [("wrong args: " if n else "missing: ") + m
                       for n, m in zip(miss.named, miss.name, strict=True)]
    out = pd.DataFrame({
        "termination": f.termination.fillna("(none)").to_numpy(),
        "error_tool": f.id.map(errs.name).fillna(store_derived.NO_ERROR).to_numpy(),
        "error_kind": f.id.map(kind).fillna(store_derived.NO_ERROR).to_numpy(),
        "deviation": f.id.map(dev).fillna(store_derived.NO_EXPECTED).to_numpy(),
    })
    return out.groupby(list(clusters.LEVELS)).size().rename("n").reset_index()


def timed(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def paths(scale: int, repeats: int, text: str) -> None:
    """Old vs new query paths of the Trajectories page on one store (issue 15).

    Peer ("computed"): the same functions with `SET VARIABLE trace_computed_paths = true`,
    i.e. the code as it was: text as `contains(lower(content), ?)` in a subquery of each
    of the overview's seven queries, error kinds by regex per error, signatures (and their
    members) recomputed from the raw tables, the embedding text rebuilt and hashed in
    Python. New: the id set from the full-text index once, the columns derived at import.
    """
    from trace_lib.explore import queries
    from trace_lib.store import search
    from trace_lib.workbench.explore import _overview

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "paths.duckdb"
        n = build(db, scale, messages=True)
        with store.connect(db) as con:
            t0 = time.perf_counter()
            report = store_derived.rebuild(con, db)
            backfill = time.perf_counter() - t0
        n_msg = 0
        with store.connect(db, read_only=True) as con:
            con.execute("SET enable_progress_bar = false")
            n_msg = con.execute("SELECT count(*) FROM messages").fetchall()[0][0]
            sigs = clusters.signature_counts(con)
            top = list(sigs.iloc[0][list(clusters.LEVELS)])
            words = TrajectoryFilter(text=text)
            exact = TrajectoryFilter(text=text, text_mode="substring")

            def fresh(fn):
                def run():
                    search.clear_cache()  # the id set's cost counted on every call
                    return fn()
                return run

            cases = [
                ("overview + listing, text search (7 queries)",
                 lambda: _overview(con, exact, 500), fresh(lambda: _overview(con, words, 500))),
                ("same, exact substring mode (scan once)", None,
                 fresh(lambda: _overview(con, exact, 500))),
                ("filter_options (error-kind counts)", lambda: queries.filter_options(con),
                 lambda: queries.filter_options(con)),
                ("signature_counts", lambda: clusters.signature_counts(con),
                 lambda: clusters.signature_counts(con)),
                ("signature_members (largest signature)",
                 lambda: clusters.signature_members(con, path=top),
                 lambda: clusters.signature_members(con, path=top)),
                ("missing_embeddings (failures)", lambda: embeddings.missing_embeddings(con),
                 lambda: embeddings.missing_embeddings(con)),
            ]
            print(f"query paths, {n:,} trajectories, {n_msg:,} messages; text {text!r}; "
                  f"backfill of derived columns + index build {backfill:.1f} s ({report})")
            print("| what | computed (old path) | derived / index (new) | ratio | answers |")
            print("|---|---|---|---|---|")
            for name, old_fn, new_fn in cases:
                new_s, new_out = timed(new_fn, repeats)
                if old_fn is None:
                    print(f"| {name} | | {new_s * 1000:.0f} ms | |")
                    continue
                con.execute(f"SET VARIABLE {store_derived.PEER_VARIABLE} = true")
                try:
                    old_s, old_out = timed(old_fn, repeats)
                finally:
                    con.execute(f"RESET VARIABLE {store_derived.PEER_VARIABLE}")
                same = _same(old_out, new_out)
                print(f"| {name} | {old_s * 1000:.0f} ms | {new_s * 1000:.0f} ms "
                      f"| x{old_s / new_s:.1f} | {same} |", flush=True)


def _same(a, b) -> str:
    import pandas as pd

    if isinstance(a, int):
        return "same answer" if a == b else f"answers differ: {a} vs {b}"
    if isinstance(a, pd.DataFrame):
        cols = [c for c in a.columns if c != "examples"]
        eq = a[cols].reset_index(drop=True).equals(b[cols].reset_index(drop=True))
        return "same answer" if eq else "answers differ"
    # overview: words mode answers another question than the substring scan; the counts
    return (f"trajectories matched: scan {int(a.summary.n_trajectories.iloc[0])}, "
            f"index {int(b.summary.n_trajectories.iloc[0])}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=int, default=144)
    ap.add_argument("--embed-n", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--paths", action="store_true",
                    help="only the old vs new query paths of the Trajectories page")
    ap.add_argument("--text", default="reservation", help="the text searched in --paths")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    if args.paths:
        paths(args.scale, args.repeats, args.text)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.duckdb"
        n = build(db, args.scale)
        with store.connect(db, read_only=True) as con:
            con.execute("SET enable_progress_bar = false")
            frames = (
                con.execute("SELECT id, dataset_id, task_id, success, termination "
                            "FROM trajectories").df(),
                con.execute("SELECT trajectory_id, message_idx, call_idx, name, arguments, "
                            "error FROM tool_calls").df(),
                con.execute("SELECT dataset_id, task_id, idx, name, arguments "
                            "FROM expected_actions").df(),
            )
            clusters.signature_counts(con)  # warm-up
            sql_s, ours = timed(lambda: clusters.signature_counts(con), args.repeats)
        peer_s, theirs = timed(lambda: pandas_signatures(frames), args.repeats)
        keyed = ours.set_index(list(clusters.LEVELS)).n.sort_index()
        peer = theirs.set_index(list(clusters.LEVELS)).n.sort_index()
        assert keyed.equals(peer.astype(keyed.dtype)), "SQL and pandas signatures differ"
        print(f"failure signatures, {n:,} trajectories, {int(keyed.sum()):,} failures, "
              f"{len(keyed)} signatures (answers identical)")
        print(f"  trace_lib SQL  {sql_s * 1000:8.0f} ms")
        print(f"  pandas peer    {peer_s * 1000:8.0f} ms   ratio x{peer_s / sql_s:.1f}")

        with store.connect(db) as con:
            con.execute("SET enable_progress_bar = false")
            ids = [r[0] for r in con.execute(
                "SELECT id FROM trajectories WHERE NOT success ORDER BY id LIMIT ?",
                [args.embed_n]).fetchall()]
            flt = TrajectoryFilter(trajectory_ids=tuple(ids))
            enc = embeddings.get_encoder()
            t0 = time.perf_counter()
            first = embeddings.ensure_embeddings(con, flt, encoder=enc)
            cold = time.perf_counter() - t0
            warm, again = timed(lambda: embeddings.ensure_embeddings(con, flt, encoder=enc),
                                args.repeats)
            texts = embeddings.trajectory_texts(con, flt).text.tolist()
        reenc, _ = timed(lambda: enc.encode(texts), 1)
        assert again.n_computed == 0 and first.n_computed == len(ids)
        print(f"embeddings, {len(ids)} failures (MiniLM-L6 on CPU)")
        print(f"  first call (encode + store)  {cold * 1000:8.0f} ms")
        print(f"  trace_lib cached call        {warm * 1000:8.0f} ms")
        print(f"  peer re-encode               {reenc * 1000:8.0f} ms   "
              f"ratio x{reenc / warm:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
