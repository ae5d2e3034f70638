"""The demo store's adapter: orders in kefu's own database (``store.models.DemoOrder``), loaded
by ``manage.py load_demo_orders`` (``make run`` does it), so the demo can answer "where is my
order?" without any outside system. Also what a store with no order system of its own to
connect would start from.

Changes run in a transaction with the order's row locked (``SELECT ... FOR UPDATE`` where the
database has it), so two workers confirming the same change do it once.
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import DatabaseError, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from store.models import DemoOrder
from store.types import Address, Order, OrderLine, Refund, ReturnRequest, Shipment, StoreError

__all__ = ["DemoAdapter", "order_from_row"]

_NUMBER = re.compile(r"^#?\s*(?:KF)?-?\s*(\d{3,12})$", re.IGNORECASE)


def _when(value: object) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and value:
        return parse_datetime(value)
    return None


def order_from_row(row: DemoOrder) -> Order:
    """The :class:`~store.types.Order` a ``DemoOrder`` row stands for."""
    lines = tuple(
        OrderLine(
            sku=str(line.get("sku", "")),
            title=str(line.get("title", "")),
            quantity=int(line.get("quantity", 1)),
            unit_price=Decimal(str(line.get("unit_price", "0"))),
        )
        for line in row.lines or []
    )
    address = None
    if row.shipping_address:
        a: dict[str, Any] = row.shipping_address
        address = Address(
            name=str(a.get("name", "")),
            line1=str(a.get("line1", "")),
            line2=str(a.get("line2", "")),
            city=str(a.get("city", "")),
            postcode=str(a.get("postcode", "")),
            country=str(a.get("country", "")),
        )
    shipments: tuple[Shipment, ...] = ()
    if row.shipped_at is not None:
        shipments = (
            Shipment(
                carrier=row.carrier,
                tracking_number=row.tracking_number,
                tracking_url=row.tracking_url,
                shipped_at=row.shipped_at,
                delivered_at=row.delivered_at,
                estimated_delivery=row.estimated_delivery,
            ),
        )
    refunds = tuple(
        Refund(
            amount=Decimal(str(r.get("amount", "0"))),
            currency=row.currency,
            status=r.get("status", "pending"),
            created_at=_when(r.get("created_at")) or row.placed_at,
            processed_at=_when(r.get("processed_at")),
        )
        for r in row.refunds or []
    )
    returns = tuple(
        ReturnRequest(
            return_id=str(r.get("return_id", "")),
            status=r.get("status", "requested"),
            created_at=_when(r.get("created_at")) or row.placed_at,
        )
        for r in row.returns or []
    )
    return Order(
        number=row.number,
        customer_id=row.customer_id,
        email=row.email,
        status=row.status,  # type: ignore[arg-type]  # written from OrderStatus only
        placed_at=row.placed_at,
        total=row.total,
        currency=row.currency,
        lines=lines,
        shipping_address=address,
        shipments=shipments,
        refunds=refunds,
        returns=returns,
        admin_url=f"/admin/store/demoorder/{row.pk}/change/",
    )


def canonical_number(number: str) -> str:
    """``"#1001"``, ``"kf 1001"``, ``"KF-1001"`` -> ``"KF-1001"``; other forms unchanged."""
    m = _NUMBER.match(number.strip())
    return f"KF-{m.group(1)}" if m else number.strip().upper()


class DemoAdapter:
    """Orders in ``store.models.DemoOrder`` (see the module docstring). Order numbers look like
    ``KF-1001``; ``#1001`` and ``1001`` name the same order."""

    name = "demo"

    def orders_for_customer(self, customer_id: str, *, limit: int = 5) -> list[Order]:
        """The customer's newest ``limit`` orders. Raises ``StoreError("upstream")`` when the
        database fails."""
        try:
            rows = list(DemoOrder.objects.filter(customer_id=customer_id).order_by("-placed_at")[:limit])
        except DatabaseError as e:
            raise StoreError("upstream", f"demo orders unavailable: {type(e).__name__}") from e
        return [order_from_row(r) for r in rows]

    def order_by_number(self, number: str) -> Order | None:
        """The order ``number`` names, or None."""
        try:
            row = DemoOrder.objects.filter(number=canonical_number(number)).first()
        except DatabaseError as e:
            raise StoreError("upstream", f"demo orders unavailable: {type(e).__name__}") from e
        return order_from_row(row) if row is not None else None

    def _locked(self, number: str) -> DemoOrder:
        row = DemoOrder.objects.select_for_update().filter(number=canonical_number(number)).first()
        if row is None:
            raise StoreError("not_found", "no such order")
        return row

    def order_cancel(self, number: str, *, idempotency_key: str, reason: str = "customer") -> Order:
        """Cancel a ``placed`` order and refund it in full (a pending refund)."""
        try:
            with transaction.atomic():
                row = self._locked(number)
                if row.status != "placed":
                    raise StoreError("not_allowed", f"order is {row.status}, only a placed order can be cancelled")
                row.status = "cancelled"
                now = timezone.now()
                row.refunds = [
                    *row.refunds,
                    {"amount": str(row.total), "status": "pending", "created_at": now.isoformat()},
                ]
                row.save(update_fields=["status", "refunds"])
        except DatabaseError as e:
            raise StoreError("upstream", f"demo orders unavailable: {type(e).__name__}") from e
        return order_from_row(row)

    def return_open(self, number: str, *, idempotency_key: str, reason: str = "") -> ReturnRequest:
        """Open a return of a ``delivered`` order with none open."""
        try:
            with transaction.atomic():
                row = self._locked(number)
                order = order_from_row(row)
                if not order.returnable:
                    why = "a return is already open" if order.status == "delivered" else f"order is {row.status}"
                    raise StoreError("not_allowed", f"no return possible: {why}")
                now = timezone.now()
                entry = {
                    "return_id": f"R-{uuid.uuid4().hex[:8].upper()}",
                    "status": "requested",
                    "created_at": now.isoformat(),
                }
                row.returns = [*row.returns, entry]
                row.save(update_fields=["returns"])
        except DatabaseError as e:
            raise StoreError("upstream", f"demo orders unavailable: {type(e).__name__}") from e
        return ReturnRequest(return_id=entry["return_id"], status="requested", created_at=now)

    def shipping_address_change(self, number: str, address: Address, *, idempotency_key: str) -> Order:
        """Send a ``placed`` order to ``address``."""
        try:
            with transaction.atomic():
                row = self._locked(number)
                if row.status != "placed":
                    raise StoreError("not_allowed", f"order is {row.status}, only a placed order can be redirected")
                row.shipping_address = {
                    "name": address.name,
                    "line1": address.line1,
                    "line2": address.line2,
                    "city": address.city,
                    "postcode": address.postcode,
                    "country": address.country,
                }
                row.save(update_fields=["shipping_address"])
        except DatabaseError as e:
            raise StoreError("upstream", f"demo orders unavailable: {type(e).__name__}") from e
        return order_from_row(row)
