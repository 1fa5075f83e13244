"""Seeded airline tasks: a user's request, the correct tool calls, the expected final database.

Design decisions
- A task is drawn from the database, not written by hand: pick a user, pick reservations
  that fit an operation kind (an eligible or ineligible cancellation, adding bags, fixing a
  passenger, a refused basic-economy date change, a cabin upgrade), then write the request
  out in full, with the user's confirmation, so no simulated user is needed.
- Ground truth is computed, never guessed: the expected actions are the tool calls a
  policy-following agent makes, and the expected database is what replaying those calls on
  a fresh copy produces (a call that errors there is a generator bug and raises).
- Each operation records the capabilities it gives a chance to fail
  (`opportunities`), which lets the demo say honestly whether a planted deficit could
  have mattered.
- Reward is code: 1.0 iff the final database hash equals the expected one and every
  expected write was made with exactly the expected arguments (tau2's DB + action check);
  reads are free, as they are in tau2.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

from trace_lib.envs.domains.airline.data_model import FREE_BAGS, AirlineDB, Reservation, User
from trace_lib.envs.domains.airline.database import FIRST_NAMES
from trace_lib.envs.domains.airline.tools import (
    AirlineTools,
    cancellation_allowed,
    reservation_flown,
)
from trace_lib.envs.domains.base import copy_db, db_hash, invoke, is_error

OP_KINDS: tuple[str, ...] = (
    "cancel", "cancel_denied", "add_bags", "change_passenger", "change_flight_denied",
    "upgrade_cabin",
)
OP_WEIGHTS: tuple[int, ...] = (2, 3, 3, 2, 4, 3)
COVERED_REASONS = ("I have a medical emergency", "a hurricane is forecast where I am going")
UNCOVERED_REASON = "my plans changed"


@dataclass
class Operation:
    kind: str
    reservation_id: str
    allowed: bool
    params: dict[str, Any] = field(default_factory=dict)
    opportunities: list[str] = field(default_factory=list)


@dataclass
class AirlineTask:
    task_id: str
    user_id: str
    request: str
    operations: list[Operation]
    expected_actions: list[dict[str, Any]]
    expected_db_hash: str

    @property
    def expected_writes(self) -> list[dict[str, Any]]:
        return [a for a in self.expected_actions if AirlineTools.is_write(a["name"])]


def canonical(action: dict[str, Any]) -> str:
    return json.dumps({"name": action["name"], "arguments": action.get("arguments", {})},
                      sort_keys=True)


def score(task: AirlineTask, final_db: AirlineDB, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """Reward by code: final database hash and expected writes vs the calls that were made."""
    made = [canonical(c) for c in calls]
    missing = [a for a in task.expected_writes if canonical(a) not in made]
    db_match = db_hash(final_db) == task.expected_db_hash
    reward = 1.0 if db_match and not missing else 0.0
    return {"reward": reward, "db_match": db_match, "missing_writes": missing}


# ------------------------------------------------------------------- selection


def _open(db: AirlineDB, res: Reservation) -> bool:
    return res.status is None and not reservation_flown(db, res)


def _payment_hint(user: User, amount: int) -> dict[str, Any] | None:
    """How the user names the card to charge: credit card by brand/last four, or gift card."""
    for method in user.payment_methods.values():
        if method.source == "credit_card":
            return {"source": "credit_card", "brand": method.brand,
                    "last_four": method.last_four, "payment_id": method.id}
    for method in user.payment_methods.values():
        if method.source == "gift_card" and method.amount >= amount:
            return {"source": "gift_card", "payment_id": method.id}
    return None


def _new_date(day: str, delta: int) -> str:
    return (date.fromisoformat(day) + timedelta(days=delta)).isoformat()


def _draw_op(rng: random.Random, db: AirlineDB, user: User, res: Reservation,
             kind: str) -> Operation | None:
    rid = res.reservation_id
    n = len(res.passengers)
    if not _open(db, res):
        return None
    if kind == "cancel":
        if cancellation_allowed(db, res, reason_covered=False) is None:
            reason = UNCOVERED_REASON
        elif res.insurance == "yes" and cancellation_allowed(db, res) is None:
            reason = rng.choice(COVERED_REASONS)
        else:
            return None
        return Operation(kind, rid, True, {"reason": reason}, ["precondition_verification"])
    if kind == "cancel_denied":
        if cancellation_allowed(db, res, reason_covered=False) is None:
            return None
        return Operation(kind, rid, False, {"reason": UNCOVERED_REASON},
                         ["precondition_verification"])
    if kind == "add_bags":
        k = rng.randint(1, 2)
        allowance = FREE_BAGS[user.membership][res.cabin] * n
        nonfree = max(0, res.total_baggages + k - allowance)
        hint = _payment_hint(user, 50 * max(0, nonfree - res.nonfree_baggages))
        if hint is None:
            return None
        return Operation(kind, rid, True, {"add": k, "payment": hint},
                         ["structured_data_reasoning", "tool_calling_precision"])
    if kind == "change_passenger":
        i = rng.randrange(n)
        new = {"first_name": rng.choice(FIRST_NAMES), "last_name": res.passengers[i].last_name,
               "dob": res.passengers[i].dob}
        if new["first_name"] == res.passengers[i].first_name:
            return None
        opp = ["tool_calling_precision"] + (["structured_data_reasoning"] if i > 0 else [])
        return Operation(kind, rid, True,
                         {"index": i, "old": res.passengers[i].model_dump(), "new": new}, opp)
    if kind == "change_flight_denied":
        if res.cabin != "basic_economy" or res.flight_type != "one_way":
            return None
        if not any(m.source == "credit_card" for m in user.payment_methods.values()):
            return None  # without a card to pay with, even a careless change cannot happen
        leg = res.flights[0]
        new_day = _new_date(leg.date, 1)
        entry = db.flights[leg.flight_number].dates.get(new_day)
        if entry is None or entry.status != "available" or (entry.available_seats or {}).get(
                "basic_economy", 0) < n:
            return None
        return Operation(kind, rid, False, {"new_date": new_day}, ["precondition_verification"])
    if kind == "upgrade_cabin":
        if res.cabin == "business":
            return None
        prices = 0
        for leg in res.flights:
            entry = db.flights[leg.flight_number].dates.get(leg.date)
            if entry is None or entry.status != "available" or (
                    (entry.available_seats or {}).get("business", 0) < n):
                return None
            prices += (entry.prices or {})["business"] - leg.price
        hint = _payment_hint(user, prices * n)
        if hint is None or prices <= 0:
            return None
        return Operation(kind, rid, True, {"payment": hint}, ["tool_calling_precision"])
    raise ValueError(f"unknown operation kind {kind!r}")


# ------------------------------------------------------------ expected actions


def expected_calls(db: AirlineDB, user: User, ops: list[Operation]) -> list[dict[str, Any]]:
    """The calls a policy-following agent makes for these operations, reads included."""
    calls: list[dict[str, Any]] = [{"name": "get_user_details",
                                    "arguments": {"user_id": user.user_id}}]
    for op in ops:
        res = db.reservations[op.reservation_id]
        calls.append({"name": "get_reservation_details",
                      "arguments": {"reservation_id": op.reservation_id}})
        if op.kind in ("cancel", "cancel_denied"):
            for leg in res.flights:
                calls.append({"name": "get_flight_status",
                              "arguments": {"flight_number": leg.flight_number, "date": leg.date}})
        if not op.allowed:
            continue
        calls.append(write_call(db, user, res, op))
    return calls


def write_call(db: AirlineDB, user: User, res: Reservation, op: Operation) -> dict[str, Any]:
    rid = op.reservation_id
    if op.kind == "cancel":
        return {"name": "cancel_reservation", "arguments": {"reservation_id": rid}}
    if op.kind == "add_bags":
        total = res.total_baggages + op.params["add"]
        allowance = FREE_BAGS[user.membership][res.cabin] * len(res.passengers)
        return {"name": "update_reservation_baggages", "arguments": {
            "reservation_id": rid, "total_baggages": total,
            "nonfree_baggages": max(0, total - allowance),
            "payment_id": op.params["payment"]["payment_id"]}}
    if op.kind == "change_passenger":
        people = [p.model_dump() for p in res.passengers]
        people[op.params["index"]] = dict(op.params["new"])
        return {"name": "update_reservation_passengers",
                "arguments": {"reservation_id": rid, "passengers": people}}
    if op.kind == "upgrade_cabin":
        return {"name": "update_reservation_flights", "arguments": {
            "reservation_id": rid, "cabin": "business",
            "flights": [{"flight_number": leg.flight_number, "date": leg.date}
                        for leg in res.flights],
            "payment_id": op.params["payment"]["payment_id"]}}
    raise ValueError(f"operation {op.kind} has no write")


# --------------------------------------------------------------------- request


def _payment_words(hint: dict[str, Any]) -> str:
    if hint["source"] == "credit_card":
        return f"my {hint['brand']} card ending in {hint['last_four']}"
    return f"my gift card {hint['payment_id']}"


def _sentence(db: AirlineDB, op: Operation) -> str:
    res = db.reservations[op.reservation_id]
    rid = op.reservation_id
    if op.kind in ("cancel", "cancel_denied"):
        return f"Please cancel reservation {rid}: {op.params['reason']}."
    if op.kind == "add_bags":
        k = op.params["add"]
        return (f"Please add {k} checked bag{'s' if k > 1 else ''} to reservation {rid} and "
                f"charge any fee to {_payment_words(op.params['payment'])}.")
    if op.kind == "change_passenger":
        old = res.passengers[op.params["index"]]
        new = op.params["new"]
        return (f"On reservation {rid}, the passenger {old.first_name} {old.last_name} should "
                f"be {new['first_name']} {new['last_name']} (born {new['dob']}); I typed the "
                "name wrong.")
    if op.kind == "change_flight_denied":
        leg = res.flights[0]
        return (f"Please move reservation {rid} from {leg.date} to {op.params['new_date']}, "
                f"same flight {leg.flight_number}.")
    if op.kind == "upgrade_cabin":
        return (f"Please upgrade reservation {rid} to business class on all its flights and "
                f"charge the difference to {_payment_words(op.params['payment'])}.")
    raise ValueError(op.kind)


def request_text(db: AirlineDB, user: User, ops: list[Operation]) -> str:
    lines = [f"Hi, this is {user.name.first_name} {user.name.last_name}, user id "
             f"{user.user_id}."]
    if len(ops) > 1:
        lines.append(f"I have {len(ops)} things to sort out, please do all of them:")
        lines += [f"{i + 1}. {_sentence(db, op)}" for i, op in enumerate(ops)]
    else:
        lines.append(_sentence(db, ops[0]))
    lines.append("I confirm these changes: go ahead with whatever the policy allows, no need "
                 "to ask me again.")
    return "\n".join(lines)


# ------------------------------------------------------------------ generator


def generate_tasks(db: AirlineDB, n: int, seed: int = 0, multi_share: float = 0.6,
                   ) -> list[AirlineTask]:
    """`n` tasks over `db`, the same for the same database, `n` and seed."""
    rng = random.Random(f"airline-tasks:{seed}")
    users = sorted(db.users)
    tasks: list[AirlineTask] = []
    attempts = 0
    while len(tasks) < n:
        attempts += 1
        if attempts > 200 * max(n, 1):
            raise RuntimeError(f"could only draw {len(tasks)} of {n} airline tasks from this "
                               "database; generate a larger one")
        user = db.users[rng.choice(users)]
        want = 2 if rng.random() < multi_share else 1
        candidates = [db.reservations[r] for r in user.reservations]
        rng.shuffle(candidates)
        ops: list[Operation] = []
        for res in candidates:
            if len(ops) == want:
                break
            # Weighted order without replacement: the first kind this reservation fits.
            keys = sorted(OP_KINDS, key=lambda k: -rng.random() ** (1 / OP_WEIGHTS[
                OP_KINDS.index(k)]))
            for kind in keys:
                op = _draw_op(rng, db, user, res, kind)
                if op is not None:
                    ops.append(op)
                    break
        if len(ops) < want:
            continue
        if len(ops) > 1:
            # A write goes last, so that stopping early leaves work undone that matters.
            ops.sort(key=lambda op: op.allowed)
            for op in ops:
                op.opportunities.append("multi_step_task_completion")
        calls = expected_calls(db, user, ops)
        final = copy_db(db)
        kit = AirlineTools(final)
        # Two operations may draw on one gift card: a task whose replay fails is redrawn.
        if any(is_error(invoke(kit, c["name"], c["arguments"])) for c in calls):
            continue
        tasks.append(AirlineTask(
            task_id=f"airline_{seed}_{len(tasks):03d}", user_id=user.user_id,
            request=request_text(db, user, ops), operations=ops, expected_actions=calls,
            expected_db_hash=db_hash(final),
        ))
    return tasks
