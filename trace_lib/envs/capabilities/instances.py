"""Record selection shared by the task builders: who and what an instance is about.

Design decisions
- Builders pick entities with a seeded RNG from sorted keys, never from dict iteration or
  set order, so that instances are reproducible across processes.
- `feasible` replays candidate reference calls on a copy of the database: a builder keeps
  only candidates the domain's tools accept, instead of re-implementing their rules.
- The refusal vocabulary is one list, used by every builder whose correct reply is "no".
"""

from __future__ import annotations

import random
from typing import Any

from trace_lib.envs.domains import copy_db, get_domain, invoke, is_error

FIRST_NAMES = (
    "Alex", "Bianca", "Carlos", "Dana", "Erik", "Farah", "Grace", "Hannah", "Isaac", "Julia",
    "Karim", "Laura", "Marco", "Nadia", "Oscar", "Paula", "Quinn", "Rosa", "Samir", "Tara",
)

REFUSAL = [
    "cannot", "can't", "can not", "unable", "not able", "not possible", "not eligible",
    "not allowed", "won't be able", "am sorry", "i'm sorry", "unfortunately", "not permitted",
]


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def feasible(domain: str, db: Any, actions: list[dict[str, Any]]) -> bool:
    """True if every call succeeds when replayed, in order, on a copy of `db`."""
    dom = get_domain(domain)
    kit = dom.tools(copy_db(db))
    return all(not is_error(invoke(kit, a["name"], a["arguments"])) for a in actions)


def pick(rng: random.Random, items: list[Any]) -> Any:
    if not items:
        raise LookupError("nothing to pick from")
    return items[rng.randrange(len(items))]


# ------------------------------------------------------------------------ airline


def airline_active(db: Any) -> list[Any]:
    """Reservations that are not cancelled and not (partly) flown, in id order."""
    from trace_lib.envs.domains.airline.tools import reservation_flown

    return [r for _, r in sorted(db.reservations.items())
            if r.status != "cancelled" and not reservation_flown(db, r)]


def airline_payment(user: Any, amount: int = 0, allow_certificate: bool = False) -> str | None:
    """A payment id of the user that can pay `amount`: a credit card first, else a gift card."""
    methods = [m for _, m in sorted(user.payment_methods.items())]
    for m in methods:
        if m.source == "credit_card":
            return m.id
    for m in methods:
        if m.source == "gift_card" and m.amount >= amount:
            return m.id
    if allow_certificate:
        for m in methods:
            if m.source == "certificate" and m.amount >= amount:
                return m.id
    return None


def person_text(p: Any) -> str:
    return f"{p.first_name} {p.last_name} (born {p.dob})"


# ------------------------------------------------------------------------- retail


def retail_orders(db: Any, status: str) -> list[Any]:
    return [o for _, o in sorted(db.orders.items()) if o.status == status]


def money(x: float) -> list[str]:
    """Ways a reply may write an amount: 21.5 -> ["21.50"], 21.0 -> ["21.00", "21"]."""
    text = f"{x:.2f}"
    return [text, text[:-3]] if text.endswith(".00") else [text]


def retail_login(db: Any, user_id: str) -> dict[str, Any]:
    """The authentication call the retail policy requires first (by email)."""
    return call("find_user_id_by_email", email=db.users[user_id].email)


def retail_other_variants(db: Any, item: Any) -> list[Any]:
    """Available variants of the same product, other than `item`, in id order."""
    product = db.products[item.product_id]
    return [v for _, v in sorted(product.variants.items())
            if v.available and v.item_id != item.item_id]
