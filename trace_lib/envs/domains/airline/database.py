"""Seeded generator of an airline database: airports, flights over a month, users, bookings.

Design decisions
- Everything comes from one `random.Random(seed)`, drawn in a fixed order, and nothing
  reads the clock or a global RNG: the same seed and sizes give a byte-identical dump.
- The month runs around the domain's fixed `NOW` (2024-05-15 15:00 EST): dates before it
  have landed (a few were cancelled by the airline), today's flights are flying, delayed
  or on time by departure hour, later dates are bookable (a few cancelled). So every
  policy case (already flown, airline-cancelled, within 24 h of booking) exists in data.
- Reservations are drawn like real bookings: direct or round trips on existing flights,
  prices copied from the flight, bags and payment consistent with the membership rules,
  some booked in the last 24 hours, some with insurance, a few already cancelled.
- Sizes are a small dataclass; defaults keep a database at a few hundred kB of JSON so
  that copying and hashing it per episode stays in the millisecond range.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from trace_lib.envs.domains.airline.data_model import (
    CABINS,
    FREE_BAGS,
    INSURANCE_FEE,
    NOW,
    TODAY,
    Address,
    AirlineDB,
    Airport,
    Certificate,
    CreditCard,
    Flight,
    FlightDate,
    GiftCard,
    Name,
    Passenger,
    Payment,
    Reservation,
    ReservationFlight,
    User,
)

AIRPORTS: tuple[tuple[str, str, str], ...] = (
    ("ATL", "Atlanta", "GA"), ("BOS", "Boston", "MA"), ("CLT", "Charlotte", "NC"),
    ("DEN", "Denver", "CO"), ("DFW", "Dallas-Fort Worth", "TX"), ("DTW", "Detroit", "MI"),
    ("EWR", "Newark", "NJ"), ("IAH", "Houston", "TX"), ("JFK", "New York", "NY"),
    ("LAS", "Las Vegas", "NV"), ("LAX", "Los Angeles", "CA"), ("MCO", "Orlando", "FL"),
    ("MIA", "Miami", "FL"), ("MSP", "Minneapolis", "MN"), ("ORD", "Chicago", "IL"),
    ("PHL", "Philadelphia", "PA"), ("PHX", "Phoenix", "AZ"), ("SEA", "Seattle", "WA"),
    ("SFO", "San Francisco", "CA"), ("LGA", "New York", "NY"),
)
FIRST_NAMES = (
    "Aarav", "Amelia", "Chen", "Daiki", "Elena", "Fatima", "Hugo", "Ines", "Jamal", "Kai",
    "Lucas", "Mei", "Noah", "Olivia", "Priya", "Raj", "Sofia", "Mateo", "Yara", "Liam",
    "Emma", "Omar", "Ava", "Ivan", "Zoe", "Ethan", "Mia", "Anya", "Lei", "Sara",
)
LAST_NAMES = (
    "Ahmed", "Brown", "Davis", "Garcia", "Gonzalez", "Hernandez", "Ito", "Johnson", "Kim",
    "Lopez", "Martin", "Moore", "Nguyen", "Patel", "Rossi", "Santos", "Silva", "Smith",
    "Taylor", "Thomas", "Wilson", "Young", "Muller", "Khan", "Li",
)
STREETS = ("Main Street", "Oak Avenue", "Pine Road", "Maple Drive", "Cedar Lane", "Elm Street")
CARD_BRANDS = ("visa", "mastercard", "amex")


@dataclass
class AirlineDBConfig:
    n_airports: int = 14
    n_route_pairs: int = 30  # each pair gets flights both ways
    first_date: str = "2024-05-01"
    n_days: int = 30
    n_users: int = 60
    max_reservations_per_user: int = 5


def _days(cfg: AirlineDBConfig) -> list[str]:
    start = date.fromisoformat(cfg.first_date)
    return [(start + timedelta(days=i)).isoformat() for i in range(cfg.n_days)]


def _hhmm(minutes: int) -> str:
    minutes %= 24 * 60
    return f"{minutes // 60:02d}:{minutes % 60:02d}:00"


def _flight_date(rng: random.Random, day: str, dep_min: int, base: dict[str, int]) -> FlightDate:
    if day < TODAY:
        if rng.random() < 0.06:
            return FlightDate(status="cancelled")
        return FlightDate(
            status="landed",
            actual_departure_time_est=f"{day}T{_hhmm(dep_min + rng.randint(-5, 45))}",
            actual_arrival_time_est=f"{day}T{_hhmm(dep_min + rng.randint(60, 300))}",
        )
    now_min = int(NOW[11:13]) * 60
    if day == TODAY:
        if dep_min < now_min - 120:
            return FlightDate(status="landed")
        if dep_min < now_min:
            return FlightDate(status="flying")
        if rng.random() < 0.3:
            late = dep_min + rng.choice((30, 60, 90, 120))
            return FlightDate(status="delayed", estimated_departure_time_est=f"{day}T{_hhmm(late)}")
        return FlightDate(status="on time")
    if rng.random() < 0.04:
        return FlightDate(status="cancelled")
    seats = {"basic_economy": rng.randint(0, 20), "economy": rng.randint(0, 20),
             "business": rng.randint(0, 10)}
    prices = {c: max(40, int(base[c] * rng.uniform(0.8, 1.3))) for c in CABINS}
    return FlightDate(status="available", available_seats=seats, prices=prices)


def _flights(rng: random.Random, cfg: AirlineDBConfig, airports: list[str]) -> dict[str, Flight]:
    pairs: list[tuple[str, str]] = []
    all_pairs = [(a, b) for i, a in enumerate(airports) for b in airports[i + 1:]]
    rng.shuffle(all_pairs)
    pairs = sorted(all_pairs[: cfg.n_route_pairs])
    flights: dict[str, Flight] = {}
    days = _days(cfg)
    number = 1
    for a, b in pairs:
        duration = rng.randint(70, 330)
        for origin, dest in ((a, b), (b, a)):
            for _ in range(rng.choice((1, 1, 2))):
                dep = rng.randrange(6 * 60, 22 * 60, 15)
                base = {"basic_economy": rng.randint(50, 100)}
                base["economy"] = base["basic_economy"] + rng.randint(40, 110)
                base["business"] = base["economy"] * 2 + rng.randint(100, 900)
                fno = f"HAT{number:03d}"
                number += 1
                flights[fno] = Flight(
                    flight_number=fno,
                    origin=origin,
                    destination=dest,
                    scheduled_departure_time_est=_hhmm(dep),
                    scheduled_arrival_time_est=_hhmm(dep + duration),
                    arrives_next_day=dep + duration >= 24 * 60,
                    dates={d: _flight_date(rng, d, dep, base) for d in days},
                )
    return flights


def _person(rng: random.Random) -> Passenger:
    year = rng.randint(1950, 2012)
    return Passenger(
        first_name=rng.choice(FIRST_NAMES),
        last_name=rng.choice(LAST_NAMES),
        dob=f"{year}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
    )


def _digits(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(string.digits) for _ in range(n))


def _user(rng: random.Random, airports: list[tuple[str, str, str]], taken: set[str]) -> User:
    me = _person(rng)
    while True:
        uid = f"{me.first_name.lower()}_{me.last_name.lower()}_{rng.randint(100, 9999)}"
        if uid not in taken:
            break
    _, city, state = rng.choice(airports)
    methods: dict = {}
    for _ in range(rng.randint(1, 3)):
        kind = rng.choices(("credit_card", "gift_card", "certificate"), (5, 3, 2))[0]
        pid = f"{kind}_{_digits(rng, 7)}"
        if kind == "credit_card":
            methods[pid] = CreditCard(id=pid, brand=rng.choice(CARD_BRANDS),
                                      last_four=_digits(rng, 4))
        elif kind == "gift_card":
            methods[pid] = GiftCard(id=pid, amount=rng.randint(0, 400))
        else:
            methods[pid] = Certificate(id=pid, amount=rng.choice((100, 150, 200, 250, 500)))
    return User(
        user_id=uid,
        name=Name(first_name=me.first_name, last_name=me.last_name),
        address=Address(address1=f"{rng.randint(10, 9999)} {rng.choice(STREETS)}",
                        address2=rng.choice(("", f"Suite {rng.randint(100, 999)}")),
                        city=city, country="USA", state=state, zip=_digits(rng, 5)),
        email=f"{me.first_name.lower()}.{me.last_name.lower()}{rng.randint(1, 99)}@example.com",
        dob=me.dob,
        payment_methods=dict(sorted(methods.items())),
        saved_passengers=[_person(rng) for _ in range(rng.randint(0, 2))],
        membership=rng.choices(("regular", "silver", "gold"), (5, 3, 2))[0],
        reservations=[],
    )


def _reservation_id(rng: random.Random, taken: dict) -> str:
    alphabet = string.ascii_uppercase + string.digits
    while True:
        rid = "".join(rng.choice(alphabet) for _ in range(6))
        if rid not in taken:
            return rid


def _reservation(rng: random.Random, db: AirlineDB, user: User, days: list[str]) -> None:
    fno = rng.choice(sorted(db.flights))
    out = db.flights[fno]
    back = sorted(f.flight_number for f in db.flights.values()
                  if f.origin == out.destination and f.destination == out.origin)
    round_trip = bool(back) and rng.random() < 0.5
    # Most bookings are for trips still ahead, as in a live system.
    last = len(days) - (6 if round_trip else 0)
    today_i = days.index(TODAY) if TODAY in days else 0
    future = rng.random() < 0.7 and today_i + 1 < last
    day_i = rng.randrange(today_i + 1, last) if future else rng.randrange(0, last)
    segments = [(out, days[day_i])]
    if round_trip:
        segments.append((db.flights[rng.choice(back)], days[day_i + rng.randint(2, 5)]))
    cabin = rng.choices(CABINS, (3, 5, 2))[0]
    # Booked before the first flight; some in the last 24 hours (free cancellation).
    first_dt = datetime.fromisoformat(f"{segments[0][1]}T{out.scheduled_departure_time_est}")
    now = datetime.fromisoformat(NOW)
    latest = min(first_dt - timedelta(hours=2), now)
    if rng.random() < 0.15 and first_dt > now:
        created = now - timedelta(minutes=rng.randint(30, 23 * 60))
    else:
        created = latest - timedelta(hours=rng.randint(26, 24 * 20))
    me = Passenger(first_name=user.name.first_name, last_name=user.name.last_name, dob=user.dob)
    passengers = [me] + user.saved_passengers[: rng.randint(0, len(user.saved_passengers))]
    passengers += [_person(rng) for _ in range(rng.choice((0, 0, 0, 1)))]
    n = len(passengers)
    legs = []
    for flight, day in segments:
        listed = flight.dates[day].prices
        price = listed[cabin] if listed else rng.randint(60, 900 if cabin == "business" else 300)
        legs.append(ReservationFlight(flight_number=flight.flight_number, origin=flight.origin,
                                      destination=flight.destination, date=day, price=price))
    free = FREE_BAGS[user.membership][cabin] * n
    total_bags = rng.randint(0, free + 1)
    nonfree = max(0, total_bags - free)
    insurance = "yes" if rng.random() < 0.35 else "no"
    amount = sum(leg.price for leg in legs) * n + nonfree * 50
    amount += INSURANCE_FEE * n if insurance == "yes" else 0
    payer = rng.choice([p for p in user.payment_methods.values() if p.source == "credit_card"]
                       or list(user.payment_methods.values()))
    rid = _reservation_id(rng, db.reservations)
    db.reservations[rid] = Reservation(
        reservation_id=rid, user_id=user.user_id, origin=out.origin, destination=out.destination,
        flight_type="round_trip" if round_trip else "one_way", cabin=cabin, flights=legs,
        passengers=passengers, payment_history=[Payment(payment_id=payer.id, amount=amount)],
        created_at=created.isoformat(timespec="seconds"), total_baggages=total_bags,
        nonfree_baggages=nonfree, insurance=insurance,
        status="cancelled" if rng.random() < 0.05 else None,
    )
    user.reservations.append(rid)


def generate_db(seed: int = 0, **size: int | str) -> AirlineDB:
    """A fresh airline database, identical for the same seed and sizes (see AirlineDBConfig)."""
    cfg = AirlineDBConfig(**size)  # type: ignore[arg-type]
    if not 2 <= cfg.n_airports <= len(AIRPORTS):
        raise ValueError(f"n_airports must be in [2, {len(AIRPORTS)}], got {cfg.n_airports}")
    rng = random.Random(f"airline:{seed}")
    chosen = sorted(rng.sample(AIRPORTS, cfg.n_airports))
    codes = [a[0] for a in chosen]
    db = AirlineDB(
        airports=[Airport(iata=code, city=city) for code, city, _ in chosen],
        flights=_flights(rng, cfg, codes),
        users={},
        reservations={},
    )
    days = _days(cfg)
    for _ in range(cfg.n_users):
        user = _user(rng, chosen, set(db.users))
        db.users[user.user_id] = user
        for _ in range(rng.randint(1, cfg.max_reservations_per_user)):
            _reservation(rng, db, user, days)
    return db
