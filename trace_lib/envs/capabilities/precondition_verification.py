"""Precondition verification: a write the user asks for, allowed by the policy or not.

Each instance is one request for a write whose eligibility depends on facts in the
records. About half the instances are eligible (reference: read, then write) and half are
not (reference: read, then refuse without writing). The verifier requires the read before
any write, the write when eligible, no write and a refusal when not.

Design decisions
- Eligibility is decided by the domain's own rule functions (airline:
  `cancellation_allowed`), never re-derived here, so the environment and the domain
  cannot disagree.
- The eligible / ineligible split is drawn first (p = 0.5) and then a matching record is
  searched, so the split does not depend on how the database happens to be populated.
- Difficulty: 1 draws ineligible cases of any kind; 2 prefers ineligible cases that look
  eligible at a glance (insurance present but the reason is not covered, economy booked
  a day and a half ago); 3 takes only those and words the reason indirectly.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any

from trace_lib.envs.capabilities.builders import CapabilitySpec, task_builder
from trace_lib.envs.capabilities.instances import airline_active, call, pick
from trace_lib.envs.capabilities.task_env import Task

COVERED = {"health": ["I got sick and my doctor told me not to travel",
                      "I have a medical emergency"],
           "weather": ["a storm is forecast at my destination", "the weather looks dangerous"]}
NOT_COVERED = {"change of plans": ["my plans changed", "I no longer need to travel"],
               "schedule conflict": ["I have a work meeting I cannot move",
                                     "the dates clash with a family event"]}


def _looks_eligible(res: Any) -> bool:
    from trace_lib.envs.domains.airline.data_model import NOW

    created = datetime.fromisoformat(res.created_at)
    recent = datetime.fromisoformat(NOW) - created <= timedelta(hours=48)
    return res.insurance == "yes" or recent


@task_builder("precondition_verification", "airline",
              note="cancel a reservation: allowed (recent, business, airline-cancelled, "
                   "insured with a covered reason) or not",
              tools=('get_user_details', 'get_reservation_details', 'cancel_reservation'),
              policy_sections=('Cancelling',))
def airline_cancel(db: Any, rng: random.Random, difficulty: int) -> Task:
    from trace_lib.envs.domains.airline.tools import cancellation_allowed

    want_eligible = rng.random() < 0.5
    covered = rng.random() < 0.5
    reasons = COVERED if covered else NOT_COVERED
    reason = pick(rng, sorted(reasons))
    reason_text = pick(rng, reasons[reason]) if difficulty >= 3 else reason
    candidates = []
    for res in airline_active(db):
        why = cancellation_allowed(db, res, reason_covered=covered)
        if (why is None) != want_eligible:
            continue
        if not want_eligible and difficulty >= 2 and not _looks_eligible(res):
            continue
        candidates.append((res, why))
    if not candidates:  # fall back to the other side rather than fail the seed
        candidates = [(r, cancellation_allowed(db, r, reason_covered=covered))
                      for r in airline_active(db)]
    res, why = pick(rng, candidates)
    uid, rid = res.user_id, res.reservation_id
    request = (f"Hi, I'm user {uid}. Please cancel my reservation {rid} ({res.origin} to "
               f"{res.destination}); the reason is: {reason_text}. If it can be cancelled, "
               f"I confirm: yes, cancel it.")
    reads = [call("get_user_details", user_id=uid),
             call("get_reservation_details", reservation_id=rid)]
    if why is None:
        actions = reads + [call("cancel_reservation", reservation_id=rid)]
        answer = (f"Reservation {rid} is cancelled; the refund goes back to the original "
                  f"payment methods within 5 to 7 business days.")
        items: list[list[str]] = []
    else:
        actions = reads
        answer = f"I'm sorry, but I cannot cancel reservation {rid}: {why}."
        items = []
    return Task(
        request=request,
        actions=actions,
        answer=answer,
        answer_items=items,
        required_reads=[call("get_reservation_details", reservation_id=rid)],
        refusal_of=None if why is None else rid,
        hint=("Read the reservation before deciding. Cancel only if it was booked less than "
              "24 hours ago, an airline-cancelled flight is on it, the cabin is business, or "
              "it has insurance and the reason is health or weather. Otherwise refuse and do "
              "not call cancel_reservation."),
        facts={"user_id": uid, "reservation_id": rid, "reason": reason,
               "reason_covered": covered, "eligible": why is None, "why_not": why,
               "cabin": res.cabin, "insurance": res.insurance, "created_at": res.created_at},
    )


@task_builder("precondition_verification", "retail",
              note="cancel an order: allowed only if it is the user's own and still pending",
              tools=('find_user_id_by_email', 'get_order_details', 'cancel_pending_order'),
              policy_sections=('General rules', 'Cancelling a pending order'))
def retail_cancel(db: Any, rng: random.Random, difficulty: int) -> Task:
    from trace_lib.envs.capabilities.instances import retail_login, retail_orders

    pending = retail_orders(db, "pending")
    kind = "eligible" if rng.random() < 0.5 else (
        "not_own" if rng.random() < (0.3 + 0.2 * difficulty) else "not_pending")
    if kind == "not_pending":
        candidates = [o for o in retail_orders(db, "processed") + retail_orders(db, "delivered")]
        if not candidates:
            kind = "not_own"
    if kind == "eligible":
        order = pick(rng, pending)
        user_id = order.user_id
    elif kind == "not_own":
        order = pick(rng, pending)
        user_id = pick(rng, [u for u in sorted(db.users) if u != order.user_id])
    else:
        order = pick(rng, candidates)
        user_id = order.user_id
    user = db.users[user_id]
    oid = order.order_id
    reason = pick(rng, ["no longer needed", "ordered by mistake"])
    request = (f"Hello, my email is {user.email}. Please cancel order {oid}; the reason is "
               f"'{reason}'. If it can be cancelled, yes, I confirm the cancellation.")
    reads = [retail_login(db, user_id), call("get_order_details", order_id=oid)]
    if kind == "eligible":
        actions = reads + [call("cancel_pending_order", order_id=oid, reason=reason)]
        answer = f"Order {oid} is cancelled; the refund is on its way."
        items: list[list[str]] = []
        why = None
    else:
        why = ("the order belongs to another customer" if kind == "not_own"
               else f"the order is {order.status}, and only pending orders can be cancelled")
        actions = reads
        answer = f"I'm sorry, I cannot cancel order {oid}: {why}."
        items = []
    return Task(
        request=request,
        actions=actions,
        answer=answer,
        answer_items=items,
        required_reads=reads,
        refusal_of=None if why is None else oid,
        hint=("Authenticate the user first (find_user_id_by_email), then read the order: "
              "cancel only an order of this user whose status is pending; otherwise refuse "
              "without calling cancel_pending_order."),
        facts={"order_id": oid, "user_id": user_id, "owner": order.user_id,
               "status": order.status, "case": kind, "why_not": why},
    )


CAPABILITY = CapabilitySpec.of("precondition_verification", airline_cancel, retail_cancel)
