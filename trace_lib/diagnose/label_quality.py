"""How good are the labels? Against planted deficits (demo) and tau2's reward breakdown.

Design decisions
- Measured on effective labels (edits, else the majority over the selected runs), the
  same labels the ranking reads.
- Planted deficits (`meta.planted_deficits`, demo data): per-trajectory precision and
  recall of `lacking` for each planted capability, micro-averaged, plus precision and
  recall of the ranking's kept set against the set of planted capabilities.
- tau2 reward breakdown (`meta.reward_info`): for each capability, how often it is
  labeled lacking when tau2's action checks failed vs passed, and when the database
  check failed vs passed; plus "any core capability lacking" against the reward.
  This is agreement, not accuracy: the benchmark's checks are a different instrument.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trace_lib import store
from trace_lib.diagnose.capability_curation import CORE
from trace_lib.diagnose.ranking import RankConfig, rank_con
from trace_lib.store import labels as store_labels
from trace_lib.store import trajectories as store_trajectories


def _pr(tp: int, fp: int, fn: int) -> dict[str, Any]:
    p = tp / (tp + fp) if tp + fp else None
    r = tp / (tp + fn) if tp + fn else None
    f1 = 2 * p * r / (p + r) if p and r else None
    return {"precision": p, "recall": r, "f1": f1, "tp": tp, "fp": fp, "fn": fn}


def _effective(con: Any, runs: list[str] | None) -> dict[tuple[str, str], str]:
    rows = (store_labels.effective_label_rows(con) if runs is None
            else store_labels.majority_over_runs(con, runs))
    return {(t, c): v for t, c, v in rows}


def planted_recovery(con: Any, runs: list[str] | None = None, cfg: RankConfig | None = None
                     ) -> dict[str, Any] | None:
    """Precision/recall against `meta.planted_deficits`; None when no trajectory has them."""
    rows = store_trajectories.with_meta_field(con, "planted_deficits")
    if not rows:
        return None
    planted = {tid: set(json.loads(p) if isinstance(p, str) else p or []) for tid, _, p in rows}
    labels = _effective(con, runs)
    universe = sorted({c for s in planted.values() for c in s} | set(CORE))
    per_cap, tot = {}, [0, 0, 0]
    for cap in universe:
        tp = fp = fn = 0
        for tid, caps in planted.items():
            pred = labels.get((tid, cap)) == "lacking"
            gold = cap in caps
            tp += pred and gold
            fp += pred and not gold
            fn += gold and not pred
        per_cap[cap] = _pr(tp, fp, fn)
        tot = [tot[0] + tp, tot[1] + fp, tot[2] + fn]
    ranking = rank_con(con, RankConfig(**{**(cfg.__dict__ if cfg else {}), "runs": runs}))
    kept = {r.capability for r in ranking.selected}
    gold_caps = {c for s in planted.values() for c in s}
    return {
        "n_trajectories": len(planted),
        "planted_capabilities": sorted(gold_caps),
        "kept": sorted(kept),
        "kept_vs_planted": _pr(len(kept & gold_caps), len(kept - gold_caps),
                               len(gold_caps - kept)),
        "per_trajectory_micro": _pr(*tot),
        "per_trajectory": per_cap,
    }


def reward_agreement(con: Any, runs: list[str] | None = None) -> dict[str, Any] | None:
    """Labels vs tau2's action checks and DB check; None when no reward breakdown exists."""
    rows = store_trajectories.with_meta_field(con, "reward_info")
    if not rows:
        return None
    labels = _effective(con, runs)
    caps = sorted({c for _, c in labels})
    checks: dict[str, dict[str, bool | None]] = {}
    for tid, success, info in rows:
        ri = json.loads(info) if isinstance(info, str) else info
        acts = ri.get("action_checks") or []
        action_ok = all(a.get("action_match") for a in acts) if acts else None
        db = (ri.get("db_check") or {}).get("db_match")
        checks[tid] = {"action_ok": action_ok, "db_ok": db, "success": success}

    def table(key: str, cap_set: list[str]) -> dict[str, Any]:
        out = {}
        for cap in cap_set:
            cells = {"lacking_when_fail": 0, "n_fail": 0, "lacking_when_pass": 0, "n_pass": 0}
            for tid, ch in checks.items():
                ok = ch[key]
                v = labels.get((tid, cap))
                if ok is None or v is None or v == "na":
                    continue
                side = "pass" if ok else "fail"
                cells[f"n_{side}"] += 1
                cells[f"lacking_when_{side}"] += v == "lacking"
            rate_f = cells["lacking_when_fail"] / cells["n_fail"] if cells["n_fail"] else None
            rate_p = cells["lacking_when_pass"] / cells["n_pass"] if cells["n_pass"] else None
            out[cap] = {**cells, "rate_fail": rate_f, "rate_pass": rate_p,
                        "difference": rate_f - rate_p if rate_f is not None and rate_p is not None
                        else None}
        return out

    core = [c for c in CORE if c in caps]
    # "any core lacking" as a failure predictor, against each check.
    anyl = {}
    for key in ("success", "action_ok", "db_ok"):
        tp = fp = fn = tn = 0
        for tid, ch in checks.items():
            if ch[key] is None:
                continue
            pred_fail = any(labels.get((tid, c)) == "lacking" for c in core)
            fail = not ch[key]
            tp += pred_fail and fail
            fp += pred_fail and not fail
            fn += fail and not pred_fail
            tn += not fail and not pred_fail
        n = tp + fp + fn + tn
        anyl[key] = {**_pr(tp, fp, fn), "tn": tn, "accuracy": (tp + tn) / n if n else None}
    return {
        "n_trajectories": len(checks),
        "n_with_action_checks": sum(c["action_ok"] is not None for c in checks.values()),
        "n_with_db_check": sum(c["db_ok"] is not None for c in checks.values()),
        "by_action_checks": table("action_ok", caps),
        "by_db_check": table("db_ok", caps),
        "any_core_lacking_predicts_failure": anyl,
    }


def evaluate(db: str | Path | None = None, runs: list[str] | None = None) -> dict[str, Any]:
    with store.connect(db) as con:
        return {"planted": planted_recovery(con, runs), "reward_breakdown": reward_agreement(con, runs)}
