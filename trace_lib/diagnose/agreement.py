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
- Stability (runs or bootstrap resamples) and sensitivity live in `stability`; the names
  are re-exported here because the queue is where they meet.
- The queue holds pairs where runs, labelers or people disagree, or whose flip moves
  the ranking (`stability.sensitivity`), skipping pairs a person decided unless people
  disagree about them. Order "disagreement": disagreement, then flips_keep, then
  sensitivity; order "sensitivity": flips_keep, sensitivity, then disagreement.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from itertools import combinations
from typing import Any

import duckdb
import numpy as np
import pandas as pd

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
    cats = list(categories) + sorted((set(a.tolist()) | set(b.tolist())) - set(categories))
    index = {c: i for i, c in enumerate(cats)}
    m = np.zeros((len(cats), len(cats)))
    np.add.at(m, (np.array([index[v] for v in a]), np.array([index[v] for v in b])), 1)
    m /= len(a)
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


def _raw_labels(con: duckdb.DuckDBPyConnection, run_ids: list[str], scope: Scope
                ) -> pd.DataFrame:
    sc, sp = scope.where(con, "t")
    return con.execute(f"""
        SELECT l.run_id, r.labeler, l.trajectory_id, l.capability, l.value
        FROM counted_labels l JOIN label_runs r ON r.id = l.run_id
        JOIN trajectories t ON t.id = l.trajectory_id
        WHERE l.value IS NOT NULL AND l.run_id IN (SELECT unnest(?::VARCHAR[])) AND {sc}""",
                       [run_ids, *sp]).df()


# Each editor's latest live (not undone, not an undo) edit per pair, in scope.
_LIVE_EDITS = """
    SELECT trajectory_id, capability, editor, arg_max(new, id) AS value
    FROM label_edits
    WHERE undoes IS NULL AND id NOT IN (SELECT undoes FROM label_edits WHERE undoes IS NOT NULL)
      AND trajectory_id IN (SELECT t.id FROM trajectories t WHERE {scope})
    GROUP BY ALL
"""


def _majority(values: pd.Series) -> str:
    counts = values.value_counts()
    best = counts.max()
    return next(v for v in VALUES if counts.get(v, 0) == best)  # ties: lacking > present > na


def _kappa_pair(x: pd.Series, y: pd.Series) -> tuple[float | None, float | None, int, str | None]:
    both = pd.concat([x.rename("a"), y.rename("b")], axis=1, join="inner").dropna()
    if both.empty:
        return None, None, 0, "no pair rated by both"
    k = cohen_kappa(both["a"].to_numpy(), both["b"].to_numpy())
    observed = float((both["a"] == both["b"]).mean())
    return k, observed, len(both), None if k is not None else "every rating in one category"


def agreement_con(con: duckdb.DuckDBPyConnection, runs: list[str] | None = None, *,
                  scope: Scope | None = None) -> AgreementReport:
    """Fleiss' kappa across runs per capability; Cohen's kappa of every labeler against
    people, of labelers against each other and of people against each other."""
    scope = scope or Scope()
    sc, sp = scope.where(con, "t")
    run_ids = counted_run_ids(con, runs)
    raw = _raw_labels(con, run_ids, scope)
    report = AgreementReport(runs=run_ids)
    caps = sorted(raw["capability"].unique()) if not raw.empty else []
    for cap in caps:
        sub = raw[raw["capability"] == cap]
        wide = sub.pivot_table(index="trajectory_id", columns="run_id", values="value",
                               aggfunc="first")
        full = wide.dropna()
        if len(run_ids) < 2:
            report.fleiss.append(FleissRow(cap, None, None, len(wide), len(run_ids),
                                           "needs at least two label runs"))
            continue
        if full.empty or full.shape[1] < len(run_ids):
            report.fleiss.append(FleissRow(cap, None, None, 0, len(run_ids),
                                           "no trajectory labeled by every run"))
            continue
        counts = np.stack([(full == v).sum(axis=1).to_numpy() for v in VALUES], axis=1)
        n = counts.sum(axis=1)[0]
        p_bar = float(((np.square(counts).sum(axis=1) - n) / (n * (n - 1))).mean())
        k = fleiss_kappa(counts)
        report.fleiss.append(FleissRow(cap, k, p_bar, len(full), len(run_ids),
                                       None if k is not None else
                                       "every rating in one category"))
    # Raters: each labeler's majority over its runs; people's effective decision; editors.
    raters: dict[str, pd.Series] = {}
    for labeler, sub in raw.groupby("labeler"):
        raters[str(labeler)] = sub.groupby(["trajectory_id", "capability"])["value"].agg(
            _majority)
    people = con.execute("SELECT trajectory_id, capability, value FROM latest_label_edits "
                         f"WHERE trajectory_id IN (SELECT t.id FROM trajectories t WHERE {sc})",
                         sp).df().set_index(["trajectory_id", "capability"])["value"]
    report.n_human_decisions = len(people)
    labelers = sorted(raters)
    for name in labelers:
        k, obs, n, why = _kappa_pair(raters[name], people)
        report.cohen.append(CohenRow(name, PEOPLE, k, obs, n, "labeler vs people", why))
    for a, b in combinations(labelers, 2):
        k, obs, n, why = _kappa_pair(raters[a], raters[b])
        report.cohen.append(CohenRow(a, b, k, obs, n, "labeler vs labeler", why))
    edits = con.execute(_LIVE_EDITS.format(scope=sc), sp).df()
    by_editor = {str(e): sub.set_index(["trajectory_id", "capability"])["value"]
                 for e, sub in edits.groupby("editor")}
    for a, b in combinations(sorted(by_editor), 2):
        k, obs, n, why = _kappa_pair(by_editor[a], by_editor[b])
        if n:
            report.cohen.append(CohenRow(a, b, k, obs, n, "person vs person", why))
    return report


# ---------------------------------------------------------------------- disagreement

DISAGREEMENT_SQL = """
WITH raw AS (
    SELECT l.trajectory_id, l.capability, l.value, r.labeler
    FROM counted_labels l JOIN label_runs r ON r.id = l.run_id
    JOIN trajectories t ON t.id = l.trajectory_id
    WHERE l.value IS NOT NULL AND l.run_id IN (SELECT unnest(?::VARCHAR[])) AND {scope}
), runs AS (
    SELECT trajectory_id, capability, count(*) AS n_runs,
           1 - greatest(count(*) FILTER (WHERE value = 'lacking'),
                        count(*) FILTER (WHERE value = 'present'),
                        count(*) FILTER (WHERE value = 'na')) / count(*) AS runs_d
    FROM raw GROUP BY ALL
), per_labeler AS (
    SELECT trajectory_id, capability, labeler,
           CASE WHEN nl >= np_ AND nl >= nn THEN 'lacking'
                WHEN np_ >= nn THEN 'present' ELSE 'na' END AS value
    FROM (SELECT trajectory_id, capability, labeler,
                 count(*) FILTER (WHERE value = 'lacking') AS nl,
                 count(*) FILTER (WHERE value = 'present') AS np_,
                 count(*) FILTER (WHERE value = 'na') AS nn
          FROM raw GROUP BY ALL)
), labelers AS (
    SELECT trajectory_id, capability,
           string_agg(labeler || '=' || value, ', ' ORDER BY labeler) AS labelers,
           1 - greatest(count(*) FILTER (WHERE value = 'lacking'),
                        count(*) FILTER (WHERE value = 'present'),
                        count(*) FILTER (WHERE value = 'na')) / count(*) AS labelers_d
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
       lb.labelers, coalesce(lb.labelers_d, 0) AS labelers_disagreement,
       p.editors, coalesce(p.people_d, 0) AS people_disagreement,
       d.trajectory_id IS NOT NULL AS decided
FROM runs r
JOIN labelers lb USING (trajectory_id, capability)
FULL OUTER JOIN editors p
  ON p.trajectory_id = r.trajectory_id AND p.capability = r.capability
LEFT JOIN latest_label_edits d
  ON d.trajectory_id = coalesce(r.trajectory_id, p.trajectory_id)
 AND d.capability = coalesce(r.capability, p.capability)
WHERE coalesce(r.runs_d, 0) > 0 OR coalesce(lb.labelers_d, 0) > 0
   OR coalesce(p.people_d, 0) > 0
"""


def disagreements(con: duckdb.DuckDBPyConnection, run_ids: list[str],
                  scope: Scope | None = None) -> pd.DataFrame:
    """Pairs where runs, labelers (each by its majority) or people (each editor's latest
    live edit) disagree, with each share (1 - largest vote / votes) and `disagreement`,
    their maximum, and `source`, which of them disagree."""
    sc, sp = (scope or Scope()).where(con, "t")
    df = con.execute(DISAGREEMENT_SQL.format(scope=sc), [run_ids, *sp, *sp]).df()
    parts = {"runs": "runs_disagreement", "labelers": "labelers_disagreement",
             "people": "people_disagreement"}
    df["disagreement"] = df[list(parts.values())].max(axis=1) if not df.empty else []
    df["source"] = [" + ".join(k for k, col in parts.items() if row[col] > 0)
                    for _, row in df.iterrows()] if not df.empty else []
    return df


def review_queue_con(con: duckdb.DuckDBPyConnection, cfg: RankConfig | None = None,
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
    dis = disagreements(con, sr.run_ids, sr.scope)
    keys = ["trajectory_id", "capability"]
    df = sens.merge(dis, on=keys, how="outer") if not dis.empty else sens.assign(
        n_runs=0, runs_disagreement=0.0, labelers=None, labelers_disagreement=0.0,
        editors=None, people_disagreement=0.0, decided=False, disagreement=0.0, source="")
    if df.empty:
        out = df
    else:
        for col, fill in (("flips_keep", False), ("sensitivity", 0.0), ("disagreement", 0.0),
                          ("people_disagreement", 0.0), ("source", "")):
            df[col] = df[col].astype(object).where(df[col].notna(), fill)
            df[col] = df[col].astype(type(fill))
        decided = set(map(tuple, con.execute(
            "SELECT trajectory_id, capability FROM latest_label_edits").fetchall()))
        df["decided"] = [(t, c) in decided for t, c in zip(df["trajectory_id"],
                                                            df["capability"], strict=True)]
        keep = (df["disagreement"] > 0) | (df["sensitivity"] > 0) | df["flips_keep"]
        keep &= ~df["decided"] | (df["people_disagreement"] > 0)
        out = df[keep].copy()
        by = (["disagreement", "flips_keep", "sensitivity"] if order == "disagreement"
              else ["flips_keep", "sensitivity", "disagreement"])
        out = out.sort_values([*by, *keys], ascending=[False, False, False, True, True])
        out = out.head(int(limit))
        meta = con.execute("SELECT id, success, task_id FROM trajectories WHERE id IN "
                           "(SELECT unnest(?::VARCHAR[]))",
                           [list(out["trajectory_id"])]).df().rename(
                               columns={"id": "trajectory_id"})
        out = out.merge(meta, on="trajectory_id", how="left").drop(columns="value")
        current = con.execute("SELECT trajectory_id, capability, value FROM effective_labels "
                              "WHERE trajectory_id IN (SELECT unnest(?::VARCHAR[]))",
                              [list(out["trajectory_id"])]).df()
        out = out.merge(current, on=keys, how="left")
        out = out[["trajectory_id", "capability", "value", "disagreement", "source",
                   "flips_keep", "flip_to", "sensitivity", "labelers", "editors",
                   "runs_disagreement", "success", "task_id"]]
    out = out.reset_index(drop=True)
    out.attrs["stability"] = asdict(sr.info) | {"sentence": sr.info.sentence()}
    out.attrs["k_effective"] = sr.ranking.k_effective
    out.attrs["left_out"] = sr.ranking.left_out
    return out
