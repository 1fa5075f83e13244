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

from trace_lib.envs.capabilities.builders import CapabilitySpec, task_builder
from trace_lib.envs.capabilities.instances import (
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
              note="2-4 exact changes: add bags, fix a passenger name, cancel an eligible trip",
              tools=('get_user_details', 'get_reservation_details', 'update_reservation_baggages', 'update_reservation_passengers', 'cancel_reservation'),
              policy_sections=('Changing a reservation', 'Cancelling'))
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


_STREETS = ("Birch Road", "Harbor Street", "Hill Avenue", "Lake Drive", "Mill Lane")
_CITIES = (("Austin", "TX"), ("Denver", "CO"), ("Portland", "OR"), ("Columbus", "OH"))


def _retail_address(rng: random.Random) -> dict[str, str]:
    city, state = pick(rng, list(_CITIES))
    return {"address1": f"{rng.randint(10, 9999)} {pick(rng, list(_STREETS))}",
            "address2": pick(rng, ["", f"Apt {rng.randint(1, 99)}"]), "city": city,
            "state": state, "country": "USA", "zip": f"{rng.randint(10000, 99999)}"}


def _address_text(a: dict[str, str]) -> str:
    line2 = f", {a['address2']}" if a["address2"] else ""
    return f"{a['address1']}{line2}, {a['city']}, {a['state']} {a['zip']}, {a['country']}"


def _retail_parts(db: Any, user: Any, rng: random.Random) -> list[tuple[str, list[dict]]]:
    parts: list[tuple[str, list[dict]]] = []
    new_home = _retail_address(rng)
    parts.append((f"change my default address to {_address_text(new_home)}",
                  [call("get_user_details", user_id=user.user_id),
                   call("modify_user_address", user_id=user.user_id, **new_home)]))
    for oid in sorted(user.orders):
        order = db.orders[oid]
        read = call("get_order_details", order_id=oid)
        if order.status == "pending":
            ship = _retail_address(rng)
            parts.append((f"ship pending order {oid} to {_address_text(ship)} instead",
                          [read, call("modify_pending_order_address", order_id=oid, **ship)]))
            reason = pick(rng, ["no longer needed", "ordered by mistake"])
            parts.append((f"cancel order {oid} (reason: {reason})",
                          [read, call("cancel_pending_order", order_id=oid, reason=reason)]))
        if order.status == "delivered":
            item = pick(rng, order.items)
            paid = [p.payment_method_id for p in order.payment_history
                    if p.transaction_type == "payment"]
            if paid:
                parts.append((
                    f"return the {item.name} (item {item.item_id}) of delivered order {oid}, "
                    f"refunded to {paid[0]}",
                    [read, call("return_delivered_order_items", order_id=oid,
                                item_ids=[item.item_id], payment_method_id=paid[0])]))
    return parts


@task_builder("multi_step_task_completion", "retail",
              note="2-4 exact changes: default address, order address, cancel, return",
              tools=('find_user_id_by_email', 'get_user_details', 'get_order_details', 'cancel_pending_order', 'modify_pending_order_address', 'modify_user_address', 'return_delivered_order_items'),
              policy_sections=('General rules', 'Cancelling a pending order', 'Changing a pending order', 'Returning a delivered order'))
def retail_changes(db: Any, rng: random.Random, difficulty: int) -> Task:
    from trace_lib.envs.capabilities.instances import retail_login

    n_parts = difficulty + 1
    users = [u for _, u in sorted(db.users.items())
             if sum(db.orders[o].status in ("pending", "delivered") for o in u.orders) >= 2]
    user = pick(rng, users or [u for _, u in sorted(db.users.items())])
    candidates = _retail_parts(db, user, rng)
    rng.shuffle(candidates)
    chosen: list[tuple[str, list[dict]]] = []
    used_orders: set[str] = set()
    for text, calls in candidates:
        key = calls[1]["arguments"].get("order_id", "user")
        if key in used_orders:
            continue  # one change per order keeps every part independent
        plan = [c for _, cs in chosen for c in cs] + calls
        if not feasible("retail", db, plan):
            continue
        chosen.append((text, calls))
        used_orders.add(key)
        if len(chosen) == n_parts:
            break
    actions = [retail_login(db, user.user_id)]
    for _, calls in chosen:
        actions.extend(calls)
    steps = "; ".join(f"({i + 1}) {text}" for i, (text, _) in enumerate(chosen))
    return Task(
        request=(f"Hi, my email is {user.email}. I need {len(chosen)} things done: {steps}. "
                 "That is the complete list, and I confirm every one of these changes."),
        actions=actions,
        answer="All the requested changes are done: " + steps + ".",
        hint=("Authenticate by email, then make a checklist of every part of the request and "
              "work through it until each part is done; do not reply before the last one."),
        facts={"user_id": user.user_id, "parts": [t for t, _ in chosen]},
    )


CAPABILITY = CapabilitySpec.of("multi_step_task_completion", airline_changes, retail_changes)
