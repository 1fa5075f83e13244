"""The airline toolkit: tau2-bench's airline tool names and argument shapes over our database.

Design decisions
- Names, argument names, JSON types and required lists equal tau2-bench's airline tools
  (a test checks them against the shared `tool_schemas_by_domain.json`); descriptions are
  our own. One extra tool, `think` (tau-bench's scratchpad, absent from tau2's
  airline set), changes nothing; `Domain.tool_schemas(names)` selects a subset.
- List arguments are typed `list[Model | dict]` as tau2 types them, which is what yields
  its `anyOf` item schemas; tools coerce the dicts and name a bad item.
- Integrity is always checked (unknown ids, flight not bookable on that date, seats,
  payment method not in the profile, gift card / certificate balance, payments that do
  not add up). Policy rules (cancellation eligibility, basic economy, baggage removal,
  passenger count, payment-method mix) are checked only with `enforce_policy=True`:
  tau2's API leaves them to the agent, and that is what precondition checks measure.
- Refunds are appended to `payment_history` as negative payments to the original methods
  (tau2's bookkeeping); gift cards and certificates are debited at once.
- New reservation ids come from a hash of the database's reservation count and the
  request, so replaying the same calls on the same database yields the same id.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, ValidationError

from trace_lib.envs.domains.airline.data_model import (
    BAG_FEE,
    FREE_BAGS,
    INSURANCE_FEE,
    MAX_PASSENGERS,
    NOW,
    TODAY,
    AirlineDB,
    Cabin,
    Certificate,
    FlightInfo,
    FlightType,
    GiftCard,
    Insurance,
    Passenger,
    Payment,
    Reservation,
    ReservationFlight,
    User,
)
from trace_lib.envs.domains.base import (
    CustomerServiceTools,
    ToolError,
    calculate_expression,
    tool,
)


def _coerce(model: type[BaseModel], items: list[Any], arg: str) -> list[Any]:
    out = []
    for i, item in enumerate(items):
        if isinstance(item, model):
            out.append(item)
            continue
        try:
            out.append(model.model_validate(item))
        except ValidationError as exc:
            fields = ", ".join(model.model_fields)
            problem = exc.errors()[0]["msg"]
            raise ToolError(f"{arg}[{i}] must be an object with {fields}: {problem}") from None
    return out


def reservation_flown(db: AirlineDB, res: Reservation) -> bool:
    """True if any segment has already departed (its date's status says so)."""
    for leg in res.flights:
        status = db.flights[leg.flight_number].dates.get(leg.date)
        if leg.date < TODAY or (status and status.status in ("flying", "landed")):
            return True
    return False


def cancellation_allowed(
    db: AirlineDB, res: Reservation, reason_covered: bool = True
) -> str | None:
    """None if the policy lets this reservation be cancelled, else why not.

    `reason_covered`: whether the user's reason is one insurance covers (health, weather).
    """
    if res.status == "cancelled":
        return "the reservation is already cancelled"
    airline_cancelled = any(
        db.flights[leg.flight_number].dates[leg.date].status == "cancelled" for leg in res.flights
    )
    if reservation_flown(db, res) and not airline_cancelled:
        return "part of the trip has already been flown"
    created = datetime.fromisoformat(res.created_at)
    if datetime.fromisoformat(NOW) - created <= timedelta(hours=24):
        return None
    if airline_cancelled or res.cabin == "business":
        return None
    if res.insurance == "yes" and reason_covered:
        return None
    return (
        "not eligible: booked more than 24 hours ago, no flight cancelled by the airline, "
        "not business class, and no insurance covering the reason"
    )


def free_bags(membership: str, cabin: str, n_passengers: int) -> int:
    return FREE_BAGS[membership][cabin] * n_passengers


class AirlineTools(CustomerServiceTools):
    """Tools over an `AirlineDB` (mutated in place)."""

    domain = "airline"
    db: AirlineDB

    # ------------------------------------------------------------------ lookups
    def _user(self, user_id: str) -> User:
        if user_id not in self.db.users:
            raise ToolError(f"user {user_id} not found")
        return self.db.users[user_id]

    def _reservation(self, reservation_id: str) -> Reservation:
        if reservation_id not in self.db.reservations:
            raise ToolError(f"reservation {reservation_id} not found")
        return self.db.reservations[reservation_id]

    def _bookable(self, info: FlightInfo, cabin: str, n: int) -> tuple[Any, int]:
        flight = self.db.flights.get(info.flight_number)
        if flight is None:
            raise ToolError(f"flight {info.flight_number} not found")
        day = flight.dates.get(info.date)
        if day is None:
            raise ToolError(f"flight {info.flight_number} does not fly on {info.date}")
        if day.status != "available":
            raise ToolError(f"flight {info.flight_number} on {info.date} is {day.status}, "
                            "not available for booking")
        if (day.available_seats or {}).get(cabin, 0) < n:
            raise ToolError(f"not enough {cabin} seats on {info.flight_number} on {info.date}")
        return flight, (day.prices or {})[cabin]

    def _charge(self, user: User, payment_id: str, amount: int) -> None:
        method = user.payment_methods.get(payment_id)
        if method is None:
            raise ToolError(f"payment method {payment_id} not found in the profile of "
                            f"{user.user_id}")
        if isinstance(method, GiftCard | Certificate):
            if amount > method.amount:
                raise ToolError(f"{method.source.replace('_', ' ')} {payment_id} has a balance "
                                f"of {method.amount}, less than {amount}")
            method.amount -= amount

    # -------------------------------------------------------------------- reads
    @tool
    def get_user_details(self, user_id: str) -> User:
        """Look up a user's profile: name, contact, membership, payment methods and
        reservation ids.

        Args:
            user_id: The user's id, such as 'sara_doe_496'.
        """
        return self._user(user_id)

    @tool
    def get_reservation_details(self, reservation_id: str) -> Reservation:
        """Look up a reservation: flights with the price paid, passengers, cabin, bags,
        insurance, payments and status.

        Args:
            reservation_id: The reservation id, such as '8JX2WO'.
        """
        return self._reservation(reservation_id)

    @tool
    def list_all_airports(self) -> list[dict[str, str]]:
        """List every airport the airline serves, with its IATA code and city."""
        return [a.model_dump() for a in self.db.airports]

    def _on(self, fno: str, day: str) -> dict[str, Any] | None:
        flight = self.db.flights[fno]
        entry = flight.dates.get(day)
        if entry is None or entry.status != "available":
            return None
        return {
            "flight_number": fno, "origin": flight.origin, "destination": flight.destination,
            "date": day, "status": entry.status,
            "scheduled_departure_time_est": flight.scheduled_departure_time_est,
            "scheduled_arrival_time_est": flight.scheduled_arrival_time_est,
            "available_seats": entry.available_seats, "prices": entry.prices,
        }

    @tool
    def search_direct_flight(self, origin: str, destination: str, date: str) -> list[dict]:
        """Find bookable nonstop flights from one airport to another on a date.

        Args:
            origin: Departure airport code, three letters, such as 'JFK'.
            destination: Arrival airport code, three letters, such as 'LAX'.
            date: Travel date, 'YYYY-MM-DD', such as '2024-05-20'.
        """
        found = []
        for fno, flight in sorted(self.db.flights.items()):
            if flight.origin == origin and flight.destination == destination:
                entry = self._on(fno, date)
                if entry:
                    found.append(entry)
        return found

    @tool
    def search_onestop_flight(self, origin: str, destination: str, date: str) -> list[list[dict]]:
        """Find bookable itineraries with one connection: the first flight leaves on the date,
        the second leaves after the first lands (same day, or the next if it lands late).

        Args:
            origin: Departure airport code, three letters, such as 'JFK'.
            destination: Final arrival airport code, three letters, such as 'LAX'.
            date: Departure date of the first flight, 'YYYY-MM-DD', such as '2024-05-20'.
        """
        found = []
        for fno, first in sorted(self.db.flights.items()):
            if first.origin != origin or first.destination == destination:
                continue
            leg1 = self._on(fno, date)
            if not leg1:
                continue
            day2 = date
            if first.arrives_next_day:
                day2 = (datetime.fromisoformat(date) + timedelta(days=1)).date().isoformat()
            for fno2, second in sorted(self.db.flights.items()):
                if second.origin != first.destination or second.destination != destination:
                    continue
                if day2 == date and second.scheduled_departure_time_est <= (
                    first.scheduled_arrival_time_est
                ):
                    continue
                leg2 = self._on(fno2, day2)
                if leg2:
                    found.append([leg1, leg2])
        return found

    @tool
    def get_flight_status(self, flight_number: str, date: str) -> str:
        """The status of a flight on a date: available, on time, delayed, flying, landed or
        cancelled.

        Args:
            flight_number: The flight number, such as 'HAT001'.
            date: The date, 'YYYY-MM-DD'.
        """
        flight = self.db.flights.get(flight_number)
        if flight is None:
            raise ToolError(f"flight {flight_number} not found")
        if date not in flight.dates:
            raise ToolError(f"flight {flight_number} does not fly on {date}")
        return flight.dates[date].status

    @tool
    def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression and return the result rounded to 2 decimals.

        Args:
            expression: Numbers, + - * /, parentheses and spaces, such as '(120 + 80) * 2'.
        """
        return calculate_expression(expression)

    # ------------------------------------------------------------------- writes
    @tool(write=True)
    def book_reservation(
        self,
        user_id: str,
        origin: str,
        destination: str,
        flight_type: FlightType,
        cabin: Cabin,
        flights: list[FlightInfo | dict],
        passengers: list[Passenger | dict],
        payment_methods: list[Payment | dict],
        total_baggages: int,
        nonfree_baggages: int,
        insurance: Insurance,
    ) -> Reservation:
        """Create a reservation for a user and charge the given payment methods.

        Args:
            user_id: Id of the user who books, such as 'sara_doe_496'.
            origin: IATA code where the trip starts, such as 'SFO'.
            destination: IATA code where the trip ends (the turnaround for a round trip).
            flight_type: 'one_way' or 'round_trip'.
            cabin: 'basic_economy', 'economy' or 'business'; the same for every flight.
            flights: Every flight of the trip, in order, each with flight_number and date.
            passengers: Every traveller, each with first_name, last_name and dob.
            payment_methods: Payment ids from the user's profile with the amount charged to
                each; the amounts must add up to the total price.
            total_baggages: Number of checked bags for the whole reservation.
            nonfree_baggages: How many of those bags are paid (beyond the free allowance).
            insurance: 'yes' or 'no' for travel insurance.
        """
        user = self._user(user_id)
        infos = _coerce(FlightInfo, flights, "flights")
        people = _coerce(Passenger, passengers, "passengers")
        pays = _coerce(Payment, payment_methods, "payment_methods")
        if not infos:
            raise ToolError("flights must list at least one flight")
        if not people:
            raise ToolError("passengers must list at least one passenger")
        if self.enforce_policy:
            if len(people) > MAX_PASSENGERS:
                raise ToolError(f"at most {MAX_PASSENGERS} passengers per reservation")
            sources = [user.payment_methods[p.payment_id].source for p in pays
                       if p.payment_id in user.payment_methods]
            if sources.count("certificate") > 1 or sources.count("credit_card") > 1 or (
                sources.count("gift_card") > 3
            ):
                raise ToolError("at most one certificate, one credit card and three gift cards")
            if nonfree_baggages != max(0, total_baggages - free_bags(
                    user.membership, cabin, len(people))):
                raise ToolError("nonfree_baggages does not match the free allowance")
        legs = []
        for info in infos:
            flight, price = self._bookable(info, cabin, len(people))
            legs.append(ReservationFlight(flight_number=info.flight_number, origin=flight.origin,
                                          destination=flight.destination, date=info.date,
                                          price=price))
        total = sum(leg.price for leg in legs) * len(people) + BAG_FEE * nonfree_baggages
        total += INSURANCE_FEE * len(people) if insurance == "yes" else 0
        paid = sum(p.amount for p in pays)
        if paid != total:
            raise ToolError(f"payments add up to {paid} but the total price is {total}")
        for p in pays:
            if p.payment_id not in user.payment_methods:
                raise ToolError(f"payment method {p.payment_id} not found in the profile of "
                                f"{user_id}")
        for p in pays:
            self._charge(user, p.payment_id, p.amount)
        for info in infos:
            day = self.db.flights[info.flight_number].dates[info.date]
            day.available_seats[cabin] -= len(people)  # type: ignore[index]
        blob = json.dumps([len(self.db.reservations), user_id, [i.model_dump() for i in infos]])
        rid = hashlib.sha256(blob.encode()).hexdigest()[:6].upper()
        res = Reservation(
            reservation_id=rid, user_id=user_id, origin=origin, destination=destination,
            flight_type=flight_type, cabin=cabin, flights=legs, passengers=people,
            payment_history=pays, created_at=NOW, total_baggages=total_baggages,
            nonfree_baggages=nonfree_baggages, insurance=insurance,
        )
        self.db.reservations[rid] = res
        user.reservations.append(rid)
        return res

    @tool(write=True)
    def cancel_reservation(self, reservation_id: str) -> Reservation:
        """Cancel a whole reservation and refund every payment to its original method. The
        policy decides whether a cancellation is allowed; check it before calling.

        Args:
            reservation_id: The reservation id, such as 'ZFA04Y'.
        """
        res = self._reservation(reservation_id)
        if res.status == "cancelled":
            raise ToolError(f"reservation {reservation_id} is already cancelled")
        if self.enforce_policy:
            why = cancellation_allowed(self.db, res)
            if why:
                raise ToolError(f"reservation {reservation_id} cannot be cancelled: {why}")
        refunds = [Payment(payment_id=p.payment_id, amount=-p.amount)
                   for p in res.payment_history if p.amount > 0]
        res.payment_history.extend(refunds)
        res.status = "cancelled"
        return res

    @tool(write=True)
    def update_reservation_baggages(
        self, reservation_id: str, total_baggages: int, nonfree_baggages: int, payment_id: str
    ) -> Reservation:
        """Set a reservation's checked bags; each extra paid bag is charged to payment_id.

        Args:
            reservation_id: The reservation id, such as 'ZFA04Y'.
            total_baggages: New total number of checked bags on the reservation.
            nonfree_baggages: New number of paid bags among them.
            payment_id: Payment method id from the user's profile, such as
                'credit_card_7815826' or 'gift_card_7815826'.
        """
        res = self._reservation(reservation_id)
        user = self._user(res.user_id)
        if total_baggages < 0 or nonfree_baggages < 0 or nonfree_baggages > total_baggages:
            raise ToolError("bag counts must satisfy 0 <= nonfree_baggages <= total_baggages")
        if self.enforce_policy:
            if res.status == "cancelled":
                raise ToolError(f"reservation {reservation_id} is cancelled")
            if total_baggages < res.total_baggages:
                raise ToolError("checked bags can be added but not removed")
            allowance = free_bags(user.membership, res.cabin, len(res.passengers))
            if nonfree_baggages != max(0, total_baggages - allowance):
                raise ToolError(f"nonfree_baggages should be {max(0, total_baggages - allowance)}"
                                f" with a free allowance of {allowance}")
        cost = BAG_FEE * max(0, nonfree_baggages - res.nonfree_baggages)
        if cost:
            self._charge(user, payment_id, cost)
            res.payment_history.append(Payment(payment_id=payment_id, amount=cost))
        elif payment_id not in user.payment_methods:
            raise ToolError(f"payment method {payment_id} not found in the profile of "
                            f"{user.user_id}")
        res.total_baggages = total_baggages
        res.nonfree_baggages = nonfree_baggages
        return res

    @tool(write=True)
    def update_reservation_flights(
        self, reservation_id: str, cabin: Cabin, flights: list[FlightInfo | dict], payment_id: str
    ) -> Reservation:
        """Replace a reservation's flights and/or cabin. List EVERY flight of the new itinerary,
        unchanged ones too: a kept flight keeps the price paid, a new one costs today's price.
        The difference is charged to, or refunded on, payment_id.

        Args:
            reservation_id: The reservation id, such as 'ZFA04Y'.
            cabin: Cabin for the whole reservation after the change.
            flights: The complete new list of flights, each with flight_number and date.
            payment_id: A gift card or credit card id from the user's profile, such as
                'credit_card_7815826', paying or receiving the difference.
        """
        res = self._reservation(reservation_id)
        user = self._user(res.user_id)
        infos = _coerce(FlightInfo, flights, "flights")
        if not infos:
            raise ToolError("flights must list at least one flight")
        if res.status == "cancelled":
            raise ToolError(f"reservation {reservation_id} is cancelled")
        old = {(leg.flight_number, leg.date): leg for leg in res.flights}
        same_flights = set(old) == {(i.flight_number, i.date) for i in infos}
        if self.enforce_policy:
            if res.cabin == "basic_economy" and not same_flights:
                raise ToolError("flights of a basic economy reservation cannot be changed")
            if cabin != res.cabin and reservation_flown(self.db, res):
                raise ToolError("the cabin cannot change once part of the trip has been flown")
            if self.db.flights.get(infos[0].flight_number) and (
                self.db.flights[infos[0].flight_number].origin != res.origin
            ):
                raise ToolError("the origin of the trip cannot change")
        n = len(res.passengers)
        legs = []
        for info in infos:
            kept = old.get((info.flight_number, info.date))
            if kept is not None and cabin == res.cabin:
                legs.append(kept.model_copy())
                continue
            flight, price = self._bookable(info, cabin, n)
            legs.append(ReservationFlight(flight_number=info.flight_number, origin=flight.origin,
                                          destination=flight.destination, date=info.date,
                                          price=price))
        diff = (sum(leg.price for leg in legs) - sum(leg.price for leg in res.flights)) * n
        method = user.payment_methods.get(payment_id)
        if method is None:
            raise ToolError(f"payment method {payment_id} not found in the profile of "
                            f"{user.user_id}")
        if method.source == "certificate":
            raise ToolError("a certificate cannot pay for a flight change; use a gift card or "
                            "credit card")
        if diff > 0:
            self._charge(user, payment_id, diff)
        elif diff < 0 and isinstance(method, GiftCard):
            method.amount += -diff
        if diff:
            res.payment_history.append(Payment(payment_id=payment_id, amount=diff))
        res.flights = legs
        res.cabin = cabin
        return res

    @tool(write=True)
    def update_reservation_passengers(
        self, reservation_id: str, passengers: list[Passenger | dict]
    ) -> Reservation:
        """Replace the passengers' names and dates of birth. The number of passengers cannot
        change.

        Args:
            reservation_id: The reservation id, such as 'ZFA04Y'.
            passengers: Every passenger after the change, each with first_name, last_name and
                dob, in the same order as on the reservation.
        """
        res = self._reservation(reservation_id)
        people = _coerce(Passenger, passengers, "passengers")
        if len(people) != len(res.passengers):
            raise ToolError(f"the reservation has {len(res.passengers)} passengers; the number "
                            "of passengers cannot change")
        res.passengers = people
        return res

    @tool(write=True)
    def send_certificate(self, user_id: str, amount: int) -> str:
        """Issue a travel certificate of `amount` dollars to a user, as compensation the policy
        allows. Use with care.

        Args:
            user_id: Id of the user receiving the certificate, such as 'sara_doe_496'.
            amount: Value of the certificate in dollars.
        """
        user = self._user(user_id)
        if amount <= 0:
            raise ToolError("amount must be positive")
        n = sum(1 for p in user.payment_methods.values() if p.source == "certificate")
        digest = hashlib.sha256(f"{user_id}:{n}:{amount}".encode()).hexdigest()
        pid = f"certificate_{int(digest[:12], 16) % 10_000_000:07d}"
        user.payment_methods[pid] = Certificate(id=pid, amount=amount)
        return f"Certificate {pid} of {amount} dollars added to the profile of {user_id}"
