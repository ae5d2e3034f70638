"""The Shopify store adapter: kefu's five order actions over Shopify's Admin GraphQL API.

One :class:`ShopifyAdapter` talks to one shop at ``{shop}/admin/api/{API_VERSION}/graphql.json``
(POST, JSON, header ``X-Shopify-Access-Token``), through one ``httpx2.Client`` with explicit
timeouts. The API version is pinned (:data:`API_VERSION`, a stable quarterly release): every field
and enum used below exists in it, and Shopify keeps a stable version for at least twelve months.
Sources: https://shopify.dev/docs/api/admin-graphql (endpoint, authentication, versioning) and the
reference page of each query and mutation, cited where it is used.

What each action sends (the documents are the ``_Q_*``/``_M_*`` constants):

* ``orders_for_customer`` reads ``customer(id: "gid://shopify/Customer/<id>") { orders(first: N,
  sortKey: PROCESSED_AT, reverse: true) }``: the customer's own connection, which is read from the
  shop's records, not ``orders(query: "customer_id:…")``, which goes through the search index and
  can miss an order placed seconds ago. ``N`` is at most :data:`MAX_ORDERS` (query cost: each order
  asks for its lines, fulfillments, refunds and returns; Shopify refuses a query over 1,000 points).
* ``order_by_number`` searches ``orders(first: 5, query: "name:\\"#1001\\"")`` and keeps the node
  whose ``name`` is exactly the number asked for (search also matches prefixes).
* ``order_cancel`` sends ``orderCancel(orderId, reason: CUSTOMER, refund: true, restock: true,
  notifyCustomer: true, staffNote)``. Shopify cancels in a background job: the adapter polls
  ``job(id) { done }`` within its time budget, then reads the order again.
* ``return_open`` reads ``returnableFulfillments(orderId)`` (the fulfillment line items still
  returnable and their quantities) and sends ``returnRequest(input: {orderId, returnLineItems:
  [{fulfillmentLineItemId, quantity, returnReason, customerNote}]})`` for all of them.
* ``shipping_address_change`` sends ``orderUpdate(input: {id, shippingAddress})`` and maps the
  order the mutation returns.

Every change first reads the order and refuses (``not_allowed``) one kefu does not see in a state
that allows it, before anything is sent; Shopify's own ``userErrors`` are mapped as well.

**Idempotency.** Shopify's ``@idempotent(key:)`` directive
(https://shopify.dev/docs/api/usage/idempotent-requests) exists only from API version 2026-01
and only on ``refundCreate`` and a few inventory mutations (changelog "Adding idempotency for
inventory adjustments and refund mutations"); ``orderCancel``, ``returnRequest`` and
``orderUpdate`` take none in 2025-07. So kefu's door
(``store.services``) keeps the idempotency: it records each change by its key and never repeats
one that succeeded. The adapter adds what the platform allows: a second cancel or a second return
finds the order's new state and is refused (``not_allowed``) before any mutation, the key is
written in the cancellation's staff note (``kefu ref <key>``) for the merchant's audit, and an
address change is naturally idempotent (the same address written twice).

**Errors.** Every failure is a :class:`~store.types.StoreError` whose message names the operation,
HTTP status or GraphQL error codes, and never the shopper's data: no e-mail, address, order
contents or access token (Shopify's ``userErrors`` texts may echo input, so only their ``field``
and ``code`` are kept). HTTP 401/403 (bad token, missing scope), 402/423 (shop frozen or locked),
404 (wrong shop or API version), 429 (with ``Retry-After``), 5xx, GraphQL ``errors`` (``THROTTLED``
included: Shopify answers a throttled query with HTTP 200), timeouts, refused or dropped
connections and bodies that are not JSON are all ``upstream``; 401/402/403/423 are marked
``permanent`` (no retry mends them) and say so in their message. Status codes: https://shopify.dev/docs/api/usage/response-codes; rate limits and the
``THROTTLED`` error: https://shopify.dev/docs/api/usage/limits.

**Time.** Each public call has a budget of ``timeout_s`` seconds for all of its requests together
(``KEFU_STORE_TIMEOUT_S``, the door's deadline, should be at least that); each request gets what is
left of it as its connect/read/write/pool timeout. Lists are read in one page: an order's first
30 lines, 5 fulfillments, 5 refunds and 5 returns.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx2

from store.types import Address, Order, OrderLine, OrderStatus, Refund, ReturnRequest, Shipment, StoreError

__all__ = ["API_VERSION", "MAX_ORDERS", "ShopifyAdapter", "order_from_node", "order_status"]

#: The pinned Admin GraphQL API version (https://shopify.dev/docs/api/usage/versioning).
API_VERSION = "2025-07"

#: The most orders ``orders_for_customer`` reads in one query (see the query-cost note above).
MAX_ORDERS = 10

JSON = dict[str, Any]

_RETRY_LATER = "Please try again in a few minutes, or ask for a person."
_ASK_PERSON = "Please ask for a person to help with this order."
_CHECK_NUMBER = "Please check the order number (it looks like #1001) and send it again."
_CHECK_ADDRESS = "Please check the address (street, postcode, city and country) and send it again."

_GID_CUSTOMER = "gid://shopify/Customer/"
_GID_ORDER = "gid://shopify/Order/"
# An order name as shops print it: "#1001", "1001", "KF-1001". Anything else (spaces, colons,
# quotes) could change the meaning of the search query, so it is not looked up at all.
_ORDER_NAME = re.compile(r"#?[A-Za-z0-9][A-Za-z0-9_.\-]{0,39}")
_API_VERSION = re.compile(r"\d{4}-(01|04|07|10)|unstable")
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.\-]*[A-Za-z0-9])?(?::\d{1,5})?")

# ---------------------------------------------------------------------------------------------
# The GraphQL documents. Field by field, from the 2025-07 reference:
#   Order        https://shopify.dev/docs/api/admin-graphql/2025-07/objects/Order
#   Fulfillment  https://shopify.dev/docs/api/admin-graphql/2025-07/objects/Fulfillment
#   Refund       https://shopify.dev/docs/api/admin-graphql/2025-07/objects/Refund
#   Return       https://shopify.dev/docs/api/admin-graphql/2025-07/objects/Return
#                (createdAt on Return: changelog "New GraphQL fields for return management", 2025-07)
# Money is asked in both currencies; the shopper's (presentment) one is used, the shop's is the
# fallback. Connection sizes keep one order under ~100 query-cost points.
# ---------------------------------------------------------------------------------------------

_MONEY = "{ shopMoney { amount currencyCode } presentmentMoney { amount currencyCode } }"

_ORDER_FRAGMENT = f"""
fragment KefuOrder on Order {{
  id
  name
  email
  createdAt
  processedAt
  cancelledAt
  displayFinancialStatus
  displayFulfillmentStatus
  subtotalLineItemsQuantity
  customer {{ id }}
  totalPriceSet {_MONEY}
  shippingAddress {{ name address1 address2 city zip countryCodeV2 }}
  lineItems(first: 30) {{
    nodes {{ sku title quantity originalUnitPriceSet {_MONEY} }}
  }}
  fulfillments(first: 5) {{
    createdAt inTransitAt deliveredAt estimatedDeliveryAt displayStatus
    trackingInfo(first: 3) {{ company number url }}
  }}
  refunds(first: 5) {{
    createdAt
    totalRefundedSet {_MONEY}
    transactions(first: 3) {{ nodes {{ kind status processedAt }} }}
  }}
  returns(first: 5) {{
    nodes {{ id name status createdAt totalQuantity refunds(first: 1) {{ nodes {{ id }} }} }}
  }}
}}
"""

# https://shopify.dev/docs/api/admin-graphql/2025-07/objects/Customer#connection-orders
_Q_CUSTOMER_ORDERS = (
    """
query KefuCustomerOrders($customerId: ID!, $first: Int!) {
  customer(id: $customerId) {
    orders(first: $first, sortKey: PROCESSED_AT, reverse: true) { nodes { ...KefuOrder } }
  }
}
"""
    + _ORDER_FRAGMENT
)

# https://shopify.dev/docs/api/admin-graphql/2025-07/queries/orders (the `name` search filter)
_Q_ORDER_BY_NAME = (
    """
query KefuOrderByName($search: String!) {
  orders(first: 5, query: $search) { nodes { ...KefuOrder } }
}
"""
    + _ORDER_FRAGMENT
)

# https://shopify.dev/docs/api/admin-graphql/2025-07/mutations/orderCancel (`refund` is the
# Boolean argument of 2024-01..2025-04 and still accepted; `refundMethod` is its newer form).
_M_ORDER_CANCEL = """
mutation KefuOrderCancel($orderId: ID!, $reason: OrderCancelReason!, $staffNote: String) {
  orderCancel(orderId: $orderId, reason: $reason, refund: true, restock: true, notifyCustomer: true,
              staffNote: $staffNote) {
    job { id done }
    orderCancelUserErrors { field message code }
  }
}
"""

# https://shopify.dev/docs/api/admin-graphql/2025-07/queries/job
_Q_JOB = """
query KefuJob($id: ID!) {
  job(id: $id) { id done }
}
"""

# https://shopify.dev/docs/apps/build/orders-fulfillment/returns-apps/build-return-management
# ("Step 1: Query returnable fulfillments")
_Q_RETURNABLE = """
query KefuReturnable($orderId: ID!) {
  returnableFulfillments(orderId: $orderId, first: 10) {
    nodes {
      id
      returnableFulfillmentLineItems(first: 50) { nodes { quantity fulfillmentLineItem { id } } }
    }
  }
}
"""

# https://shopify.dev/docs/api/admin-graphql/2025-07/mutations/returnRequest
_M_RETURN_REQUEST = """
mutation KefuReturnRequest($input: ReturnRequestInput!) {
  returnRequest(input: $input) {
    return { id name status createdAt totalQuantity refunds(first: 1) { nodes { id } } }
    userErrors { field message code }
  }
}
"""

# https://shopify.dev/docs/api/admin-graphql/2025-07/mutations/orderUpdate
_M_ORDER_UPDATE = (
    """
mutation KefuOrderUpdate($input: OrderInput!) {
  orderUpdate(input: $input) {
    order { ...KefuOrder }
    userErrors { field message }
  }
}
"""
    + _ORDER_FRAGMENT
)

# ---------------------------------------------------------------------------------------------
# Status mapping (see order_status). Enum values from
#   OrderDisplayFulfillmentStatus  https://shopify.dev/docs/api/admin-graphql/2025-07/enums/OrderDisplayFulfillmentStatus
#   FulfillmentDisplayStatus       https://shopify.dev/docs/api/admin-graphql/2025-07/enums/FulfillmentDisplayStatus
#   ReturnStatus                   https://shopify.dev/docs/api/admin-graphql/2025-07/enums/ReturnStatus
#   OrderTransactionStatus         https://shopify.dev/docs/api/admin-graphql/2025-07/enums/OrderTransactionStatus
# ---------------------------------------------------------------------------------------------

#: Fulfillments that carry nothing (cancelled, failed, label voided): ignored.
_INACTIVE_FULFILLMENT = frozenset({"CANCELED", "FAILURE", "LABEL_VOIDED"})
#: Fulfillments not yet handed to a carrier (a label bought or printed, a request submitted).
_PRE_CARRIER = frozenset({"LABEL_PURCHASED", "LABEL_PRINTED", "SUBMITTED"})
#: Fulfillments that reached the shopper.
_DELIVERED = frozenset({"DELIVERED", "PICKED_UP"})
#: Order-level fulfillment states in which the warehouse (or a fulfillment service) has the order.
_BEING_PREPARED = frozenset({"IN_PROGRESS", "PENDING_FULFILLMENT", "PARTIALLY_FULFILLED"})

_RETURN_STATUS: dict[str, Literal["requested", "received", "refunded", "declined"]] = {
    "REQUESTED": "requested",  # asked for, not yet approved
    "OPEN": "requested",  # approved: waiting for the parcel
    "DECLINED": "declined",
}

_CANCEL_REASONS = frozenset({"CUSTOMER", "DECLINED", "FRAUD", "INVENTORY", "STAFF", "OTHER"})

# https://shopify.dev/docs/api/admin-graphql/2025-07/enums/ReturnReason
_RETURN_REASONS = frozenset(
    {
        "COLOR",
        "DEFECTIVE",
        "NOT_AS_DESCRIBED",
        "OTHER",
        "SIZE_TOO_LARGE",
        "SIZE_TOO_SMALL",
        "STYLE",
        "UNKNOWN",
        "UNWANTED",
        "WRONG_ITEM",
    }
)
_REASON_WORDS: tuple[tuple[str, str], ...] = (
    ("broken", "DEFECTIVE"),
    ("damaged", "DEFECTIVE"),
    ("defect", "DEFECTIVE"),
    ("faulty", "DEFECTIVE"),
    ("wrong", "WRONG_ITEM"),
    ("too small", "SIZE_TOO_SMALL"),
    ("too large", "SIZE_TOO_LARGE"),
    ("too big", "SIZE_TOO_LARGE"),
    ("colour", "COLOR"),
    ("color", "COLOR"),
    ("style", "STYLE"),
    ("not as described", "NOT_AS_DESCRIBED"),
    ("changed my mind", "UNWANTED"),
    ("unwanted", "UNWANTED"),
    ("don't want", "UNWANTED"),
    ("do not want", "UNWANTED"),
)

# ReturnErrorCode values (https://shopify.dev/docs/api/admin-graphql/2025-07/enums/ReturnErrorCode)
_RETURN_STATE_CODES = frozenset({"INVALID_STATE", "ALREADY_EXISTS", "NOT_EDITABLE", "FEATURE_NOT_ENABLED"})
_UPSTREAM_CODES = frozenset({"INTERNAL_ERROR", "CREATION_FAILED", "NOTIFICATION_FAILED"})


# ---------------------------------------------------------------------------------------------
# Mapping Shopify nodes to kefu's values (pure functions: tested without a server)
# ---------------------------------------------------------------------------------------------


def _nodes(connection: Any) -> list[JSON]:
    """The items of a connection (``{"nodes": [...]}``) or of a plain list, dicts only."""
    if isinstance(connection, Mapping):
        connection = connection.get("nodes")
    if not isinstance(connection, list):
        return []
    return [n for n in connection if isinstance(n, dict)]


def _time(value: Any) -> datetime | None:
    """A Shopify ``DateTime`` (ISO 8601, ``"2025-07-01T10:00:00Z"``) as an aware UTC datetime."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def _money(bag: Any) -> tuple[Decimal, str]:
    """``(amount, currency)`` of a ``MoneyBag``: the shopper's (presentment) money, else the
    shop's; ``(0, "")`` when absent."""
    if isinstance(bag, Mapping):
        for key in ("presentmentMoney", "shopMoney"):
            money = bag.get(key)
            if isinstance(money, Mapping) and money.get("amount") is not None:
                try:
                    return Decimal(str(money["amount"])), str(money.get("currencyCode") or "")
                except InvalidOperation:
                    continue
    return Decimal("0"), ""


def _numeric_id(gid: Any) -> str:
    """``"gid://shopify/Order/148977776"`` → ``"148977776"`` ("" when not a gid)."""
    if not isinstance(gid, str) or not gid.startswith("gid://shopify/"):
        return ""
    return gid.rsplit("/", 1)[-1].split("?", 1)[0]


def _display(node: Mapping[str, Any]) -> str:
    return str(node.get("displayStatus") or "").upper()


def _delivered(fulfillment: Mapping[str, Any]) -> bool:
    return bool(fulfillment.get("deliveredAt")) or _display(fulfillment) in _DELIVERED


def _units(node: Mapping[str, Any]) -> int:
    """Units in the order: ``subtotalLineItemsQuantity``, else the sum of the line quantities."""
    total = node.get("subtotalLineItemsQuantity")
    if isinstance(total, int) and total > 0:
        return total
    return sum(int(line.get("quantity") or 0) for line in _nodes(node.get("lineItems")))


def order_status(node: Mapping[str, Any]) -> OrderStatus:
    """Where a Shopify ``Order`` node stands, in kefu's words. In this order of precedence:

    ============  ===============================================================================
    kefu          Shopify
    ============  ===============================================================================
    cancelled     ``cancelledAt`` is set
    returned      the ``CLOSED`` returns' ``totalQuantity`` covers every unit of the order
                  (``subtotalLineItemsQuantity``): every item came back
    delivered     ``displayFulfillmentStatus`` ``FULFILLED`` and every active fulfillment handed
                  to a carrier has ``deliveredAt`` or ``displayStatus`` ``DELIVERED``/``PICKED_UP``
    shipped       a fulfillment handed to a carrier (any ``displayStatus`` but the inactive and
                  pre-carrier ones below), or ``FULFILLED`` with no fulfillment listed
    packed        a fulfillment not yet with a carrier (``LABEL_PURCHASED``, ``LABEL_PRINTED``,
                  ``SUBMITTED``), or ``displayFulfillmentStatus`` ``IN_PROGRESS``,
                  ``PENDING_FULFILLMENT`` or ``PARTIALLY_FULFILLED``
    placed        anything else: ``UNFULFILLED``, ``OPEN``, ``SCHEDULED``, ``ON_HOLD``,
                  ``REQUEST_DECLINED``, ``RESTOCKED``
    ============  ===============================================================================

    Fulfillments whose ``displayStatus`` is ``CANCELED``, ``FAILURE`` or ``LABEL_VOIDED`` are
    ignored. A partly shipped order is ``shipped`` (something is on its way, and it can no longer
    be cancelled). Sources: the Order, Fulfillment and Return objects and the
    ``OrderDisplayFulfillmentStatus``/``FulfillmentDisplayStatus`` enums of the 2025-07 reference.
    """
    if node.get("cancelledAt"):
        return "cancelled"
    units = _units(node)
    returned = sum(
        int(r.get("totalQuantity") or 0)
        for r in _nodes(node.get("returns"))
        if str(r.get("status") or "").upper() == "CLOSED"
    )
    if units > 0 and returned >= units:
        return "returned"
    fulfilled = str(node.get("displayFulfillmentStatus") or "").upper()
    active = [f for f in _nodes(node.get("fulfillments")) if _display(f) not in _INACTIVE_FULFILLMENT]
    carried = [f for f in active if _display(f) not in _PRE_CARRIER]
    if carried or fulfilled == "FULFILLED":
        if fulfilled == "FULFILLED" and carried and all(_delivered(f) for f in carried):
            return "delivered"
        return "shipped"
    if active or fulfilled in _BEING_PREPARED:
        return "packed"
    return "placed"


def _shipments(node: Mapping[str, Any]) -> tuple[Shipment, ...]:
    """One :class:`Shipment` per tracking number of each fulfillment handed to a carrier (one
    without a number when the fulfillment has none). ``shipped_at`` is the fulfillment's
    ``createdAt``; ``estimated_delivery`` its ``estimatedDeliveryAt``."""
    shipments: list[Shipment] = []
    for f in _nodes(node.get("fulfillments")):
        if _display(f) in _INACTIVE_FULFILLMENT or _display(f) in _PRE_CARRIER:
            continue
        shipped_at = _time(f.get("createdAt")) or _time(f.get("inTransitAt"))
        if shipped_at is None:
            continue
        delivered_at = _time(f.get("deliveredAt"))
        eta = _time(f.get("estimatedDeliveryAt"))
        tracking = _nodes(f.get("trackingInfo")) or [{}]
        for t in tracking:
            shipments.append(
                Shipment(
                    carrier=str(t.get("company") or ""),
                    tracking_number=str(t.get("number") or ""),
                    tracking_url=str(t.get("url") or ""),
                    shipped_at=shipped_at,
                    delivered_at=delivered_at,
                    estimated_delivery=eta,
                )
            )
    return tuple(shipments)


def _refund(node: Mapping[str, Any]) -> Refund | None:
    """A Shopify ``Refund`` as kefu's :class:`Refund`, or None when no money moves (a restock-only
    refund of 0). Its status from its transactions (``OrderTransactionStatus``):

    * ``succeeded``: every refund transaction is ``SUCCESS``; ``processed_at`` is the latest
      transaction's ``processedAt``;
    * ``failed``: a transaction is ``FAILURE`` or ``ERROR`` and none is still pending;
    * ``pending``: otherwise (``PENDING``, ``AWAITING_RESPONSE``, ``UNKNOWN``, or no transaction
      recorded yet).
    """
    amount, currency = _money(node.get("totalRefundedSet"))
    created_at = _time(node.get("createdAt"))
    if amount <= 0 or created_at is None:
        return None
    transactions = _nodes(node.get("transactions"))
    refunds = [t for t in transactions if str(t.get("kind") or "REFUND").upper() == "REFUND"] or transactions
    statuses = {str(t.get("status") or "").upper() for t in refunds}
    processed_at: datetime | None = None
    status: Literal["pending", "succeeded", "failed"]
    if statuses and statuses == {"SUCCESS"}:
        status = "succeeded"
        times = [t for t in (_time(x.get("processedAt")) for x in refunds) if t is not None]
        processed_at = max(times) if times else None
    elif statuses & {"FAILURE", "ERROR"} and not statuses & {"PENDING", "AWAITING_RESPONSE"}:
        status = "failed"
    else:
        status = "pending"
    return Refund(amount=amount, currency=currency, status=status, created_at=created_at, processed_at=processed_at)


def _return(node: Mapping[str, Any]) -> ReturnRequest | None:
    """A Shopify ``Return`` as kefu's :class:`ReturnRequest` (None for a ``CANCELED`` one, which
    the shopper withdrew): ``REQUESTED`` and ``OPEN`` → ``requested``, ``DECLINED`` →
    ``declined``, ``CLOSED`` → ``refunded`` when the return has a refund, else ``received``.
    ``return_id`` is the return's name (``"#1001-R1"``, what the merchant's admin shows);
    ``label_url`` is "" (Shopify e-mails the label)."""
    status_name = str(node.get("status") or "").upper()
    created_at = _time(node.get("createdAt"))
    if created_at is None:
        return None
    status: Literal["requested", "received", "refunded", "declined"]
    if status_name == "CLOSED":
        status = "refunded" if _nodes(node.get("refunds")) else "received"
    elif status_name in _RETURN_STATUS:
        status = _RETURN_STATUS[status_name]
    else:  # CANCELED, or a status this version does not know
        return None
    return_id = str(node.get("name") or "") or _numeric_id(node.get("id"))
    return ReturnRequest(return_id=return_id, status=status, created_at=created_at)


def _address(node: Any) -> Address | None:
    """A ``MailingAddress`` (``name address1 address2 city zip countryCodeV2``) as an Address."""
    if not isinstance(node, Mapping) or not node.get("address1"):
        return None
    return Address(
        name=str(node.get("name") or ""),
        line1=str(node.get("address1") or ""),
        line2=str(node.get("address2") or ""),
        city=str(node.get("city") or ""),
        postcode=str(node.get("zip") or ""),
        country=str(node.get("countryCodeV2") or ""),
    )


def order_from_node(node: Mapping[str, Any], *, admin_base: str) -> Order:
    """A Shopify ``Order`` node (the ``KefuOrder`` fragment's shape) as kefu's :class:`Order`.

    * ``number``: ``name`` (``"#1001"``); ``customer_id``: the numeric part of ``customer.id``
      (``"gid://shopify/Customer/544365967"`` → ``"544365967"``, "" for a guest order);
      ``email``: the order's ``email``.
    * ``status``: :func:`order_status`; ``placed_at``: ``processedAt`` (the date the order was
      placed, also for imported orders), else ``createdAt``.
    * ``total``/``currency``: ``totalPriceSet`` (what was charged; refunds are listed apart), in
      the shopper's presentment currency; ``lines``: ``lineItems`` (``sku`` "" when none,
      ``originalUnitPriceSet``).
    * ``shipping_address``: ``shippingAddress`` (country = ``countryCodeV2``).
    * ``shipments``/``refunds``/``returns``: see ``_shipments``, ``_refund``, ``_return``.
    * ``admin_url``: ``{admin_base}/admin/orders/<numeric id>``; ``extra``: ``shopify_id`` (the
      gid), ``financial_status`` and ``fulfillment_status`` (Shopify's display statuses).
    """
    total, currency = _money(node.get("totalPriceSet"))
    placed_at = _time(node.get("processedAt")) or _time(node.get("createdAt")) or datetime.fromtimestamp(0, UTC)
    lines = []
    for line in _nodes(node.get("lineItems")):
        price, _ = _money(line.get("originalUnitPriceSet"))
        lines.append(
            OrderLine(
                sku=str(line.get("sku") or ""),
                title=str(line.get("title") or ""),
                quantity=int(line.get("quantity") or 0),
                unit_price=price,
            )
        )
    customer = node.get("customer")
    customer_id = _numeric_id(customer.get("id")) if isinstance(customer, Mapping) else ""
    refunds = tuple(r for r in (_refund(n) for n in _nodes(node.get("refunds"))) if r is not None)
    returns = tuple(r for r in (_return(n) for n in _nodes(node.get("returns"))) if r is not None)
    numeric = _numeric_id(node.get("id"))
    return Order(
        number=str(node.get("name") or ""),
        customer_id=customer_id,
        email=str(node.get("email") or ""),
        status=order_status(node),
        placed_at=placed_at,
        total=total,
        currency=currency,
        lines=tuple(lines),
        shipping_address=_address(node.get("shippingAddress")),
        shipments=_shipments(node),
        refunds=refunds,
        returns=returns,
        admin_url=f"{admin_base}/admin/orders/{numeric}" if numeric else "",
        extra={
            "shopify_id": str(node.get("id") or ""),
            "financial_status": str(node.get("displayFinancialStatus") or ""),
            "fulfillment_status": str(node.get("displayFulfillmentStatus") or ""),
        },
    )


def _return_reason(reason: str) -> str:
    """kefu's free-text reason as a ``ReturnReason`` value: the value itself when given one
    (``"defective"`` → ``DEFECTIVE``), else by keywords (``"it arrived broken"`` →
    ``DEFECTIVE``), ``UNKNOWN`` when empty, ``OTHER`` otherwise."""
    text = reason.strip()
    if not text:
        return "UNKNOWN"
    as_value = re.sub(r"[\s\-]+", "_", text).upper()
    if as_value in _RETURN_REASONS:
        return as_value
    lowered = text.lower().replace("’", "'")
    for word, value in _REASON_WORDS:
        if word in lowered:
            return value
    return "OTHER"


def _field(error: Mapping[str, Any]) -> str:
    field = error.get("field")
    if isinstance(field, list):
        return ".".join(str(part) for part in field)
    return str(field or "")


def _describe(errors: Iterable[Mapping[str, Any]]) -> str:
    """``"orderId: INVALID; input.returnLineItems.0.quantity: GREATER_THAN"``: the field and code
    of each user error, never its text (which may echo the shopper's input)."""
    parts = []
    for e in errors:
        code = str(e.get("code") or "")
        field = _field(e)
        parts.append(f"{field}: {code}" if field and code else field or code or "no code")
    return "; ".join(parts) or "no detail"


class _Deadline:
    """The time left to one public call, in seconds (``time.monotonic``)."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self.end = time.monotonic() + budget_s

    def left(self) -> float:
        return self.end - time.monotonic()


class ShopifyAdapter:
    """kefu's :class:`~store.adapters.base.StoreAdapter` over one Shopify shop's Admin GraphQL
    API (see the module docstring for what each method sends and how errors map).

    ``shop_url``: ``"name.myshopify.com"`` or ``"name"`` (https is used), or a full base URL
    (``"http://127.0.0.1:8081"`` for a local fake; only scheme and host are kept).
    ``access_token``: the Admin API access token (``shpat_…``) of the app installed on the shop;
    it needs the ``read_orders``, ``write_orders``, ``read_returns`` and ``write_returns`` scopes.
    ``api_version``: the Admin API version in the path (default :data:`API_VERSION`).
    ``timeout_s``: the budget of one call, all its requests together, in seconds.
    ``transport``: an ``httpx2`` transport to use instead of the network (tests).

    Raises ``StoreError("not_configured")`` for a missing token or a malformed URL or version.
    One ``httpx2.Client`` (a connection pool) per adapter; :meth:`close` releases it.
    """

    name = "shopify"

    def __init__(
        self,
        *,
        shop_url: str,
        access_token: str,
        api_version: str = API_VERSION,
        timeout_s: float = 5.0,
        transport: httpx2.BaseTransport | None = None,
    ) -> None:
        if not access_token or not access_token.strip():
            raise StoreError("not_configured", "the Shopify adapter has no Admin API access token")
        if not _API_VERSION.fullmatch(api_version):
            raise StoreError("not_configured", f"not a Shopify API version: {api_version!r} (expected YYYY-MM)")
        if not timeout_s > 0:
            raise StoreError("not_configured", "the Shopify adapter's timeout_s must be positive")
        self.base_url = _base_url(shop_url)
        self.api_version = api_version
        self.timeout_s = float(timeout_s)
        self.endpoint = f"/admin/api/{api_version}/graphql.json"
        self._client = httpx2.Client(
            base_url=self.base_url,
            headers={
                "X-Shopify-Access-Token": access_token.strip(),
                "Content-Type": "application/json",
                "Accept": "application/json",
                "User-Agent": "kefu-store-adapter (shopify)",
            },
            timeout=httpx2.Timeout(self.timeout_s),
            follow_redirects=False,
            transport=transport,
        )

    def __repr__(self) -> str:  # never print the token
        return f"ShopifyAdapter({self.base_url!r}, api_version={self.api_version!r})"

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()

    def __enter__(self) -> ShopifyAdapter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the five actions

    def orders_for_customer(self, customer_id: str, *, limit: int = 5) -> list[Order]:
        """The customer's most recent orders, newest first (by ``processedAt``), at most
        ``min(limit, MAX_ORDERS)``. ``customer_id``: Shopify's numeric customer id (``"544365967"``)
        or its gid; anything else, or an unknown customer, gives ``[]``."""
        numeric = customer_id.strip()
        if numeric.startswith(_GID_CUSTOMER):
            numeric = numeric[len(_GID_CUSTOMER) :]
        if not numeric.isdigit() or limit <= 0:
            return []
        deadline = _Deadline(self.timeout_s)
        data = self._graphql(
            "KefuCustomerOrders",
            _Q_CUSTOMER_ORDERS,
            {"customerId": _GID_CUSTOMER + numeric, "first": min(limit, MAX_ORDERS)},
            deadline,
        )
        customer = data.get("customer")
        if not isinstance(customer, Mapping):
            return []
        nodes = _nodes(customer.get("orders"))[: min(limit, MAX_ORDERS)]
        return [order_from_node(n, admin_base=self.base_url) for n in nodes]

    def order_by_number(self, number: str) -> Order | None:
        """The order named ``number``: ``"#1001"``, ``"1001"`` (read as ``"#1001"``) or a shop's
        own format (``"KF-1001"``), compared case-insensitively with the order's ``name``; None
        when there is none, or when ``number`` is not an order name at all."""
        return self._find(number, _Deadline(self.timeout_s))

    def order_cancel(self, number: str, *, idempotency_key: str, reason: str = "customer") -> Order:
        """Cancel an order kefu sees as ``placed``, refunding it in full to the original payment
        method, restocking it and notifying the customer; the order as it now stands (with the
        refund Shopify created, usually ``pending`` at first).

        ``reason``: an ``OrderCancelReason`` (``customer``, ``declined``, ``fraud``,
        ``inventory``, ``staff``, ``other``); anything else is sent as ``CUSTOMER``. Shopify
        cancels in a background job; if it has not finished within the call's budget, the order
        is returned as it was, with ``extra["cancellation"] == "pending"`` and
        ``extra["shopify_job_id"]``. Raises ``not_found``, ``not_allowed`` (not ``placed``, or
        Shopify refused: ``orderCancelUserErrors``), ``upstream``."""
        deadline = _Deadline(self.timeout_s)
        order = self._require(number, deadline)
        if order.status != "placed":
            raise StoreError(
                "not_allowed",
                f"Shopify order {order.number} is {order.status}: only an order not yet packed can be cancelled",
                next_step=_too_late(order.status, "cancelled"),
            )
        gid = order.extra["shopify_id"]
        shopify_reason = reason.strip().upper() if reason.strip().upper() in _CANCEL_REASONS else "CUSTOMER"
        data = self._graphql(
            "KefuOrderCancel",
            _M_ORDER_CANCEL,
            {
                "orderId": gid,
                "reason": shopify_reason,
                "staffNote": f"Cancelled through kefu (kefu ref {idempotency_key})",
            },
            deadline,
        )
        payload = data.get("orderCancel")
        if not isinstance(payload, Mapping):
            raise StoreError("upstream", "Shopify answered orderCancel without a payload", next_step=_RETRY_LATER)
        errors = _nodes(payload.get("orderCancelUserErrors"))
        if errors:
            raise _cancel_error(order.number, errors)
        job = payload.get("job")
        if not isinstance(job, Mapping):
            job = {}
        job_id = str(job.get("id") or "")
        done = bool(job.get("done"))
        try:
            if not done and job_id:
                done = self._wait_for_job(job_id, deadline)
            if not done:
                return replace(order, extra={**order.extra, "cancellation": "pending", "shopify_job_id": job_id})
            after = self._find(order.number, deadline)
        except StoreError as error:
            if error.code != "upstream":
                raise
            # The cancellation was accepted; only the follow-up read failed. Saying "failed"
            # now would make a retry cancel (and refund) twice if the job went through.
            return replace(order, extra={**order.extra, "cancellation": "pending", "shopify_job_id": job_id})
        if after is None or after.status != "cancelled":
            raise StoreError(
                "upstream",
                f"Shopify finished the cancellation job of order {order.number} but the order is not cancelled",
                next_step=_ASK_PERSON,
            )
        return after

    def return_open(self, number: str, *, idempotency_key: str, reason: str = "") -> ReturnRequest:
        """Request a return of every still-returnable item of a delivered order; the return
        (``status`` ``requested``: Shopify's ``REQUESTED``, the merchant approves it and e-mails
        the label). ``reason`` becomes each line's ``returnReason`` (see ``_return_reason``) and,
        when given, its ``customerNote`` (first 255 characters). Raises ``not_found``,
        ``not_allowed`` (not delivered, a return already open, nothing left to return, or
        Shopify refused: ``userErrors``), ``invalid``, ``upstream``. ``idempotency_key`` is kept
        by the door (see the module docstring)."""
        deadline = _Deadline(self.timeout_s)
        order = self._require(number, deadline)
        if order.status != "delivered":
            raise StoreError(
                "not_allowed",
                f"Shopify order {order.number} is {order.status}: a return can be opened once it is delivered",
                next_step=(
                    "A return can be opened once the order has been delivered."
                    if order.status in ("placed", "packed", "shipped")
                    else _ASK_PERSON
                ),
            )
        if not order.returnable:
            raise StoreError(
                "not_allowed",
                f"Shopify order {order.number} already has a return open",
                next_step="A return is already open for this order; the store sends the return label by e-mail.",
            )
        gid = order.extra["shopify_id"]
        data = self._graphql("KefuReturnable", _Q_RETURNABLE, {"orderId": gid}, deadline)
        items: list[tuple[str, int]] = []
        for fulfillment in _nodes(data.get("returnableFulfillments")):
            for item in _nodes(fulfillment.get("returnableFulfillmentLineItems")):
                line = item.get("fulfillmentLineItem")
                quantity = int(item.get("quantity") or 0)
                if isinstance(line, Mapping) and line.get("id") and quantity > 0:
                    items.append((str(line["id"]), quantity))
        if not items:
            raise StoreError(
                "not_allowed",
                f"Shopify order {order.number} has nothing left to return",
                next_step=_ASK_PERSON,
            )
        shopify_reason = _return_reason(reason)
        line_items: list[JSON] = []
        for line_id, quantity in items:
            line_input: JSON = {"fulfillmentLineItemId": line_id, "quantity": quantity, "returnReason": shopify_reason}
            if reason.strip():
                line_input["customerNote"] = reason.strip()[:255]
            line_items.append(line_input)
        data = self._graphql(
            "KefuReturnRequest",
            _M_RETURN_REQUEST,
            {"input": {"orderId": gid, "returnLineItems": line_items}},
            deadline,
        )
        payload = data.get("returnRequest")
        if not isinstance(payload, Mapping):
            raise StoreError("upstream", "Shopify answered returnRequest without a payload", next_step=_RETRY_LATER)
        errors = _nodes(payload.get("userErrors"))
        if errors:
            raise _return_error(order.number, errors)
        node = payload.get("return")
        opened = _return(node) if isinstance(node, Mapping) else None
        if opened is None:
            raise StoreError(
                "upstream", f"Shopify answered returnRequest for {order.number} without a return", next_step=_ASK_PERSON
            )
        return opened

    def shipping_address_change(self, number: str, address: Address, *, idempotency_key: str) -> Order:
        """Send an order kefu sees as ``placed`` to ``address`` (``orderUpdate`` with a
        ``MailingAddressInput``: the name split into ``firstName``/``lastName`` at its last
        space, ``address1``, ``address2``, ``city``, ``zip``, ``countryCode``); the order as
        Shopify returns it. Raises ``invalid`` (an empty street, city, name or a country that is
        not an ISO 3166-1 alpha-2 code, checked before sending; or Shopify's ``userErrors`` on
        ``shippingAddress``), ``not_found``, ``not_allowed``, ``upstream``. Writing the same
        address twice changes nothing, so a repeated key is harmless."""
        country = address.country.strip().upper()
        if not (address.name.strip() and address.line1.strip() and address.city.strip()) or not re.fullmatch(
            "[A-Z]{2}", country
        ):
            raise StoreError(
                "invalid",
                "the new address needs a name, a street, a city and a two-letter country code",
                next_step=_CHECK_ADDRESS,
            )
        deadline = _Deadline(self.timeout_s)
        order = self._require(number, deadline)
        if order.status != "placed":
            raise StoreError(
                "not_allowed",
                f"Shopify order {order.number} is {order.status}: the address can only change before it is packed",
                next_step=_too_late(order.status, "sent elsewhere"),
            )
        first, _, last = address.name.strip().rpartition(" ")
        mailing: JSON = {
            "firstName": first,
            "lastName": last,
            "address1": address.line1.strip(),
            "address2": address.line2.strip(),
            "city": address.city.strip(),
            "zip": address.postcode.strip(),
            "countryCode": country,
        }
        data = self._graphql(
            "KefuOrderUpdate",
            _M_ORDER_UPDATE,
            {"input": {"id": order.extra["shopify_id"], "shippingAddress": mailing}},
            deadline,
        )
        payload = data.get("orderUpdate")
        if not isinstance(payload, Mapping):
            raise StoreError("upstream", "Shopify answered orderUpdate without a payload", next_step=_RETRY_LATER)
        errors = _nodes(payload.get("userErrors"))
        if errors:
            on_address = any("shippingAddress" in _field(e) for e in errors)
            raise StoreError(
                "invalid" if on_address else "not_allowed",
                f"Shopify refused the address change of order {order.number} ({_describe(errors)})",
                next_step=_CHECK_ADDRESS if on_address else _ASK_PERSON,
            )
        node = payload.get("order")
        if not isinstance(node, Mapping):
            raise StoreError("upstream", f"Shopify answered orderUpdate for {order.number} without the order")
        return order_from_node(node, admin_base=self.base_url)

    # ------------------------------------------------------------------ helpers

    def _find(self, number: str, deadline: _Deadline) -> Order | None:
        name = number.strip()
        if not _ORDER_NAME.fullmatch(name):
            return None
        if name.isdigit():
            name = "#" + name
        escaped = name.replace("\\", "\\\\").replace('"', '\\"')
        data = self._graphql("KefuOrderByName", _Q_ORDER_BY_NAME, {"search": f'name:"{escaped}"'}, deadline)
        for node in _nodes(data.get("orders")):
            if str(node.get("name") or "").casefold() == name.casefold():
                return order_from_node(node, admin_base=self.base_url)
        return None

    def _require(self, number: str, deadline: _Deadline) -> Order:
        order = self._find(number, deadline)
        if order is None:
            raise StoreError("not_found", "no Shopify order with that number", next_step=_CHECK_NUMBER)
        return order

    def _wait_for_job(self, job_id: str, deadline: _Deadline) -> bool:
        """Poll ``job(id) { done }`` (at once, then after 0.1, 0.2, 0.4… s, at most 1 s apart)
        while the call's budget allows a poll and the final read; whether the job is done."""
        reserve = min(1.0, deadline.budget_s * 0.25)  # for reading the order afterwards
        pause = 0.0
        while True:
            if pause:
                if deadline.left() - pause < reserve:
                    return False
                time.sleep(pause)
            data = self._graphql("KefuJob", _Q_JOB, {"id": job_id}, deadline)
            job = data.get("job")
            if isinstance(job, Mapping) and job.get("done"):
                return True
            pause = min(1.0, pause * 2 or 0.1)

    def query(self, operation: str, document: str, variables: JSON) -> JSON:
        """POST one read-only GraphQL ``document`` (operation name ``operation``) within this
        adapter's ``timeout_s``; its ``data``. Every failure is ``StoreError("upstream")`` as for
        the actions. For the catalog sync (``store.adapters.shopify_catalog``)."""
        return self._graphql(operation, document, variables, _Deadline(self.timeout_s))

    def _graphql(self, operation: str, query: str, variables: JSON, deadline: _Deadline) -> JSON:
        """POST one GraphQL operation; its ``data``. Every failure is ``StoreError("upstream")``."""
        left = deadline.left()
        if left <= 0.01:
            raise StoreError(
                "upstream", f"no time left for Shopify {operation} within {self.timeout_s:g}s", next_step=_RETRY_LATER
            )
        try:
            response = self._client.post(
                self.endpoint,
                json={"query": query, "variables": variables, "operationName": operation},
                timeout=httpx2.Timeout(left),
            )
        except httpx2.TimeoutException as error:
            raise StoreError(
                "upstream",
                f"Shopify did not answer {operation} within {self.timeout_s:g}s ({type(error).__name__})",
                next_step=_RETRY_LATER,
            ) from None
        except httpx2.HTTPError as error:  # refused, reset, dropped before the answer, TLS...
            raise StoreError(
                "upstream",
                f"could not reach Shopify for {operation} ({type(error).__name__})",
                next_step=_RETRY_LATER,
            ) from None
        _raise_for_status(operation, response, self.api_version)
        try:
            body = response.json()
        except ValueError:
            raise StoreError(
                "upstream",
                f"Shopify answered {operation} with a body that is not JSON "
                f"(HTTP {response.status_code}, {response.headers.get('content-type', 'no content type')})",
                next_step=_RETRY_LATER,
            ) from None
        if not isinstance(body, dict):
            raise StoreError("upstream", f"Shopify answered {operation} with JSON that is not an object")
        _raise_for_graphql_errors(operation, body)
        data = body.get("data")
        if not isinstance(data, dict):
            raise StoreError("upstream", f"Shopify answered {operation} without data", next_step=_RETRY_LATER)
        return data


def _base_url(shop_url: str) -> str:
    """``"https://name.myshopify.com"`` from ``"name.myshopify.com"``, ``"name"`` or a full URL."""
    text = shop_url.strip().rstrip("/")
    if "://" in text:
        parts = urlsplit(text)
        if parts.scheme not in ("http", "https") or not parts.netloc or not _HOST.fullmatch(parts.netloc):
            raise StoreError("not_configured", "the Shopify shop URL must be http(s)://host[:port]")
        return f"{parts.scheme}://{parts.netloc}"
    if "." not in text and text:
        text += ".myshopify.com"
    if not _HOST.fullmatch(text):
        raise StoreError("not_configured", "the Shopify shop must be a domain such as name.myshopify.com")
    return f"https://{text.lower()}"


def _raise_for_status(operation: str, response: httpx2.Response, api_version: str) -> None:
    status = response.status_code
    if status == 200:
        return
    if status == 401:
        message = (
            "Shopify rejected the Admin API access token (HTTP 401): set a valid X-Shopify-Access-Token "
            "for the Shopify adapter; retrying will not help"
        )
    elif status == 403:
        message = (
            "Shopify refused access (HTTP 403): the access token lacks a scope "
            "(orders: read_orders, write_orders, read_returns, write_returns; the catalog: read_products, "
            "read_inventory, read_translations); retrying will not help"
        )
    elif status in (402, 423):
        message = f"the Shopify shop is {'frozen (unpaid)' if status == 402 else 'locked'} (HTTP {status})"
    elif status == 404:
        message = f"no Shopify Admin API at this shop URL for version {api_version} (HTTP 404)"
    elif status == 429:
        retry_after = response.headers.get("retry-after", "")
        try:
            wait = f"; retry after {float(retry_after):g}s"
        except ValueError:
            wait = ""
        message = f"Shopify rate-limited {operation} (HTTP 429{wait})"
    elif status >= 500:
        message = f"Shopify failed on {operation} (HTTP {status})"
    else:
        message = f"Shopify answered {operation} with HTTP {status}"
    # Refused credentials, a missing scope or a frozen shop: no retry mends them.
    raise StoreError("upstream", message, next_step=_RETRY_LATER, permanent=status in (401, 402, 403, 423))


def _raise_for_graphql_errors(operation: str, body: Mapping[str, Any]) -> None:
    """GraphQL ``errors`` (a list, or a string for some top-level failures) → ``upstream``; only
    their ``extensions.code`` values are kept (their texts may quote variables)."""
    errors = body.get("errors")
    if not errors:
        return
    codes: list[str] = []
    if isinstance(errors, list):
        for e in errors:
            extensions = e.get("extensions") if isinstance(e, Mapping) else None
            code = extensions.get("code") if isinstance(extensions, Mapping) else None
            if code and str(code) not in codes:
                codes.append(str(code))
    if "THROTTLED" in codes:
        message = f"Shopify throttled {operation} (GraphQL THROTTLED: the app's query-cost budget is spent)"
    elif "ACCESS_DENIED" in codes:
        message = f"Shopify denied {operation} (GraphQL ACCESS_DENIED: the access token lacks a scope)"
    else:
        message = f"Shopify answered {operation} with GraphQL errors ({', '.join(codes) or 'no code'})"
    raise StoreError("upstream", message, next_step=_RETRY_LATER)


def _too_late(status: str, what: str) -> str:
    if status in ("packed", "shipped"):
        return f"The order is already on its way, so it can no longer be {what}; it can be returned once delivered."
    if status == "delivered":
        return f"The order has been delivered, so it can no longer be {what}; a return can be opened instead."
    if status == "cancelled":
        return "The order is already cancelled."
    return _ASK_PERSON


def _cancel_error(number: str, errors: list[JSON]) -> StoreError:
    """``orderCancelUserErrors`` (``OrderCancelUserErrorCode``) → ``NOT_FOUND``: ``not_found``;
    ``INTERNAL_ERROR``: ``upstream``; ``INVALID``, ``NO_REFUND_PERMISSION`` and the rest:
    ``not_allowed`` (Shopify refused to cancel this order)."""
    codes = {str(e.get("code") or "") for e in errors}
    detail = _describe(errors)
    if "NOT_FOUND" in codes:
        return StoreError("not_found", f"Shopify no longer finds order {number} ({detail})", next_step=_CHECK_NUMBER)
    if codes & _UPSTREAM_CODES:
        return StoreError("upstream", f"Shopify failed to cancel order {number} ({detail})", next_step=_RETRY_LATER)
    return StoreError("not_allowed", f"Shopify refused to cancel order {number} ({detail})", next_step=_ASK_PERSON)


def _return_error(number: str, errors: list[JSON]) -> StoreError:
    """``userErrors`` of ``returnRequest`` (``ReturnErrorCode``) → ``NOT_FOUND``: ``not_found``;
    ``INVALID_STATE``, ``ALREADY_EXISTS``, ``NOT_EDITABLE``, ``FEATURE_NOT_ENABLED``:
    ``not_allowed``; ``INTERNAL_ERROR``, ``CREATION_FAILED``, ``NOTIFICATION_FAILED``:
    ``upstream``; the validation codes (``BLANK``, ``INVALID``, ``GREATER_THAN``…): ``invalid``."""
    codes = {str(e.get("code") or "") for e in errors}
    detail = _describe(errors)
    if "NOT_FOUND" in codes:
        return StoreError("not_found", f"Shopify no longer finds order {number} ({detail})", next_step=_CHECK_NUMBER)
    if codes & _RETURN_STATE_CODES:
        return StoreError(
            "not_allowed", f"Shopify refused a return of order {number} ({detail})", next_step=_ASK_PERSON
        )
    if codes & _UPSTREAM_CODES:
        return StoreError(
            "upstream", f"Shopify failed to open a return of order {number} ({detail})", next_step=_RETRY_LATER
        )
    return StoreError(
        "invalid", f"Shopify rejected the return request of order {number} ({detail})", next_step=_ASK_PERSON
    )
