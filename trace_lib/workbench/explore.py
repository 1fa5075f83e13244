"""Explore use cases: the Trajectories page's reads (and `explore ...`), one call each.

Design decisions
- Each function opens one short connection and closes it before returning: reads are
  read-only (a CLI writer waits milliseconds at most); only `embed` writes (the cache).
- `overview` returns every frame of the page's charts tab at once, from the same filter
  the CLI compiles from its flags (`TrajectoryFilter`).
- The page's unfiltered view (filter options, overview frames, the listing's first page)
  is computed when trajectories are imported and stored (`explore.overview_stored`, issue
  35): `trajectories_page` and `filter_options` read it on a first visit; a store written
  otherwise has it computed on that visit and stored for the next (`store_overview`, also
  what `data.import_files`, `evaluation.import_episodes` and `reindex` call).
- Charts and transcript renderers are pure functions over the results (no store): their
  modules (`trajectory_charts`, `transcript_render`, `call_alignment`, `search_highlight`,
  `untrusted_text`) are re-exported here by name so a page needs nothing but
  `trace_lib.workbench`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from trace_lib import store
from trace_lib.errors import UserInputError
from trace_lib.explore import (  # noqa: F401  (pure figures and renderers for the page)
    call_alignment,
    search_highlight,
    trajectory_charts,
    transcript_render,
    untrusted_text,
)
from trace_lib.explore.clusters import LEVELS as SIGNATURE_LEVELS  # noqa: F401
from trace_lib.explore.clusters import PATH_SEP, path_label  # noqa: F401
from trace_lib.explore.queries import TrajectoryFilter

Db = str | Path | None


@dataclass
class Overview:
    summary: pd.DataFrame
    by_domain: pd.DataFrame
    terminations: pd.DataFrame
    tool_calls: pd.DataFrame
    tool_usage: pd.DataFrame
    error_kinds: pd.DataFrame
    listing: pd.DataFrame


def filter_options(db: Db) -> pd.DataFrame:
    """The values each filter widget offers, with counts (stored at import: read)."""
    from trace_lib.explore import overview_stored, queries

    with store.connect(db, read_only=True) as con:
        got = overview_stored.read(con, names=("options",))
        return got["options"] if got is not None else queries.filter_options(con)


def overview(db: Db, flt: TrajectoryFilter | None = None, limit: int = 500) -> Overview:
    """Summary, charts' frames and the listing for a filter (`explore stats|list`)."""
    with store.connect(db, read_only=True) as con:
        return _overview(con, flt, limit)


def _overview(con: Any, flt: TrajectoryFilter | None, limit: int) -> Overview:
    from trace_lib.explore import overview_rollup, overview_stored, queries

    # A filter on trajectory columns only: the aggregates from the rollup stored at import;
    # any other: the filter evaluated once, the same cells built over its trajectories and
    # the listing taken from them.
    rolled = overview_rollup.frames(con, flt, overview_stored.version(con)) \
        if overview_rollup.servable(flt) else None
    if rolled is not None:
        return Overview(**rolled, listing=queries.list_trajectories(con, flt, limit=limit))
    with overview_rollup.filtered(con, flt) as src:
        if src is not None:
            return Overview(**overview_rollup.frames_of(con, src),
                            listing=queries.list_trajectories(con, limit=limit, source=src))
    listing = queries.list_trajectories(con, flt, limit=limit)
    # No filter (or the computed paths asked for): the six aggregates; a text filter's
    # matching ids are computed once and every query semi-joins them (store.search.bind).
    return Overview(
        summary=queries.outcome_summary(con, flt),
        by_domain=queries.success_by_domain_agent(con, flt),
        terminations=queries.termination_counts(con, flt),
        tool_calls=queries.tool_call_histogram(con, flt),
        tool_usage=queries.tool_usage(con, flt),
        error_kinds=queries.tool_error_kinds(con, flt),
        listing=listing,
    )


@dataclass
class SearchStatus:
    """Whether the fast paths are in place: the full-text index covers every trajectory,
    every trajectory has its derived columns. Either missing: answers stay right, slower;
    `explore reindex` repairs both."""

    index_fresh: bool
    n_unindexed: int
    derived_ready: bool

    @property
    def ok(self) -> bool:
        return self.index_fresh and self.derived_ready


@dataclass
class TrajectoriesPage:
    """What the Trajectories page shows on every visit for one filter, from one
    connection (its failure-signature tab asks `signature_counts` when it opens)."""

    overview: Overview
    status: SearchStatus
    # Unfiltered: stored (read what an import stored) or computed (and stored for the next
    # visit where the store could be written); a filter: filtered (computed, not stored).
    source: str = "filtered"


def _status(con: Any) -> SearchStatus:
    from trace_lib.store import derived, search

    state = search.index_state(con)
    return SearchStatus(state.fresh, state.n_unindexed, derived.ready(con))


def _from_frames(frames: dict[str, pd.DataFrame]) -> Overview:
    return Overview(**{name: frames[name] for name in (
        "summary", "by_domain", "terminations", "tool_calls", "tool_usage", "error_kinds",
        "listing")})


def trajectories_page(db: Db, flt: TrajectoryFilter | None = None, limit: int = 500
                      ) -> TrajectoriesPage:
    """The Trajectories page's data: overview (summary, charts' frames, listing) and the
    state of the fast paths. Unfiltered, the overview is what the last import stored
    (`explore.overview_stored`); missing (a store written otherwise), it is computed and
    stored for the next visit."""
    from trace_lib.explore import overview_stored

    fill = None
    with store.connect(db, read_only=True) as con:
        if not overview_stored.unfiltered(flt):
            return TrajectoriesPage(_overview(con, flt, limit), _status(con))
        frames, source = overview_stored.read(con, limit), "stored"
        if frames is None:
            v, t0 = overview_stored.version(con), time.perf_counter()
            frames, source = overview_stored.compute(con, limit), "computed"
            fill = (frames, v, time.perf_counter() - t0)
        page = TrajectoriesPage(_from_frames(frames), _status(con), source)
    if fill is not None:
        store_overview(db, *fill, limit=limit)
    return page


def store_overview(db: Db, frames: dict[str, pd.DataFrame] | None = None,
                   version: str | None = None, compute_s: float = 0.0, *,
                   limit: int = 500) -> str | None:
    """Store the unfiltered view (`frames` computed at `version`, else computed now):
    what an import's finish calls. A cache fill: a store another writer holds for more
    than a moment is left as it is (None), the next visit computes it again."""
    from trace_lib.explore import overview_stored

    try:
        with store.connect(db, timeout_s=2.0) as con:
            if frames is None:
                return overview_stored.store_default(con, limit)
            overview_stored.store(con, frames, version, compute_s, limit)
            return "computed"
    except store.StoreError:
        return None


def store_version(db: Db) -> tuple[float, ...]:
    """Changes whenever the store or its search index is written (a page cache key)."""
    from trace_lib.store import search

    return search.file_version(store.resolve_db_path(db))


def search_status(db: Db) -> SearchStatus:
    with store.connect(db, read_only=True) as con:
        return _status(con)


def reindex(db: Db) -> dict[str, int]:
    """Backfill derived columns and rebuild the full-text index (`explore reindex`)."""
    from trace_lib.explore import overview_stored
    from trace_lib.store import derived

    path = store.resolve_db_path(db)
    if not path.exists():
        raise UserInputError(f"{path}: no database here yet; nothing to index")
    with store.connect(path) as con:
        out = derived.rebuild(con, path)
        overview_stored.store_default(con)  # and the page's unfiltered view
        return out


def encoder_warmup():
    """The process's background import of scikit-learn and load of the default encoder
    (started on first call): `.fraction`, `.text`, `.ready()`, `.wait()`."""
    from trace_lib.explore import embeddings

    return embeddings.warm_up()


def list_trajectories(db: Db, flt: TrajectoryFilter | None = None, limit: int = 50
                      ) -> pd.DataFrame:
    from trace_lib.explore import queries

    with store.connect(db, read_only=True) as con:
        return queries.list_trajectories(con, flt, limit=limit)


def signature_counts(db: Db, flt: TrajectoryFilter | None = None) -> pd.DataFrame:
    """Failure clusters by signature (termination › tool › error kind › deviation)."""
    from trace_lib.explore import clusters

    with store.connect(db, read_only=True) as con:
        return clusters.signature_counts(con, flt)


def signature_members(db: Db, flt: TrajectoryFilter | None, path: list[str],
                      limit: int = 100) -> pd.DataFrame:
    from trace_lib.explore import clusters

    with store.connect(db, read_only=True) as con:
        return clusters.signature_members(con, flt, path=path, limit=limit)


def missing_embeddings(db: Db, flt: TrajectoryFilter | None, failures_only: bool = True
                       ) -> int:
    from trace_lib.explore import embeddings

    with store.connect(db, read_only=True) as con:
        return embeddings.missing_embeddings(con, flt, failures_only=failures_only)


def embed(db: Db, flt: TrajectoryFilter | None = None, failures_only: bool = True,
          batch_size: int = 64, progress: Callable[[int, int], None] | None = None):
    """Embed in-scope trajectories (cached by text hash) (`explore embed`, the page)."""
    from trace_lib.explore import embeddings

    with store.connect(db) as con:
        return embeddings.ensure_embeddings(con, flt, failures_only=failures_only,
                                            batch_size=batch_size, progress=progress)


def semantic_clusters(db: Db, flt: TrajectoryFilter | None = None, k: int | None = None,
                      failures_only: bool = True):
    from trace_lib.explore import embeddings

    with store.connect(db, read_only=True) as con:
        return embeddings.semantic_clusters(con, flt, k=k, failures_only=failures_only)


@dataclass
class TranscriptView:
    transcript: Any  # transcript_model.Transcript
    expected_vs_actual: list[Any]
    pair: tuple[str, str] | None


def transcript(db: Db, trajectory_id: str) -> TranscriptView:
    """One trajectory: messages, expected vs actual calls, its contrast pair if any."""
    from trace_lib.explore import transcript_loading as tl

    with store.connect(db, read_only=True) as con:
        t = tl.load_transcript(con, trajectory_id)
        pair = tl.contrast_pair(con, trajectory_id)
    return TranscriptView(t, call_alignment.expected_vs_actual(t) if t.expected else [], pair)


@dataclass
class Comparison:
    left: Any  # transcript_model.Transcript
    right: Any
    alignment: list[Any]  # AlignedRow of left's agent calls vs right's

    # The default pair (no other id given) is a passed (left) and a failed (right) trial;
    # these names keep `explore compare` and notebook 00 reading it that way.
    @property
    def passed(self) -> Any:
        return self.left

    @property
    def failed(self) -> Any:
        return self.right


def trials(db: Db, trajectory_id: str) -> pd.DataFrame:
    """Every trial of the trajectory's task in its dataset (itself included): id, trial,
    outcome, reward, termination (what the page offers to compare with)."""
    from trace_lib.explore import transcript_loading as tl

    with store.connect(db, read_only=True) as con:
        return tl.task_trials(con, trajectory_id)


def compare(db: Db, trajectory_id: str, other_id: str | None = None) -> Comparison:
    """Two trajectories aligned on tool calls: `trajectory_id` (left) against `other_id`
    (right, any trajectory); without `other_id`, a passed (left) and a failed (right)
    trial of the trajectory's task."""
    from trace_lib.explore import transcript_loading as tl

    with store.connect(db, read_only=True) as con:
        if other_id is not None:
            if other_id == trajectory_id:
                raise UserInputError(f"compare: {trajectory_id!r} with itself; choose "
                                     "another trajectory")
            pair: tuple[str, str] | None = (trajectory_id, other_id)
        else:
            pair = tl.contrast_pair(con, trajectory_id)
        if pair is None:
            raise UserInputError(
                f"trajectory {trajectory_id!r}: its task has no passed and failed "
                "trial with a known outcome to compare; give another trajectory id")
        left, right = (tl.load_transcript(con, i) for i in pair)
    return Comparison(left, right,
                      call_alignment.align_calls(left.agent_calls(), right.agent_calls()))
