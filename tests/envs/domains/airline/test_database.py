"""The seeded airline database: deterministic, consistent, covering every policy case."""

from __future__ import annotations

from datetime import datetime

import pytest

from trace_lib.envs.domains import get_domain
from trace_lib.envs.domains.airline.data_model import FREE_BAGS, INSURANCE_FEE, NOW, TODAY
from trace_lib.envs.domains.airline.tools import cancellation_allowed, reservation_flown
from trace_lib.envs.domains.base import db_hash


def test_same_seed_same_database_other_seed_other_database():
    dom = get_domain("airline")
    a, b = dom.make_db(seed=7), dom.make_db(seed=7)
    assert a.model_dump_json() == b.model_dump_json()
    assert db_hash(a) != db_hash(dom.make_db(seed=8))


def test_sizes_are_configurable_and_checked():
    dom = get_domain("airline")
    small = dom.make_db(seed=1, n_users=5, n_airports=6, n_route_pairs=4, n_days=10)
    assert len(small.users) == 5 and len(small.airports) == 6
    assert all(len(f.dates) == 10 for f in small.flights.values())
    with pytest.raises(ValueError, match="n_airports"):
        dom.make_db(seed=1, n_airports=1)
    with pytest.raises(TypeError):
        dom.make_db(seed=1, n_planes=3)


def test_records_are_consistent():
    db = get_domain("airline").make_db(seed=0)
    codes = {a.iata for a in db.airports}
    for flight in db.flights.values():
        assert {flight.origin, flight.destination} <= codes
        for day, entry in flight.dates.items():
            if entry.status == "available":
                assert day > TODAY and entry.prices and entry.available_seats
            elif day < TODAY:
                assert entry.status in ("landed", "cancelled")
    for rid, res in db.reservations.items():
        user = db.users[res.user_id]
        assert rid in user.reservations
        assert res.payment_history[0].payment_id in user.payment_methods
        n = len(res.passengers)
        free = FREE_BAGS[user.membership][res.cabin] * n
        assert res.nonfree_baggages == max(0, res.total_baggages - free)
        fare = sum(leg.price for leg in res.flights) * n
        extra = 50 * res.nonfree_baggages + (INSURANCE_FEE * n if res.insurance == "yes" else 0)
        assert res.payment_history[0].amount == fare + extra
        for leg in res.flights:
            flight = db.flights[leg.flight_number]
            assert (leg.origin, leg.destination) == (flight.origin, flight.destination)
            assert leg.date in flight.dates
        assert datetime.fromisoformat(res.created_at) <= datetime.fromisoformat(NOW)
        first = db.flights[res.flights[0].flight_number]
        assert res.created_at < f"{res.flights[0].date}T{first.scheduled_departure_time_est}"


def test_every_policy_case_exists_in_the_data():
    db = get_domain("airline").make_db(seed=0)
    open_res = [r for r in db.reservations.values()
                if r.status is None and not reservation_flown(db, r)]
    assert any(reservation_flown(db, r) for r in db.reservations.values())
    assert any(r.status == "cancelled" for r in db.reservations.values())
    assert any(cancellation_allowed(db, r, reason_covered=False) is None for r in open_res)
    assert any(cancellation_allowed(db, r, reason_covered=False) for r in open_res)
    assert {r.cabin for r in open_res} == {"basic_economy", "economy", "business"}
    assert {u.membership for u in db.users.values()} == {"regular", "silver", "gold"}
    sources = {p.source for u in db.users.values() for p in u.payment_methods.values()}
    assert sources == {"credit_card", "gift_card", "certificate"}
    statuses = {e.status for f in db.flights.values() for e in f.dates.values()}
    assert {"available", "landed", "cancelled", "flying"} <= statuses
