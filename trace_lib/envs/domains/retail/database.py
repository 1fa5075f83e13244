"""Seeded generator of a retail database: a catalogue with variants, users, their orders.

Design decisions
- One `random.Random(seed)` drawn in a fixed order; no clock, no global RNG: the same seed
  and sizes give a byte-identical dump.
- The catalogue is built from product templates with option axes (colour, size,
  capacity...); every product gets several variants, some unavailable, so "exchange for an
  available item of the same product" has both answers in the data.
- Orders cover every status the policy distinguishes (pending, processed, delivered,
  cancelled), with fulfilments for shipped ones and a payment history consistent with the
  items' prices, so cancellations, modifications, returns and exchanges all have cases.
"""

from __future__ import annotations

import itertools
import random
import string
from dataclasses import dataclass

from trace_lib.envs.domains.airline.database import FIRST_NAMES, LAST_NAMES, STREETS
from trace_lib.envs.domains.retail.data_model import (
    Address,
    CreditCard,
    Fulfillment,
    GiftCard,
    Name,
    Order,
    OrderItem,
    PaymentRecord,
    Paypal,
    Product,
    RetailDB,
    User,
    Variant,
)

# name -> (option axes, price range)
PRODUCT_TEMPLATES: dict[str, tuple[dict[str, tuple[str, ...]], tuple[int, int]]] = {
    "T-Shirt": ({"color": ("black", "white", "blue", "red"), "size": ("S", "M", "L", "XL")},
                (15, 40)),
    "Running Shoes": ({"color": ("black", "white", "grey"), "size": ("8", "9", "10", "11")},
                      (60, 160)),
    "Water Bottle": ({"capacity": ("500ml", "750ml", "1000ml"),
                      "material": ("steel", "plastic", "glass")}, (10, 45)),
    "Backpack": ({"color": ("black", "green", "navy"), "size": ("small", "medium", "large")},
                 (35, 120)),
    "Headphones": ({"type": ("over-ear", "on-ear", "in-ear"),
                    "connectivity": ("wired", "wireless")}, (40, 300)),
    "Desk Lamp": ({"color": ("white", "black", "silver"), "brightness": ("low", "high")},
                  (20, 90)),
    "Coffee Maker": ({"capacity": ("4 cups", "8 cups", "12 cups"), "color": ("black", "red")},
                     (45, 220)),
    "Yoga Mat": ({"thickness": ("4mm", "6mm", "8mm"), "color": ("purple", "blue", "grey")},
                 (20, 80)),
    "Mechanical Keyboard": ({"switch": ("red", "blue", "brown"), "layout": ("full", "tkl")},
                            (70, 220)),
    "Smart Watch": ({"color": ("black", "silver", "gold"), "band": ("leather", "silicone")},
                    (150, 450)),
    "Tablet": ({"storage": ("64GB", "128GB", "256GB"), "color": ("grey", "silver")},
               (200, 800)),
    "Office Chair": ({"material": ("mesh", "leather", "fabric"), "color": ("black", "grey")},
                     (90, 400)),
    "Bluetooth Speaker": ({"color": ("black", "blue", "red"), "battery": ("10h", "20h")},
                          (30, 180)),
    "Jigsaw Puzzle": ({"pieces": ("500", "1000", "2000"), "theme": ("animals", "art")},
                      (12, 45)),
    "Electric Kettle": ({"capacity": ("1L", "1.5L", "2L"), "material": ("steel", "glass")},
                        (25, 110)),
    "Sunglasses": ({"color": ("black", "brown", "blue"), "lens": ("polarized", "standard")},
                   (25, 200)),
}


@dataclass
class RetailDBConfig:
    n_products: int = 16
    n_users: int = 50
    max_orders_per_user: int = 4
    max_items_per_order: int = 4


def _digits(rng: random.Random, n: int) -> str:
    return str(rng.randint(1, 9)) + "".join(rng.choice(string.digits) for _ in range(n - 1))


def _catalogue(rng: random.Random, cfg: RetailDBConfig) -> dict[str, Product]:
    names = sorted(PRODUCT_TEMPLATES)[: cfg.n_products]
    products: dict[str, Product] = {}
    for name in names:
        axes, (lo, hi) = PRODUCT_TEMPLATES[name]
        combos = list(itertools.product(*axes.values()))
        rng.shuffle(combos)
        variants: dict[str, Variant] = {}
        base = rng.uniform(lo, hi)
        for combo in combos[: rng.randint(4, min(9, len(combos)))]:
            item_id = _digits(rng, 10)
            variants[item_id] = Variant(
                item_id=item_id, options=dict(zip(axes, combo, strict=True)),
                available=rng.random() < 0.75, price=round(base * rng.uniform(0.85, 1.2), 2))
        pid = _digits(rng, 10)
        products[pid] = Product(product_id=pid, name=name, variants=dict(sorted(variants.items())))
    return dict(sorted(products.items()))


def _user(rng: random.Random, taken: set[str]) -> User:
    first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
    while True:
        uid = f"{first.lower()}_{last.lower()}_{rng.randint(1000, 9999)}"
        if uid not in taken:
            break
    methods: dict = {}
    for _ in range(rng.randint(1, 3)):
        kind = rng.choices(("credit_card", "paypal", "gift_card"), (5, 2, 3))[0]
        pid = f"{kind}_{_digits(rng, 7)}"
        if kind == "credit_card":
            methods[pid] = CreditCard(id=pid, brand=rng.choice(("visa", "mastercard", "amex")),
                                      last_four=_digits(rng, 4))
        elif kind == "paypal":
            methods[pid] = Paypal(id=pid)
        else:
            methods[pid] = GiftCard(id=pid, balance=float(rng.randint(0, 300)))
    return User(
        user_id=uid, name=Name(first_name=first, last_name=last),
        address=Address(address1=f"{rng.randint(10, 9999)} {rng.choice(STREETS)}",
                        address2=rng.choice(("", f"Apt {rng.randint(1, 99)}")),
                        city=rng.choice(("Austin", "Denver", "Columbus", "Seattle", "Boston",
                                         "Phoenix", "Portland", "Chicago")),
                        country="USA", state=rng.choice(("TX", "CO", "OH", "WA", "MA", "AZ",
                                                         "OR", "IL")),
                        zip=_digits(rng, 5)),
        email=f"{first.lower()}.{last.lower()}{rng.randint(1, 999)}@example.com",
        payment_methods=dict(sorted(methods.items())), orders=[],
    )


def _order(rng: random.Random, db: RetailDB, user: User, cfg: RetailDBConfig) -> None:
    while True:
        oid = f"#W{_digits(rng, 7)}"
        if oid not in db.orders:
            break
    items = []
    for _ in range(rng.randint(1, cfg.max_items_per_order)):
        product = db.products[rng.choice(sorted(db.products))]
        variant = product.variants[rng.choice(sorted(product.variants))]
        items.append(OrderItem(name=product.name, product_id=product.product_id,
                               item_id=variant.item_id, price=variant.price,
                               options=dict(variant.options)))
    status = rng.choices(("pending", "processed", "delivered", "cancelled"), (3, 1.5, 4.5, 1))[0]
    fulfillments = []
    if status in ("processed", "delivered"):
        fulfillments = [Fulfillment(tracking_id=[_digits(rng, 12)],
                                    item_ids=[i.item_id for i in items])]
    payer = user.payment_methods[rng.choice(sorted(user.payment_methods))]
    total = round(sum(i.price for i in items), 2)
    history = [PaymentRecord(transaction_type="payment", amount=total, payment_method_id=payer.id)]
    order = Order(order_id=oid, user_id=user.user_id, address=user.address.model_copy(),
                  items=items, fulfillments=fulfillments, status=status,
                  payment_history=history)
    if status == "cancelled":
        order.cancel_reason = rng.choice(("no longer needed", "ordered by mistake"))
        history.append(PaymentRecord(transaction_type="refund", amount=total,
                                     payment_method_id=payer.id))
    db.orders[oid] = order
    user.orders.append(oid)


def generate_db(seed: int = 0, **size: int) -> RetailDB:
    """A fresh retail database, identical for the same seed and sizes (see RetailDBConfig)."""
    cfg = RetailDBConfig(**size)
    if not 1 <= cfg.n_products <= len(PRODUCT_TEMPLATES):
        raise ValueError(f"n_products must be in [1, {len(PRODUCT_TEMPLATES)}], "
                         f"got {cfg.n_products}")
    rng = random.Random(f"retail:{seed}")
    db = RetailDB(products=_catalogue(rng, cfg), users={}, orders={})
    for _ in range(cfg.n_users):
        user = _user(rng, set(db.users))
        db.users[user.user_id] = user
        for _ in range(rng.randint(1, cfg.max_orders_per_user)):
            _order(rng, db, user, cfg)
    return db
