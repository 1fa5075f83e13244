"""Airline tools: the rules they apply (schema fidelity: ../test_schema_fidelity.py)."""

from __future__ import annotations

import json

import pytest

from trace_lib.envs.domains import get_domain, invoke, is_error
from trace_lib.envs.domains.airline.data_model import (
    NOW,
    AirlineDB,
    Certificate,
    CreditCard,
    FlightDate,
    GiftCard,
    Reservation,
)
from trace_lib.envs.domains.airline.tools import cancellation_allowed, reservation_flown
from trace_lib.envs.domains.base import db_hash


@pytest.fixture(scope="module")
def base_db() -> AirlineDB:
    return get_domain("airline").make_db(seed=3)


@pytest.fixture
def db(base_db: AirlineDB) -> AirlineDB:
    return base_db.model_copy(deep=True)


def _find(db: AirlineDB, pred) -> Reservation:
    for res in db.reservations.values():
        if pred(res):
            return res
    pytest.fail("generated database has no reservation of the kind this test needs")


def _ineligible(db):
    return lambda r: cancellation_allowed(db, r, reason_covered=False) is not None and (
        r.status is None and not reservation_flown(db, r))


def test_cancel_follows_tau2_semantics_unless_policy_enforced(db: AirlineDB):
    res = _find(db, _ineligible(db))
    paid = sum(p.amount for p in res.payment_history)
    strict = get_domain("airline").tools(db, enforce_policy=True)
    before = db_hash(db)
    out = invoke(strict, "cancel_reservation", {"reservation_id": res.reservation_id})
    assert is_error(out) and "cannot be cancelled" in out and "not eligible" in out
    assert db_hash(db) == before
    # tau2's API does not check eligibility: the agent must, and the default kit obeys.
    lax = get_domain("airline").tools(db)
    out = json.loads(invoke(lax, "cancel_reservation", {"reservation_id": res.reservation_id}))
    assert out["status"] == "cancelled"
    assert sum(p["amount"] for p in out["payment_history"]) == 0 and paid > 0
    again = invoke(lax, "cancel_reservation", {"reservation_id": res.reservation_id})
    assert again == f"Error: reservation {res.reservation_id} is already cancelled"


def test_eligible_cancellations(db: AirlineDB):
    strict = get_domain("airline").tools(db, enforce_policy=True)
    business = _find(db, lambda r: r.cabin == "business" and r.status is None
                     and not reservation_flown(db, r))
    assert cancellation_allowed(db, business) is None
    assert not is_error(invoke(strict, "cancel_reservation",
                               {"reservation_id": business.reservation_id}))
    # Booked an hour ago: free cancellation whatever the cabin.
    fresh = _find(db, _ineligible(db))
    fresh.created_at = NOW[:11] + "14:00:00"
    assert cancellation_allowed(db, fresh, reason_covered=False) is None
    # Insurance covers health/weather reasons only.
    insured = _find(db, lambda r: _ineligible(db)(r) and r.insurance == "no")
    insured.insurance = "yes"
    assert cancellation_allowed(db, insured, reason_covered=False) is not None
    assert cancellation_allowed(db, insured, reason_covered=True) is None
    # A flight cancelled by the airline makes any reservation on it cancellable.
    hit = _find(db, _ineligible(db))
    leg = hit.flights[0]
    db.flights[leg.flight_number].dates[leg.date] = FlightDate(status="cancelled")
    assert cancellation_allowed(db, hit, reason_covered=False) is None


def test_flown_reservation_cannot_be_cancelled_under_policy(db: AirlineDB):
    flown = _find(db, lambda r: r.status is None and reservation_flown(db, r) and all(
        db.flights[x.flight_number].dates[x.date].status != "cancelled" for x in r.flights))
    assert cancellation_allowed(db, flown) == "part of the trip has already been flown"


def _future_basic(db):
    return lambda r: (r.cabin == "basic_economy" and r.status is None
                      and not reservation_flown(db, r))


def test_basic_economy_flight_change_refused_under_policy(db: AirlineDB):
    res = _find(db, _future_basic(db))
    user = db.users[res.user_id]
    user.payment_methods["credit_card_0000001"] = CreditCard(
        id="credit_card_0000001", brand="visa", last_four="0001")
    card = user.payment_methods["credit_card_0000001"]
    flights = [{"flight_number": f.flight_number, "date": f.date} for f in res.flights]
    flights[0]["date"] = "2024-05-29" if res.flights[0].date != "2024-05-29" else "2024-05-28"
    strict = get_domain("airline").tools(db, enforce_policy=True)
    out = invoke(strict, "update_reservation_flights", {
        "reservation_id": res.reservation_id, "cabin": "basic_economy", "flights": flights,
        "payment_id": card.id})
    assert out == "Error: flights of a basic economy reservation cannot be changed"
    # A cabin change without changing flights is allowed, basic economy included.
    same = [{"flight_number": f.flight_number, "date": f.date} for f in res.flights]
    for f in res.flights:  # make room so the outcome depends on the rule alone
        entry = db.flights[f.flight_number].dates[f.date]
        entry.status = "available"
        entry.available_seats = {"basic_economy": 9, "economy": 9, "business": 9}
        entry.prices = {"basic_economy": 80, "economy": 150, "business": 600}
    up = json.loads(invoke(strict, "update_reservation_flights", {
        "reservation_id": res.reservation_id, "cabin": "economy", "flights": same,
        "payment_id": card.id}))
    assert up["cabin"] == "economy"
    assert [f["price"] for f in up["flights"]] == [150] * len(same)


def test_baggage_rules_and_gift_card_balance(db: AirlineDB):
    res = _find(db, lambda r: r.status is None and not reservation_flown(db, r))
    user = db.users[res.user_id]
    user.payment_methods["gift_card_0000009"] = GiftCard(id="gift_card_0000009", amount=60)
    strict = get_domain("airline").tools(db, enforce_policy=True)
    allowance = {"regular": {"basic_economy": 0, "economy": 1, "business": 2},
                 "silver": {"basic_economy": 1, "economy": 2, "business": 3},
                 "gold": {"basic_economy": 2, "economy": 3, "business": 4}}[
        user.membership][res.cabin] * len(res.passengers)
    total = max(res.total_baggages, allowance) + 2
    right = total - allowance
    wrong = invoke(strict, "update_reservation_baggages", {
        "reservation_id": res.reservation_id, "total_baggages": total,
        "nonfree_baggages": right + 1, "payment_id": "gift_card_0000009"})
    assert is_error(wrong) and f"should be {right}" in wrong
    removed = invoke(strict, "update_reservation_baggages", {
        "reservation_id": res.reservation_id, "total_baggages": res.total_baggages - 1,
        "nonfree_baggages": 0, "payment_id": "gift_card_0000009"})
    if res.total_baggages > 0:
        assert removed == "Error: checked bags can be added but not removed"
    cost = 50 * (right - res.nonfree_baggages)
    assert cost == 100  # two paid bags beyond the allowance; the card holds only 60
    out = invoke(strict, "update_reservation_baggages", {
        "reservation_id": res.reservation_id, "total_baggages": total,
        "nonfree_baggages": right, "payment_id": "gift_card_0000009"})
    assert out == "Error: gift card gift_card_0000009 has a balance of 60, less than 100"
    user.payment_methods["gift_card_0000009"].amount = 150
    out = json.loads(invoke(strict, "update_reservation_baggages", {
        "reservation_id": res.reservation_id, "total_baggages": total,
        "nonfree_baggages": right, "payment_id": "gift_card_0000009"}))
    assert out["total_baggages"] == total and out["payment_history"][-1] == {
        "payment_id": "gift_card_0000009", "amount": 100}
    assert user.payment_methods["gift_card_0000009"].amount == 50
    unknown = invoke(strict, "update_reservation_baggages", {
        "reservation_id": res.reservation_id, "total_baggages": total + 1,
        "nonfree_baggages": right + 1, "payment_id": "credit_card_9999999"})
    assert "not found in the profile" in unknown


def _bookable(db: AirlineDB, cabin: str, seats: int):
    for _, flight in sorted(db.flights.items()):
        for day, entry in sorted(flight.dates.items()):
            if entry.status == "available" and entry.available_seats[cabin] >= seats:
                return flight, day, entry
    pytest.fail("no bookable flight")


def test_book_reservation_charges_exactly_and_takes_seats(db: AirlineDB):
    user = next(u for u in db.users.values())
    user.payment_methods["certificate_0000007"] = Certificate(id="certificate_0000007",
                                                              amount=5000)
    flight, day, entry = _bookable(db, "economy", 2)
    seats = entry.available_seats["economy"]
    price = entry.prices["economy"]
    kit = get_domain("airline").tools(db)
    people = [{"first_name": "Ann", "last_name": "Lee", "dob": "1990-01-01"},
              {"first_name": "Bo", "last_name": "Lee", "dob": "1992-02-02"}]
    args = {"user_id": user.user_id, "origin": flight.origin,
            "destination": flight.destination, "flight_type": "one_way", "cabin": "economy",
            "flights": [{"flight_number": flight.flight_number, "date": day}],
            "passengers": people, "total_baggages": 0, "nonfree_baggages": 0,
            "insurance": "yes"}
    total = 2 * price + 2 * 30
    short = invoke(kit, "book_reservation", {
        **args, "payment_methods": [{"payment_id": "certificate_0000007", "amount": total - 1}]})
    assert short == f"Error: payments add up to {total - 1} but the total price is {total}"
    out = json.loads(invoke(kit, "book_reservation", {
        **args, "payment_methods": [{"payment_id": "certificate_0000007", "amount": total}]}))
    assert out["reservation_id"] in db.reservations
    assert out["reservation_id"] in user.reservations
    assert out["created_at"] == NOW and out["flights"][0]["price"] == price
    assert entry.available_seats["economy"] == seats - 2
    assert user.payment_methods["certificate_0000007"].amount == 5000 - total
    bad_item = invoke(kit, "book_reservation", {
        **args, "passengers": [{"first_name": "X"}],
        "payment_methods": [{"payment_id": "certificate_0000007", "amount": 1}]})
    assert bad_item.startswith("Error: passengers[0] must be an object with first_name")


def test_flight_change_prices_and_certificate_rule(db: AirlineDB):
    res = _find(db, lambda r: r.cabin == "economy" and r.status is None and not
                reservation_flown(db, r) and len(r.flights) == 1 and all(
                    db.flights[f.flight_number].dates[f.date].status == "available"
                    for f in r.flights))
    user = db.users[res.user_id]
    user.payment_methods["certificate_0000003"] = Certificate(id="certificate_0000003",
                                                              amount=9000)
    user.payment_methods["credit_card_0000003"] = CreditCard(id="credit_card_0000003",
                                                             brand="visa", last_four="0003")
    kit = get_domain("airline").tools(db)
    same = [{"flight_number": f.flight_number, "date": f.date} for f in res.flights]
    via_cert = invoke(kit, "update_reservation_flights", {
        "reservation_id": res.reservation_id, "cabin": "economy", "flights": same,
        "payment_id": "certificate_0000003"})
    assert "certificate cannot pay" in via_cert
    # Same flights, same cabin: kept price, nothing charged.
    kept = json.loads(invoke(kit, "update_reservation_flights", {
        "reservation_id": res.reservation_id, "cabin": "economy", "flights": same,
        "payment_id": "credit_card_0000003"}))
    assert kept["flights"][0]["price"] == res.flights[0].price
    n = len(res.passengers)
    leg = res.flights[0]
    entry = db.flights[leg.flight_number].dates[leg.date]
    if entry.available_seats["business"] >= n:
        up = json.loads(invoke(kit, "update_reservation_flights", {
            "reservation_id": res.reservation_id, "cabin": "business", "flights": same,
            "payment_id": "credit_card_0000003"}))
        assert up["cabin"] == "business"
        assert up["flights"][0]["price"] == entry.prices["business"]
        assert up["payment_history"][-1]["amount"] == (entry.prices["business"] - leg.price) * n


def test_passenger_count_cannot_change(db: AirlineDB):
    res = _find(db, lambda r: r.status is None)
    kit = get_domain("airline").tools(db)
    people = [p.model_dump() for p in res.passengers] + [
        {"first_name": "New", "last_name": "Person", "dob": "2000-01-01"}]
    out = invoke(kit, "update_reservation_passengers",
                 {"reservation_id": res.reservation_id, "passengers": people})
    assert "number of passengers cannot change" in out


def test_reads_search_and_certificates(db: AirlineDB):
    kit = get_domain("airline").tools(db)
    airports = json.loads(invoke(kit, "list_all_airports", {}))
    assert {a["iata"] for a in airports} == {a.iata for a in db.airports}
    flight, day, entry = _bookable(db, "business", 1)
    direct = json.loads(invoke(kit, "search_direct_flight", {
        "origin": flight.origin, "destination": flight.destination, "date": day}))
    assert flight.flight_number in {f["flight_number"] for f in direct}
    assert all(f["status"] == "available" for f in direct)
    for pair in json.loads(invoke(kit, "search_onestop_flight", {
            "origin": flight.origin, "destination": "ATL", "date": day})):
        assert pair[0]["destination"] == pair[1]["origin"]
        assert pair[0]["origin"] == flight.origin and pair[1]["destination"] == "ATL"
    assert invoke(kit, "get_flight_status", {
        "flight_number": flight.flight_number, "date": day}) == "available"
    assert "not found" in invoke(kit, "get_flight_status", {"flight_number": "HAT999",
                                                             "date": day})
    user_id = next(iter(db.users))
    msg = invoke(kit, "send_certificate", {"user_id": user_id, "amount": 100})
    assert "added to the profile" in msg
    certs = [p for p in db.users[user_id].payment_methods.values()
             if p.source == "certificate" and p.amount == 100]
    assert certs
    assert invoke(kit, "transfer_to_human_agents", {"summary": "x"}) == "Transfer successful"
    assert invoke(kit, "think", {"thought": "hm"}) == ""
