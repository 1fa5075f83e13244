"""The Rankings view's threshold-free parts, computed when a label run finishes and
stored, so that the page's first visit reads them (issue 35).

Design decisions
- Two parts of the Rankings view move with no slider and cost seconds at 1M trajectories:
  bootstrap stability's resamples (`stability`: B x T multiplicities drawn and counted)
  and the failure clusters (one GROUP BY of every failed trajectory's lacking signature).
  Both depend on the labels (`materialise.version`: runs, edits, undos, capabilities),
  the scope and, for the stability, the counted runs, method, B and seed; both are
  stored under exactly those in the store (`store.rank_stored`), never in process memory
  alone, so a server start, a second process and the `rank` verb find them.
- `store_default` is what a label run's finish calls, right after the materialised
  labels are brought up to date (`labeling`, `background_labeling`, `label_csv`): the
  page's default view (the whole store, every finished run, `StabilityConfig()`, the
  clusters over every capability not rejected). Its cost is a label run's, once; at 1M
  trajectories x 1 run see bench/README.md ("Session 22: the first visit reads what the
  label run stored").
- What the page computes from its kept set (the greedy cover, the export document's
  examples) is stored threshold-free too (issue 35, part 2): per scope, the failed
  trajectories' cover signatures (`ranking.CoverSignatures`: which capabilities each
  lacks and is labelled for, grouped: ~9k rows at 1M trajectories x 14 capabilities) and
  every shown capability's examples. Any kept set's cover follows from the signatures in
  milliseconds and its examples are a lookup (`kept_details`), so the first visit and
  every slider move read no label for them; keying by the kept set instead would have
  left every slider position that changes it to recompute (0.7-1.2 s of CPU at 1M).
- Any other inputs (a scope, a subset of runs, another B) are computed on first use and
  stored under their own key, as the defaults would have been. An edit, an undo, a new
  run or a capability change moves the version: a stored result of another version is
  never read (and is dropped by the next write).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from trace_lib.diagnose import materialise, stability
from trace_lib.diagnose.ranking import (
    CoverSignatures,
    RankConfig,
    cover_from_signatures,
    cover_signatures,
    failed_examples,
    failure_clusters,
    rank_con,
)
from trace_lib.diagnose.resamples import Progress
from trace_lib.scope import Scope
from trace_lib.store import rank_stored
from trace_lib.store.connection import Connection


def clusters_key(con: Connection, run_ids: list[str], scope: Scope | None) -> str:
    """The inputs the stored clusters answer for: the counted runs and the scope as SQL.
    The capabilities they group by (those the ranking shows, rejected ones left out)
    follow from these and the version, which holds the catalog's statuses."""
    sc, sp = (scope or Scope()).where(con, "t")
    return json.dumps({"runs": list(run_ids), "scope": [sc, [str(p) for p in sp]]},
                      sort_keys=True)


def stored_failure_clusters(con: Connection, run_ids: list[str], scope: Scope | None,
                            capabilities: list[str]) -> tuple[list[dict[str, Any]], str]:
    """`ranking.failure_clusters` over `capabilities` (the ranking's, for `run_ids` and
    `scope`) read from the store for the current labels, else computed and stored; and
    where they came from (stored | computed)."""
    key, version = clusters_key(con, run_ids, scope), materialise.version_hash(con)
    got = rank_stored.read_clusters(con, key, version)
    if got is not None:
        return got, "stored"
    t0 = time.perf_counter()
    out = failure_clusters(con, capabilities, scope=scope)
    rank_stored.write_clusters(con, key, version, out, time.perf_counter() - t0)
    return out, "computed"


N_EXAMPLES = 5  # per capability in the export document (`ranking.selected_document`)


def cover_key(con: Connection, scope: Scope | None) -> str:
    """The inputs the stored cover signatures and examples answer for: the scope as SQL.
    Not the counted runs: the cover and the examples read the effective labels, the same
    whatever runs the ranking counts; not the kept set: they are stored for every
    capability the ranking shows, so every kept set (every slider position) reads them."""
    sc, sp = (scope or Scope()).where(con, "t")
    return json.dumps({"scope": [sc, [str(p) for p in sp]], "examples": N_EXAMPLES},
                      sort_keys=True)


@dataclass
class KeptDetails:
    cover: list[dict[str, Any]]  # `ranking.greedy_cover` of the kept set
    examples: dict[str, list[dict[str, Any]]]  # `ranking.failed_examples` of the kept set
    source: str  # stored | computed


def kept_details(con: Connection, kept: list[str], scope: Scope | None,
                 capabilities: list[str]) -> KeptDetails:
    """The greedy cover and the export examples of `kept`, from the cover signatures and
    examples stored for `scope` and the current labels over `capabilities` (the ranking's,
    rejected ones left out; `kept` is among them), else computed for all of them and
    stored: a later kept set reads them too."""
    key, version = cover_key(con, scope), materialise.version_hash(con)
    got = rank_stored.read_cover(con, key, version)
    if got is not None:
        sigs = CoverSignatures.from_json(got[0])
        if set(kept) <= set(sigs.capabilities):
            return KeptDetails(cover_from_signatures(sigs, kept),
                               {c: got[1].get(c, []) for c in kept}, "stored")
    t0 = time.perf_counter()
    caps = sorted(set(capabilities) | set(kept))
    sigs = cover_signatures(con, caps, scope=scope)
    examples = failed_examples(con, caps, N_EXAMPLES, scope)
    rank_stored.write_cover(con, key, version, sigs.to_json(), examples,
                            time.perf_counter() - t0)
    return KeptDetails(cover_from_signatures(sigs, kept), {c: examples[c] for c in kept},
                       "computed")


def pending(con: Connection, runs: list[str] | None, st: stability.StabilityConfig | None,
            scope: Scope | None, version: tuple | None = None) -> bool:
    """Whether a Rankings view with these inputs has a threshold-free part to compute
    (nothing stored for the current labels); `version`: `materialise.version` if the
    caller has just read it."""
    scope = scope or Scope()
    run_ids = stability.counted_run_ids(con, runs)
    if not run_ids:
        return False
    if st is not None and stability.stability_pending(con, runs, st, scope, version):
        return True
    vh = materialise.version_hash(con, version)
    return not (rank_stored.has_clusters(con, clusters_key(con, run_ids, scope), vh)
                and rank_stored.has_cover(con, cover_key(con, scope), vh))


def prepare(con: Connection, runs: list[str] | None, st: stability.StabilityConfig | None,
            scope: Scope | None, progress: Progress | None = None) -> dict[str, str]:
    """Compute and store what a Rankings view with these inputs needs and no slider moves
    (bootstrap stability, failure clusters, the cover signatures and examples every kept
    set reads), reporting `progress(fraction, text)`; where each came from (stored |
    memory | computed | chosen | none)."""
    scope = scope or Scope()
    run_ids = stability.counted_run_ids(con, runs)
    if not run_ids:
        return {"stability": "none", "clusters": "none", "cover": "none"}
    stab = "none"
    if st is not None:
        stab = stability.prepare(con, runs, st, scope, None if progress is None else (
            lambda f, text: progress(0.7 * f, text)))
    if progress is not None:
        progress(0.7, "grouping the failed trajectories by the capabilities they lack")
    caps = [r.capability for r in rank_con(con, RankConfig(runs=runs), scope=scope).rows
            if r.status != "rejected"]
    _, clusters = stored_failure_clusters(con, run_ids, scope, caps)
    if progress is not None:
        progress(0.85, "the cover signatures and the export examples")
    cover = kept_details(con, [], scope, caps).source
    if progress is not None:
        progress(1.0, "stored for the next visit")
    return {"stability": stab, "clusters": clusters, "cover": cover}


def store_default(con: Connection) -> dict[str, str]:
    """What a label run's finish calls: `prepare` for the Rankings page's default view
    (the whole store, every finished run, `StabilityConfig()`)."""
    return prepare(con, None, stability.StabilityConfig(), Scope())


def run_finished(con: Connection) -> None:
    """What every path that finishes a label run calls (a labeler's run, a background
    job's, a CSV import): the materialised labels brought up to date, then the Rankings
    page's default view stored (`store_default`), in that order, one call."""
    materialise.sync(con)
    store_default(con)
