"""Tool calling precision: one write with many exact arguments, all given in the request.

Each instance is a single write whose every argument can be read off the request (ids,
nested objects, enums, counts, amounts). Partial credit is the share of arguments the
agent's best call of that tool got right, so "almost" scores between 0 and 1.

Design decisions
- The request states every value, so a wrong argument is a precision failure, not a
  reasoning or policy one; amounts are computed here from the domain's own prices and
  fees and written into the request.
- Candidates are replayed on a copy of the database; only calls the tools accept are used.
- Difficulty: 1 is a passenger-list edit (one nested list); 2 adds bookings (eleven
  arguments, nested flights/passengers/payments); 3 books round trips with several
  passengers and cabin changes that must list every flight again.
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
    person_text,
    pick,
)
from trace_lib.envs.capabilities.task_env import Task


def _airline_passenger_edit(db: Any, rng: random.Random) -> tuple[str, dict] | None:
    res = pick(rng, airline_active(db))
    i = rng.randrange(len(res.passengers))
    people = [p.model_dump() for p in res.passengers]
    old = res.passengers[i]
    year, month, day = old.dob.split("-")
    new_dob = f"{year}-{day if int(day) <= 12 else month}-{month if int(day) <= 12 else day}"
    if new_dob == old.dob:
        new_dob = f"{int(year) + 1}-{month}-{day}"
    new_first = pick(rng, [n for n in FIRST_NAMES if n != old.first_name])
    people[i] = {"first_name": new_first, "last_name": old.last_name, "dob": new_dob}
    listing = "; ".join(
        f"passenger {j + 1}: {p['first_name']} {p['last_name']}, born {p['dob']}"
        for j, p in enumerate(people)
    )
    text = (f"I'm user {res.user_id}. On reservation {res.reservation_id}, passenger "
            f"{person_text(old)} was entered wrongly. The passenger list must read, in this "
            f"order: {listing}. I confirm this change.")
    return text, call("update_reservation_passengers", reservation_id=res.reservation_id,
                      passengers=people)


def _airline_booking(db: Any, rng: random.Random, round_trip: bool, max_pax: int):
    from trace_lib.envs.domains.airline.data_model import BAG_FEE, INSURANCE_FEE, TODAY
    from trace_lib.envs.domains.airline.tools import free_bags

    user = pick(rng, [u for _, u in sorted(db.users.items())])
    people = [{"first_name": user.name.first_name, "last_name": user.name.last_name,
               "dob": user.dob}]
    people += [p.model_dump() for p in user.saved_passengers][: rng.randint(0, max_pax - 1)]
    n = len(people)
    cabin = pick(rng, ["basic_economy", "economy", "business"])
    out_options = sorted(
        (fno, day) for fno, f in db.flights.items() for day, d in f.dates.items()
        if day > TODAY and d.status == "available" and (d.available_seats or {}).get(cabin, 0) >= n
    )
    if not out_options:
        return None
    fno, day = pick(rng, out_options)
    out = db.flights[fno]
    legs = [(fno, day)]
    if round_trip:
        back = sorted(
            (b.flight_number, d2) for b in db.flights.values()
            if b.origin == out.destination and b.destination == out.origin
            for d2, d in b.dates.items()
            if d2 > day and d.status == "available"
            and (d.available_seats or {}).get(cabin, 0) >= n
        )
        if not back:
            return None
        legs.append(pick(rng, back[:6]))
    prices = [db.flights[f].dates[d].prices[cabin] for f, d in legs]
    free = free_bags(user.membership, cabin, n)
    total_bags = rng.randint(0, free + 2)
    nonfree = max(0, total_bags - free)
    insurance = pick(rng, ["yes", "no"])
    amount = sum(prices) * n + BAG_FEE * nonfree + (INSURANCE_FEE * n if insurance == "yes" else 0)
    pay = airline_payment(user, amount)
    if pay is None:
        return None
    args = {
        "user_id": user.user_id, "origin": out.origin, "destination": out.destination,
        "flight_type": "round_trip" if round_trip else "one_way", "cabin": cabin,
        "flights": [{"flight_number": f, "date": d} for f, d in legs],
        "passengers": people,
        "payment_methods": [{"payment_id": pay, "amount": amount}],
        "total_baggages": total_bags, "nonfree_baggages": nonfree, "insurance": insurance,
    }
    flights_text = " and ".join(f"flight {f} on {d}" for f, d in legs)
    pax_text = "; ".join(f"{p['first_name']} {p['last_name']}, born {p['dob']}" for p in people)
    text = (f"I'm user {user.user_id}. Please book a "
            f"{'round trip' if round_trip else 'one-way trip'} from {out.origin} to "
            f"{out.destination} in {cabin.replace('_', ' ')}: {flights_text}. Passengers: "
            f"{pax_text}. {total_bags} checked bags in total, {nonfree} of them paid. "
            f"Insurance: {insurance}. Charge the whole ${amount} to {pay}. I confirm this "
            f"booking.")
    return text, call("book_reservation", **args)


def _airline_cabin_change(db: Any, rng: random.Random):
    res = pick(rng, airline_active(db))
    user = db.users[res.user_id]
    cabin = pick(rng, [c for c in ("basic_economy", "economy", "business") if c != res.cabin])
    pay = airline_payment(user, 5000)
    if pay is None:
        return None
    flights = [{"flight_number": leg.flight_number, "date": leg.date} for leg in res.flights]
    text = (f"I'm user {res.user_id}. Please move reservation {res.reservation_id} to "
            f"{cabin.replace('_', ' ')} for all its flights, keeping the same flights "
            f"({', '.join(f['flight_number'] + ' on ' + f['date'] for f in flights)}), and "
            f"settle the difference with {pay}. I confirm this change.")
    return text, call("update_reservation_flights", reservation_id=res.reservation_id,
                      cabin=cabin, flights=flights, payment_id=pay)


def _airline_draw(db: Any, rng: random.Random, difficulty: int):
    if difficulty == 1:
        return _airline_passenger_edit(db, rng)
    if difficulty == 2:
        kind = pick(rng, ["passengers", "book", "book"])
        if kind == "passengers":
            return _airline_passenger_edit(db, rng)
        return _airline_booking(db, rng, round_trip=False, max_pax=2)
    kind = pick(rng, ["book", "cabin"])
    if kind == "cabin":
        return _airline_cabin_change(db, rng)
    return _airline_booking(db, rng, round_trip=True, max_pax=3)


@task_builder("tool_calling_precision", "airline",
              note="passenger-list edits, full bookings, cabin changes listing every flight",
              tools={1: ("update_reservation_passengers",),
                     2: ("update_reservation_passengers", "book_reservation"),
                     3: ("book_reservation", "update_reservation_flights")},
              policy_sections=('Booking', 'Changing a reservation'))
def airline_precise_write(db: Any, rng: random.Random, difficulty: int) -> Task:
    drawn = None
    for _ in range(30):
        drawn = _airline_draw(db, rng, difficulty)
        if drawn is not None and feasible("airline", db, [drawn[1]]):
            break
        drawn = None
    if drawn is None:
        drawn = _airline_passenger_edit(db, rng)
    text, write = drawn
    return Task(
        request=text,
        actions=[write],
        answer=f"Done: {write['name']} went through as you asked.",
        answer_items=[],
        hint=(f"Use {write['name']} once, copying every value from the request exactly: ids, "
              "dates, names, counts and amounts; nested lists must contain every item."),
        facts={"tool": write["name"], "arguments": write["arguments"]},
    )


def _retail_swap(db: Any, rng: random.Random, status: str, max_items: int):
    from trace_lib.envs.capabilities.instances import retail_orders, retail_other_variants

    orders = [o for o in retail_orders(db, status)
              if any(retail_other_variants(db, i) for i in o.items)]
    if not orders:
        return None
    order = pick(rng, orders)
    user = db.users[order.user_id]
    swappable = [i for i in order.items if retail_other_variants(db, i)]
    chosen = swappable[: rng.randint(1, min(max_items, len(swappable)))]
    old_ids = [i.item_id for i in chosen]
    new_ids = [pick(rng, retail_other_variants(db, i)).item_id for i in chosen]
    pay = pick(rng, sorted(user.payment_methods))
    tool = ("modify_pending_order_items" if status == "pending"
            else "exchange_delivered_order_items")
    pairs = "; ".join(f"item {o} ({i.name}) for item {n}"
                      for o, n, i in zip(old_ids, new_ids, chosen, strict=True))
    verb = "change the items of pending order" if status == "pending" else "exchange, in " \
        "delivered order"
    text = (f"My email is {user.email}. Please {verb} {order.order_id}: {pairs}. Use {pay} for "
            f"any price difference. That is the complete list; I confirm.")
    return text, call(tool, order_id=order.order_id, item_ids=old_ids, new_item_ids=new_ids,
                      payment_method_id=pay), user.user_id


def _retail_order_address(db: Any, rng: random.Random):
    from trace_lib.envs.capabilities.instances import retail_orders
    from trace_lib.envs.capabilities.multi_step_task_completion import (
        _address_text,
        _retail_address,
    )

    order = pick(rng, retail_orders(db, "pending"))
    user = db.users[order.user_id]
    address = _retail_address(rng)
    text = (f"My email is {user.email}. Please ship pending order {order.order_id} to "
            f"{_address_text(address)} (address line 1: {address['address1']}; line 2: "
            f"{address['address2'] or 'empty'}). I confirm.")
    return text, call("modify_pending_order_address", order_id=order.order_id, **address), \
        user.user_id


def _retail_draw(db: Any, rng: random.Random, difficulty: int):
    if difficulty == 1:
        return _retail_order_address(db, rng)
    if difficulty == 2:
        return _retail_swap(db, rng, pick(rng, ["pending", "delivered"]), 1)
    return _retail_swap(db, rng, pick(rng, ["pending", "delivered"]), 3)


@task_builder("tool_calling_precision", "retail",
              note="order address changes, item swaps and exchanges with exact id lists",
              tools={1: ("find_user_id_by_email", "modify_pending_order_address"),
                     2: ("find_user_id_by_email", "modify_pending_order_items",
                         "exchange_delivered_order_items"),
                     3: ("find_user_id_by_email", "modify_pending_order_items",
                         "exchange_delivered_order_items")},
              policy_sections=('General rules', 'Changing a pending order', 'Exchanging a delivered order'))
def retail_precise_write(db: Any, rng: random.Random, difficulty: int) -> Task:
    from trace_lib.envs.capabilities.instances import retail_login

    drawn = None
    for _ in range(30):
        drawn = _retail_draw(db, rng, difficulty)
        if drawn is not None and feasible("retail", db, [drawn[1]]):
            break
        drawn = None
    if drawn is None:
        drawn = _retail_order_address(db, rng)
    text, write, user_id = drawn
    return Task(
        request=text,
        actions=[retail_login(db, user_id), write],
        answer=f"Done: {write['name']} went through as you asked.",
        hint=(f"Authenticate by email, then use {write['name']} once, copying every value "
              "from the request exactly; item ids are not product ids, and the lists must "
              "pair old and new items position by position."),
        facts={"tool": write["name"], "arguments": write["arguments"]},
    )


CAPABILITY = CapabilitySpec.of("tool_calling_precision", airline_precise_write, retail_precise_write)
