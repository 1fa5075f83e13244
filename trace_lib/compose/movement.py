"""Gate movement: is a gate-training run actually changing the routing?

Design decisions
- Read from the run's own metrics.jsonl rows (plain dicts), so the Routing page, `job
  status` and notebooks agree and none of them imports torch for it.
- "Moved" means the gates' distance from where the run started (`gate_delta`) is above
  1e-8: the norm alone cannot tell a warm-started run that then stood still from one that
  learned. Routing entropy and the share per slot say where the routing went.
- The warning names the likely cause seen in the rows: no GRPO step kept a group (every
  group had constant reward, so GRPO has no signal) or no step ran at all; a person can
  act on either (more seeds, a larger group, a warm start, an environment the model can
  sometimes solve).
"""

from __future__ import annotations

from typing import Any

MOVED_EPS = 1e-8


def gate_movement(rows: list[dict[str, Any]], finished: bool = False) -> dict[str, Any]:
    """Summary of gate movement over a gate-training run's metrics rows.

    Returns gate_norm, gate_delta, routing_entropy, shares ({slot: share}, last GRPO
    step), steps (GRPO rows), informative_steps (rows with a kept group), moved (bool or
    None when nothing was measured yet) and warning (str or None). `finished`: the run
    has ended, so "not moved yet" becomes "did not move"."""
    measured = [r for r in rows if r.get("gate_delta") is not None]
    grpo = [r for r in rows if r.get("phase") == "grpo"]
    last = measured[-1] if measured else {}
    last_grpo = grpo[-1] if grpo else {}
    shares = {k[len("share_"):]: float(v) for k, v in last_grpo.items()
              if k.startswith("share_") and v is not None}
    # Deltas are measured from the start of each phase's gates; the largest is the run's.
    delta = max((float(r["gate_delta"]) for r in measured), default=None)
    informative = sum(1 for r in grpo if (r.get("groups_kept") or 0) > 0)
    moved = None if delta is None else delta > MOVED_EPS
    warning = None
    if moved is False or (finished and moved is None):
        if grpo and not informative:
            cause = (f"none of the {len(grpo)} GRPO steps had a group with reward variance, "
                     "so GRPO had no signal; use more or other seeds, a larger group, a warm "
                     "start, or environments the composed model sometimes solves")
        elif not grpo and not measured:
            cause = "no warm-start or GRPO step ran"
        else:
            cause = "every update was zero (check the estimator: `chosen` cannot move " \
                    "zero-initialised gates)"
        warning = f"The gates have not moved from where they started: {cause}."
    return {"gate_norm": last.get("gate_norm"), "gate_delta": delta,
            "routing_entropy": last_grpo.get("routing_entropy"), "shares": shares,
            "steps": len(grpo), "informative_steps": informative, "moved": moved,
            "warning": warning}


def movement_line(summary: dict[str, Any]) -> str:
    """One line for `job status`."""
    if summary["moved"] is None:
        return "gates: not measured yet"
    shares = ", ".join(f"{k} {v:.2f}" for k, v in summary["shares"].items())
    ent = summary["routing_entropy"]
    return (f"gates: norm {summary['gate_norm']:.4g}, moved {summary['gate_delta']:.4g}, "
            f"routing entropy {'-' if ent is None else f'{ent:.3f}'}"
            + (f", share {shares}" if shares else "")
            + f"; {summary['informative_steps']}/{summary['steps']} GRPO steps with signal")
