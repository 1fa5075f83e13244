"""Multi-step task completion: one request with several independent changes, all required.

Each instance asks for `difficulty` + 1 changes (2 to 4) on the user's records, every one of
them allowed and spelled out with exact values, so the only thing being measured is whether
the agent carries the whole request through. Partial credit is the share of changes made.

Design decisions
- Every part is exact (bag counts, names, payment ids), so no reasoning or policy judgement
  is needed: a failure is a dropped or abandoned part, which is the capability.
- Parts are drawn from the domain's write tools that the policy allows without conditions
  (airline: add bags, fix a passenger's name, cancel a reservation booked within 24 hours
  or in business), and each candidate part is replayed on a copy of the database
  after the parts already chosen, so the whole plan is feasible in order.
"""

from __future__ import annotations

import random
from typing import Any

from trace_lib.envs.capabilities import task_builder
from trace_lib.envs.capabilities.records import (
    FIRST_NAMES,
    airline_active,
    airline_payment,
    call,
    feasible,
    pick,
)
from trace_lib.envs.capabilities.task_env import Task


def _airline_parts(db: Any, user: Any, rng: random.Random) -> list[tuple[str, list[dict]]]:
    """Candidate parts (request text, calls) on this user's active reservations."""
    from trace_lib.envs.domains.airline.tools import cancellation_allowed, free_bags

    parts: list[tuple[str, list[dict]]] = []
    mine = [r for r in airline_active(db) if r.user_id == user.user_id]
    for res in mine:
        rid = res.reservation_id
        read = call("get_reservation_details", reservation_id=rid)
        pay = airline_payment(user, 200)
        if pay:
            extra = rng.randint(1, 2)
            total = res.total_baggages + extra
            nonfree = max(0, total - free_bags(user.membership, res.cabin, len(res.passengers)))
            nonfree = max(nonfree, res.nonfree_baggages)
            parts.append((
                f"on reservation {rid}, add {extra} checked bag{'s' if extra > 1 else ''} "
                f"(that makes {total} in total, {nonfree} of them paid; charge any fee to "
                f"{pay})",
                [read, call("update_reservation_baggages", reservation_id=rid,
                            total_baggages=total, nonfree_baggages=nonfree, payment_id=pay)],
            ))
        i = rng.randrange(len(res.passengers))
        old = res.passengers[i]
        new_first = pick(rng, [n for n in FIRST_NAMES if n != old.first_name])
        people = [p.model_dump() for p in res.passengers]
        people[i] = {**people[i], "first_name": new_first}
        parts.append((
            f"on reservation {rid}, correct the first name of passenger {old.first_name} "
            f"{old.last_name} (born {old.dob}) to {new_first}; everything else stays",
            [read, call("update_reservation_passengers", reservation_id=rid, passengers=people)],
        ))
        if cancellation_allowed(db, res, reason_covered=False) is None:
            parts.append((f"cancel reservation {rid} because my plans changed",
                          [read, call("cancel_reservation", reservation_id=rid)]))
    return parts


@task_builder("multi_step_task_completion", "airline",
              note="2-4 exact changes: add bags, fix a passenger name, cancel an eligible trip")
def airline_changes(db: Any, rng: random.Random, difficulty: int) -> Task:
    n_parts = difficulty + 1
    users = [u for _, u in sorted(db.users.items())
             if sum(1 for r in airline_active(db) if r.user_id == u.user_id) >= 2]
    if not users:
        users = [u for _, u in sorted(db.users.items())]
    user = pick(rng, users)
    candidates = _airline_parts(db, user, rng)
    rng.shuffle(candidates)
    chosen: list[tuple[str, list[dict]]] = []
    touched_cancelled: set[str] = set()
    for text, calls in candidates:
        rid = calls[0]["arguments"]["reservation_id"]
        if rid in touched_cancelled:
            continue
        plan = [c for _, cs in chosen for c in cs] + calls
        if not feasible("airline", db, plan):
            continue
        chosen.append((text, calls))
        if calls[-1]["name"] == "cancel_reservation":
            touched_cancelled.add(rid)
        if len(chosen) == n_parts:
            break
    # A cancellation must come after any other change to the same reservation.
    chosen.sort(key=lambda p: p[1][-1]["name"] == "cancel_reservation")
    actions = [call("get_user_details", user_id=user.user_id)]
    seen_reads: set[str] = set()
    for _, calls in chosen:
        read, write = calls
        key = read["arguments"]["reservation_id"]
        if key not in seen_reads:
            actions.append(read)
            seen_reads.add(key)
        actions.append(write)
    steps = "; ".join(f"({i + 1}) {text}" for i, (text, _) in enumerate(chosen))
    request = (f"Hi, I'm user {user.user_id}. I need {len(chosen)} things done today: {steps}. "
               f"I confirm all of these changes, please go ahead with every one of them.")
    return Task(
        request=request,
        actions=actions,
        answer="All the requested changes are done: " + steps + ".",
        answer_items=[],
        hint=("Make a checklist of every part of the request and work through it until each "
              "part is done; do not reply before the last one."),
        facts={"user_id": user.user_id, "parts": [t for t, _ in chosen]},
    )
