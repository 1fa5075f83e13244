"""Bootstrap resamples of the pooled labels, as arrays: what bootstrap stability counts.

Design decisions
- Trajectories are resampled with replacement within failed and within passed ones (see
  stability.py for why). A resample is a row of multiplicities w[b, t], kept because the
  review queue's sensitivity needs each trajectory's weight in each resample; the counts
  per (resample, capability, outcome, value) are w @ one-hot(slot).
- Each resample has its own generator, `SeedSequence(seed).spawn(B)[b]`: resamples are
  drawn on a thread pool (numpy's integer draws and bincount release the GIL; at 1M
  trajectories x B=200 the draws were 2.9 s on one thread, 0.6 s on two cores) and the
  figures depend on the seed only, never on the number of threads.
- Only integers cross from the store into numpy. The trajectory index (failed first,
  then passed, each by id, so a stratum is a slice of columns) is one small table; the
  (trajectory, capability, value) pairs join it once. When every finished run counts
  they are read from `label_pairs` (the materialised effective value) with no
  intermediate table: 2.1 -> 1.1 s at 1M trajectories x 14 capabilities.
- Memory: multiplicities are uint8 (uint16 if a count passes 255), the counts are
  accumulated in float32 chunks (exact below 2^24); at 1M x B=200 w is 200 MB.
- The counts alone (`ResampleCounts`: caps and the (B, C, 6) counts) are what a ranking
  needs, and what the store keeps (`stability`, issue 35); `Resamples` adds the arrays the
  review queue's sensitivity needs (trajectory ids, outcomes, codes, multiplicities).
- `progress(fraction, text)`, when given, is called from the calling thread between the
  read, each resample drawn and each chunk counted (the Rankings page's bar when nothing
  was stored for the current labels).
- `draw_counts` gives the counts alone, drawing and counting a block of resamples at a
  time, so a label run's finish (and the page's pending path) never holds the (B, T)
  multiplicities; the same seeds give the same counts to the bit (tested).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from trace_lib.diagnose import materialise
from trace_lib.diagnose.ranking import POOLED_VALUES_SQL, run_filter_sql
from trace_lib.store.connection import Connection

# The same pairs when every finished run counts (the usual case): the materialised
# effective value (latest edit, else the majority with the same ties), no GROUP BY over
# every label (4 of the 10 s of a first bootstrap at 1M trajectories).
MAT_POOLED_SQL = ("SELECT trajectory_id, capability, value FROM label_pairs "
                  "WHERE n_rows > 0 AND value IS NOT NULL")
CODE_SQL = "CASE p.value WHEN 'lacking' THEN 0 WHEN 'present' THEN 1 ELSE 2 END"


Progress = Callable[[float, str], None]


@dataclass
class ResampleCounts:
    """What a bootstrap ranking counts: per resample and capability, lf pf nf lp pp np."""
    caps: list[str]
    counts: np.ndarray  # (B, C, 6) float64, whole numbers


@dataclass
class Resamples(ResampleCounts):
    """Pooled labels as arrays and the resample multiplicities (and their counts)."""
    tids: np.ndarray  # (T,) trajectory ids, failed first, then passed, each by id
    success: np.ndarray  # (T,) bool
    codes: np.ndarray  # (T, C) int8: 0 lacking, 1 present, 2 na, -1 unlabeled
    w: np.ndarray  # (B, T) multiplicities (uint8 / uint16)


def workers() -> int:
    """Threads for the draws and the counts: the cores this process may use, at most 8."""
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else os.cpu_count() or 1))


def multiplicities(success: np.ndarray, b: int, seed: int,
                   progress: Progress | None = None, rows: range | None = None
                   ) -> np.ndarray:
    """(B, T) how often each trajectory is drawn; resampled within failed and passed.
    `rows`: only those resamples of the B (the same draws as in the whole).

    `success` is sorted (failed first), so each stratum is a slice of columns."""
    if len(success) and not (success[:-1] <= success[1:]).all():
        raise ValueError("multiplicities expects the failed trajectories first")
    n_failed = int(np.count_nonzero(~success))
    strata = [(lo, hi) for lo, hi in ((0, n_failed), (n_failed, len(success))) if hi > lo]
    seeds = np.random.SeedSequence(seed).spawn(b)
    rows = range(b) if rows is None else rows

    def draw(w: np.ndarray, i: int) -> int:
        rng = np.random.default_rng(seeds[rows[i]])
        top = 0
        for lo, hi in strata:
            row = np.bincount(rng.integers(0, hi - lo, size=hi - lo), minlength=hi - lo)
            w[i, lo:hi] = row
            top = max(top, int(row.max()))
        return top

    for dtype in (np.uint8, np.uint16):
        w = np.empty((len(rows), len(success)), dtype=dtype)
        top = 0
        with ThreadPoolExecutor(workers()) as pool:
            for i, got in enumerate(pool.map(lambda i, w=w: draw(w, i), range(len(rows)))):
                top = max(top, got)
                if progress is not None and (i + 1) % 10 == 0:
                    progress((i + 1) / len(rows), f"drew {i + 1} of {len(rows)} resamples")
        if top <= np.iinfo(dtype).max:
            return w  # a count above 255 is all but impossible: then draw again, wider
    raise ValueError(f"a trajectory was drawn {top} times in one resample")


def resample_counts(w: np.ndarray, codes: np.ndarray, success: np.ndarray,
                    chunk: int = 1 << 16, progress: Progress | None = None) -> np.ndarray:
    """(B, C, 6) counts per resample: w @ one-hot(capability, value) per stratum (a
    trajectory only ever counts in its own outcome's slots, so the one-hot needs 3 columns
    per capability, not 6: half the multiply-adds), a chunk of trajectories at a time in
    float32 (exact: every count is below 2^24) on the thread pool, so neither w nor the
    one-hot matrix is ever materialised in float64."""
    b, (t, c) = w.shape[0], codes.shape
    n_failed = int(np.count_nonzero(~success))
    chunks = [(s, lo, min(lo + chunk, hi))
              for s, (lo0, hi) in enumerate(((0, n_failed), (n_failed, t)))
              for lo in range(lo0, hi, chunk)]

    def part(job: tuple[int, int, int]) -> tuple[int, np.ndarray]:
        s, lo, hi = job
        piece = codes[lo:hi]
        onehot = np.zeros((hi - lo, c * 3), dtype=np.float32)
        rows, cols = np.nonzero(piece >= 0)
        onehot[rows, cols * 3 + piece[rows, cols]] = 1.0
        return s, w[:, lo:hi].astype(np.float32) @ onehot

    counts = np.zeros((b, c, 2, 3))
    # One BLAS thread per pool worker: the pool already spreads the chunks over the cores,
    # and OpenBLAS's own threads on top of it spin. On the loaded 2-core box a block of 40
    # resamples x 1M trajectories counted in 3-16 s with two BLAS threads, 0.34 s with one
    # (threadpoolctl limits the whole process for the while: brief, and harmless).
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, user_api="blas"), ThreadPoolExecutor(workers()) as pool:
        for i, (s, p) in enumerate(pool.map(part, chunks)):
            counts[:, :, s, :] += p.reshape(b, c, 3)
            if progress is not None:
                progress((i + 1) / len(chunks), f"counted {i + 1} of {len(chunks)} chunks")
    return counts.reshape(b, c, 6)  # slot 3 * passed + value


def pooled_arrays(con: Connection, run_ids: list[str], scope_sql: str, scope_params: list,
                  ids: bool = True
                  ) -> tuple[np.ndarray | None, np.ndarray, list[str], np.ndarray]:
    """(trajectory ids, success, capabilities, codes) of the trajectories in scope with a
    known outcome and at least one pooled label over `run_ids`, failed first; `ids`
    False: no ids (the counts need none, and 1M strings are 0.3 s to fetch)."""
    if materialise.counts_every_finished_run(con, run_ids):
        materialise.sync(con)
        pairs = MAT_POOLED_SQL
    else:
        where, params = run_filter_sql(run_ids)
        con.execute("CREATE OR REPLACE TEMP TABLE boot_pooled AS "
                    + POOLED_VALUES_SQL.format(run_filter=where), params)
        pairs = "SELECT * FROM boot_pooled"
    try:
        con.execute(f"""
            CREATE OR REPLACE TEMP TABLE boot_tix AS
            SELECT t.id AS trajectory_id, t.success,
                   row_number() OVER (ORDER BY t.success, t.id) - 1 AS ti
            FROM trajectories t
            WHERE t.success IS NOT NULL AND {scope_sql}
              AND t.id IN (SELECT trajectory_id FROM ({pairs}))""", scope_params)
        tix = con.execute(f"SELECT {'trajectory_id, ' if ids else ''}success FROM boot_tix "
                          "ORDER BY ti").fetchnumpy()
        # Every capability with a pair anywhere; those with none in scope are dropped below.
        caps = [r[0] for r in con.execute(
            f"SELECT DISTINCT capability FROM ({pairs}) ORDER BY capability").fetchall()]
        res = con.execute(f"""
            WITH c AS (SELECT unnest(?::VARCHAR[]) AS capability,
                              generate_subscripts(?::VARCHAR[], 1) - 1 AS ci)
            SELECT x.ti::INTEGER AS ti, c.ci::SMALLINT AS ci, ({CODE_SQL})::TINYINT AS code
            FROM ({pairs}) p JOIN boot_tix x USING (trajectory_id)
            JOIN c USING (capability)""", [caps, caps]).fetchnumpy()
    finally:
        con.execute("DROP TABLE IF EXISTS boot_pooled")
        con.execute("DROP TABLE IF EXISTS boot_tix")
    tids = np.asarray(tix["trajectory_id"], dtype=object) if ids else None
    success = np.asarray(tix["success"], dtype=bool)
    codes = np.full((len(success), len(caps)), -1, dtype=np.int8)
    codes[np.asarray(res["ti"], dtype=np.int64), np.asarray(res["ci"], dtype=np.int64)] = (
        np.asarray(res["code"], dtype=np.int8))
    labeled = (codes >= 0).any(axis=0)
    if not labeled.all():
        caps = [c for c, keep in zip(caps, labeled, strict=True) if keep]
        codes = np.ascontiguousarray(codes[:, labeled])
    return tids, success, caps, codes


def _part(progress: Progress | None, lo: float, hi: float) -> Progress | None:
    return None if progress is None else (
        lambda f, text: progress(lo + (hi - lo) * f, text))


def draw_resamples(con: Connection, run_ids: list[str], b: int, seed: int,
                   scope_sql: str, scope_params: list,
                   progress: Progress | None = None) -> Resamples:
    """B stratified resamples of the trajectories in scope with a known outcome and at
    least one pooled label over `run_ids`. `progress` hears of the read (the first 30%),
    the draws (to 70%) and the counts (to 100%)."""
    if progress is not None:
        progress(0.0, "reading the pooled labels")
    tids, success, caps, codes = pooled_arrays(con, run_ids, scope_sql, scope_params)
    assert tids is not None
    if progress is not None:
        progress(0.3, f"drawing {b} resamples of {len(tids):,} trajectories")
    w = multiplicities(success, b, seed, _part(progress, 0.3, 0.7))
    counts = resample_counts(w, codes, success, progress=_part(progress, 0.7, 1.0))
    return Resamples(caps=caps, counts=counts, tids=tids, success=success, codes=codes, w=w)


def draw_counts(con: Connection, run_ids: list[str], b: int, seed: int, scope_sql: str,
                scope_params: list, progress: Progress | None = None, block: int = 40
                ) -> ResampleCounts:
    """`draw_resamples`' counts alone, `block` resamples at a time: the same draws and,
    every count being a whole number below 2^24, the same counts to the bit, without ever
    holding the (B, T) multiplicities (2 GB at 10M trajectories x B=200; a block of 40 is
    400 MB there). What a label run's finish stores."""
    if progress is not None:
        progress(0.0, "reading the pooled labels")
    _, success, caps, codes = pooled_arrays(con, run_ids, scope_sql, scope_params, ids=False)
    counts = np.zeros((b, len(caps), 6))
    for lo in range(0, b, block):
        if progress is not None:
            progress(0.3 + 0.7 * lo / b, f"drawing and counting resamples {lo + 1}-"
                     f"{min(lo + block, b)} of {b} ({len(success):,} trajectories)")
        w = multiplicities(success, b, seed, rows=range(lo, min(lo + block, b)))
        counts[lo:lo + len(w)] = resample_counts(w, codes, success)
    if progress is not None:
        progress(1.0, f"counted {b} resamples")
    return ResampleCounts(caps=caps, counts=counts)
