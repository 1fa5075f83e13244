"""Agreement between label runs, labelers and people, and the review queue ordered by
disagreement and by what a flip would change in the ranking.

Design decisions
- Kappa formulas are implemented here in numpy (no statistics package at run time) and
  tested against textbook examples (Fleiss 1971 as reprinted on Wikipedia; Cohen's
  two-rater example) and, where installed, scikit-learn's `cohen_kappa_score`.
  A kappa whose chance agreement is 1 (every rating in one category) is 0/0: it is
  `None` ("undefined"), never 1 or 0.
- Fleiss' kappa is across label runs per capability, on the raw labels of finished runs
  (human edits are applied to every run alike, so counting them would fake agreement),
  over the trajectories every run labeled.
- Cohen's kappa compares raters pairwise on the pairs both rated: each labeler (its
  majority over its finished runs, raw labels), "people" (the effective human decision:
  the latest live edit) and, between people, each editor's latest live edit. People edit
  where they think a labeler is wrong, so kappa against people is measured on a biased
  sample; `n` is always shown beside it.
- Every count is a GROUP BY in the store: Fleiss' per-category totals, one confusion
  table per pair of raters for Cohen, the disagreement shares, and the queue's join,
  filter, order and limit; only small tables (and the queue's `limit` rows) reach
  Python. At 100k trajectories x 10 runs (14M labels) the agreement report takes ~1 s
  and the queue ~8 s (pandas group-bys and row loops before: 23 s at 10k x 1 run for
  the report, 149 s at 100k x 10 for the queue).
- Stability (runs or bootstrap resamples) and sensitivity live in `stability`; the names
  are re-exported here because the queue is where they meet.
- The queue holds pairs where runs, labelers or people disagree, whose flip moves the
  ranking (`stability.sensitivity`), or that a finished run labeled lacking/present
  without verified evidence (`n_unsupported`, issue 31), skipping pairs a person decided
  unless people disagree about them. Unsupported pairs come first in either order (a
  judgment nobody can check is the first thing a person should look at); then order
  "disagreement": disagreement, flips_keep, sensitivity; order "sensitivity": flips_keep,
  sensitivity, then disagreement.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd

from trace_lib.diagnose.materialise import MAJORITY
from trace_lib.diagnose.ranking import RankConfig
from trace_lib.diagnose.stability import (  # noqa: F401  (re-exported: one import for callers)
    METHODS,
    VALUES,
    StabilityConfig,
    StabilityInfo,
    StableRanking,
    boot_k,
    bootstrap_ranking,
    counted_run_ids,
    resolve,
    runs_vary,
    sensitivity,
    stable_ranking,
)
from trace_lib.errors import UserInputError
from trace_lib.scope import Scope
from trace_lib.store.connection import Connection

ORDERS = ("disagreement", "sensitivity")
PEOPLE = "people"


# ------------------------------------------------------------------------------ kappa

def fleiss_kappa(counts: np.ndarray | list[list[int]]) -> float | None:
    """Fleiss' kappa of an (N subjects x k categories) matrix of rating counts, every
    row summing to the same number of raters n >= 2; None when chance agreement is 1."""
    x = np.asarray(counts, dtype=float)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError("fleiss_kappa: expected a non-empty subjects x categories matrix")
    n_per = x.sum(axis=1)
    n = n_per[0]
    if n < 2 or not np.all(n_per == n):
        raise ValueError("fleiss_kappa: every subject needs the same number (>= 2) of ratings")
    p_j = x.sum(axis=0) / (x.shape[0] * n)
    p_i = (np.square(x).sum(axis=1) - n) / (n * (n - 1))
    p_bar, p_e = float(p_i.mean()), float(np.square(p_j).sum())
    if math.isclose(p_e, 1.0):
        return None
    return (p_bar - p_e) / (1.0 - p_e)


def cohen_kappa(a: list[str] | np.ndarray, b: list[str] | np.ndarray,
                categories: tuple[str, ...] = VALUES) -> float | None:
    """Cohen's kappa of two raters over the same items; None when chance agreement is 1."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.ndim != 1 or len(a) == 0:
        raise ValueError("cohen_kappa: expected two equally long, non-empty rating lists")
    table: dict[tuple[str, str], int] = {}
    for x, y in zip(a.tolist(), b.tolist(), strict=True):
        table[(x, y)] = table.get((x, y), 0) + 1
    return cohen_kappa_counts(table, categories)


def cohen_kappa_counts(table: dict[tuple[str, str], int],
                       categories: tuple[str, ...] = VALUES) -> float | None:
    """Cohen's kappa of a confusion table {(a's rating, b's rating): count}; None when
    chance agreement is 1."""
    seen = {v for pair in table for v in pair}
    cats = list(categories) + sorted(seen - set(categories))
    index = {c: i for i, c in enumerate(cats)}
    m = np.zeros((len(cats), len(cats)))
    for (x, y), c in table.items():
        m[index[x], index[y]] += c
    m /= m.sum()
    p_o = float(np.trace(m))
    p_e = float(m.sum(axis=1) @ m.sum(axis=0))
    if math.isclose(p_e, 1.0):
        return None
    return (p_o - p_e) / (1.0 - p_e)


# -------------------------------------------------------------------------- reports

@dataclass
class FleissRow:
    capability: str
    kappa: float | None
    observed: float | None  # mean pairwise agreement P-bar
    n_trajectories: int  # labeled by every run
    n_runs: int
    why: str | None = None  # why kappa is undefined


@dataclass
class CohenRow:
    rater_a: str
    rater_b: str
    kappa: float | None
    observed: float | None
    n: int
    kind: str  # "labeler vs people" | "labeler vs labeler" | "person vs person"
    why: str | None = None


@dataclass
class AgreementReport:
    runs: list[str]
    fleiss: list[FleissRow] = field(default_factory=list)
    cohen: list[CohenRow] = field(default_factory=list)
    n_human_decisions: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# Each editor's latest live (not undone, not an undo) edit per pair, in scope.
_LIVE_EDITS = """
    SELECT trajectory_id, capability, editor, arg_max(new, id) AS value
    FROM label_edits
    WHERE undoes IS NULL AND id NOT IN (SELECT undoes FROM label_edits WHERE undoes IS NOT NULL)
      AND trajectory_id IN (SELECT t.id FROM trajectories t WHERE {scope})
    GROUP BY ALL
"""


# One pass over the raw labels of the counted runs in scope: votes per pair and labeler
# (Fleiss, Cohen's labeler majorities and the disagreement shares all start from it).
_VOTES_SQL = """
    SELECT l.trajectory_id, l.capability, r.labeler,
           count(*) FILTER (WHERE l.value = 'lacking') AS nl,
           count(*) FILTER (WHERE l.value = 'present') AS np,
           count(*) FILTER (WHERE l.value = 'na') AS nn,
           count(*) FILTER (WHERE l.unsupported) AS nu
    FROM counted_labels l JOIN label_runs r ON r.id = l.run_id
    JOIN trajectories t ON t.id = l.trajectory_id
    WHERE l.value IS NOT NULL AND l.run_id IN (SELECT unnest(?::VARCHAR[])) AND {scope}
    GROUP BY ALL"""


def agreement_con(con: Connection, runs: list[str] | None = None, *,
                  scope: Scope | None = None) -> AgreementReport:
    """Fleiss' kappa across runs per capability; Cohen's kappa of every labeler against
    people, of labelers against each other and of people against each other.

    Every count is a GROUP BY in the store (per capability and category for Fleiss, a
    confusion table per rater pair for Cohen); only those small tables reach Python, so
    the report costs the same few scans at 10k trajectories as at 1M x 10 runs."""
    scope = scope or Scope()
    sc, sp = scope.where(con, "t")
    run_ids = counted_run_ids(con, runs)
    report = AgreementReport(runs=run_ids)
    n_runs = len(run_ids)
    con.execute("CREATE OR REPLACE TEMP TABLE agreement_votes AS SELECT *, "
                f"nl + np + nn AS n FROM ({_VOTES_SQL.format(scope=sc)})",
                [run_ids, *sp])
    try:
        for cap, n_wide, n_full, sl, sp_, sn, p_bar in con.execute("""
                WITH per AS (SELECT capability, trajectory_id, sum(n) AS n, sum(nl) AS nl,
                                    sum(np) AS np, sum(nn) AS nn
                             FROM agreement_votes GROUP BY ALL)
                SELECT capability, count(*), count(*) FILTER (WHERE n = $n),
                       sum(nl) FILTER (WHERE n = $n), sum(np) FILTER (WHERE n = $n),
                       sum(nn) FILTER (WHERE n = $n),
                       avg((nl * nl + np * np + nn * nn - n) / (n * (n - 1)))
                           FILTER (WHERE n = $n)
                FROM per GROUP BY capability ORDER BY capability""", {"n": n_runs}
                ).fetchall():
            report.fleiss.append(_fleiss_row(cap, n_wide, n_full, (sl, sp_, sn), p_bar,
                                             n_runs))
        # Raters: each labeler's majority over its runs; people's effective decision;
        # editors' latest live edits. Each pair of raters is one confusion table.
        majority = (f"SELECT labeler AS rater, trajectory_id, capability, "
                    f"{MAJORITY} AS value FROM agreement_votes")
        people = ("SELECT trajectory_id, capability, value FROM latest_label_edits WHERE "
                  f"trajectory_id IN (SELECT t.id FROM trajectories t WHERE {sc})")
        report.n_human_decisions = con.execute(f"SELECT count(*) FROM ({people})",
                                               sp).fetchone()[0]
        labelers = [r[0] for r in con.execute(
            "SELECT DISTINCT labeler FROM agreement_votes ORDER BY labeler").fetchall()]
        vs_people = _confusions(con, f"""
            SELECT a.rater AS rater_a, '{PEOPLE}' AS rater_b, a.value AS a, b.value AS b
            FROM ({majority}) a JOIN ({people}) b USING (trajectory_id, capability)""", sp)
        for name in labelers:
            report.cohen.append(_cohen_row(name, PEOPLE, vs_people, "labeler vs people"))
        vs_labelers = _confusions(con, f"""
            SELECT a.rater AS rater_a, b.rater AS rater_b, a.value AS a, b.value AS b
            FROM ({majority}) a JOIN ({majority}) b USING (trajectory_id, capability)
            WHERE a.rater < b.rater""", [])
        for a, b in combinations(labelers, 2):
            report.cohen.append(_cohen_row(a, b, vs_labelers, "labeler vs labeler"))
        editors = _LIVE_EDITS.format(scope=sc)
        vs_editors = _confusions(con, f"""
            SELECT a.editor AS rater_a, b.editor AS rater_b, a.value AS a, b.value AS b
            FROM ({editors}) a JOIN ({editors}) b USING (trajectory_id, capability)
            WHERE a.editor < b.editor""", [*sp, *sp])
        for a, b in sorted(vs_editors):
            report.cohen.append(_cohen_row(a, b, vs_editors, "person vs person"))
    finally:
        con.execute("DROP TABLE IF EXISTS agreement_votes")
    return report


def _fleiss_row(cap: str, n_wide: int, n_full: int, totals: tuple, p_bar: float | None,
                n_runs: int) -> FleissRow:
    """Fleiss' kappa from per-category totals over the trajectories every run labeled
    (the formula of `fleiss_kappa`, from sums instead of the subjects x categories matrix)."""
    if n_runs < 2:
        return FleissRow(cap, None, None, n_wide, n_runs, "needs at least two label runs")
    if not n_full:
        return FleissRow(cap, None, None, 0, n_runs, "no trajectory labeled by every run")
    p_j = np.asarray(totals, dtype=float) / (n_full * n_runs)
    p_e = float(np.square(p_j).sum())
    if math.isclose(p_e, 1.0):
        return FleissRow(cap, None, float(p_bar), n_full, n_runs,
                         "every rating in one category")
    return FleissRow(cap, (float(p_bar) - p_e) / (1.0 - p_e), float(p_bar), n_full, n_runs)


def _confusions(con: Connection, pairs_sql: str, params: list
                ) -> dict[tuple[str, str], dict[tuple[str, str], int]]:
    """{(rater a, rater b): {(a's value, b's value): pairs}} of a query yielding
    rater_a, rater_b, a, b per pair both rated."""
    out: dict[tuple[str, str], dict[tuple[str, str], int]] = {}
    for ra, rb, a, b, n in con.execute(
            f"SELECT rater_a, rater_b, a, b, count(*) FROM ({pairs_sql}) "
            "WHERE a IS NOT NULL AND b IS NOT NULL GROUP BY ALL", params).fetchall():
        out.setdefault((str(ra), str(rb)), {})[(a, b)] = int(n)
    return out


def _cohen_row(a: str, b: str, tables: dict[tuple[str, str], dict[tuple[str, str], int]],
               kind: str) -> CohenRow:
    """Cohen's kappa, observed agreement and n of raters a and b from their confusion table."""
    table = tables.get((a, b)) or {}
    n = sum(table.values())
    if not n:
        return CohenRow(a, b, None, None, 0, kind, "no pair rated by both")
    k = cohen_kappa_counts(table)
    observed = sum(c for (x, y), c in table.items() if x == y) / n
    return CohenRow(a, b, k, observed, n, kind,
                    None if k is not None else "every rating in one category")


# ---------------------------------------------------------------------- disagreement

DISAGREEMENT_SQL = """
WITH votes AS (""" + _VOTES_SQL + """
), per_labeler AS (
    SELECT *, """ + MAJORITY + """ AS value FROM votes
), runs AS (  -- runs and labelers from the same rows: each pair's labelers, rolled up
    SELECT trajectory_id, capability, sum(nl + np + nn) AS n_runs,
           1 - greatest(sum(nl), sum(np), sum(nn)) / sum(nl + np + nn) AS runs_d,
           string_agg(labeler || '=' || value, ', ' ORDER BY labeler) AS labelers,
           1 - greatest(count(*) FILTER (WHERE value = 'lacking'),
                        count(*) FILTER (WHERE value = 'present'),
                        count(*) FILTER (WHERE value = 'na')) / count(*) AS labelers_d,
           sum(nu) AS n_unsupported
    FROM per_labeler GROUP BY ALL
), editors AS (
    SELECT trajectory_id, capability,
           string_agg(editor || '=' || value, ', ' ORDER BY editor) AS editors,
           1 - greatest(count(*) FILTER (WHERE value = 'lacking'),
                        count(*) FILTER (WHERE value = 'present'),
                        count(*) FILTER (WHERE value = 'na')) / count(*) AS people_d
    FROM (""" + _LIVE_EDITS + """) GROUP BY ALL
)
SELECT coalesce(r.trajectory_id, p.trajectory_id) AS trajectory_id,
       coalesce(r.capability, p.capability) AS capability,
       coalesce(r.n_runs, 0) AS n_runs, coalesce(r.runs_d, 0) AS runs_disagreement,
       r.labelers, coalesce(r.labelers_d, 0) AS labelers_disagreement,
       p.editors, coalesce(p.people_d, 0) AS people_disagreement,
       greatest(coalesce(r.runs_d, 0), coalesce(r.labelers_d, 0), coalesce(p.people_d, 0))
           AS disagreement,
       concat_ws(' + ', CASE WHEN r.runs_d > 0 THEN 'runs' END,
                 CASE WHEN r.labelers_d > 0 THEN 'labelers' END,
                 CASE WHEN p.people_d > 0 THEN 'people' END,
                 CASE WHEN r.n_unsupported > 0 THEN 'unsupported' END) AS source,
       coalesce(r.n_unsupported, 0) AS n_unsupported
FROM runs r
FULL OUTER JOIN editors p
  ON p.trajectory_id = r.trajectory_id AND p.capability = r.capability
WHERE coalesce(r.runs_d, 0) > 0 OR coalesce(r.labelers_d, 0) > 0
   OR coalesce(p.people_d, 0) > 0 OR coalesce(r.n_unsupported, 0) > 0
"""


# The queue from the sensitivity frame (registered as a relation) and DISAGREEMENT_SQL:
# joined, filtered, ordered and cut to `limit` in the store, so only `limit` rows reach
# pandas (at 100k trajectories x 10 runs both sides hold ~1.4M pairs).
_QUEUE_SQL = """
WITH joined AS (
    SELECT coalesce(s.trajectory_id, d.trajectory_id) AS trajectory_id,
           coalesce(s.capability, d.capability) AS capability,
           coalesce(s.flips_keep, false) AS flips_keep, s.flip_to,
           coalesce(s.sensitivity, 0.0) AS sensitivity,
           coalesce(d.disagreement, 0.0) AS disagreement, coalesce(d.source, '') AS source,
           coalesce(d.people_disagreement, 0.0) AS people_disagreement,
           d.labelers, d.editors, coalesce(d.runs_disagreement, 0.0) AS runs_disagreement,
           coalesce(d.n_unsupported, 0) AS n_unsupported
    FROM queue_sensitivity s
    FULL OUTER JOIN ({disagreements}) d
      ON d.trajectory_id = s.trajectory_id AND d.capability = s.capability
)
SELECT j.* EXCLUDE (people_disagreement)
FROM joined j
LEFT JOIN latest_label_edits e
  ON e.trajectory_id = j.trajectory_id AND e.capability = j.capability
WHERE (j.disagreement > 0 OR j.sensitivity > 0 OR j.flips_keep OR j.n_unsupported > 0)
  AND (e.trajectory_id IS NULL OR j.people_disagreement > 0)
ORDER BY j.n_unsupported > 0 DESC, {order}, j.trajectory_id, j.capability
LIMIT ?
"""
QUEUE_COLUMNS = ["trajectory_id", "capability", "value", "n_unsupported", "disagreement",
                 "source",
                 "flips_keep", "flip_to", "sensitivity", "labelers", "editors",
                 "runs_disagreement", "success", "task_id"]


def review_queue_con(con: Connection, cfg: RankConfig | None = None,
                     st: StabilityConfig | None = None, *, limit: int = 50,
                     order: str = "disagreement", scope: Scope | None = None
                     ) -> pd.DataFrame:
    """The review queue: pairs people should look at, by disagreement and by sensitivity
    (see the module docstring); `df.attrs` carries the stability used and left-out runs."""
    if order not in ORDERS:
        raise UserInputError(f"review queue: order {order!r}: expected one of "
                             f"{', '.join(ORDERS)}")
    cfg = cfg or RankConfig()
    sr = stable_ranking(con, cfg, st, scope=scope)
    sens = sensitivity(con, sr, cfg)
    keys = ["trajectory_id", "capability"]
    by = (["disagreement", "flips_keep", "sensitivity"] if order == "disagreement"
          else ["flips_keep", "sensitivity", "disagreement"])
    sc, sp = sr.scope.where(con, "t")
    # Registered on a cursor of its own: `register` refuses a connection whose last
    # `execute` result was not read to the end (a `fetchone` anywhere before, e.g. in the
    # cached bootstrap's key), and the registration stays local to this query.
    cur = con.cursor()
    try:
        # An empty frame's object columns have no type to infer: give them one.
        cur.register("queue_sensitivity", sens.astype({
            "trajectory_id": str, "capability": str, "value": object, "flip_to": object,
            "flips_keep": bool, "sensitivity": float}) if sens.empty else sens)
        out = cur.execute(_QUEUE_SQL.format(
            order=", ".join(f"j.{c} DESC" for c in by),
            disagreements=DISAGREEMENT_SQL.format(scope=sc)),
            [sr.run_ids, *sp, *sp, int(limit)]).df()
    finally:
        cur.close()
    if out.empty:
        out = pd.DataFrame(columns=QUEUE_COLUMNS)
    else:
        meta = con.execute("SELECT id, success, task_id FROM trajectories WHERE id IN "
                           "(SELECT unnest(?::VARCHAR[]))",
                           [list(out["trajectory_id"])]).df().rename(
                               columns={"id": "trajectory_id"})
        out = out.merge(meta, on="trajectory_id", how="left")
        current = con.execute("SELECT trajectory_id, capability, value FROM effective_labels "
                              "WHERE trajectory_id IN (SELECT unnest(?::VARCHAR[]))",
                              [list(out["trajectory_id"])]).df()
        out = out.merge(current, on=keys, how="left")[QUEUE_COLUMNS]
    out = out.reset_index(drop=True)
    out.attrs["stability"] = asdict(sr.info) | {"sentence": sr.info.sentence()}
    out.attrs["k_effective"] = sr.ranking.k_effective
    out.attrs["left_out"] = sr.ranking.left_out
    return out
