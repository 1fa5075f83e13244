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
  reference N=10 becomes ceil(K * B / 10) of B. Seeded (numpy's default_rng(seed)), so the
  same store gives the same figures. The note says "stability from B bootstrap resamples,
  not independent label runs". Pooled figures (Fisher p, Wilson intervals) stay the run
  ranking's: they are over the whole sample already.
- Sensitivity comes from the keep rule itself: for each (trajectory, capability) pair
  and each other value, re-count every run (or resample, weighting the trajectory by its
  multiplicity) as if a person had set that value (an edit applies to every run), and
  see whether the capability's kept/not-kept verdict changes (`flips_keep`) and by what
  share of the runs the pass count moves (`sensitivity`, in [0, 1]). Runs: one table of
  pass-after-flip per (run, outcome, old value, new value), then a gather per pair.
  Resamples: the counts moved by the trajectory's multiplicity, in chunks of pairs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import duckdb
import numpy as np
import pandas as pd

from trace_lib.diagnose.labels import left_out_note, left_out_runs_con
from trace_lib.diagnose.ranking import (
    REFERENCE_N,
    CapabilityRank,
    RankConfig,
    Ranking,
    RunFigures,
    rank_con,
)
from trace_lib.errors import UserInputError
from trace_lib.scope import Scope

VALUES = ("lacking", "present", "na")  # code 0, 1, 2 (slot = 3 * passed + code)
METHODS = ("auto", "runs", "bootstrap")


def counted_run_ids(con: duckdb.DuckDBPyConnection, runs: list[str] | None) -> list[str]:
    """The finished runs the ranking counts (all, or `runs`), oldest first."""
    all_runs = [r[0] for r in con.execute(
        "SELECT id FROM label_runs ORDER BY started_at, id").fetchall()]
    if runs is not None:
        unknown = sorted(set(runs) - set(all_runs))
        if unknown:
            raise UserInputError(f"--runs: unknown label run(s) {', '.join(unknown)}; "
                                 f"known: {', '.join(all_runs) or '(none)'}")
    unfinished = {r["run"] for r in left_out_runs_con(con)}
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


def runs_vary(con: duckdb.DuckDBPyConnection, run_ids: list[str]) -> bool:
    """Whether any pair gets different values from different runs (raw labels)."""
    return con.execute("""
        SELECT 1 FROM counted_labels
        WHERE value IS NOT NULL AND run_id IN (SELECT unnest(?::VARCHAR[]))
        GROUP BY trajectory_id, capability HAVING count(DISTINCT value) > 1 LIMIT 1""",
                       [run_ids]).fetchone() is not None


def resolve(con: duckdb.DuckDBPyConnection, run_ids: list[str], st: StabilityConfig
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


@dataclass
class _Boot:
    """Pooled labels as arrays and the resample multiplicities."""
    tids: np.ndarray  # (T,)
    success: np.ndarray  # (T,) bool
    caps: list[str]
    codes: np.ndarray  # (T, C) int8: 0 lacking, 1 present, 2 na, -1 unlabeled
    w: np.ndarray  # (B, T) multiplicities
    counts: np.ndarray  # (B, C, 6) lf pf nf lp pp np


POOLED_SQL = """
WITH votes AS (
    SELECT l.trajectory_id, l.capability,
           count(*) FILTER (WHERE l.value = 'lacking') AS nl,
           count(*) FILTER (WHERE l.value = 'present') AS np_,
           count(*) FILTER (WHERE l.value = 'na') AS nn
    FROM effective_run_labels l
    WHERE l.run_id IN (SELECT unnest(?::VARCHAR[]))
    GROUP BY ALL
)
SELECT v.trajectory_id, v.capability, t.success,
       CASE WHEN nl >= np_ AND nl >= nn THEN 'lacking'
            WHEN np_ >= nn THEN 'present' ELSE 'na' END AS value
FROM votes v JOIN trajectories t ON t.id = v.trajectory_id
WHERE t.success IS NOT NULL AND {scope}
"""


def _multiplicities(success: np.ndarray, b: int, seed: int) -> np.ndarray:
    """(B, T) how often each trajectory is drawn; resampled within failed and passed."""
    rng = np.random.default_rng(seed)
    w = np.zeros((b, len(success)), dtype=np.float64)
    for group in (~success, success):
        idx = np.flatnonzero(group)
        if len(idx) == 0:
            continue
        draws = rng.integers(0, len(idx), size=(b, len(idx)))
        flat = (draws + np.arange(b)[:, None] * len(idx)).ravel()
        w[:, idx] = np.bincount(flat, minlength=b * len(idx)).reshape(b, len(idx))
    return w


def _boot(con: duckdb.DuckDBPyConnection, run_ids: list[str], st: StabilityConfig,
          scope: Scope) -> _Boot:
    sc, sp = scope.where(con, "t")
    df = con.execute(POOLED_SQL.format(scope=sc), [run_ids, *sp]).df()
    tids = np.array(sorted(df["trajectory_id"].unique()), dtype=object)
    caps = sorted(df["capability"].unique())
    t_index = {t: i for i, t in enumerate(tids)}
    c_index = {c: i for i, c in enumerate(caps)}
    codes = np.full((len(tids), len(caps)), -1, dtype=np.int8)
    success = np.zeros(len(tids), dtype=bool)
    if not df.empty:
        ti = df["trajectory_id"].map(t_index).to_numpy()
        codes[ti, df["capability"].map(c_index).to_numpy()] = (
            df["value"].map({v: i for i, v in enumerate(VALUES)}).to_numpy())
        success[ti] = df["success"].astype(bool).to_numpy()
    w = _multiplicities(success, st.b, st.seed)
    onehot = np.zeros((len(tids), len(caps) * 6))
    rows, cols = np.nonzero(codes >= 0)
    onehot[rows, cols * 6 + 3 * success[rows] + codes[rows, cols]] = 1.0
    counts = (w @ onehot).reshape(st.b, len(caps), 6)
    return _Boot(tids, success, caps, codes, w, counts)


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


def bootstrap_ranking(con: duckdb.DuckDBPyConnection, cfg: RankConfig, info: StabilityInfo,
                      base: Ranking, boot: _Boot) -> Ranking:
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
    boot: _Boot | None = None


def stable_ranking(con: duckdb.DuckDBPyConnection, cfg: RankConfig | None = None,
                   st: StabilityConfig | None = None, *, scope: Scope | None = None
                   ) -> StableRanking:
    """The ranking with stability from runs, or from bootstrap resamples (see `resolve`)."""
    cfg = cfg or RankConfig()
    st = st or StabilityConfig()
    scope = scope or Scope()
    base = rank_con(con, cfg, scope=scope)  # validates cfg, the run names and the scope
    run_ids = counted_run_ids(con, cfg.runs)
    info = resolve(con, run_ids, st)
    if info.method == "runs" or not run_ids:
        return StableRanking(base, info, run_ids, scope)
    boot = _boot(con, run_ids, st, scope)
    return StableRanking(bootstrap_ranking(con, cfg, info, base, boot), info, run_ids, scope,
                         boot)


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


def _sensitivity_boot(sr: StableRanking, cfg: RankConfig, chunk: int = 4000) -> pd.DataFrame:
    boot = sr.boot
    assert boot is not None
    b = boot.w.shape[0]
    rows_by_cap = {r.capability: r for r in sr.ranking.rows}
    out = []
    for j, cap in enumerate(boot.caps):
        r = rows_by_cap.get(cap)
        if r is None:
            continue
        base = boot.counts[:, j, :]  # (B, 6)
        labeled = np.flatnonzero(boot.codes[:, j] >= 0)
        for start in range(0, len(labeled), chunk):
            idx = labeled[start:start + chunk]
            cur = boot.codes[idx, j].astype(int)
            slot_old = 3 * boot.success[idx] + cur
            m = boot.w[:, idx]  # (B, n)
            new_pass: dict[int, np.ndarray] = {}
            for v in range(3):
                c = np.repeat(base[:, None, :], len(idx), axis=1)  # (B, n, 6)
                cols = np.arange(len(idx))
                c[:, cols, slot_old] -= m
                c[:, cols, 3 * boot.success[idx] + v] += m
                new_pass[v] = _figures(c, cfg.rho, cfg.delta)["passed"].sum(axis=0)
            flip_to, flips, sens = _best_flip(cur, new_pass, r.n_runs_passed, r.selected,
                                              sr.ranking.k_effective, b,
                                              r.status != "rejected")
            out.append(pd.DataFrame({
                "trajectory_id": boot.tids[idx], "capability": cap,
                "value": [VALUES[x] for x in cur],
                "flip_to": [VALUES[x] if x >= 0 else None for x in flip_to],
                "flips_keep": flips, "sensitivity": sens}))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=SENS_COLUMNS)


def _sensitivity_runs(con: duckdb.DuckDBPyConnection, sr: StableRanking, cfg: RankConfig
                      ) -> pd.DataFrame:
    run_ids = sr.run_ids
    if not run_ids:
        return pd.DataFrame(columns=SENS_COLUMNS)
    # Per run the counted row (value NULL = the labeler failed; an edit fills it in);
    # a run without a row for the pair is not touched by an edit.
    sc, sp = sr.scope.where(con, "t")
    df = con.execute(f"""
        SELECT l.run_id, l.trajectory_id, l.capability, t.success,
               coalesce(e.value, l.value) AS value
        FROM counted_labels l
        JOIN trajectories t ON t.id = l.trajectory_id
        LEFT JOIN latest_label_edits e
          ON e.trajectory_id = l.trajectory_id AND e.capability = l.capability
        WHERE t.success IS NOT NULL AND l.run_id IN (SELECT unnest(?::VARCHAR[])) AND {sc}""",
                     [run_ids, *sp]).df()
    pooled = con.execute(POOLED_SQL.format(scope=sc), [run_ids, *sp]).df().set_index(
        ["trajectory_id", "capability"])["value"]
    code = {v: i for i, v in enumerate(VALUES)}
    r_index = {r: i for i, r in enumerate(run_ids)}
    out = []
    for r in sr.ranking.rows:
        sub = df[df["capability"] == r.capability]
        if sub.empty:
            continue
        # k: -2 no row (unchanged), -1 row without a value (an edit adds one), 0..2 value.
        sub = sub.assign(code=sub["value"].map(code).fillna(-1))
        wide = sub.pivot(index="trajectory_id", columns="run_id", values="code").reindex(
            columns=run_ids)
        k = wide.fillna(-2).to_numpy(dtype=int)
        success = sub.groupby("trajectory_id")["success"].first().reindex(wide.index)
        s = success.astype(bool).to_numpy().astype(int)
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
        cur_vals = [pooled.get((t, r.capability)) for t in wide.index]
        cur = np.array([code.get(v, -1) if v else -1 for v in cur_vals])
        flip_to, flips, sens = _best_flip(cur, new_pass, r.n_runs_passed, r.selected,
                                          sr.ranking.k_effective, len(run_ids),
                                          r.status != "rejected")
        out.append(pd.DataFrame({
            "trajectory_id": wide.index.to_numpy(), "capability": r.capability,
            "value": cur_vals, "flip_to": [VALUES[x] if x >= 0 else None for x in flip_to],
            "flips_keep": flips, "sensitivity": sens}))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=SENS_COLUMNS)


def sensitivity(con: duckdb.DuckDBPyConnection, sr: StableRanking, cfg: RankConfig
                ) -> pd.DataFrame:
    """Per labeled (trajectory, capability) pair of known outcome: the value whose
    setting would move the keep rule most, whether it flips kept/not kept, by how much."""
    if sr.boot is not None:
        return _sensitivity_boot(sr, cfg)
    return _sensitivity_runs(con, sr, cfg)
