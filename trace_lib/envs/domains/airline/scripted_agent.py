"""A scripted airline agent with deficit knobs: trajectories with known, planted failures.

It plays an `AirlineTask` against the real tools and records a full OpenAI-messages
trajectory. Four knobs, named after the capabilities the diagnose stage looks for:

- `precondition_verification`: skips the eligibility check before a write (cancels
  without checking the reservation, changes a basic-economy flight anyway).
- `multi_step_task_completion`: stops after the first of several requested operations.
- `tool_calling_precision`: copies one argument of a write from the wrong record (another
  reservation of the user, another payment method, another reservation's flights).
- `structured_data_reasoning`: misreads a nested field (counts flights as passengers for
  the bag allowance, takes the first passenger instead of the named one, or reads the
  first flight's date as the booking time when judging a cancellation).

Design decisions
- The agent understands the request through the task's structured operations (no
  language understanding is simulated); every fact it acts on (cabin, membership, bag
  counts, flight statuses, payment ids, passengers) is parsed from the tools'
  observations, so a knob changes what it does, and the tools answer for real.
- A knob is armed per trajectory by a seeded draw on the agent profile's rate and fires at
  the first place it can change behaviour. `planted` lists knobs that fired and changed
  what the agent did, whether or not that cost the reward (skipping a check before an
  allowed cancellation is still a planted deficit, in a successful trajectory);
  `armed` lists every knob drawn, including those with no chance to act.
- One tool call per assistant message and no text alongside it, as the policy asks.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from trace_lib.envs.domains.airline.data_model import FREE_BAGS, NOW, AirlineDB
from trace_lib.envs.domains.airline.tasks import AirlineTask, Operation, score
from trace_lib.envs.domains.airline.tools import AirlineTools
from trace_lib.envs.domains.base import copy_db, invoke, is_error

DEFICITS: tuple[str, ...] = (
    "structured_data_reasoning",
    "multi_step_task_completion",
    "precondition_verification",
    "tool_calling_precision",
)


@dataclass(frozen=True)
class AgentProfile:
    name: str
    rates: dict[str, float]  # chance that each deficit knob is armed in a trajectory


AGENT_PROFILES: dict[str, AgentProfile] = {
    p.name: p
    for p in (
        AgentProfile("scripted-careful", {d: 0.1 for d in DEFICITS}),
        AgentProfile("scripted-hasty", {
            "precondition_verification": 0.8, "multi_step_task_completion": 0.8,
            "tool_calling_precision": 0.15, "structured_data_reasoning": 0.15}),
        AgentProfile("scripted-sloppy", {
            "precondition_verification": 0.15, "multi_step_task_completion": 0.2,
            "tool_calling_precision": 0.55, "structured_data_reasoning": 0.6}),
    )
}


def draw_deficits(profile: AgentProfile, seed: int, task_id: str, trial: int) -> set[str]:
    rng = random.Random(f"deficits:{seed}:{task_id}:{profile.name}:{trial}")
    return {d for d in DEFICITS if rng.random() < profile.rates.get(d, 0.0)}


@dataclass
class Episode:
    """One run: the database copy, the messages so far, the calls made, knobs that fired."""

    db: AirlineDB
    kit: AirlineTools
    armed: set[str]
    messages: list[dict[str, Any]] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    planted: list[str] = field(default_factory=list)
    effects: list[str] = field(default_factory=list)

    def call(self, name: str, arguments: dict[str, Any]) -> Any:
        call_id = f"call_{len(self.calls):03d}"
        self.messages.append({"role": "assistant", "content": None, "tool_calls": [{
            "id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}]})
        obs = invoke(self.kit, name, arguments)
        self.messages.append({"role": "tool", "tool_call_id": call_id, "name": name,
                              "content": obs})
        self.calls.append({"name": name, "arguments": arguments, "error": is_error(obs)})
        if is_error(obs):
            return obs
        try:
            return json.loads(obs)
        except json.JSONDecodeError:
            return obs

    def fire(self, deficit: str, effect: str) -> bool:
        """Use an armed knob once; True if it fired now."""
        if deficit not in self.armed or deficit in self.planted:
            return False
        self.planted.append(deficit)
        self.effects.append(f"{deficit}: {effect}")
        return True


def _eligible(res: dict[str, Any], statuses: list[str], reason: str) -> tuple[bool, str]:
    """The agent's own reading of the cancellation policy, from what the tools returned."""
    if res["status"] == "cancelled":
        return False, "it is already cancelled"
    if any(s in ("flying", "landed") for s in statuses):
        return False, "part of the trip has already been flown"
    if datetime.fromisoformat(NOW) - datetime.fromisoformat(res["created_at"]) <= timedelta(
            hours=24):
        return True, "it was booked less than 24 hours ago"
    if "cancelled" in statuses:
        return True, "the airline cancelled one of its flights"
    if res["cabin"] == "business":
        return True, "it is a business class reservation"
    if res["insurance"] == "yes" and reason != "my plans changed":
        return True, "its travel insurance covers your reason"
    return False, ("it was booked more than 24 hours ago, no flight was cancelled by the "
                   "airline, it is not business class, and insurance does not cover the reason")


def _payment_id(user: dict[str, Any], hint: dict[str, Any]) -> str | None:
    for pid, method in user["payment_methods"].items():
        if hint["source"] == "credit_card" and method["source"] == "credit_card" and (
                method["last_four"] == hint["last_four"]):
            return pid
        if hint["source"] == "gift_card" and pid == hint["payment_id"]:
            return pid
    return None


def _other(values: list[str], current: str) -> str | None:
    others = [v for v in values if v != current]
    return others[0] if others else None


class ScriptedAirlineAgent:
    """Plays tasks; `armed` deficits decide where it goes wrong."""

    def __init__(self, ep: Episode, task: AirlineTask) -> None:
        self.ep = ep
        self.task = task
        self.user: dict[str, Any] = {}

    def run(self) -> list[str]:
        ep = self.ep
        user = ep.call("get_user_details", {"user_id": self.task.user_id})
        if isinstance(user, str):
            return [f"I could not find your profile ({user})."]
        self.user = user
        notes = []
        for i, op in enumerate(self.task.operations):
            if i > 0 and ep.fire("multi_step_task_completion",
                                 f"stopped after operation 1 of {len(self.task.operations)}"):
                break
            notes.append(self.operation(op))
        return notes

    def _wrong_reservation(self, rid: str) -> str:
        other = _other(self.user["reservations"], rid)
        if other and self.ep.fire("tool_calling_precision",
                                  f"used reservation {other} instead of {rid}"):
            return other
        return rid

    def _wrong_payment(self, pid: str) -> str:
        other = _other(sorted(self.user["payment_methods"]), pid)
        if other and self.ep.fire("tool_calling_precision",
                                  f"charged {other} instead of {pid}"):
            return other
        return pid

    def operation(self, op: Operation) -> str:
        ep, rid = self.ep, op.reservation_id
        if op.kind in ("cancel", "cancel_denied"):
            if ep.fire("precondition_verification",
                       f"cancelled {rid} without checking eligibility"):
                out = ep.call("cancel_reservation", {"reservation_id": rid})
                return self._outcome(out, f"Reservation {rid} is cancelled")
            res = ep.call("get_reservation_details", {"reservation_id": rid})
            if isinstance(res, str):
                return f"I could not open reservation {rid}: {res}"
            statuses = [ep.call("get_flight_status", {"flight_number": leg["flight_number"],
                                                      "date": leg["date"]})
                        for leg in res["flights"]]
            ok, why = _eligible(res, statuses, op.params["reason"])
            # Misreading: the first flight's date taken for the booking time ("booked today").
            misread = dict(res, created_at=f"{res['flights'][0]['date']}T00:00:00")
            ok2, why2 = _eligible(misread, statuses, op.params["reason"])
            if ok2 != ok and ep.fire("structured_data_reasoning",
                                     f"read the flight date {res['flights'][0]['date']} as the "
                                     f"booking time of {rid}"):
                ok, why = ok2, why2
            if not ok:
                return f"I cannot cancel reservation {rid}: {why}."
            target = self._wrong_reservation(rid)
            out = ep.call("cancel_reservation", {"reservation_id": target})
            return self._outcome(out, f"Reservation {rid} is cancelled ({why}); the refund "
                                 "goes back to the original payment methods in 5-7 business days")
        res = ep.call("get_reservation_details", {"reservation_id": rid})
        if isinstance(res, str):
            return f"I could not open reservation {rid}: {res}"
        if op.kind == "change_flight_denied":
            return self._change_flight(op, res)
        if op.kind == "add_bags":
            return self._add_bags(op, res)
        if op.kind == "change_passenger":
            return self._change_passenger(op, res)
        if op.kind == "upgrade_cabin":
            return self._upgrade(op, res)
        raise ValueError(f"unknown operation {op.kind}")

    def _outcome(self, out: Any, done: str) -> str:
        if isinstance(out, str) and is_error(out):
            return f"That did not go through: {out[len('Error: '):]}"
        return done + "."

    def _change_flight(self, op: Operation, res: dict[str, Any]) -> str:
        ep, rid = self.ep, op.reservation_id
        if res["cabin"] == "basic_economy" and not ep.fire(
                "precondition_verification", f"changed the flights of basic economy {rid}"):
            return f"I cannot change the flights of reservation {rid}: it is basic economy."
        leg = res["flights"][0]
        found = ep.call("search_direct_flight", {"origin": leg["origin"],
                                                 "destination": leg["destination"],
                                                 "date": op.params["new_date"]})
        same = [f for f in found if f["flight_number"] == leg["flight_number"]] if isinstance(
            found, list) else []
        if not same:
            return f"Flight {leg['flight_number']} is not available on {op.params['new_date']}."
        card = next((pid for pid, m in self.user["payment_methods"].items()
                     if m["source"] == "credit_card"), None)
        if card is None:
            return "You have no credit card on file to pay the difference with."
        out = ep.call("update_reservation_flights", {
            "reservation_id": rid, "cabin": res["cabin"],
            "flights": [{"flight_number": leg["flight_number"], "date": op.params["new_date"]}],
            "payment_id": card})
        return self._outcome(out, f"Reservation {rid} now flies on {op.params['new_date']}")

    def _add_bags(self, op: Operation, res: dict[str, Any]) -> str:
        ep, rid = self.ep, op.reservation_id
        n_pax, n_legs = len(res["passengers"]), len(res["flights"])
        per_pax = FREE_BAGS[self.user["membership"]][res["cabin"]]
        total = res["total_baggages"] + op.params["add"]
        nonfree = max(0, total - per_pax * n_pax)
        misread = max(0, total - per_pax * n_legs)
        # Fires only where the misreading changes the bags charged.
        if misread != nonfree and ep.fire(
                "structured_data_reasoning",
                f"counted {n_legs} flights as passengers (there are {n_pax})"):
            nonfree = misread
        ep.call("calculate", {"expression": f"({nonfree} - {res['nonfree_baggages']}) * 50"})
        pid = _payment_id(self.user, op.params["payment"])
        if pid is None:
            return "I could not find that payment method in your profile."
        out = ep.call("update_reservation_baggages", {
            "reservation_id": rid, "total_baggages": total, "nonfree_baggages": nonfree,
            "payment_id": self._wrong_payment(pid)})
        fee = 50 * max(0, nonfree - res["nonfree_baggages"])
        return self._outcome(out, f"Reservation {rid} now has {total} checked bags "
                             f"({nonfree} paid; {fee} dollars charged)")

    def _change_passenger(self, op: Operation, res: dict[str, Any]) -> str:
        ep, rid = self.ep, op.reservation_id
        new = op.params["new"]
        # The request names the passenger by their current name and date of birth.
        wanted = self.task_operation_old(op)
        found = [i for i, p in enumerate(res["passengers"])
                 if (p["first_name"], p["last_name"], p["dob"]) == wanted]
        if not found:
            return f"I could not find {wanted[0]} {wanted[1]} on reservation {rid}."
        idx = found[0]
        if idx != 0 and ep.fire("structured_data_reasoning",
                                f"edited passenger 0 instead of passenger {idx}"):
            idx = 0
        people = [dict(p) for p in res["passengers"]]
        people[idx] = dict(new)
        out = ep.call("update_reservation_passengers", {
            "reservation_id": self._wrong_reservation(rid), "passengers": people})
        return self._outcome(out, f"The passenger on reservation {rid} is now "
                             f"{new['first_name']} {new['last_name']}")

    def task_operation_old(self, op: Operation) -> tuple[str, str, str]:
        old = op.params["old"]
        return old["first_name"], old["last_name"], old["dob"]

    def _upgrade(self, op: Operation, res: dict[str, Any]) -> str:
        ep, rid = self.ep, op.reservation_id
        flights = [{"flight_number": leg["flight_number"], "date": leg["date"]}
                   for leg in res["flights"]]
        diff = 0
        for leg in res["flights"]:
            found = ep.call("search_direct_flight", {"origin": leg["origin"],
                                                     "destination": leg["destination"],
                                                     "date": leg["date"]})
            match = [f for f in found if f["flight_number"] == leg["flight_number"]] if (
                isinstance(found, list)) else []
            if not match or match[0]["available_seats"]["business"] < len(res["passengers"]):
                return f"Business class is not available on flight {leg['flight_number']}."
            diff += match[0]["prices"]["business"] - leg["price"]
        ep.call("calculate", {"expression": f"{diff} * {len(res['passengers'])}"})
        pid = _payment_id(self.user, op.params["payment"])
        if pid is None:
            return "I could not find that payment method in your profile."
        other = _other(self.user["reservations"], rid)
        if other and "tool_calling_precision" in set(ep.armed) - set(ep.planted):
            theirs = ep.call("get_reservation_details", {"reservation_id": other})
            if isinstance(theirs, dict) and ep.fire(
                    "tool_calling_precision", f"sent the flights of {other} for {rid}"):
                flights = [{"flight_number": leg["flight_number"], "date": leg["date"]}
                           for leg in theirs["flights"]]
        out = ep.call("update_reservation_flights", {
            "reservation_id": rid, "cabin": "business", "flights": flights,
            "payment_id": pid})
        return self._outcome(out, f"Reservation {rid} is now business class; "
                             f"{diff * len(res['passengers'])} dollars charged")


def play(task: AirlineTask, db: AirlineDB, policy: str, *, agent: str = "scripted-careful",
         trial: int = 0, seed: int = 0, deficits: set[str] | None = None) -> dict[str, Any]:
    """Play `task` on a copy of `db`; return the trajectory record (OpenAI messages + meta).

    `deficits` arms exactly these knobs; by default they are drawn from the agent profile.
    """
    if agent not in AGENT_PROFILES and deficits is None:
        raise KeyError(f"unknown agent {agent!r}; known: {', '.join(AGENT_PROFILES)}")
    armed = set(deficits) if deficits is not None else draw_deficits(
        AGENT_PROFILES[agent], seed, task.task_id, trial)
    unknown = armed - set(DEFICITS)
    if unknown:
        raise KeyError(f"unknown deficits {sorted(unknown)}; known: {', '.join(DEFICITS)}")
    final_db = copy_db(db)
    ep = Episode(db=final_db, kit=AirlineTools(final_db), armed=armed)  # type: ignore[arg-type]
    ep.messages = [{"role": "system", "content": policy},
                   {"role": "user", "content": task.request}]
    notes = ScriptedAirlineAgent(ep, task).run()
    closing = "Is there anything else I can help you with?"
    ep.messages.append({"role": "assistant", "content": "\n".join(notes + [closing])})
    result = score(task, final_db, [c for c in ep.calls if not c["error"]])
    opportunities = sorted({o for op in task.operations for o in op.opportunities})
    return {
        "id": f"{task.task_id}__{agent}__{trial}",
        "task_id": task.task_id,
        "trial": trial,
        "agent_model": agent,
        "domain": "airline",
        "reward": result["reward"],
        "success": result["reward"] == 1.0,
        "termination": "agent_stop",
        "messages": ep.messages,
        "expected_actions": task.expected_actions,
        "meta": {
            "planted_deficits": sorted(ep.planted),
            "armed_deficits": sorted(armed),
            "deficit_effects": ep.effects,
            "opportunities": opportunities,
            "operations": [op.kind for op in task.operations],
            "db_match": result["db_match"],
            "missing_writes": result["missing_writes"],
            "source": "trace_lib.envs.domains.airline.scripted_agent",
        },
    }
