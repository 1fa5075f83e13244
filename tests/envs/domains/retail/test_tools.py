"""Retail domain: the seeded database and the tools' rules (schema fidelity:
../test_schema_fidelity.py)."""

from __future__ import annotations

import json

import pytest

from trace_lib.envs.domains import get_domain, invoke, is_error
from trace_lib.envs.domains.base import db_hash
from trace_lib.envs.domains.retail.data_model import CreditCard, GiftCard, Order, RetailDB


def test_write_tools():
    writes = set(get_domain("retail").write_tools())
    assert writes == {"cancel_pending_order", "exchange_delivered_order_items",
                      "modify_pending_order_address", "modify_pending_order_items",
                      "modify_pending_order_payment", "modify_user_address",
                      "return_delivered_order_items"}


def test_database_is_seeded_and_covers_every_status():
    dom = get_domain("retail")
    a = dom.make_db(seed=4)
    assert a.model_dump_json() == dom.make_db(seed=4).model_dump_json()
    assert db_hash(a) != db_hash(dom.make_db(seed=5))
    assert {o.status for o in a.orders.values()} == {"pending", "processed", "delivered",
                                                     "cancelled"}
    for order in a.orders.values():
        paid = sum(p.amount for p in order.payment_history if p.transaction_type == "payment")
        assert round(paid, 2) == round(sum(i.price for i in order.items), 2)
        for item in order.items:
            assert item.item_id in a.products[item.product_id].variants
        assert order.order_id in a.users[order.user_id].orders
    small = dom.make_db(seed=1, n_users=3, n_products=4)
    assert len(small.users) == 3 and len(small.products) == 4
    with pytest.raises(ValueError, match="n_products"):
        dom.make_db(seed=1, n_products=0)


@pytest.fixture
def db() -> RetailDB:
    return get_domain("retail").make_db(seed=0)


def _order(db: RetailDB, status: str, pred=lambda o: True) -> Order:
    for order in db.orders.values():
        if order.status == status and pred(order):
            return order
    pytest.fail(f"no {status} order of the needed kind")


def _swap(db: RetailDB, order: Order, available: bool = True):
    """(old item id, a different variant of the same product with this availability)."""
    for item in order.items:
        for vid, v in db.products[item.product_id].variants.items():
            if vid != item.item_id and v.available == available:
                return item, v
    return None


def test_user_lookup(db: RetailDB):
    kit = get_domain("retail").tools(db)
    user = next(iter(db.users.values()))
    assert invoke(kit, "find_user_id_by_email", {"email": user.email.upper()}) == user.user_id
    assert invoke(kit, "find_user_id_by_name_zip", {
        "first_name": user.name.first_name, "last_name": user.name.last_name,
        "zip": user.address.zip}) == user.user_id
    assert invoke(kit, "find_user_id_by_email", {"email": "nobody@x.org"}) == (
        "Error: no user with that email")
    order_id = user.orders[0]
    assert "order ids start with '#'" in invoke(kit, "get_order_details",
                                                {"order_id": order_id[1:]})
    item_id = db.orders[order_id].items[0].item_id
    assert "item ids are not product ids" in invoke(kit, "get_product_details",
                                                    {"product_id": item_id})
    types = json.loads(invoke(kit, "list_all_product_types", {}))
    assert set(types.values()) == set(db.products)


def test_cancel_only_pending_with_a_valid_reason_and_gift_card_refund(db: RetailDB):
    kit = get_domain("retail").tools(db)
    delivered = _order(db, "delivered")
    out = invoke(kit, "cancel_pending_order", {"order_id": delivered.order_id,
                                               "reason": "no longer needed"})
    assert out == (f"Error: order {delivered.order_id} is delivered; only pending orders can "
                   "be cancelled")
    pending = _order(db, "pending")
    user = db.users[pending.user_id]
    user.payment_methods["gift_card_1111111"] = GiftCard(id="gift_card_1111111", balance=5.0)
    pending.payment_history[0].payment_method_id = "gift_card_1111111"
    before = db_hash(db)
    bad = invoke(kit, "cancel_pending_order", {"order_id": pending.order_id,
                                               "reason": "found it cheaper"})
    assert bad.startswith("Error: reason must be one of") and db_hash(db) == before
    done = json.loads(invoke(kit, "cancel_pending_order", {"order_id": pending.order_id,
                                                           "reason": "ordered by mistake"}))
    assert done["status"] == "cancelled" and done["cancel_reason"] == "ordered by mistake"
    total = pending.payment_history[0].amount
    assert done["payment_history"][-1] == {"transaction_type": "refund", "amount": total,
                                           "payment_method_id": "gift_card_1111111"}
    assert user.payment_methods["gift_card_1111111"].balance == round(5.0 + total, 2)


def test_modify_items_rules_and_one_shot(db: RetailDB):
    kit = get_domain("retail").tools(db)
    order = _order(db, "pending", lambda o: _swap(db, o) is not None and _swap(
        db, o, available=False) is not None)
    user = db.users[order.user_id]
    user.payment_methods["credit_card_2222222"] = CreditCard(
        id="credit_card_2222222", brand="visa", last_four="2222")
    item, unavailable = _swap(db, order, available=False)
    out = invoke(kit, "modify_pending_order_items", {
        "order_id": order.order_id, "item_ids": [item.item_id],
        "new_item_ids": [unavailable.item_id], "payment_method_id": "credit_card_2222222"})
    assert out == f"Error: new item {unavailable.item_id} is not available"
    other_product = next(p for pid, p in db.products.items() if pid != item.product_id)
    foreign = next(iter(other_product.variants))
    out = invoke(kit, "modify_pending_order_items", {
        "order_id": order.order_id, "item_ids": [item.item_id], "new_item_ids": [foreign],
        "payment_method_id": "credit_card_2222222"})
    assert "is not a variant of" in out
    item, new = _swap(db, order)
    old_price = item.price
    done = json.loads(invoke(kit, "modify_pending_order_items", {
        "order_id": order.order_id, "item_ids": [item.item_id], "new_item_ids": [new.item_id],
        "payment_method_id": "credit_card_2222222"}))
    assert done["status"] == "pending (item modified)"
    assert new.item_id in [i["item_id"] for i in done["items"]]
    diff = round(new.price - old_price, 2)
    assert done["payment_history"][-1]["amount"] == abs(diff)
    again = invoke(kit, "modify_pending_order_address", {
        "order_id": order.order_id, "address1": "1 A St", "address2": "", "city": "X",
        "state": "TX", "country": "USA", "zip": "11111"})
    assert "only pending orders can be modified" in again


def test_gift_card_must_cover_what_it_pays(db: RetailDB):
    kit = get_domain("retail").tools(db)
    order = _order(db, "pending", lambda o: len([p for p in o.payment_history
                                                 if p.transaction_type == "payment"]) == 1)
    user = db.users[order.user_id]
    total = order.payment_history[0].amount
    user.payment_methods["gift_card_3333333"] = GiftCard(id="gift_card_3333333",
                                                         balance=round(total - 1, 2))
    out = invoke(kit, "modify_pending_order_payment", {"order_id": order.order_id,
                                                       "payment_method_id": "gift_card_3333333"})
    assert out.startswith("Error: gift card gift_card_3333333 has a balance of")
    current = order.payment_history[0].payment_method_id
    same = invoke(kit, "modify_pending_order_payment", {
        "order_id": order.order_id, "payment_method_id": current})
    assert same == "Error: the new payment method must differ from the current one"
    user.payment_methods["gift_card_3333333"].balance = round(total + 10, 2)
    done = json.loads(invoke(kit, "modify_pending_order_payment", {
        "order_id": order.order_id, "payment_method_id": "gift_card_3333333"}))
    assert [p["transaction_type"] for p in done["payment_history"][-2:]] == ["payment", "refund"]
    assert user.payment_methods["gift_card_3333333"].balance == 10.0


def test_return_and_exchange_delivered_orders(db: RetailDB):
    kit = get_domain("retail").tools(db)
    order = _order(db, "delivered", lambda o: _swap(db, o) is not None)
    user = db.users[order.user_id]
    user.payment_methods["credit_card_4444444"] = CreditCard(
        id="credit_card_4444444", brand="amex", last_four="4444")
    item = order.items[0]
    original = order.payment_history[0].payment_method_id
    out = invoke(kit, "return_delivered_order_items", {
        "order_id": order.order_id, "item_ids": [item.item_id],
        "payment_method_id": "credit_card_4444444"})
    if original != "credit_card_4444444":
        assert out == "Error: the refund must go to the original payment method or a gift card"
    twice = invoke(kit, "return_delivered_order_items", {
        "order_id": order.order_id, "item_ids": [item.item_id] * (len(order.items) + 1),
        "payment_method_id": original})
    assert "is not in order" in twice
    snapshot = db.model_copy(deep=True)
    done = json.loads(invoke(kit, "return_delivered_order_items", {
        "order_id": order.order_id, "item_ids": [item.item_id], "payment_method_id": original}))
    assert done["status"] == "return requested" and done["return_items"] == [item.item_id]
    assert is_error(invoke(kit, "exchange_delivered_order_items", {
        "order_id": order.order_id, "item_ids": [item.item_id], "new_item_ids": [item.item_id],
        "payment_method_id": original}))
    # On the untouched copy, an exchange for another variant of the same product works.
    kit2 = get_domain("retail").tools(snapshot)
    o2 = snapshot.orders[order.order_id]
    old, new = _swap(snapshot, o2)
    ex = json.loads(invoke(kit2, "exchange_delivered_order_items", {
        "order_id": o2.order_id, "item_ids": [old.item_id], "new_item_ids": [new.item_id],
        "payment_method_id": "credit_card_4444444"}))
    assert ex["status"] == "exchange requested"
    assert ex["exchange_new_items"] == [new.item_id]
    assert ex["exchange_price_difference"] == round(new.price - old.price, 2)


def test_user_address_change(db: RetailDB):
    kit = get_domain("retail").tools(db)
    user = next(iter(db.users.values()))
    orders_before = {o: db.orders[o].address.model_dump() for o in user.orders}
    done = json.loads(invoke(kit, "modify_user_address", {
        "user_id": user.user_id, "address1": "9 New Rd", "address2": "", "city": "Austin",
        "state": "TX", "country": "USA", "zip": "78701"}))
    assert done["address"]["address1"] == "9 New Rd"
    assert {o: db.orders[o].address.model_dump() for o in user.orders} == orders_before
