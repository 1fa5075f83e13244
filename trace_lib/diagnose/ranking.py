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
- Re-ranking after an edit must be interactive at 100k trajectories x 14 capabilities x
  10 runs (14M label rows). The two passes over the raw labels are cached in-process per
  (file, labels fingerprint, runs); an edit then costs one join of `label_edits` (small)
  with the labels it touches, and the counts are patched: minus the raw contribution of
  each edited pair, plus its edited value. The direct SQL is kept as the definition
  (`incremental=False`) and a test checks both agree.
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
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import duckdb
from scipy.stats import fisher_exact

from trace_lib import store
from trace_lib.diagnose.labels import left_out_note, left_out_runs_con
from trace_lib.errors import UserInputError

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

def _run_filter(runs: list[str] | None) -> tuple[str, list[Any]]:
    if runs is None:
        return "", []
    return "AND l.run_id IN (SELECT unnest(?::VARCHAR[]))", [runs]


PER_RUN_SQL = """
SELECT l.run_id, l.capability,
       count(*) FILTER (WHERE NOT t.success AND l.value = 'lacking') AS lf,
       count(*) FILTER (WHERE NOT t.success AND l.value = 'present') AS pf,
       count(*) FILTER (WHERE NOT t.success AND l.value = 'na') AS nf,
       count(*) FILTER (WHERE t.success AND l.value = 'lacking') AS lp,
       count(*) FILTER (WHERE t.success AND l.value = 'present') AS pp,
       count(*) FILTER (WHERE t.success AND l.value = 'na') AS np
FROM effective_run_labels l JOIN trajectories t ON t.id = l.trajectory_id
WHERE t.success IS NOT NULL {run_filter}
GROUP BY ALL
"""

# Pooled: the latest edit, else the majority over the selected runs (ties -> lacking,
# the same rule as the `effective_labels` view).
POOLED_SQL = """
WITH votes AS (
    SELECT l.trajectory_id, l.capability,
           count(*) FILTER (WHERE l.value = 'lacking') AS nl,
           count(*) FILTER (WHERE l.value = 'present') AS np_,
           count(*) FILTER (WHERE l.value = 'na') AS nn
    FROM effective_run_labels l
    WHERE true {run_filter}
    GROUP BY ALL
), maj AS (
    SELECT trajectory_id, capability,
           CASE WHEN nl >= np_ AND nl >= nn THEN 'lacking'
                WHEN np_ >= nn THEN 'present' ELSE 'na' END AS value
    FROM votes
)
SELECT m.capability,
       count(*) FILTER (WHERE NOT t.success AND m.value = 'lacking') AS lf,
       count(*) FILTER (WHERE NOT t.success AND m.value = 'present') AS pf,
       count(*) FILTER (WHERE NOT t.success AND m.value = 'na') AS nf,
       count(*) FILTER (WHERE t.success AND m.value = 'lacking') AS lp,
       count(*) FILTER (WHERE t.success AND m.value = 'present') AS pp,
       count(*) FILTER (WHERE t.success AND m.value = 'na') AS np
FROM maj m JOIN trajectories t ON t.id = m.trajectory_id
WHERE t.success IS NOT NULL
GROUP BY ALL
"""


# Incremental path: counts over the raw labels are cached per (file, labels fingerprint,
# runs); an edit only touches the few (trajectory, capability) pairs in `label_edits`, so
# re-ranking = cached base - raw contribution of edited pairs + their edited values.
BASE_PER_RUN_SQL = """
SELECT l.run_id, l.capability, t.success, l.value, count(*) AS n
FROM labels l JOIN trajectories t ON t.id = l.trajectory_id
WHERE t.success IS NOT NULL AND l.value IS NOT NULL {run_filter}
GROUP BY ALL
"""
BASE_POOLED_SQL = """
WITH votes AS (
    SELECT l.trajectory_id, l.capability,
           count(*) FILTER (WHERE l.value = 'lacking') AS nl,
           count(*) FILTER (WHERE l.value = 'present') AS np_,
           count(*) FILTER (WHERE l.value = 'na') AS nn
    FROM labels l WHERE l.value IS NOT NULL {run_filter}
    GROUP BY ALL
)
SELECT v.capability, t.success,
       CASE WHEN nl >= np_ AND nl >= nn THEN 'lacking'
            WHEN np_ >= nn THEN 'present' ELSE 'na' END AS value,
       count(*) AS n
FROM votes v JOIN trajectories t ON t.id = v.trajectory_id
WHERE t.success IS NOT NULL
GROUP BY ALL
"""
EDITED_SQL = """
SELECT l.run_id, l.trajectory_id, l.capability, t.success, l.value AS old, e.value AS new
FROM labels l
JOIN latest_label_edits e ON e.trajectory_id = l.trajectory_id AND e.capability = l.capability
JOIN trajectories t ON t.id = l.trajectory_id
WHERE t.success IS NOT NULL {run_filter}
"""
_BASE_CACHE: dict[tuple[Any, ...], tuple[dict[Any, int], dict[Any, int]]] = {}
_VALUES = ("lacking", "present", "na")


def _majority(votes: dict[str, int]) -> str:
    nl, np_, nn = (votes.get(v, 0) for v in _VALUES)
    return "lacking" if nl >= np_ and nl >= nn else ("present" if np_ >= nn else "na")


def _fingerprint(con: duckdb.DuckDBPyConnection, runs: list[str] | None) -> tuple[Any, ...]:
    path = con.execute("SELECT path FROM duckdb_databases() WHERE database_name = "
                       "current_database()").fetchone()
    counts = con.execute("SELECT (SELECT count(*) FROM labels), "
                         "(SELECT count(*) FROM trajectories)").fetchone()
    run_rows = tuple(con.execute("SELECT id, finished_at, status FROM label_runs ORDER BY id"
                                 ).fetchall())
    return (path[0] if path else None, counts, run_rows, tuple(runs) if runs else None)


def _counts_incremental(con: duckdb.DuckDBPyConnection, runs: list[str] | None
                        ) -> tuple[list[tuple[Any, ...]], dict[str, tuple[int, ...]]]:
    """(per-run rows, pooled) as PER_RUN_SQL / POOLED_SQL compute them, via the cache."""
    where, params = _run_filter(runs)
    key = _fingerprint(con, runs)
    if key[0] is None or key not in _BASE_CACHE:
        per_run = {(r, c, s, v): n for r, c, s, v, n in con.execute(
            BASE_PER_RUN_SQL.format(run_filter=where), params).fetchall()}
        pooled = {(c, s, v): n for c, s, v, n in con.execute(
            BASE_POOLED_SQL.format(run_filter=where), params).fetchall()}
        if len(_BASE_CACHE) > 8:
            _BASE_CACHE.clear()
        _BASE_CACHE[key] = (per_run, pooled)
    base_run, base_pool = _BASE_CACHE[key]
    per_run, pooled = dict(base_run), dict(base_pool)
    pair_votes: dict[tuple[str, str], dict[str, int]] = {}
    pair_info: dict[tuple[str, str], tuple[bool, str]] = {}
    for run, tid, cap, success, old, new in con.execute(EDITED_SQL.format(run_filter=where),
                                                         params).fetchall():
        if old is not None:
            per_run[(run, cap, success, old)] -= 1
            votes = pair_votes.setdefault((tid, cap), {})
            votes[old] = votes.get(old, 0) + 1
        per_run[(run, cap, success, new)] = per_run.get((run, cap, success, new), 0) + 1
        pair_info[(tid, cap)] = (success, new)
    for (tid, cap), (success, new) in pair_info.items():
        votes = pair_votes.get((tid, cap))
        if votes:  # the pair had a majority before the edit: take it out
            pooled[(cap, success, _majority(votes))] -= 1
        pooled[(cap, success, new)] = pooled.get((cap, success, new), 0) + 1
    rows: dict[tuple[str, str], list[int]] = {}
    for (run, cap, success, value), n in per_run.items():
        slot = (0 if not success else 3) + _VALUES.index(value)
        rows.setdefault((run, cap), [0] * 6)[slot] += n
    pooled_out: dict[str, list[int]] = {}
    for (cap, success, value), n in pooled.items():
        slot = (0 if not success else 3) + _VALUES.index(value)
        pooled_out.setdefault(cap, [0] * 6)[slot] += n
    return ([(run, cap, *v) for (run, cap), v in rows.items()],
            {c: tuple(v) for c, v in pooled_out.items()})


def _ratio(a: int, b: int) -> float | None:
    return a / b if b else None


def _mean_std(xs: list[float]) -> tuple[float | None, float | None]:
    if not xs:
        return None, None
    m = sum(xs) / len(xs)
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def rank_con(con: duckdb.DuckDBPyConnection, cfg: RankConfig | None = None, *,
             incremental: bool = True) -> Ranking:
    """The ranking on an open connection (the page and the benchmark reuse one).

    `incremental` (default) reuses cached counts over the raw labels and applies only the
    edited pairs; `incremental=False` runs the direct SQL over `effective_run_labels`
    (the definition; the tests check that both agree)."""
    cfg = cfg or RankConfig()
    if not 0 <= cfg.rho <= 1 or not -1 <= cfg.delta <= 1 or cfg.k < 1:
        raise UserInputError(f"rank: expected 0<=rho<=1, -1<=delta<=1, K>=1; got rho={cfg.rho}, "
                             f"delta={cfg.delta}, K={cfg.k}")
    all_runs = [r[0] for r in con.execute(
        "SELECT id FROM label_runs ORDER BY started_at, id").fetchall()]
    # Only finished runs count: a running (or killed) or failed run is left out and named.
    left_out = left_out_runs_con(con)
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
    # Without unfinished runs the filter is not needed (and the cache key stays stable).
    run_filter = run_ids if (cfg.runs is not None or unfinished) else None
    n_runs = len(run_ids)
    k_eff, note = effective_k(cfg.k, n_runs)
    left_note = left_out_note(left_out)
    if left_note:
        note = f"{note}; {left_note}" if note else left_note
    if incremental:
        per_run, pooled = _counts_incremental(con, run_filter)
    else:
        where, params = _run_filter(run_filter)
        per_run = con.execute(PER_RUN_SQL.format(run_filter=where), params).fetchall()
        pooled = {r[0]: r[1:] for r in con.execute(POOLED_SQL.format(run_filter=where),
                                                      params).fetchall()}
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
        mc, sc = _mean_std(covs)
        md, sd = _mean_std(deltas)
        n_pass = sum(f.passed for f in figs)
        desc, status = caps.get(cap, ("(not in the catalog)", "proposed"))
        lf, pf, nf, lp, pp, np_ = pooled.get(cap, (0, 0, 0, 0, 0, 0))
        fisher_p = None
        if (lf + pf) and (lp + pp):
            fisher_p = float(fisher_exact([[lf, lp], [pf, pp]], alternative="greater").pvalue)
        rows.append(CapabilityRank(
            capability=cap, description=desc, status=status,
            mean_cov=mc, std_cov=sc, mean_delta=md, std_delta=sd,
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
    return Ranking(rows, cfg, k_eff, n_runs, note, left_out)


def rank(db: str | Path | None = None, cfg: RankConfig | None = None) -> Ranking:
    with store.connect(db) as con:
        return rank_con(con, cfg)


def ranking_json(ranking: Ranking) -> list[dict[str, Any]]:
    """The `rank --json` document: one object per capability."""
    out = []
    for r in ranking.rows:
        out.append({
            "capability": r.capability, "mean_cov": r.mean_cov, "std_cov": r.std_cov,
            "mean_delta": r.mean_delta, "std_delta": r.std_delta,
            "n_runs_passed": r.n_runs_passed, "n_runs_total": r.n_runs_total,
            "selected": r.selected, "fisher_p": r.fisher_p, "status": r.status,
            "cov_ci": r.cov_ci, "er_minus_ci": r.er_minus_ci, "er_plus_ci": r.er_plus_ci,
            "k_effective": ranking.k_effective, "note": ranking.note,
            "left_out_runs": [r["run"] for r in ranking.left_out],
            "runs": [{"run": f.run, "cov": f.cov, "delta": f.delta, "er_minus": f.er_minus,
                      "er_plus": f.er_plus, "lf": f.lf, "pf": f.pf, "nf": f.nf, "lp": f.lp,
                      "pp": f.pp, "np": f.np} for f in r.runs],
        })
    return out


# ------------------------------------------------------------------- cover, clusters

def lacking_failures(con: duckdb.DuckDBPyConnection, capabilities: list[str] | None = None
                     ) -> dict[str, set[str]]:
    """capability -> failed trajectory ids whose effective label is lacking."""
    sql = """SELECT e.capability, e.trajectory_id FROM effective_labels e
             JOIN trajectories t ON t.id = e.trajectory_id
             WHERE t.success = false AND e.value = 'lacking'"""
    params: list[Any] = []
    if capabilities is not None:
        sql += " AND e.capability IN (SELECT unnest(?::VARCHAR[]))"
        params.append(capabilities)
    out: dict[str, set[str]] = {c: set() for c in capabilities or []}
    for cap, tid in con.execute(sql, params).fetchall():
        out.setdefault(cap, set()).add(tid)
    return out


def greedy_cover(con: duckdb.DuckDBPyConnection, capabilities: list[str]) -> list[dict[str, Any]]:
    """Greedy set cover of failed trajectories by `capabilities`: each step adds the one
    explaining most not-yet-explained failures. Returns the cumulative curve."""
    n_failed = con.execute("SELECT count(*) FROM trajectories WHERE success = false").fetchone()[0]
    sets = lacking_failures(con, capabilities)
    covered: set[str] = set()
    curve = []
    remaining = dict(sets)
    while remaining:
        cap, members = max(remaining.items(), key=lambda kv: (len(kv[1] - covered), kv[0]))
        gain = len(members - covered)
        covered |= members
        del remaining[cap]
        curve.append({"step": len(curve) + 1, "capability": cap, "new": gain,
                      "covered": len(covered), "n_failed": n_failed,
                      "fraction": len(covered) / n_failed if n_failed else None})
    return curve


def failure_clusters(con: duckdb.DuckDBPyConnection, capabilities: list[str] | None = None,
                     limit: int = 20) -> list[dict[str, Any]]:
    """Failed trajectories grouped by which capabilities are lacking together."""
    cap_filter, params = "", []
    if capabilities is not None:
        cap_filter = "AND e.capability IN (SELECT unnest(?::VARCHAR[]))"
        params = [capabilities]
    rows = con.execute(f"""
        WITH sig AS (
            SELECT t.id,
                   coalesce(string_agg(e.capability, ' + ' ORDER BY e.capability)
                            FILTER (WHERE e.value = 'lacking' {cap_filter}),
                            '(none lacking)') AS signature
            FROM trajectories t LEFT JOIN effective_labels e ON e.trajectory_id = t.id
            WHERE t.success = false
            GROUP BY t.id
        )
        SELECT signature, count(*) AS n, list(id ORDER BY id)[1:5] AS examples
        FROM sig GROUP BY signature ORDER BY n DESC, signature LIMIT {int(limit)}
    """, params).fetchall()
    return [{"signature": s, "n": n, "examples": ex} for s, n, ex in rows]


# -------------------------------------------------------------------------- export

def selected_document(con: duckdb.DuckDBPyConnection, cfg: RankConfig | None = None,
                      n_examples: int = 5) -> list[dict[str, Any]]:
    """The kept capabilities in the reference `selected_capabilities.json` format."""
    ranking = rank_con(con, cfg)
    kept = ranking.selected
    examples = lacking_failures(con, [r.capability for r in kept])
    task_of = dict(con.execute("SELECT id, coalesce(task_id, id) FROM trajectories").fetchall())
    out = []
    for r in kept:
        cases: list[str] = []
        for tid in sorted(examples.get(r.capability, set())):
            task = str(task_of.get(tid, tid))
            if task not in cases:
                cases.append(task)
            if len(cases) >= n_examples:
                break
        out.append({
            "skill": r.capability, "description": r.description,
            "mean_cov": r.mean_cov, "std_cov": r.std_cov,
            "mean_delta": r.mean_delta, "std_delta": r.std_delta,
            "n_runs_passed": r.n_runs_passed, "n_runs_total": r.n_runs_total,
            "example_failed_cases": cases, "status": "selected",
        })
    return out


def export_selected(db: str | Path | None, path: str | Path, cfg: RankConfig | None = None,
                    n_examples: int = 5) -> list[dict[str, Any]]:
    """Write `selected_capabilities.json` in the reference format; returns what it wrote."""
    with store.connect(db) as con:
        doc = selected_document(con, cfg, n_examples)
    Path(path).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return doc
