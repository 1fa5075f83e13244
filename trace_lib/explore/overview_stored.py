"""The Trajectories page's unfiltered view, computed when trajectories are imported and
stored, so that the page's first visit reads it (issue 35, part 2).

Design decisions
- The page's first visit (no filter touched) shows the filter widgets' options, the
  outcome summary, the four charts' frames, the tool table and the first 500 rows of the
  listing, every one an aggregate over the whole store: ~0.5 s of CPU at 1M
  trajectories, linear in the store (5 s or more at 10M). None of it depends on a widget,
  so it is computed once, where the trajectories change, and stored in the store
  (`store.explore_stored`): a server start, a second process and the CLI find it.
- `store_default` is what an import's finish calls (`workbench.data.import_files`,
  `workbench.evaluation.import_episodes`, `explore reindex`, `demo build`), after the
  import committed: the stage that imports (`ingest`) knows nothing of explore, so the
  use cases that import call it. Its cost is an import's, once (bench/README.md, "Session
  22, part 2").
- Keyed by the trajectories' fingerprint (`explore_stored.fingerprint`): whatever wrote
  the trajectories, their calls or the datasets' names (an importer that did not call
  `store_default`, a deleted dataset, plain SQL), the stored view is not read for them; the
  next visit computes it (what every visit did before) and stores it, if it can write.
- The fingerprint is one scan of two tables; it is kept per store file state
  (`store.file_memo`: the store's, its WAL's and the index's sizes and mtimes, the key
  the page caches its results under), in the process and in the store's side file, so
  the options and the overview of one visit fingerprint once, and a server restart on an
  unchanged store not at all.
- A filter (any field set) is computed as before: what an action costs is the filter's.
  `bench/explore.py`'s computed-paths peer (`derived.computed_paths`) never reads it.
- Frames are stored as Parquet (pyarrow): dtypes, NaN and None come back as computed, so
  the stored view equals the computed one (`pandas.testing.assert_frame_equal`, tested).
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable

import pandas as pd

from trace_lib.explore import queries
from trace_lib.explore.queries import TrajectoryFilter
from trace_lib.store import derived, explore_stored, file_memo
from trace_lib.store.connection import Connection

LIMIT = 500  # the listing's rows on the page (`workbench.explore.trajectories_page`)

# The frames of the unfiltered view, in the order the page reads them.
FRAMES: dict[str, Callable[[Connection], pd.DataFrame]] = {
    "options": queries.filter_options,
    "summary": lambda con: queries.outcome_summary(con, None),
    "by_domain": lambda con: queries.success_by_domain_agent(con, None),
    "terminations": lambda con: queries.termination_counts(con, None),
    "tool_calls": lambda con: queries.tool_call_histogram(con, None),
    "tool_usage": lambda con: queries.tool_usage(con, None),
    "error_kinds": lambda con: queries.tool_error_kinds(con, None),
}
LISTING = "listing"

# Kept per state of the store's files, in the process and beside the store (a first visit
# after a server start does not hash every trajectory again).
_VERSIONS: file_memo.FileMemo[str] = file_memo.FileMemo("explore_fingerprint", 8, persist=True)


def unfiltered(flt: TrajectoryFilter | None) -> bool:
    """Whether `flt` restricts nothing (the page's first visit, `explore stats` alone)."""
    return flt is None or flt == TrajectoryFilter()


def key(limit: int) -> str:
    return json.dumps({"filter": None, "listing": int(limit)})


def version(con: Connection) -> str:
    """`explore_stored.fingerprint`, kept per store file state (`store.file_memo`)."""
    return _VERSIONS.get(con, (), lambda: explore_stored.fingerprint(con))


def compute(con: Connection, limit: int = LIMIT) -> dict[str, pd.DataFrame]:
    """The unfiltered view from the tables (what is stored)."""
    out = {name: frame(con) for name, frame in FRAMES.items()}
    out[LISTING] = queries.list_trajectories(con, None, limit=limit)
    return out


def _to_bytes(df: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    df.to_parquet(buf, engine="pyarrow")
    return buf.getvalue()


def _from_bytes(data: bytes) -> pd.DataFrame:
    return pd.read_parquet(io.BytesIO(data), engine="pyarrow")


def read(con: Connection, limit: int = LIMIT, names: tuple[str, ...] | None = None
         ) -> dict[str, pd.DataFrame] | None:
    """The stored unfiltered view (or the frames `names` of it) for the store as it is,
    else None."""
    if derived.computed_paths(con):
        return None
    got = explore_stored.read(con, key(limit), version(con))
    wanted = [*FRAMES, LISTING] if names is None else list(names)
    if got is None or not set(wanted) <= set(got):
        return None
    return {name: _from_bytes(got[name]) for name in wanted}


def store(con: Connection, frames: dict[str, pd.DataFrame], v: str, compute_s: float,
          limit: int = LIMIT) -> bool:
    """Store `frames` (all of `compute`) as computed at fingerprint `v`; False when the
    connection cannot write."""
    return explore_stored.write(con, key(limit), v, {n: _to_bytes(df) for n, df in
                                                     frames.items()}, compute_s)


def store_default(con: Connection, limit: int = LIMIT) -> str:
    """What an import's finish calls: compute and store the unfiltered view unless it is
    stored for these trajectories; where it came from (stored | computed)."""
    from trace_lib.explore import overview_rollup

    v = explore_stored.fingerprint(con)
    # The filters' rollup too (`overview_rollup`): a filter change then reads cells.
    rolled = overview_rollup.store_default(con, v)
    if explore_stored.read(con, key(limit), v) is not None:
        return "stored" if rolled == "stored" else "computed"
    t0 = time.perf_counter()
    frames = compute(con, limit)
    store(con, frames, v, time.perf_counter() - t0, limit)
    return "computed"
