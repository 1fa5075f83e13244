"""Contrastive-coverage ranking of capabilities, computed in DuckDB over effective labels.

Per labeling run r and capability c, among trajectories with a known outcome:

    LF, PF, NF = lacking / present / na among failed;  LP, PP, NP among passed
    Cov_r   = LF / (LF + PF + NF)           share of failures this capability explains
    ER-     = LF / (LF + PF)                lacking rate when failing (na excluded)
    ER+     = LP / (LP + PP)                lacking rate when passing
    Delta_r = ER- - ER+

Design decisions
- Everything that moves when a label is edited is SQL over `effective_run_labels`
  (per-run labels with the latest human edit applied), so an edit re-ranks at once
  without recomputing labels. Two aggregate passes: per (run, capability) counts, and
  per (trajectory, capability) majority for the pooled figures.
- Re-ranking must be interactive at 100k trajectories x 14 capabilities x 10 runs (14M
  label rows), after an edit and after a label run alike. The counts are materialised in
  the store (`materialise`: per run and pooled, per scope key), patched when an edit lands
  and extended when a run finishes, so a rank is a sum over a few thousand count rows.
  The direct SQL over `effective_run_labels` is kept as the definition
  (`incremental=False`) and a test checks both agree. Pooled figures over a subset of the
  runs (not materialised) use the definition.
- A `Scope` (datasets, agent models, domains) restricts every figure, the cover, the
  clusters and the exported examples to its trajectories; examples are qualified by
  dataset, task and trial (bare task ids are ambiguous across datasets).
- The Rankings page reads the effective labels once per rerun: `rank_con` sums counts,
  the greedy cover reads (capability, row id) integer pairs into numpy; the export reuses
  the ranking.
- Undefined is not zero: a ratio with an empty denominator is NULL/None; a run where
  Cov or Delta is undefined does not pass; means and stds are over defined runs and
  `n_runs_defined` says how many that was. Std is the population std (ddof=0), as
  numpy's default in the reference.
- The Cov denominator is the failed trajectories labeled for c in run r (LF+PF+NF),
  so a pair the labeler failed on is excluded rather than counted as "not lacking".
- Selection: Cov_r >= rho and Delta_r >= delta in at least K of N runs (reference: rho
  0.10, delta 0.20, K 8 of N 10). With fewer runs than the reference N, K scales
  proportionally (ceil(K * n / 10), at least 1) and `note` says so. Rejected
  capabilities never get selected; their figures are still shown.
- Beyond the reference, on pooled effective labels (latest edit, else majority over
  runs): Wilson 95% intervals for Cov, ER- and ER+, a one-sided Fisher exact p for
  "lacking is associated with failing", and (in `greedy_cover`) how many failures the
  kept set explains together.
- The cover and the failure clusters count labelled failures: a failed trajectory no run
  labelled (an import nobody labelled yet) is not "explained by none" but unknown. The
  cover's denominator is the failed trajectories with an effective label for at least
  one of its capabilities, and says how many failed ones have none (`n_unlabelled`); the
  clusters give those their own signature, `UNLABELLED`, apart from `(none lacking)`.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np

from trace_lib import store
from trace_lib.diagnose import materialise
from trace_lib.diagnose.label_runs import left_out_note
from trace_lib.errors import UserInputError
from trace_lib.scope import Scope
from trace_lib.store.labels import left_out_runs

REFERENCE_N = 10


@dataclass
class RankConfig:
    rho: float = 0.10
    delta: float = 0.20
    k: int = 8
    runs: list[str] | None = None  # label run ids; None = all runs


@dataclass
class RunFigures:
    run: str
    cov: float | None
    delta: float | None
    er_minus: float | None
    er_plus: float | None
    lf: int
    pf: int
    nf: int
    lp: int
    pp: int
    np: int
    passed: bool


@dataclass
class CapabilityRank:
    capability: str
    description: str
    status: str
    mean_cov: float | None
    std_cov: float | None
    mean_delta: float | None
    std_delta: float | None
    n_runs_passed: int
    n_runs_total: int
    n_runs_defined: int
    selected: bool
    fisher_p: float | None
    cov_ci: tuple[float, float] | None
    er_minus_ci: tuple[float, float] | None
    er_plus_ci: tuple[float, float] | None
    pooled: dict[str, int] = field(default_factory=dict)  # lf, pf, nf, lp, pp, np
    runs: list[RunFigures] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["runs"] = [{k: v for k, v in asdict(r).items()} for r in self.runs]
        return d


@dataclass
class Ranking:
    rows: list[CapabilityRank]
    config: RankConfig
    k_effective: int
    n_runs: int
    note: str | None
    left_out: list[dict[str, Any]] = field(default_factory=list)  # unfinished label runs
    scope: Scope = field(default_factory=Scope)

    @property
    def selected(self) -> list[CapabilityRank]:
        return [r for r in self.rows if r.selected]


# ---------------------------------------------------------------------------- maths

def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float] | None:
    """Wilson score interval for k successes in n; None when n == 0."""
    if n <= 0:
        return None
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def effective_k(k: int, n_runs: int) -> tuple[int, str | None]:
    if n_runs >= REFERENCE_N:
        if k > n_runs:
            return n_runs, f"K={k} exceeds the {n_runs} runs; using K={n_runs}"
        return k, None
    if n_runs == 0:
        return k, "no label runs yet"
    scaled = max(1, math.ceil(k * n_runs / REFERENCE_N))
    return scaled, (f"only {n_runs} run(s) (reference N={REFERENCE_N}): K scaled from {k} to "
                    f"{scaled} of {n_runs}")


# ------------------------------------------------------------------------------ SQL

def run_filter_sql(runs: list[str] | None) -> tuple[str, list[Any]]:
    if runs is None:
        return "", []
    return "AND list_contains(?::VARCHAR[], l.run_id)", [runs]


# The definition (`incremental=False`, and the pooled figures over a subset of the runs):
# direct SQL over `effective_run_labels`. `{scope}` is a Scope's SQL over `trajectories t`.
PER_RUN_SQL = """
SELECT l.run_id, l.capability,
       count(*) FILTER (WHERE NOT t.success AND l.value = 'lacking') AS lf,
       count(*) FILTER (WHERE NOT t.success AND l.value = 'present') AS pf,
       count(*) FILTER (WHERE NOT t.success AND l.value = 'na') AS nf,
       count(*) FILTER (WHERE t.success AND l.value = 'lacking') AS lp,
       count(*) FILTER (WHERE t.success AND l.value = 'present') AS pp,
       count(*) FILTER (WHERE t.success AND l.value = 'na') AS np
FROM effective_run_labels l JOIN trajectories t ON t.id = l.trajectory_id
WHERE t.success IS NOT NULL AND {scope} {run_filter}
GROUP BY ALL
"""

# Pooled: the latest edit, else the majority over the selected runs (ties -> lacking,
# the same rule as the `effective_labels` view), per (trajectory, capability).
POOLED_VALUES_SQL = """
WITH votes AS (
    SELECT l.trajectory_id, l.capability,
           count(*) FILTER (WHERE l.value = 'lacking') AS nl,
           count(*) FILTER (WHERE l.value = 'present') AS np_,
           count(*) FILTER (WHERE l.value = 'na') AS nn
    FROM effective_run_labels l
    WHERE true {run_filter}
    GROUP BY ALL
)
SELECT trajectory_id, capability,
       CASE WHEN nl >= np_ AND nl >= nn THEN 'lacking'
            WHEN np_ >= nn THEN 'present' ELSE 'na' END AS value
FROM votes
"""
POOLED_SQL = "WITH maj AS (" + POOLED_VALUES_SQL + """)
SELECT m.capability,
       count(*) FILTER (WHERE NOT t.success AND m.value = 'lacking') AS lf,
       count(*) FILTER (WHERE NOT t.success AND m.value = 'present') AS pf,
       count(*) FILTER (WHERE NOT t.success AND m.value = 'na') AS nf,
       count(*) FILTER (WHERE t.success AND m.value = 'lacking') AS lp,
       count(*) FILTER (WHERE t.success AND m.value = 'present') AS pp,
       count(*) FILTER (WHERE t.success AND m.value = 'na') AS np
FROM maj m JOIN trajectories t ON t.id = m.trajectory_id
WHERE t.success IS NOT NULL AND {scope}
GROUP BY ALL
"""

# Materialised path (the default): sums over the count tables `materialise.sync` keeps.
# `{scope}` is the same Scope SQL over the tables' own dataset/agent/domain columns.
_SIX = """
       sum(n) FILTER (WHERE NOT success AND value = 'lacking') AS lf,
       sum(n) FILTER (WHERE NOT success AND value = 'present') AS pf,
       sum(n) FILTER (WHERE NOT success AND value = 'na') AS nf,
       sum(n) FILTER (WHERE success AND value = 'lacking') AS lp,
       sum(n) FILTER (WHERE success AND value = 'present') AS pp,
       sum(n) FILTER (WHERE success AND value = 'na') AS np"""
MAT_PER_RUN_SQL = ("SELECT l.run_id, l.capability," + _SIX +
                   "\nFROM label_run_counts l WHERE {scope} {run_filter} GROUP BY ALL")
MAT_POOLED_SQL = ("SELECT t.capability," + _SIX +
                  "\nFROM label_pooled_counts t WHERE {scope} GROUP BY ALL")


def _ratio(a: int, b: int) -> float | None:
    return a / b if b else None


def _mean_std(xs: list[float]) -> tuple[float | None, float | None]:
    if not xs:
        return None, None
    m = sum(xs) / len(xs)
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def _ints(row: tuple[Any, ...]) -> tuple[int, ...]:
    return tuple(int(x or 0) for x in row)


def rank_con(con: duckdb.DuckDBPyConnection, cfg: RankConfig | None = None, *,
             incremental: bool = True, scope: Scope | None = None) -> Ranking:
    """The ranking on an open connection (the page and the benchmark reuse one).

    `incremental` (default) reads the materialised counts (`materialise.sync` brings them
    up to date first: after a label run or an edit that is a patch, not a recount);
    `incremental=False` runs the direct SQL over `effective_run_labels` (the definition;
    the tests check that both agree). `scope` restricts every figure to its trajectories."""
    cfg = cfg or RankConfig()
    scope = scope or Scope()
    if not 0 <= cfg.rho <= 1 or not -1 <= cfg.delta <= 1 or cfg.k < 1:
        raise UserInputError(f"rank: expected 0<=rho<=1, -1<=delta<=1, K>=1; got rho={cfg.rho}, "
                             f"delta={cfg.delta}, K={cfg.k}")
    all_runs = [r[0] for r in con.execute(
        "SELECT id FROM label_runs ORDER BY started_at, id").fetchall()]
    # Only finished runs count: a running (or killed) or failed run is left out and named.
    left_out = left_out_runs(con)
    unfinished = {r["run"] for r in left_out}
    if cfg.runs is not None:
        unknown = sorted(set(cfg.runs) - set(all_runs))
        if unknown:
            raise UserInputError(f"rank --runs: unknown label run(s) {', '.join(unknown)}; "
                                 f"known: {', '.join(all_runs) or '(none)'}")
        run_ids = [r for r in cfg.runs if r not in unfinished]
        left_out = [r for r in left_out if r["run"] in set(cfg.runs)]
    else:
        run_ids = [r for r in all_runs if r not in unfinished]
    every_finished = set(run_ids) == set(all_runs) - unfinished
    n_runs = len(run_ids)
    k_eff, note = effective_k(cfg.k, n_runs)
    left_note = left_out_note(left_out)
    if left_note:
        note = f"{note}; {left_note}" if note else left_note
    if not scope.is_empty():
        note = f"{note}; scope: {scope.describe()}" if note else f"scope: {scope.describe()}"
    if incremental:
        materialise.sync(con)
        where, params = run_filter_sql(None if every_finished else run_ids)
        sc, sp = scope.where(con, "l")
        per_run = [(r[0], r[1], *_ints(r[2:])) for r in con.execute(
            MAT_PER_RUN_SQL.format(scope=sc, run_filter=where), sp + params).fetchall()]
        sc, sp = scope.where(con, "t")
        if every_finished:
            pooled_rows = con.execute(MAT_POOLED_SQL.format(scope=sc), sp).fetchall()
        else:  # a subset of the runs: its majority is not materialised
            where, params = run_filter_sql(run_ids)
            pooled_rows = con.execute(POOLED_SQL.format(scope=sc, run_filter=where),
                                      params + sp).fetchall()
    else:
        where, params = run_filter_sql(run_ids)
        sc, sp = scope.where(con, "t")
        per_run = con.execute(PER_RUN_SQL.format(scope=sc, run_filter=where),
                              sp + params).fetchall()
        pooled_rows = con.execute(POOLED_SQL.format(scope=sc, run_filter=where),
                                  params + sp).fetchall()
    pooled = {r[0]: _ints(r[1:]) for r in pooled_rows}
    caps = {r[0]: (r[1], r[2]) for r in con.execute(
        "SELECT name, description, status FROM capabilities").fetchall()}

    by_cap: dict[str, dict[str, RunFigures]] = {}
    for run, cap, lf, pf, nf, lp, pp, np_ in per_run:
        er_m, er_p = _ratio(lf, lf + pf), _ratio(lp, lp + pp)
        cov = _ratio(lf, lf + pf + nf)
        delta = er_m - er_p if er_m is not None and er_p is not None else None
        passed = cov is not None and delta is not None and cov >= cfg.rho and delta >= cfg.delta
        by_cap.setdefault(cap, {})[run] = RunFigures(run, cov, delta, er_m, er_p, lf, pf, nf,
                                                      lp, pp, np_, passed)
    rows = []
    order = {r: i for i, r in enumerate(run_ids)}
    for cap in sorted(set(by_cap) | set(pooled)):
        figs = sorted(by_cap.get(cap, {}).values(), key=lambda f: order.get(f.run, 0))
        covs = [f.cov for f in figs if f.cov is not None]
        deltas = [f.delta for f in figs if f.delta is not None]
        mc, sc_ = _mean_std(covs)
        md, sd = _mean_std(deltas)
        n_pass = sum(f.passed for f in figs)
        desc, status = caps.get(cap, ("(not in the catalog)", "proposed"))
        lf, pf, nf, lp, pp, np_ = pooled.get(cap, (0, 0, 0, 0, 0, 0))
        fisher_p = None
        if (lf + pf) and (lp + pp):
            # scipy.stats is imported by the first ranking, not by every importer of this
            # module (its import is ~0.5 s: the Labels page and most CLI verbs never rank).
            from scipy.stats import fisher_exact

            fisher_p = float(fisher_exact([[lf, lp], [pf, pp]], alternative="greater").pvalue)
        rows.append(CapabilityRank(
            capability=cap, description=desc, status=status,
            mean_cov=mc, std_cov=sc_, mean_delta=md, std_delta=sd,
            n_runs_passed=n_pass, n_runs_total=n_runs, n_runs_defined=len(deltas),
            selected=n_runs > 0 and n_pass >= k_eff and status != "rejected",
            fisher_p=fisher_p,
            cov_ci=wilson(lf, lf + pf + nf), er_minus_ci=wilson(lf, lf + pf),
            er_plus_ci=wilson(lp, lp + pp),
            pooled={"lf": lf, "pf": pf, "nf": nf, "lp": lp, "pp": pp, "np": np_},
            runs=figs,
        ))
    # Kept first, each group by mean Delta (undefined last), then name.
    rows.sort(key=lambda r: (not r.selected, r.mean_delta is None, -(r.mean_delta or 0.0),
                             r.capability))
    return Ranking(rows, cfg, k_eff, n_runs, note, left_out, scope)


def rank(db: str | Path | None = None, cfg: RankConfig | None = None, *,
         scope: Scope | None = None) -> Ranking:
    with store.connect(db) as con:
        return rank_con(con, cfg, scope=scope)


def format_p(p: float | None) -> str:
    """A p-value people can read: '3.2e-07', '0.041', '< 1e-300' (underflow), '' if undefined."""
    if p is None or math.isnan(p):
        return ""
    if p < 1e-300:
        return "< 1e-300"
    return f"{p:.1e}" if p < 1e-3 else f"{p:.3f}"


def ranking_json(ranking: Ranking) -> list[dict[str, Any]]:
    """The `rank --json` document: one object per capability."""
    out = []
    sc = ranking.scope
    for r in ranking.rows:
        out.append({
            "capability": r.capability, "mean_cov": r.mean_cov, "std_cov": r.std_cov,
            "mean_delta": r.mean_delta, "std_delta": r.std_delta,
            "n_runs_passed": r.n_runs_passed, "n_runs_total": r.n_runs_total,
            "selected": r.selected, "fisher_p": r.fisher_p, "status": r.status,
            "cov_ci": r.cov_ci, "er_minus_ci": r.er_minus_ci, "er_plus_ci": r.er_plus_ci,
            "pooled": r.pooled,
            "k_effective": ranking.k_effective, "note": ranking.note,
            "left_out_runs": [r["run"] for r in ranking.left_out],
            "scope": {"datasets": list(sc.datasets), "agent_models": list(sc.agent_models),
                      "domains": list(sc.domains)},
            "runs": [{"run": f.run, "cov": f.cov, "delta": f.delta, "er_minus": f.er_minus,
                      "er_plus": f.er_plus, "lf": f.lf, "pf": f.pf, "nf": f.nf, "lp": f.lp,
                      "pp": f.pp, "np": f.np} for f in r.runs],
        })
    return out


# ------------------------------------------------------------------- cover, clusters

NONE_LACKING = "(none lacking)"
UNLABELLED = "(not labelled)"


def n_failed(con: duckdb.DuckDBPyConnection, scope: Scope | None = None) -> int:
    sc, sp = (scope or Scope()).where(con, "t")
    return int(con.execute(f"SELECT count(*) FROM trajectories t WHERE t.success = false "
                           f"AND {sc}", sp).fetchone()[0])


def failed_labelled(con: duckdb.DuckDBPyConnection, capabilities: list[str],
                    scope: Scope | None = None) -> tuple[int, int]:
    """(failed trajectories with an effective label for at least one of `capabilities`,
    failed trajectories in all) within `scope`."""
    sc, sp = (scope or Scope()).where(con, "t")
    labelled, total = con.execute(f"""
        SELECT count(*) FILTER (WHERE t.id IN (
                   SELECT trajectory_id FROM label_pairs
                   WHERE value IS NOT NULL AND list_contains(?::VARCHAR[], capability))),
               count(*)
        FROM trajectories t WHERE t.success = false AND {sc}""",
                                   [capabilities, *sp]).fetchone()
    return int(labelled), int(total)


@dataclass
class CoverSignatures:
    """Failed trajectories grouped by which of `capabilities` they lack and which they
    have an effective label for: `lacking[i]` and `labelled[i]` are bit sets (one uint64
    word per 64 capabilities, bit j = `capabilities[j]`), `n[i]` how many failed
    trajectories share them; failed trajectories with no label at all are a row of empty
    sets. Threshold-free: the greedy cover of ANY subset follows from it in milliseconds
    (`cover_from_signatures`), so it is what a label run's finish stores
    (`rank_precompute`), and a slider move reads no label."""

    capabilities: list[str]
    lacking: np.ndarray  # (rows, words) uint64
    labelled: np.ndarray  # (rows, words) uint64
    n: np.ndarray  # (rows,) int64

    def to_json(self) -> dict[str, Any]:
        return {"capabilities": self.capabilities, "lacking": self.lacking.tolist(),
                "labelled": self.labelled.tolist(), "n": self.n.tolist()}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CoverSignatures:
        words = max(1, -(-len(d["capabilities"]) // 64))
        return cls(list(d["capabilities"]),
                   np.asarray(d["lacking"], dtype=np.uint64).reshape(-1, words),
                   np.asarray(d["labelled"], dtype=np.uint64).reshape(-1, words),
                   np.asarray(d["n"], dtype=np.int64))

    def bits(self, which: np.ndarray, capabilities: list[str]) -> np.ndarray:
        """(rows, len(capabilities)) bool: whether each row's set holds each capability."""
        pos = {c: i for i, c in enumerate(self.capabilities)}
        idx = np.asarray([pos[c] for c in capabilities], dtype=np.int64)
        return ((which[:, idx // 64] >> (idx % 64).astype(np.uint64)) & np.uint64(1)).astype(bool)


def cover_signatures(con: duckdb.DuckDBPyConnection, capabilities: list[str], *,
                     scope: Scope | None = None) -> CoverSignatures:
    """`CoverSignatures` of the failed trajectories in `scope` over `capabilities`: one
    GROUP BY of the materialised effective labels into bit sets (`bit_or` of one bit per
    capability), grouped again by set. Bit sets, not lists: at 1M trajectories x 14
    capabilities grouping lists of indices cost 1.6 s of CPU, words 0.6 s."""
    materialise.sync(con)
    caps = list(capabilities)
    words = max(1, -(-len(caps) // 64))
    sc, sp = (scope or Scope()).where(con, "t")

    def word(name: str, w: int, cond: str) -> str:
        # one uint64 word per 64 capabilities: a catalog of any size fits
        bit = "1::UBIGINT << (k.ci % 64)::UBIGINT"
        return (f"coalesce(bit_or(CASE WHEN {cond} AND k.ci // 64 = {w} THEN {bit} END), "
                f"0::UBIGINT) AS {name}{w}")

    cols = [word("l", w, "e.value = 'lacking'") for w in range(words)]
    cols += [word("b", w, "TRUE") for w in range(words)]
    names = [f"l{w}" for w in range(words)] + [f"b{w}" for w in range(words)]
    got = con.execute(f"""
        WITH k AS (SELECT unnest(?::VARCHAR[]) AS capability,
                          generate_subscripts(?::VARCHAR[], 1) - 1 AS ci),
        p AS (SELECT e.trajectory_id, {", ".join(cols)}
              FROM label_pairs e JOIN k USING (capability)
              WHERE e.value IS NOT NULL GROUP BY e.trajectory_id)
        SELECT {", ".join(f"coalesce(p.{c}, 0::UBIGINT) AS {c}" for c in names)},
               count(*) AS n
        FROM trajectories t LEFT JOIN p ON p.trajectory_id = t.id
        WHERE t.success = false AND {sc}
        GROUP BY ALL ORDER BY ALL""", [caps, caps, *sp]).fetchnumpy()

    def stack(prefix: str) -> np.ndarray:
        return np.stack([np.asarray(got[f"{prefix}{w}"], dtype=np.uint64)
                         for w in range(words)], axis=1)

    return CoverSignatures(caps, stack("l"), stack("b"), np.asarray(got["n"], dtype=np.int64))


def cover_from_signatures(sigs: CoverSignatures, capabilities: list[str]
                          ) -> list[dict[str, Any]]:
    """`greedy_cover` of `capabilities` (a subset of `sigs.capabilities`) from the
    signatures alone: numpy over a few thousand rows, no label read."""
    if not capabilities:
        return []
    lack = sigs.bits(sigs.lacking, capabilities)
    labelled = sigs.bits(sigs.labelled, capabilities).any(axis=1)
    n_all = int(sigs.n.sum())
    n_fail = int(sigs.n[labelled].sum())
    covered = np.zeros(len(sigs.n), dtype=bool)
    left = dict(enumerate(capabilities))
    curve: list[dict[str, Any]] = []
    n_covered = 0
    while left:
        gains = {i: int(sigs.n[lack[:, i] & ~covered].sum()) for i in left}
        best = max(gains, key=lambda i: (gains[i], left[i]))
        covered |= lack[:, best]
        n_covered += gains[best]
        curve.append({"step": len(curve) + 1, "capability": left.pop(best),
                      "new": gains[best], "covered": n_covered, "n_failed": n_fail,
                      "n_unlabelled": n_all - n_fail,
                      "fraction": n_covered / n_fail if n_fail else None})
    return curve


def greedy_cover(con: duckdb.DuckDBPyConnection, capabilities: list[str], *,
                 scope: Scope | None = None) -> list[dict[str, Any]]:
    """Greedy set cover of labelled failed trajectories by `capabilities`: each step adds
    the one explaining most not-yet-explained failures (ties: the later name). Returns the
    cumulative curve; `n_failed` is the failed trajectories labelled for at least one of
    `capabilities` and `n_unlabelled` the failed ones that are not. Computed from the
    failed trajectories' signatures (`cover_signatures`): only a few thousand rows of bit
    sets leave the store (at 1M trajectories the (capability, row id) pairs this replaced
    cost 0.8-1.2 s of CPU per call, the Python sets of ids before them 0.9 s more)."""
    if not capabilities:
        return []
    return cover_from_signatures(cover_signatures(con, capabilities, scope=scope),
                                 capabilities)


def failure_clusters(con: duckdb.DuckDBPyConnection, capabilities: list[str] | None = None,
                     limit: int = 20, *, scope: Scope | None = None) -> list[dict[str, Any]]:
    """Failed trajectories grouped by which capabilities are lacking together; those with
    no effective label for any of `capabilities` are `UNLABELLED`, apart from the
    labelled ones that lack none (`NONE_LACKING`).

    A signature is grouped as the sorted list of its capabilities' indices and named in
    Python: string keys per trajectory were 0.7 s of the 1M store's first ranking, lists
    of small integers 0.3 s."""
    materialise.sync(con)
    if capabilities is None:
        capabilities = [r[0] for r in con.execute(
            "SELECT DISTINCT capability FROM label_pairs WHERE value = 'lacking'").fetchall()]
    caps = sorted(set(capabilities))
    sc, sp = (scope or Scope()).where(con, "t")
    rows = con.execute(f"""
        WITH c AS (SELECT unnest(?::VARCHAR[]) AS capability,
                          generate_subscripts(?::VARCHAR[], 1) - 1 AS ci),
        lack AS (
            SELECT e.trajectory_id, list(c.ci ORDER BY c.ci) AS sig
            FROM label_pairs e JOIN c USING (capability)
            WHERE e.value = 'lacking' GROUP BY e.trajectory_id
        )
        SELECT coalesce(l.sig, []) AS sig,
               t.id IN (SELECT trajectory_id FROM label_pairs
                        WHERE value IS NOT NULL AND list_contains(?::VARCHAR[], capability))
                 AS labelled,
               count(*) AS n, min(t.id, 5) AS examples
        FROM trajectories t LEFT JOIN lack l ON l.trajectory_id = t.id
        WHERE t.success = false AND {sc}
        GROUP BY ALL
    """, [caps, caps, caps, *sp]).fetchall()
    named = [(" + ".join(caps[i] for i in sig) or (NONE_LACKING if labelled else UNLABELLED),
              n, sorted(ex)) for sig, labelled, n, ex in rows]
    named.sort(key=lambda r: (-r[1], r[0]))
    return [{"signature": s, "n": n, "examples": ex} for s, n, ex in named[:int(limit)]]


# -------------------------------------------------------------------------- export

def qualified_case(dataset: str | None, task_id: str | None, trial: int | None,
                   trajectory_id: str) -> str:
    """'DATASET/task TASK/trial N': unambiguous across datasets (bare task ids are not)."""
    task = task_id if task_id is not None else trajectory_id
    return f"{dataset or '?'}/task {task}/trial {trial if trial is not None else '?'}"


def failed_examples(con: duckdb.DuckDBPyConnection, capabilities: list[str], n_examples: int,
                    scope: Scope | None = None) -> dict[str, list[dict[str, Any]]]:
    """Per capability, up to `n_examples` failed trajectories lacking it, one per (dataset,
    task), qualified by dataset name, task id, trial and trajectory id (one query)."""
    if not capabilities:
        return {}
    materialise.sync(con)
    sc, sp = (scope or Scope()).where(con, "t")
    rows = con.execute(f"""
        WITH c AS (
            SELECT e.capability, t.id, d.name AS dataset, t.task_id, t.trial,
                   row_number() OVER (PARTITION BY e.capability, t.dataset_id,
                                      coalesce(t.task_id, t.id) ORDER BY t.id) AS k
            FROM label_pairs e JOIN trajectories t ON t.id = e.trajectory_id
            LEFT JOIN datasets d ON d.id = t.dataset_id
            WHERE t.success = false AND e.value = 'lacking' AND {sc}
              AND list_contains(?::VARCHAR[], e.capability)
        ), firsts AS (
            SELECT *, row_number() OVER (PARTITION BY capability ORDER BY id) AS r
            FROM c WHERE k = 1
        )
        SELECT capability, id, dataset, task_id, trial FROM firsts
        WHERE r <= {int(n_examples)} ORDER BY capability, id""",
                       sp + [capabilities]).fetchall()
    out: dict[str, list[dict[str, Any]]] = {c: [] for c in capabilities}
    for cap, tid, dataset, task, trial in rows:
        out[cap].append({"trajectory_id": tid, "dataset": dataset, "task_id": task,
                         "trial": trial, "case": qualified_case(dataset, task, trial, tid)})
    return out


def selected_document(con: duckdb.DuckDBPyConnection, cfg: RankConfig | None = None,
                      n_examples: int = 5, *, scope: Scope | None = None,
                      ranking: Ranking | None = None,
                      examples: dict[str, list[dict[str, Any]]] | None = None
                      ) -> list[dict[str, Any]]:
    """The kept capabilities in the reference `selected_capabilities.json` format, with
    qualified examples: `example_failed_cases` are 'DATASET/task T/trial N' strings and
    `example_failed_trajectories` name the trajectory ids. Pass the `ranking` already
    computed (the Rankings page does) to avoid ranking twice, and `examples` (what
    `failed_examples` returns for at least the kept capabilities: the Rankings page's are
    stored at a label run's finish) to read no label."""
    ranking = ranking or rank_con(con, cfg, scope=scope)
    kept = ranking.selected
    if examples is None:
        examples = failed_examples(con, [r.capability for r in kept], n_examples,
                                   ranking.scope)
    out = []
    for r in kept:
        ex = examples.get(r.capability, [])
        out.append({
            "skill": r.capability, "description": r.description,
            "mean_cov": r.mean_cov, "std_cov": r.std_cov,
            "mean_delta": r.mean_delta, "std_delta": r.std_delta,
            "n_runs_passed": r.n_runs_passed, "n_runs_total": r.n_runs_total,
            "example_failed_cases": [e["case"] for e in ex],
            "example_failed_trajectories": [
                {k: e[k] for k in ("dataset", "task_id", "trial", "trajectory_id")} for e in ex],
            "status": "selected",
        })
    return out


def export_selected(db: str | Path | None, path: str | Path, cfg: RankConfig | None = None,
                    n_examples: int = 5, *, scope: Scope | None = None) -> list[dict[str, Any]]:
    """Write `selected_capabilities.json` in the reference format; returns what it wrote."""
    with store.connect(db) as con:
        doc = selected_document(con, cfg, n_examples, scope=scope)
    Path(path).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return doc
