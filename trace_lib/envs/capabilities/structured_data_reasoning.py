"""Structured data reasoning: a question whose answer must be computed from tool records.

Each instance is a read-only question about the user's own records. The reference reads
the records it needs and replies with the figure (and the entity, when one is asked for).
No write is needed: a write makes the episode fail.

Design decisions
- Questions are computed from the same pydantic records the tools return, so the answer
  key is exactly what a careful reading of the observations gives.
- Questions whose answer is ambiguous (a tie for "the most expensive") are redrawn, so
  every instance has one right answer.
- Difficulty: 1 asks about one named record (net amount paid); 2 adds aggregates over all
  the user's active records; 3 adds questions that join records with a policy table (the
  free bag allowance) or ask for an argmax with its value.
"""

from __future__ import annotations

import random
from typing import Any

from trace_lib.envs.capabilities.builders import CapabilitySpec, task_builder
from trace_lib.envs.capabilities.instances import call, pick
from trace_lib.envs.capabilities.task_env import Task


def _airline_net_paid(db: Any, rng: random.Random) -> dict[str, Any] | None:
    res = pick(rng, [r for _, r in sorted(db.reservations.items())])
    total = sum(p.amount for p in res.payment_history)
    return {
        "question": f"how much have I paid in total for reservation {res.reservation_id}, "
                    "after any refunds? Just the dollar amount.",
        "user_id": res.user_id,
        "reads": [call("get_reservation_details", reservation_id=res.reservation_id)],
        "items": [[str(total)]],
        "answer": f"Your net payment for reservation {res.reservation_id} is ${total}.",
        "facts": {"reservation_id": res.reservation_id, "net_paid": total},
    }


def _airline_user_reservations(db: Any, rng: random.Random, at_least: int) -> tuple[Any, list]:
    users = [u for _, u in sorted(db.users.items())
             if sum(1 for r in u.reservations if db.reservations[r].status != "cancelled")
             >= at_least]
    user = pick(rng, users or [u for _, u in sorted(db.users.items())])
    active = [db.reservations[r] for r in sorted(user.reservations)
              if db.reservations[r].status != "cancelled"]
    return user, active


def _airline_total_bags(db: Any, rng: random.Random) -> dict[str, Any] | None:
    user, active = _airline_user_reservations(db, rng, 2)
    total = sum(r.total_baggages for r in active)
    return {
        "question": "how many checked bags do I have in total across all my reservations that "
                    "are not cancelled?",
        "user_id": user.user_id,
        "reads": [call("get_user_details", user_id=user.user_id)]
        + [call("get_reservation_details", reservation_id=r.reservation_id) for r in active],
        "items": [[str(total)]],
        "answer": f"You have {total} checked bags across your active reservations.",
        "facts": {"reservations": [r.reservation_id for r in active], "total_bags": total},
    }


def _airline_priciest(db: Any, rng: random.Random) -> dict[str, Any] | None:
    user, active = _airline_user_reservations(db, rng, 2)
    if len(active) < 2:
        return None
    per = {r.reservation_id: max(leg.price for leg in r.flights) for r in active}
    best = max(per.values())
    winners = [rid for rid, p in per.items() if p == best]
    if len(winners) != 1:
        return None
    rid = winners[0]
    return {
        "question": "among my reservations that are not cancelled, which one has the most "
                    "expensive single flight (price paid per passenger), and what was that "
                    "price?",
        "user_id": user.user_id,
        "reads": [call("get_user_details", user_id=user.user_id)]
        + [call("get_reservation_details", reservation_id=r.reservation_id) for r in active],
        "items": [[rid], [str(best)]],
        "answer": f"Reservation {rid} has the most expensive flight, at ${best} per passenger.",
        "facts": {"prices": per, "reservation_id": rid, "price": best},
    }


def _airline_free_bags(db: Any, rng: random.Random) -> dict[str, Any] | None:
    from trace_lib.envs.domains.airline.data_model import FREE_BAGS

    res = pick(rng, [r for _, r in sorted(db.reservations.items()) if r.status != "cancelled"])
    user = db.users[res.user_id]
    free = FREE_BAGS[user.membership][res.cabin] * len(res.passengers)
    return {
        "question": f"how many checked bags can reservation {res.reservation_id} carry for "
                    "free under your policy (all passengers together)?",
        "user_id": user.user_id,
        "reads": [call("get_user_details", user_id=user.user_id),
                  call("get_reservation_details", reservation_id=res.reservation_id)],
        "items": [[str(free)]],
        "answer": f"Reservation {res.reservation_id} includes {free} free checked bags.",
        "facts": {"membership": user.membership, "cabin": res.cabin,
                  "passengers": len(res.passengers), "free_bags": free},
    }


_AIRLINE_QUESTIONS = {
    1: [_airline_net_paid],
    2: [_airline_net_paid, _airline_total_bags, _airline_priciest],
    3: [_airline_total_bags, _airline_priciest, _airline_free_bags],
}


@task_builder("structured_data_reasoning", "airline",
              note="net amount paid, total bags, priciest flight, free bag allowance",
              tools=('get_user_details', 'get_reservation_details'),
              policy_sections=('Records', 'Booking'))
def airline_question(db: Any, rng: random.Random, difficulty: int) -> Task:
    q = None
    for _ in range(20):
        q = pick(rng, _AIRLINE_QUESTIONS[difficulty])(db, rng)
        if q is not None:
            break
    if q is None:
        q = _airline_net_paid(db, rng)
    assert q is not None
    return Task(
        request=f"Hello, my user id is {q['user_id']}. Could you tell me {q['question']}",
        actions=q["reads"],
        answer=q["answer"],
        answer_items=q["items"],
        required_reads=q["reads"][-1:],
        hint=("Read every record the question depends on, then compute the figure from the "
              "fields (payment_history amounts include refunds as negative numbers; "
              "cancelled reservations are excluded when the question says so). Change "
              "nothing."),
        facts=q["facts"],
    )


def _retail_user(db: Any, rng: random.Random, min_orders: int = 1) -> Any:
    users = [u for _, u in sorted(db.users.items()) if len(u.orders) >= min_orders]
    return pick(rng, users or [u for _, u in sorted(db.users.items())])


def _retail_net_paid(db: Any, rng: random.Random) -> dict[str, Any] | None:
    from trace_lib.envs.capabilities.instances import money, retail_login

    order = pick(rng, [o for _, o in sorted(db.orders.items())])
    net = round(sum(p.amount if p.transaction_type == "payment" else -p.amount
                    for p in order.payment_history), 2)
    return {
        "question": f"how much have I paid for order {order.order_id} so far, payments minus "
                    "refunds?",
        "user_id": order.user_id,
        "reads": [retail_login(db, order.user_id),
                  call("get_order_details", order_id=order.order_id)],
        "items": [money(net)],
        "answer": f"Your net payment for order {order.order_id} is ${net:.2f}.",
        "facts": {"order_id": order.order_id, "net_paid": net},
    }


def _retail_priciest_item(db: Any, rng: random.Random) -> dict[str, Any] | None:
    from trace_lib.envs.capabilities.instances import money, retail_login

    order = pick(rng, [o for _, o in sorted(db.orders.items()) if len(o.items) >= 2] or
                 [o for _, o in sorted(db.orders.items())])
    best = max(i.price for i in order.items)
    winners = {i.item_id for i in order.items if i.price == best}
    if len(winners) != 1:
        return None
    item_id = winners.pop()
    return {
        "question": f"which item of order {order.order_id} cost the most (its item id) and "
                    "what was its price?",
        "user_id": order.user_id,
        "reads": [retail_login(db, order.user_id),
                  call("get_order_details", order_id=order.order_id)],
        "items": [[item_id], money(best)],
        "answer": f"Item {item_id} was the most expensive, at ${best:.2f}.",
        "facts": {"order_id": order.order_id, "item_id": item_id, "price": best},
    }


def _retail_items_delivered(db: Any, rng: random.Random) -> dict[str, Any] | None:
    from trace_lib.envs.capabilities.instances import retail_login

    user = _retail_user(db, rng, 2)
    orders = [db.orders[o] for o in sorted(user.orders)]
    count = sum(len(o.items) for o in orders if o.status == "delivered")
    return {
        "question": "how many items in total have been delivered to me, counting every "
                    "delivered order?",
        "user_id": user.user_id,
        "reads": [retail_login(db, user.user_id), call("get_user_details", user_id=user.user_id)]
        + [call("get_order_details", order_id=o.order_id) for o in orders],
        "items": [[str(count)]],
        "answer": f"{count} items have been delivered to you.",
        "facts": {"orders": {o.order_id: o.status for o in orders}, "delivered_items": count},
    }


def _retail_cheapest_variant(db: Any, rng: random.Random) -> dict[str, Any] | None:
    from trace_lib.envs.capabilities.instances import money, retail_login, retail_other_variants

    order = pick(rng, [o for _, o in sorted(db.orders.items())])
    item = pick(rng, order.items)
    others = retail_other_variants(db, item)
    if not others:
        return None
    cheapest = min(v.price for v in others)
    winners = [v for v in others if v.price == cheapest]
    if len(winners) != 1:
        return None
    return {
        "question": f"in order {order.order_id} I bought a {item.name}; which other available "
                    "variant of that product is the cheapest (its item id), and how much is it?",
        "user_id": order.user_id,
        "reads": [retail_login(db, order.user_id),
                  call("get_order_details", order_id=order.order_id),
                  call("get_product_details", product_id=item.product_id)],
        "items": [[winners[0].item_id], money(cheapest)],
        "answer": f"Item {winners[0].item_id} is the cheapest available variant, at "
                  f"${cheapest:.2f}.",
        "facts": {"product_id": item.product_id, "item_id": winners[0].item_id,
                  "price": cheapest},
    }


_RETAIL_QUESTIONS = {
    1: [_retail_net_paid],
    2: [_retail_net_paid, _retail_priciest_item, _retail_items_delivered],
    3: [_retail_items_delivered, _retail_priciest_item, _retail_cheapest_variant],
}


@task_builder("structured_data_reasoning", "retail",
              note="net paid, priciest item, delivered item count, cheapest other variant",
              tools=('find_user_id_by_email', 'get_user_details', 'get_order_details', 'get_product_details'),
              policy_sections=('Records',))
def retail_question(db: Any, rng: random.Random, difficulty: int) -> Task:
    q = None
    for _ in range(20):
        q = pick(rng, _RETAIL_QUESTIONS[difficulty])(db, rng)
        if q is not None:
            break
    if q is None:
        q = _retail_net_paid(db, rng)
    assert q is not None
    email = db.users[q["user_id"]].email
    return Task(
        request=f"Hi, my email is {email}. Could you tell me {q['question']}",
        actions=q["reads"],
        answer=q["answer"],
        answer_items=q["items"],
        required_reads=q["reads"][-1:],
        hint=("Authenticate by email, read every record the question depends on, then compute "
              "the figure from the fields (refunds count negative; item ids and product ids "
              "differ). Change nothing."),
        facts=q["facts"],
    )


CAPABILITY = CapabilitySpec.of("structured_data_reasoning", airline_question, retail_question)
