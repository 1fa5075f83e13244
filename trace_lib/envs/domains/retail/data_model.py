"""Retail domain records: products with variant items, users, orders with payment history.

Design decisions
- Shapes follow tau2-bench's retail database: products keyed by product id, each with
  variant items keyed by item id (options, availability, price); orders keyed by
  "#W" ids that copy each item's price and options at purchase time; a payment history of
  payments and refunds per order. Product ids and item ids are separate number spaces,
  as in the benchmark (the policy warns agents not to confuse them).
- Money is dollars with cents (`float`), always rounded to 2 decimals where it is
  computed, so hashes do not drift with float noise.
- Order statuses include the post-action ones tau2 uses ("pending (item modified)",
  "return requested", "exchange requested"), so a write is visible in the status and a
  second modification of the same order can be refused.
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

OrderStatus = Literal[
    "pending", "processed", "delivered", "cancelled", "pending (item modified)",
    "return requested", "exchange requested",
]
CANCEL_REASONS: tuple[str, ...] = ("no longer needed", "ordered by mistake")


class Variant(BaseModel):
    item_id: str
    options: dict[str, str]
    available: bool
    price: float


class Product(BaseModel):
    product_id: str
    name: str
    variants: dict[str, Variant]


class Paypal(BaseModel):
    source: Literal["paypal"] = "paypal"
    id: str


class GiftCard(BaseModel):
    source: Literal["gift_card"] = "gift_card"
    id: str
    balance: float


PaymentMethod = Annotated[CreditCard | Paypal | GiftCard, Field(discriminator="source")]


class User(Customer):
    payment_methods: dict[str, PaymentMethod]
    orders: list[str]


class OrderItem(BaseModel):
    name: str
    product_id: str
    item_id: str
    price: float
    options: dict[str, str]


class Fulfillment(BaseModel):
    tracking_id: list[str]
    item_ids: list[str]


class PaymentRecord(BaseModel):
    transaction_type: Literal["payment", "refund"]
    amount: float
    payment_method_id: str


class Order(BaseModel):
    order_id: str
    user_id: str
    address: Address
    items: list[OrderItem]
    fulfillments: list[Fulfillment]
    status: OrderStatus
    payment_history: list[PaymentRecord]
    cancel_reason: str | None = None
    exchange_items: list[str] | None = None
    exchange_new_items: list[str] | None = None
    exchange_payment_method_id: str | None = None
    exchange_price_difference: float | None = None
    return_items: list[str] | None = None
    return_payment_method_id: str | None = None


class RetailDB(BaseModel):
    products: dict[str, Product]
    users: dict[str, User]
    orders: dict[str, Order]
