"""Airline domain records: users, flights with per-date status, reservations.

Design decisions
- The shapes follow tau2-bench's airline database (so trajectories read alike and the
  tool schemas match): payment methods keyed by id with a `source` discriminator,
  flights keyed by number with one entry per date, reservations that copy the price paid
  for each segment (a later price change does not touch a booked segment).
- Money is whole dollars (`int`): prices, balances and payments never carry float noise,
  so a database hash is stable and a balance check is exact.
- `FlightInfo`, `Passenger` and `Payment` double as tool argument types; their field
  descriptions are what the generated tool schemas show.
- Times are naive ISO strings in the airline's clock (EST); `NOW` is fixed so that
  "within 24 hours of booking" and "already flown" are decidable from the data alone.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from trace_lib.envs.domains.base import (  # noqa: F401  (the shared records, re-exported)
    Address,
    CreditCard,
    Customer,
    Name,
)

NOW = "2024-05-15T15:00:00"  # the domain's current time (EST)
TODAY = NOW[:10]

Cabin = Literal["business", "economy", "basic_economy"]
FlightType = Literal["round_trip", "one_way"]
Insurance = Literal["yes", "no"]
Membership = Literal["gold", "silver", "regular"]
FlightStatus = Literal["available", "on time", "delayed", "flying", "landed", "cancelled"]
CABINS: tuple[str, ...] = ("basic_economy", "economy", "business")

# Free checked bags per passenger, by the booking user's membership and the cabin.
FREE_BAGS: dict[str, dict[str, int]] = {
    "regular": {"basic_economy": 0, "economy": 1, "business": 2},
    "silver": {"basic_economy": 1, "economy": 2, "business": 3},
    "gold": {"basic_economy": 2, "economy": 3, "business": 4},
}
BAG_FEE = 50
INSURANCE_FEE = 30
MAX_PASSENGERS = 5


class FlightInfo(BaseModel):
    flight_number: str = Field(description="Flight number, such as 'HAT001'.")
    date: str = Field(description="Date of the flight, 'YYYY-MM-DD', such as '2024-05-01'.")


class Passenger(BaseModel):
    first_name: str = Field(description="Passenger's first name")
    last_name: str = Field(description="Passenger's last name")
    dob: str = Field(description="Date of birth, 'YYYY-MM-DD'")


class Payment(BaseModel):
    payment_id: str = Field(description="Id of a payment method in the user's profile")
    amount: int = Field(description="Amount in dollars (negative for a refund)")


class GiftCard(BaseModel):
    source: Literal["gift_card"] = "gift_card"
    id: str
    amount: int


class Certificate(BaseModel):
    source: Literal["certificate"] = "certificate"
    id: str
    amount: int


PaymentMethod = Annotated[CreditCard | GiftCard | Certificate, Field(discriminator="source")]


class User(Customer):
    dob: str
    payment_methods: dict[str, PaymentMethod]
    saved_passengers: list[Passenger]
    membership: Membership
    reservations: list[str]


class ReservationFlight(BaseModel):
    flight_number: str
    origin: str
    destination: str
    date: str
    price: int  # per passenger, as paid at booking time


class Reservation(BaseModel):
    reservation_id: str
    user_id: str
    origin: str
    destination: str
    flight_type: FlightType
    cabin: Cabin
    flights: list[ReservationFlight]
    passengers: list[Passenger]
    payment_history: list[Payment]
    created_at: str
    total_baggages: int
    nonfree_baggages: int
    insurance: Insurance
    status: Literal["cancelled"] | None = None


class FlightDate(BaseModel):
    """One date of a flight. Seats and prices are listed only while it can be booked."""

    status: FlightStatus
    available_seats: dict[str, int] | None = None
    prices: dict[str, int] | None = None
    actual_departure_time_est: str | None = None
    actual_arrival_time_est: str | None = None
    estimated_departure_time_est: str | None = None


class Flight(BaseModel):
    flight_number: str
    origin: str
    destination: str
    scheduled_departure_time_est: str  # "HH:MM:SS"
    scheduled_arrival_time_est: str  # may be "+1" day, see `arrives_next_day`
    arrives_next_day: bool = False
    dates: dict[str, FlightDate]


class Airport(BaseModel):
    iata: str
    city: str


class AirlineDB(BaseModel):
    airports: list[Airport]
    flights: dict[str, Flight]
    users: dict[str, User]
    reservations: dict[str, Reservation]
