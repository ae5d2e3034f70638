"""What a store adapter does: the five things kefu needs from where a store keeps its orders.

An adapter only fetches and changes orders; it does not decide who may: ``store.services`` (the
part's door) checks every order against its :class:`~store.types.Owner` before anything is
shown or changed, so a new adapter cannot leak one shopper's orders to another by mistake.

Calls are blocking (a database query, an HTTP request) and must return within
``KEFU_STORE_TIMEOUT_S`` seconds, or raise ``StoreError("upstream")``; the door runs them in a
worker thread with that deadline.
"""

from __future__ import annotations

from typing import Protocol

from store.types import Address, Order, ReturnRequest

__all__ = ["StoreAdapter"]


class StoreAdapter(Protocol):
    """Where a store's orders live. ``name`` ("demo", "shopify") is written on the audit log.

    Every method raises :class:`~store.types.StoreError`: ``upstream`` when the store's system
    failed or timed out (transient), ``not_allowed`` when the platform refused the change in the
    order's state (already shipped, already cancelled), ``invalid`` for a request the platform
    rejects as malformed. "No such order" is ``None`` / ``[]``, not an error.

    The three changes take an ``idempotency_key`` (at most 64 characters): the same key sent
    twice changes the order once and returns the same result (a retried request after a timeout,
    a shopper confirming twice)."""

    name: str

    def orders_for_customer(self, customer_id: str, *, limit: int = 5) -> list[Order]:
        """The customer's most recent orders, newest first, at most ``limit``."""
        ...

    def order_by_number(self, number: str) -> Order | None:
        """The order the shopper calls ``number`` ("KF-1001", "#1001", "1001": the adapter
        accepts the forms its platform prints), or None."""
        ...

    def order_cancel(self, number: str, *, idempotency_key: str, reason: str = "customer") -> Order:
        """Cancel an order not yet packed (refunding its payment in full); the order as it now
        stands. ``not_allowed`` once packed, shipped or already cancelled."""
        ...

    def return_open(self, number: str, *, idempotency_key: str, reason: str = "") -> ReturnRequest:
        """Open a return of every item of a delivered order (the store e-mails the label); the
        return request. ``not_allowed`` before delivery or with a return already open."""
        ...

    def shipping_address_change(self, number: str, address: Address, *, idempotency_key: str) -> Order:
        """Send an order not yet packed to ``address``; the order as it now stands.
        ``not_allowed`` once packed; ``invalid`` when the platform rejects the address."""
        ...
