"""Stability of the K-of-N selection: over label runs, or over bootstrap resamples of the
trajectories when the runs cannot differ; and the ranking's sensitivity to one flip.

Design decisions
- A deterministic labeler (the offline heuristic) repeats itself, so N runs of it say
  nothing about stability (std 0, every run passes or none does). When the counted runs
  give no run-to-run variation (one run, or every pair unanimous) the `auto` method draws
  B bootstrap resamples of trajectories instead and uses them as the runs behind K-of-N:
  trajectories are resampled with replacement *within* failed and within passed ones (so
  each resample keeps the number of failures and passes, and ER-/ER+ stay defined), the
  labels are the pooled effective labels (latest edit, else the majority over the runs),
  the rule per resample is the ranking's (Cov >= rho and Delta >= delta), and K of the
  reference N=10 becomes ceil(K * B / 10) of B. Seeded (one generator per resample,
  resamples.py), so the same store gives the same figures. The note says "stability
  from B bootstrap resamples, not independent label runs". Pooled figures (Fisher p, Wilson intervals) stay the run
  ranking's: they are over the whole sample already.
- Sensitivity comes from the keep rule itself: for each (trajectory, capability) pair
  and each other value, re-count every run (or resample, weighting the trajectory by its
  multiplicity) as if a person had set that value (an edit applies to every run), and
  see whether the capability's kept/not-kept verdict changes (`flips_keep`) and by what
  share of the runs the pass count moves (`sensitivity`, in [0, 1]). Runs: one table of
  pass-after-flip per (run, outcome, old value, new value), then a gather per pair; the
  per-run codes come from one GROUP BY in the store (`_run_codes`), not a pandas pivot.
  Resamples: a flip moves resample b's counts by the trajectory's multiplicity m, so
  pass-after-flip is a table over (resample, outcome, old, new, m); only the resamples
  where some entry differs from today's verdict are looked up per pair (equal to a
  recount of every resample: tested). 10k pairs x 14 capabilities x B=200: 6 s -> 0.1 s;
  runs at 100k x 10 runs: 59 s -> 3 s.
- Stored, not recomputed on a first visit (issue 35). What no slider moves (rho, delta,
  K) is what `auto` resolved to and, for the bootstrap, the (B, C, 6) counts per resample
  and capability. It depends on the store's labels (`materialise.version`: every run,
  edit, undo and capability change moves it), the counted runs, the scope, the requested
  method, B and seed, and is stored under exactly those (`stability_key`, table
  `rank_stability`, `trace_lib.store.rank_stored`). A label run's finish stores it for
  the Rankings page's defaults (`rank_precompute.store_default`: the whole store, every
  finished run, `StabilityConfig()`), so that page, `rank` and a notebook read 2,800 count rows instead
  of drawing B x 1M multiplicities; any other inputs compute as before and store their
  entry too. A ranking takes, in order: this process's full resamples for the version
  (`_BOOT_CACHE`), the stored entry for the version, or a computation, which it stores;
  `StableRanking.source` says which. The per-run counts of the runs method are already the
  materialised `label_run_counts`: its entry holds only the resolution.
- Sensitivity needs the multiplicities, which are not stored (200 MB at 1M x B=200): a
  ranking built from stored counts has none, and `sensitivity` draws them (the same seed,
  so the same counts; tested) when the review queue asks. What stores the counts ahead
  of a ranking (`prepare`: a label run's finish, the page's pending path) counts a block
  of resamples at a time (`resamples.draw_counts`) and keeps nothing in memory.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from trace_lib.diagnose import materialise
from trace_lib.diagnose.label_runs import left_out_note
from trace_lib.diagnose.ranking import (
    POOLED_VALUES_SQL,
    REFERENCE_N,
    CapabilityRank,
    RankConfig,
    Ranking,
    RunFigures,
    rank_con,
    run_filter_sql,
)
from trace_lib.diagnose.resamples import (
    Progress,
    ResampleCounts,
    Resamples,
    draw_counts,
    draw_resamples,
)
from trace_lib.errors import UserInputError
from trace_lib.scope import Scope
from trace_lib.store import rank_stored as stored
from trace_lib.store.connection import Connection
from trace_lib.store.labels import left_out_runs

VALUES = ("lacking", "present", "na")  # code 0, 1, 2 (slot = 3 * passed + code)
METHODS = ("auto", "runs", "bootstrap")


def counted_run_ids(con: Connection, runs: list[str] | None) -> list[str]:
    """The finished runs the ranking counts (all, or `runs`), oldest first."""
    all_runs = [r[0] for r in con.execute(
        "SELECT id FROM label_runs ORDER BY started_at, id").fetchall()]
    if runs is not None:
        unknown = sorted(set(runs) - set(all_runs))
        if unknown:
            raise UserInputError(f"--runs: unknown label run(s) {', '.join(unknown)}; "
                                 f"known: {', '.join(all_runs) or '(none)'}")
    unfinished = {r["run"] for r in left_out_runs(con)}
    return [r for r in all_runs if r not in unfinished and (runs is None or r in runs)]


# ------------------------------------------------------------------------ stability

@dataclass
class StabilityConfig:
    method: str = "auto"  # auto | runs | bootstrap
    b: int = 200  # bootstrap resamples
    seed: int = 0


@dataclass
class StabilityInfo:
    method: str  # what was used: runs | bootstrap
    reason: str
    b: int | None = None
    seed: int | None = None

    def sentence(self) -> str:
        if self.method == "bootstrap":
            return (f"stability from {self.b} bootstrap resamples, not independent label runs "
                    f"({self.reason}; seed {self.seed})")
        return f"stability from independent label runs ({self.reason})"


def _check(st: StabilityConfig) -> None:
    if st.method not in METHODS:
        raise UserInputError(f"stability: method {st.method!r}: expected one of "
                             f"{', '.join(METHODS)}")
    if not 10 <= st.b <= 5000:
        raise UserInputError(f"stability: bootstrap resamples {st.b}: expected 10..5000")


def runs_vary(con: Connection, run_ids: list[str]) -> bool:
    """Whether any pair gets different values from different runs (raw labels)."""
    if materialise.counts_every_finished_run(con, run_ids):
        # Every finished run counts (the usual case): the materialised votes per pair
        # answer it without a scan of every label (1.1 s at 100k x 10 runs, on every
        # slider move of the Rankings page).
        materialise.sync(con)
        return con.execute("SELECT 1 FROM label_pairs WHERE (nl > 0)::INT + (np > 0)::INT "
                           "+ (nn > 0)::INT > 1 LIMIT 1").fetchone() is not None
    return con.execute("""
        SELECT 1 FROM counted_labels
        WHERE value IS NOT NULL AND run_id IN (SELECT unnest(?::VARCHAR[]))
        GROUP BY trajectory_id, capability HAVING count(DISTINCT value) > 1 LIMIT 1""",
                       [run_ids]).fetchone() is not None


def resolve(con: Connection, run_ids: list[str], st: StabilityConfig
            ) -> StabilityInfo:
    _check(st)
    boot = StabilityInfo("bootstrap", "", st.b, st.seed)
    if st.method == "bootstrap":
        boot.reason = "chosen"
        return boot
    if st.method == "runs":
        return StabilityInfo("runs", "chosen")
    if len(run_ids) < 2:
        boot.reason = f"{len(run_ids)} label run, so runs cannot show stability"
        return boot
    if not runs_vary(con, run_ids):
        boot.reason = (f"the {len(run_ids)} label runs are identical (a deterministic "
                       "labeler)")
        return boot
    return StabilityInfo("runs", f"{len(run_ids)} runs that differ")


def _boot_key(con: Connection, run_ids: list[str], st: StabilityConfig, scope: Scope
              ) -> tuple:
    sc, sp = scope.where(con, "t")
    return (tuple(run_ids), sc, tuple(map(str, sp)), st.b, st.seed)


def _boot(con: Connection, run_ids: list[str], st: StabilityConfig,
          scope: Scope, progress: Progress | None = None) -> Resamples:
    """The resamples, cached per (store, store version, runs, scope, B, seed): they do not
    depend on rho, delta or K, so a Rankings slider move reuses them (at 1M trajectories x
    1 run they took ~25 s per move; now once per store version and process)."""
    sc, sp = scope.where(con, "t")
    return _BOOT_CACHE.get(con, _boot_key(con, run_ids, st, scope),
                           lambda: draw_resamples(con, run_ids, st.b, st.seed, sc, sp,
                                                  progress))


# A few entries only: one at 1M trajectories x B=200 holds ~200 MB of multiplicities.
_BOOT_CACHE = materialise.StoreMemo(size=2)


def _figures(c: np.ndarray, rho: float, delta: float) -> dict[str, np.ndarray]:
    """Cov, ER-, ER+, Delta and pass over the last axis (lf pf nf lp pp np); NaN = undefined."""
    lf, pf, nf, lp, pp = (c[..., i] for i in range(5))
    with np.errstate(divide="ignore", invalid="ignore"):
        cov = np.where(lf + pf + nf > 0, lf / (lf + pf + nf), np.nan)
        er_m = np.where(lf + pf > 0, lf / (lf + pf), np.nan)
        er_p = np.where(lp + pp > 0, lp / (lp + pp), np.nan)
    d = er_m - er_p
    passed = ~np.isnan(cov) & ~np.isnan(d) & (np.nan_to_num(cov, nan=-9) >= rho) & (
        np.nan_to_num(d, nan=-9) >= delta)
    return {"cov": cov, "er_m": er_m, "er_p": er_p, "delta": d, "passed": passed}


def _opt(x: float) -> float | None:
    return None if np.isnan(x) else float(x)


def boot_k(k: int, b: int) -> int:
    """K of the reference N=10 as K of B resamples."""
    return max(1, math.ceil(k * b / REFERENCE_N))


def bootstrap_ranking(con: Connection, cfg: RankConfig, info: StabilityInfo,
                      base: Ranking, boot: ResampleCounts) -> Ranking:
    """`base` (the run ranking: pooled figures, Fisher, intervals) with its per-run figures
    replaced by per-resample ones and K-of-N by K-of-B."""
    b = int(info.b or 0)
    k_eff = boot_k(cfg.k, b)
    figs = _figures(boot.counts, cfg.rho, cfg.delta)
    c_index = {c: i for i, c in enumerate(boot.caps)}
    rows: list[CapabilityRank] = []
    for r in base.rows:
        j = c_index.get(r.capability)
        if j is None:
            rows.append(r)
            continue
        runs = []
        for i in range(b):
            cnt = [int(round(x)) for x in boot.counts[i, j]]
            runs.append(RunFigures(f"boot-{i + 1:03d}", _opt(figs["cov"][i, j]),
                                   _opt(figs["delta"][i, j]), _opt(figs["er_m"][i, j]),
                                   _opt(figs["er_p"][i, j]), *cnt,
                                   bool(figs["passed"][i, j])))
        covs = figs["cov"][:, j][~np.isnan(figs["cov"][:, j])]
        deltas = figs["delta"][:, j][~np.isnan(figs["delta"][:, j])]
        n_pass = int(figs["passed"][:, j].sum())
        rows.append(CapabilityRank(
            capability=r.capability, description=r.description, status=r.status,
            mean_cov=float(covs.mean()) if len(covs) else None,
            std_cov=float(covs.std()) if len(covs) else None,
            mean_delta=float(deltas.mean()) if len(deltas) else None,
            std_delta=float(deltas.std()) if len(deltas) else None,
            n_runs_passed=n_pass, n_runs_total=b, n_runs_defined=len(deltas),
            selected=n_pass >= k_eff and r.status != "rejected", fisher_p=r.fisher_p,
            cov_ci=r.cov_ci, er_minus_ci=r.er_minus_ci, er_plus_ci=r.er_plus_ci,
            pooled=r.pooled, runs=runs))
    rows.sort(key=lambda r: (not r.selected, r.mean_delta is None, -(r.mean_delta or 0.0),
                             r.capability))
    note = (f"{info.sentence()}: trajectories resampled with replacement within failed and "
            f"within passed ones; kept iff Cov ≥ rho and Delta ≥ delta in at least {k_eff} "
            f"of {b} resamples (K={cfg.k} of {REFERENCE_N} scaled)")
    left = left_out_note(base.left_out)
    return Ranking(rows, cfg, k_eff, b, f"{note}; {left}" if left else note, base.left_out,
                   scope=base.scope)


@dataclass
class StableRanking:
    ranking: Ranking
    info: StabilityInfo
    run_ids: list[str]
    scope: Scope = field(default_factory=Scope)
    # The bootstrap's counts: `Resamples` when drawn in this process, the counts alone
    # when read from the store (`sensitivity` draws the rest when it needs them).
    boot: ResampleCounts | None = None
    # Where the threshold-free part came from: computed | memory | stored | chosen (the
    # runs method asked for by name: nothing to compute).
    source: str = "computed"


# ------------------------------------------------------------ stored threshold-free part

def stability_key(con: Connection, run_ids: list[str], st: StabilityConfig,
                  scope: Scope) -> str:
    """The inputs a stored entry answers for (besides the store version): the counted
    runs, the scope as SQL, the requested method, B and seed."""
    sc, sp = scope.where(con, "t")
    return json.dumps({"runs": list(run_ids), "scope": [sc, [str(p) for p in sp]],
                       "method": st.method, "b": st.b, "seed": st.seed}, sort_keys=True)


def _threshold_free(con: Connection, run_ids: list[str], st: StabilityConfig,
                    scope: Scope, progress: Progress | None = None, *,
                    keep_weights: bool = True
                    ) -> tuple[StabilityInfo, ResampleCounts | None, str]:
    """What `auto` resolved to and the bootstrap counts, and where they came from: this
    process's resamples, the store, or computed now (with `progress`) and stored.
    `keep_weights` False: count without the multiplicities, and keep nothing in memory
    (a label run's finish, the page's pending path)."""
    _check(st)
    if st.method == "runs":
        return StabilityInfo("runs", "chosen"), None, "chosen"
    key, version = stability_key(con, run_ids, st, scope), materialise.version_hash(con)
    got = stored.read(con, key, version)
    if got is not None:
        info = StabilityInfo(got.method, got.reason, got.b, got.seed)
        if got.method == "runs":
            return info, None, "stored"
        memo = _BOOT_CACHE.peek(con, _boot_key(con, run_ids, st, scope))
        if memo is not None:
            return info, memo, "memory"
        assert got.counts is not None
        return info, ResampleCounts(got.caps, got.counts), "stored"
    t0 = time.perf_counter()
    info = resolve(con, run_ids, st)
    boot: Resamples | None = None
    source = "computed"
    if info.method == "bootstrap":
        boot = _BOOT_CACHE.peek(con, _boot_key(con, run_ids, st, scope))
        if boot is not None:
            source = "memory"
        elif keep_weights:
            boot = _boot(con, run_ids, st, scope, progress)
        else:
            sc, sp = scope.where(con, "t")
            boot = draw_counts(con, run_ids, st.b, st.seed, sc, sp, progress)
    stored.write(con, key, version, stored.StoredStability(
        info.method, info.reason, info.b, info.seed, list(boot.caps) if boot else [],
        boot.counts if boot else None, time.perf_counter() - t0))
    return info, boot, source


def stability_pending(con: Connection, runs: list[str] | None, st: StabilityConfig,
                      scope: Scope, version: tuple | None = None) -> bool:
    """Whether a ranking with these inputs would have to draw bootstrap resamples (nothing
    stored for the current labels, nothing in this process); `version`: the store's
    `materialise.version` if the caller has just read it."""
    _check(st)
    run_ids = counted_run_ids(con, runs)
    if st.method == "runs" or not run_ids:
        return False
    key = stability_key(con, run_ids, st, scope)
    if stored.has(con, key, materialise.version_hash(con, version)):
        return False
    return (resolve(con, run_ids, st).method == "bootstrap"
            and _BOOT_CACHE.peek(con, _boot_key(con, run_ids, st, scope)) is None)


def prepare(con: Connection, runs: list[str] | None, st: StabilityConfig, scope: Scope,
            progress: Progress | None = None) -> str:
    """Make sure the threshold-free part for these inputs is stored (computing its counts
    alone, with `progress`, if need be: nothing is kept in memory); where it came from."""
    run_ids = counted_run_ids(con, runs)
    if not run_ids:
        return "none"
    return _threshold_free(con, run_ids, st, scope, progress, keep_weights=False)[2]


def stable_ranking(con: Connection, cfg: RankConfig | None = None,
                   st: StabilityConfig | None = None, *, scope: Scope | None = None
                   ) -> StableRanking:
    """The ranking with stability from runs, or from bootstrap resamples (see `resolve`);
    the threshold-free part read from the store when it holds it for these inputs."""
    cfg = cfg or RankConfig()
    st = st or StabilityConfig()
    scope = scope or Scope()
    base = rank_con(con, cfg, scope=scope)  # validates cfg, the run names and the scope
    run_ids = counted_run_ids(con, cfg.runs)
    if not run_ids:
        return StableRanking(base, resolve(con, run_ids, st), run_ids, scope,
                             source="computed")
    info, boot, source = _threshold_free(con, run_ids, st, scope)
    if info.method == "runs" or boot is None:
        return StableRanking(base, info, run_ids, scope, source=source)
    return StableRanking(bootstrap_ranking(con, cfg, info, base, boot), info, run_ids, scope,
                         boot, source)


# ---------------------------------------------------------------------- sensitivity

SENS_COLUMNS = ["trajectory_id", "capability", "value", "flip_to", "flips_keep",
                "sensitivity"]


def _best_flip(cur: np.ndarray, new_pass: dict[int, np.ndarray], n_pass: int, kept: bool,
               k_eff: int, n_total: int, can_keep: bool) -> tuple[np.ndarray, ...]:
    """Per pair: the value to flip to, whether it flips keep, the share of passes moved."""
    flip_to = np.full(len(cur), -1)
    flips = np.zeros(len(cur), dtype=bool)
    sens = np.zeros(len(cur))
    for v, npass in new_pass.items():
        moved = np.abs(npass - n_pass) / max(n_total, 1)
        flip_v = ((npass >= k_eff) != kept) & can_keep & (cur != v)
        better = (flip_v & ~flips) | ((flip_v == flips) & (moved > sens) & (cur != v))
        flip_to = np.where(better, v, flip_to)
        sens = np.where(better, moved, sens)
        flips |= flip_v
    return flip_to, flips, sens


def _sensitivity_boot(sr: StableRanking, cfg: RankConfig, chunk: int = 1 << 22
                      ) -> pd.DataFrame:
    """Sensitivity under the bootstrap, without recounting each resample per pair.

    Flipping one pair changes resample b's counts by its multiplicity m = w[b, t] (moved
    from slot (success, old) to (success, new)), so whether b passes after the flip is a
    function of (b, success, old, new, m): a table of B x 2 x 3 x 3 x (max m + 1) keep-rule
    evaluations per capability. Most resamples pass or fail whatever one pair does; only
    the "critical" ones (some entry differs from today's outcome) are looked up per pair.
    The cost is O(pairs x critical resamples) instead of O(pairs x B x 6) count updates
    (6.1 s -> see bench/README "Pages" at 10k trajectories, B = 200)."""
    boot = sr.boot
    assert isinstance(boot, Resamples)
    b = boot.w.shape[0]
    w = boot.w
    ms = np.arange(int(w.max(initial=0)) + 1)
    rows_by_cap = {r.capability: r for r in sr.ranking.rows}
    out = []
    for j, cap in enumerate(boot.caps):
        r = rows_by_cap.get(cap)
        if r is None:
            continue
        base = boot.counts[:, j, :]  # (B, 6)
        before = _figures(base, cfg.rho, cfg.delta)["passed"]  # (B,)
        c = np.broadcast_to(base[:, None, None, None, None, :],
                            (b, 2, 3, 3, len(ms), 6)).copy()
        for s in (0, 1):
            for old in range(3):
                for v in range(3):
                    c[:, s, old, v, :, 3 * s + old] -= ms
                    c[:, s, old, v, :, 3 * s + v] += ms
        change = (_figures(c, cfg.rho, cfg.delta)["passed"].astype(np.int8)
                  - before.astype(np.int8)[:, None, None, None, None])  # -1, 0, +1
        critical = np.flatnonzero(change.reshape(b, -1).any(axis=1))
        labeled = np.flatnonzero(boot.codes[:, j] >= 0)
        cur = boot.codes[labeled, j].astype(int)
        succ = boot.success[labeled].astype(int)
        n_before = int(before.sum())
        new_pass = {v: np.full(len(labeled), n_before) for v in range(3)}
        step = max(1, chunk // max(len(labeled), 1))  # resamples per gather (memory bound)
        for start in range(0, len(critical), step):
            bs = critical[start:start + step]
            m = w[np.ix_(bs, labeled)].astype(np.intp)  # (critical, pairs)
            for v in range(3):
                new_pass[v] += change[bs[:, None], succ, cur, v, m].sum(axis=0)
        flip_to, flips, sens = _best_flip(cur, new_pass, r.n_runs_passed, r.selected,
                                          sr.ranking.k_effective, b, r.status != "rejected")
        out.append(pd.DataFrame({
            "trajectory_id": boot.tids[labeled], "capability": cap,
            "value": [VALUES[x] for x in cur],
            "flip_to": [VALUES[x] if x >= 0 else None for x in flip_to],
            "flips_keep": flips, "sensitivity": sens}))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=SENS_COLUMNS)


def _run_codes(con: Connection, run_ids: list[str], scope: Scope
               ) -> dict[str, np.ndarray]:
    """Per (capability, trajectory) of known outcome, sorted: its success, each run's code
    (k: -2 no row, so an edit leaves that run alone; -1 a row without a value, an edit
    adds one; 0..2 the value after the latest edit) and the pooled value it has today.
    One GROUP BY in the store; the columns come back as numpy arrays."""
    sc, sp = scope.where(con, "t")
    where, params = run_filter_sql(run_ids)
    pooled = POOLED_VALUES_SQL.format(run_filter=where)
    codes = ", ".join(f"coalesce(max(code) FILTER (WHERE ri = {i + 1}), -2) AS k{i}"
                      for i in range(len(run_ids)))
    res = con.execute(f"""
        WITH lab AS (
            SELECT list_position(?::VARCHAR[], l.run_id) AS ri, l.trajectory_id,
                   l.capability, t.success,
                   CASE coalesce(e.value, l.value) WHEN 'lacking' THEN 0 WHEN 'present'
                        THEN 1 WHEN 'na' THEN 2 ELSE -1 END AS code
            FROM counted_labels l
            JOIN trajectories t ON t.id = l.trajectory_id
            LEFT JOIN latest_label_edits e
              ON e.trajectory_id = l.trajectory_id AND e.capability = l.capability
            WHERE t.success IS NOT NULL AND list_position(?::VARCHAR[], l.run_id) > 0
              AND {sc}
        )
        SELECT w.capability, w.trajectory_id, w.success, p.value AS pooled, w.* EXCLUDE
               (capability, trajectory_id, success)
        FROM (SELECT capability, trajectory_id, any_value(success) AS success, {codes}
              FROM lab GROUP BY capability, trajectory_id) w
        LEFT JOIN ({pooled}) p USING (trajectory_id, capability)
        ORDER BY w.capability, w.trajectory_id""",
                      [run_ids, run_ids, *sp, *params]).fetchnumpy()
    return res


def _sensitivity_runs(con: Connection, sr: StableRanking, cfg: RankConfig
                      ) -> pd.DataFrame:
    run_ids = sr.run_ids
    if not run_ids:
        return pd.DataFrame(columns=SENS_COLUMNS)
    data = _run_codes(con, run_ids, sr.scope)
    caps = np.asarray(data["capability"], dtype=object)
    k_all = np.stack([np.asarray(data[f"k{i}"], dtype=int) for i in range(len(run_ids))],
                     axis=1) if len(caps) else np.zeros((0, len(run_ids)), dtype=int)
    pooled = np.asarray(data["pooled"], dtype=object)
    if hasattr(data["pooled"], "mask"):  # NULL (no pooled value) comes back masked
        pooled[np.ma.getmaskarray(data["pooled"])] = None
    code = {v: i for i, v in enumerate(VALUES)}
    r_index = {r: i for i, r in enumerate(run_ids)}
    out = []
    for r in sr.ranking.rows:
        lo, hi = np.searchsorted(caps, r.capability, "left"), np.searchsorted(
            caps, r.capability, "right")
        if lo == hi:
            continue
        k = k_all[lo:hi]
        s = np.asarray(data["success"][lo:hi], dtype=bool).astype(int)
        counts = np.zeros((len(run_ids), 6))
        for f in r.runs:
            if f.run in r_index:
                counts[r_index[f.run]] = [f.lf, f.pf, f.nf, f.lp, f.pp, f.np]
        # table[run, success, old + 2, new] = does the run pass after the flip
        table = np.zeros((len(run_ids), 2, 5, 3), dtype=bool)
        for si in (0, 1):
            for oi, old in enumerate((-2, -1, 0, 1, 2)):
                for v in range(3):
                    c = counts.copy()
                    if old != -2:
                        if old >= 0:
                            c[:, 3 * si + old] -= 1
                        c[:, 3 * si + v] += 1
                    table[:, si, oi, v] = _figures(c, cfg.rho, cfg.delta)["passed"]
        runs_ax = np.arange(len(run_ids))[None, :]
        new_pass = {v: table[runs_ax, s[:, None], k + 2, v].sum(axis=1) for v in range(3)}
        cur_vals = pooled[lo:hi]
        cur = np.array([code.get(v, -1) if v else -1 for v in cur_vals])
        flip_to, flips, sens = _best_flip(cur, new_pass, r.n_runs_passed, r.selected,
                                          sr.ranking.k_effective, len(run_ids),
                                          r.status != "rejected")
        out.append(pd.DataFrame({
            "trajectory_id": np.asarray(data["trajectory_id"][lo:hi], dtype=object),
            "capability": r.capability, "value": list(cur_vals),
            "flip_to": [VALUES[x] if x >= 0 else None for x in flip_to],
            "flips_keep": flips, "sensitivity": sens}))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=SENS_COLUMNS)


def sensitivity(con: Connection, sr: StableRanking, cfg: RankConfig
                ) -> pd.DataFrame:
    """Per labeled (trajectory, capability) pair of known outcome: the value whose
    setting would move the keep rule most, whether it flips kept/not kept, by how much."""
    if sr.boot is not None:
        if not isinstance(sr.boot, Resamples):  # counts read from the store: draw the rest
            st = StabilityConfig("bootstrap", int(sr.info.b or 0), int(sr.info.seed or 0))
            sr.boot = _boot(con, sr.run_ids, st, sr.scope)
        return _sensitivity_boot(sr, cfg)
    return _sensitivity_runs(con, sr, cfg)
