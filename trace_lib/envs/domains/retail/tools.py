"""The retail toolkit: tau2-bench's retail tool names and argument shapes over our database.

Design decisions
- Names, argument names, JSON types and required lists equal tau2-bench's retail tools
  (a test checks them against the shared `tool_schemas_by_domain.json`); descriptions are
  our own words. One extra tool, `think` (tau-bench's scratchpad, absent from tau2's
  retail set), changes nothing; `Domain.tool_schemas(names)` selects a subset.
- Unlike the airline API, tau2's retail API checks order status itself (only pending
  orders are cancelled or modified, only delivered ones returned or exchanged) and the
  cancellation reason; we do the same, always, and also refuse a second modification (the
  status becomes "pending (item modified)"), a payment change to the same method, and a
  return refunded anywhere but the original method or a gift card. `enforce_policy` has
  nothing to add here: what remains for the agent (authenticating the user, confirming,
  gathering every item before a one-shot modification) is not visible to a tool.
- Item swaps (modify/exchange) are checked item by item: the old item must be in the
  order as many times as listed, the new one must be an available variant of the same
  product and a different item; the price difference is paid by, or refunded to, the
  given method, and a gift card must cover what it pays.
- Gift card refunds land at once (balance goes up); other refunds are recorded in the
  payment history only, as the policy says they take days.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from trace_lib.envs.domains.base import (
    CustomerServiceTools,
    ToolError,
    calculate_expression,
    tool,
)
from trace_lib.envs.domains.retail.data_model import (
    CANCEL_REASONS,
    Address,
    GiftCard,
    Order,
    PaymentRecord,
    RetailDB,
    User,
)


class RetailTools(CustomerServiceTools):
    """Tools over a `RetailDB` (mutated in place)."""

    domain = "retail"
    db: RetailDB

    # ------------------------------------------------------------------ lookups
    def _user(self, user_id: str) -> User:
        if user_id not in self.db.users:
            raise ToolError(f"user {user_id} not found")
        return self.db.users[user_id]

    def _order(self, order_id: str, status: str | None = None, action: str = "") -> Order:
        """The order; with `status`, refused unless it is in that status (for `action`)."""
        if order_id not in self.db.orders:
            hint = "" if order_id.startswith("#") else " (order ids start with '#')"
            raise ToolError(f"order {order_id} not found{hint}")
        order = self.db.orders[order_id]
        if status is not None and order.status != status:
            raise ToolError(f"order {order_id} is {order.status}; only {status} orders can be "
                            f"{action}")
        return order

    def _method(self, user: User, payment_method_id: str) -> Any:
        method = user.payment_methods.get(payment_method_id)
        if method is None:
            raise ToolError(f"payment method {payment_method_id} not found in the profile of "
                            f"{user.user_id}")
        return method

    def _swap_check(self, order: Order, item_ids: list[str], new_item_ids: list[str]) -> float:
        """Validate an item-for-item swap; return the price difference (new - old)."""
        if not item_ids:
            raise ToolError("item_ids must list at least one item")
        if len(item_ids) != len(new_item_ids):
            raise ToolError("item_ids and new_item_ids must have the same length")
        have = Counter(i.item_id for i in order.items)
        for item_id, n in Counter(item_ids).items():
            if have[item_id] < n:
                raise ToolError(f"item {item_id} is not in order {order.order_id} "
                                f"{n} time(s)")
        diff = 0.0
        for old_id, new_id in zip(item_ids, new_item_ids, strict=True):
            old = next(i for i in order.items if i.item_id == old_id)
            variant = self.db.products[old.product_id].variants.get(new_id)
            if variant is None:
                raise ToolError(f"new item {new_id} is not a variant of {old.name} "
                                f"(product {old.product_id})")
            if new_id == old_id:
                raise ToolError(f"new item {new_id} is the same as the old one")
            if not variant.available:
                raise ToolError(f"new item {new_id} is not available")
            diff += variant.price - old.price
        return round(diff, 2)

    def _pay_difference(self, user: User, payment_method_id: str, diff: float) -> None:
        method = self._method(user, payment_method_id)
        if isinstance(method, GiftCard):
            if diff > method.balance + 1e-9:
                raise ToolError(f"gift card {payment_method_id} has a balance of "
                                f"{method.balance}, less than {diff}")
            method.balance = round(method.balance - diff, 2)

    # -------------------------------------------------------------------- reads
    @tool
    def find_user_id_by_email(self, email: str) -> str:
        """Find a user's id from their email address.

        Args:
            email: The user's email, such as 'someone@example.com'.
        """
        for user_id, user in self.db.users.items():
            if user.email.lower() == email.strip().lower():
                return user_id
        raise ToolError("no user with that email")

    @tool
    def find_user_id_by_name_zip(self, first_name: str, last_name: str, zip: str) -> str:
        """Find a user's id from their first name, last name and zip code; for users who do
        not remember their email.

        Args:
            first_name: First name, such as 'John'.
            last_name: Last name, such as 'Doe'.
            zip: Zip code of the default address, such as '12345'.
        """
        for user_id, user in self.db.users.items():
            if (user.name.first_name.lower(), user.name.last_name.lower(), user.address.zip) == (
                    first_name.strip().lower(), last_name.strip().lower(), zip.strip()):
                return user_id
        raise ToolError("no user with that name and zip code")

    @tool
    def get_user_details(self, user_id: str) -> User:
        """Look up a user's profile: name, email, default address, payment methods, orders.

        Args:
            user_id: The user's id, such as 'sara_doe_4960'.
        """
        return self._user(user_id)

    @tool
    def get_order_details(self, order_id: str) -> Order:
        """Look up an order: status, items with prices and options, address, fulfilments and
        payment history.

        Args:
            order_id: The order id, which starts with '#', such as '#W0000000'.
        """
        return self._order(order_id)

    @tool
    def get_product_details(self, product_id: str) -> Any:
        """Look up a product and all its variant items: options, availability and price.

        Args:
            product_id: The product id, such as '6086499569' (not an item id).
        """
        if product_id not in self.db.products:
            raise ToolError(f"product {product_id} not found (item ids are not product ids)")
        return self.db.products[product_id]

    @tool
    def list_all_product_types(self) -> dict[str, str]:
        """List every product type the store sells, name -> product id."""
        return dict(sorted((p.name, pid) for pid, p in self.db.products.items()))

    @tool
    def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression and return the result rounded to 2 decimals.

        Args:
            expression: Numbers, + - * /, parentheses and spaces, such as '12.5 * 3'.
        """
        return calculate_expression(expression)

    # ------------------------------------------------------------------- writes
    @tool(write=True)
    def cancel_pending_order(self, order_id: str, reason: str) -> Order:
        """Cancel a pending order and refund it: at once onto a gift card, in 5-7 business
        days otherwise. Orders already processed or delivered cannot be cancelled.

        Args:
            order_id: The order id, which starts with '#', such as '#W0000000'.
            reason: Either 'no longer needed' or 'ordered by mistake'.
        """
        order = self._order(order_id, "pending", "cancelled")
        if reason not in CANCEL_REASONS:
            raise ToolError(f"reason must be one of {', '.join(map(repr, CANCEL_REASONS))}")
        user = self._user(order.user_id)
        refunds = []
        for p in order.payment_history:
            if p.transaction_type != "payment":
                continue
            refunds.append(PaymentRecord(transaction_type="refund", amount=p.amount,
                                         payment_method_id=p.payment_method_id))
            method = user.payment_methods.get(p.payment_method_id)
            if isinstance(method, GiftCard):
                method.balance = round(method.balance + p.amount, 2)
        order.payment_history.extend(refunds)
        order.status = "cancelled"
        order.cancel_reason = reason
        return order

    @tool(write=True)
    def modify_pending_order_address(self, order_id: str, address1: str, address2: str,
                                     city: str, state: str, country: str, zip: str) -> Order:
        """Change the shipping address of a pending order.

        Args:
            order_id: The order id, which starts with '#', such as '#W0000000'.
            address1: First address line, such as '123 Main St'.
            address2: Second address line, such as 'Apt 1', or ''.
            city: City, such as 'Austin'.
            state: State, such as 'TX'.
            country: Country, such as 'USA'.
            zip: Zip code, such as '78701'.
        """
        order = self._order(order_id, "pending", "modified")
        order.address = Address(address1=address1, address2=address2, city=city, state=state,
                                country=country, zip=zip)
        return order

    @tool(write=True)
    def modify_pending_order_items(self, order_id: str, item_ids: list[str],
                                   new_item_ids: list[str], payment_method_id: str) -> Order:
        """Swap items of a pending order for other variants of the same products, all in one
        call (it can be made once per order); the price difference is charged to, or refunded
        on, payment_method_id.

        Args:
            order_id: The order id, which starts with '#', such as '#W0000000'.
            item_ids: Item ids to replace, each such as '1008292230'; repeat an id to replace
                several units.
            new_item_ids: Replacement item ids, position by position, each a variant of the
                same product as the item it replaces.
            payment_method_id: Payment method id from the user's profile, such as
                'gift_card_0000000' or 'credit_card_0000000'.
        """
        order = self._order(order_id, "pending", "modified")
        diff = self._swap_check(order, item_ids, new_item_ids)
        user = self._user(order.user_id)
        self._pay_difference(user, payment_method_id, diff)
        for old_id, new_id in zip(item_ids, new_item_ids, strict=True):
            item = next(i for i in order.items if i.item_id == old_id)
            variant = self.db.products[item.product_id].variants[new_id]
            item.item_id, item.price, item.options = new_id, variant.price, dict(variant.options)
        order.payment_history.append(PaymentRecord(
            transaction_type="payment" if diff > 0 else "refund", amount=abs(diff),
            payment_method_id=payment_method_id))
        order.status = "pending (item modified)"
        return order

    @tool(write=True)
    def modify_pending_order_payment(self, order_id: str, payment_method_id: str) -> Order:
        """Pay a pending order with another method from the profile: the new method is
        charged the order total and the old one refunded.

        Args:
            order_id: The order id, which starts with '#', such as '#W0000000'.
            payment_method_id: The new payment method id, such as 'gift_card_0000000' or
                'credit_card_0000000'.
        """
        order = self._order(order_id, "pending", "modified")
        payments = [p for p in order.payment_history if p.transaction_type == "payment"]
        if len(payments) != 1:
            raise ToolError(f"order {order_id} has {len(payments)} payments; expected one")
        old = payments[0]
        if old.payment_method_id == payment_method_id:
            raise ToolError("the new payment method must differ from the current one")
        user = self._user(order.user_id)
        self._pay_difference(user, payment_method_id, old.amount)
        old_method = user.payment_methods.get(old.payment_method_id)
        if isinstance(old_method, GiftCard):
            old_method.balance = round(old_method.balance + old.amount, 2)
        order.payment_history += [
            PaymentRecord(transaction_type="payment", amount=old.amount,
                          payment_method_id=payment_method_id),
            PaymentRecord(transaction_type="refund", amount=old.amount,
                          payment_method_id=old.payment_method_id),
        ]
        return order

    @tool(write=True)
    def modify_user_address(self, user_id: str, address1: str, address2: str, city: str,
                            state: str, country: str, zip: str) -> User:
        """Change a user's default address (existing orders keep theirs).

        Args:
            user_id: The user's id, such as 'sara_doe_4960'.
            address1: First address line, such as '123 Main St'.
            address2: Second address line, such as 'Apt 1', or ''.
            city: City, such as 'Austin'.
            state: State, such as 'TX'.
            country: Country, such as 'USA'.
            zip: Zip code, such as '78701'.
        """
        user = self._user(user_id)
        user.address = Address(address1=address1, address2=address2, city=city, state=state,
                               country=country, zip=zip)
        return user

    @tool(write=True)
    def return_delivered_order_items(self, order_id: str, item_ids: list[str],
                                     payment_method_id: str) -> Order:
        """Request the return of items of a delivered order (once per order); the user gets
        an email on how to send them back, and the refund goes to payment_method_id.

        Args:
            order_id: The order id, which starts with '#', such as '#W0000000'.
            item_ids: Item ids to return, each such as '1008292230'; repeat an id to return
                several units.
            payment_method_id: Where the refund goes: the order's original payment method or a
                gift card of the user, such as 'gift_card_0000000'.
        """
        order = self._order(order_id, "delivered", "returned")
        if not item_ids:
            raise ToolError("item_ids must list at least one item")
        have = Counter(i.item_id for i in order.items)
        for item_id, n in Counter(item_ids).items():
            if have[item_id] < n:
                raise ToolError(f"item {item_id} is not in order {order_id} {n} time(s)")
        user = self._user(order.user_id)
        method = self._method(user, payment_method_id)
        original = {p.payment_method_id for p in order.payment_history
                    if p.transaction_type == "payment"}
        if payment_method_id not in original and not isinstance(method, GiftCard):
            raise ToolError("the refund must go to the original payment method or a gift card")
        order.status = "return requested"
        order.return_items = sorted(item_ids)
        order.return_payment_method_id = payment_method_id
        return order

    @tool(write=True)
    def exchange_delivered_order_items(self, order_id: str, item_ids: list[str],
                                       new_item_ids: list[str], payment_method_id: str) -> Order:
        """Request an exchange of items of a delivered order for other variants of the same
        products (once per order); the price difference is charged to, or refunded on,
        payment_method_id.

        Args:
            order_id: The order id, which starts with '#', such as '#W0000000'.
            item_ids: Item ids to exchange, each such as '1008292230'; repeat an id to
                exchange several units.
            new_item_ids: Replacement item ids, position by position, each a variant of the
                same product as the item it replaces.
            payment_method_id: Payment method id from the user's profile, such as
                'gift_card_0000000' or 'credit_card_0000000'.
        """
        order = self._order(order_id, "delivered", "exchanged")
        diff = self._swap_check(order, item_ids, new_item_ids)
        user = self._user(order.user_id)
        self._pay_difference(user, payment_method_id, diff)
        order.status = "exchange requested"
        order.exchange_items = sorted(item_ids)
        order.exchange_new_items = sorted(new_item_ids)
        order.exchange_payment_method_id = payment_method_id
        order.exchange_price_difference = diff
        return order
