"""The Shopify store adapter (store/adapters/shopify.py) against a local fake of Shopify's Admin
GraphQL endpoint (tests/store/shopify_fake.py): a real HTTP server on 127.0.0.1, never the network.

Per action: found, not found, not allowed, Shopify's own refusals (userErrors) and the upstream
failures (HTTP 500, 429, 401, a GraphQL THROTTLED error, a timeout, a dropped connection...); the
status, tracking, refund and return mappings field by field. The adapter keeps no idempotency
of its own (Shopify 2025-07 has no @idempotent on these mutations; kefu's door keeps it), so what
is tested is that a repeated change finds the order's new state and is refused before any
mutation is sent.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx2
import pytest

from store.adapters.shopify import API_VERSION, ShopifyAdapter, order_from_node, order_status
from store.types import Address, Order, OrderLine, Refund, ReturnRequest, Shipment, StoreError

HERE = Path(__file__).resolve().parent

ADA = "544365967"
BO = "624407574"
RETRY_LATER = "Please try again in a few minutes, or ask for a person."
NEW_ADDRESS = Address(name="Ada King Lovelace", line1="5 Avenue Foch", city="Lyon", postcode="69006", country="fr")
# What may never appear in an error: the shoppers' e-mails, names and streets (and the token).
PERSONAL = ("ada@example.com", "bo@example.com", "Lovelace", "Andersen", "Rivoli", "MacLaren", "Avenue Foch")


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


@pytest.fixture
def shop() -> Iterator[Any]:
    """The fake shop, started per test (imported as conftest imports tests/fake_openai.py)."""
    sys.path.insert(0, str(HERE))
    from shopify_fake import running_fake_shopify

    with running_fake_shopify() as fake:
        yield fake


def make_adapter(shop: Any, *, timeout_s: float = 10.0, **kwargs: Any) -> ShopifyAdapter:
    return ShopifyAdapter(shop_url=shop.base_url, access_token=shop.token, timeout_s=timeout_s, **kwargs)


@pytest.fixture
def adapter(shop: Any) -> Iterator[ShopifyAdapter]:
    with make_adapter(shop) as a:
        yield a


def assert_clean(error: StoreError, shop: Any) -> None:
    text = f"{error.message} | {error.next_step} | {error!r}"
    for secret in (*PERSONAL, shop.token):
        assert secret not in text, (secret, text)


def roots(shop: Any) -> list[str]:
    return [r["root"] for r in shop.requests]


# ---------------------------------------------------------------------------------------------
# Reading: the mapping field by field
# ---------------------------------------------------------------------------------------------


def test_a_placed_order_is_mapped_field_by_field(shop: Any, adapter: ShopifyAdapter) -> None:
    order = adapter.order_by_number("#1001")
    assert order == Order(
        number="#1001",
        customer_id=ADA,
        email="ada@example.com",
        status="placed",
        placed_at=utc(2025, 7, 1, 10, 0),
        total=Decimal("59.98"),
        currency="EUR",
        lines=(OrderLine(sku="SOCK-1", title="Wool socks", quantity=2, unit_price=Decimal("29.99")),),
        shipping_address=Address(
            name="Ada Lovelace", line1="12 Rue de Rivoli", line2="Apt 4", city="Paris", postcode="75001", country="FR"
        ),
        shipments=(),
        refunds=(),
        returns=(),
        admin_url=f"{shop.base_url}/admin/orders/148977776",
    )
    assert order.extra == {
        "shopify_id": "gid://shopify/Order/148977776",
        "financial_status": "PAID",
        "fulfillment_status": "UNFULFILLED",
    }
    assert order.changeable and not order.returnable
    # One request, to the pinned version, with the token, named.
    [request] = shop.requests
    assert request["root"] == "orders" and request["operation"] == "KefuOrderByName"
    assert request["variables"] == {"search": 'name:"#1001"'}
    assert request["headers"]["X-Shopify-Access-Token"] == shop.token


def test_a_shipped_order_carries_its_tracking(adapter: ShopifyAdapter) -> None:
    order = adapter.order_by_number("#1002")
    assert order is not None
    assert order.status == "shipped"
    assert order.shipments == (
        Shipment(
            carrier="UPS",
            tracking_number="1Z1234512345123456",
            tracking_url="https://www.ups.com/WebTracking?loc=en_US&requester=ST&trackNums=1Z1234512345123456",
            shipped_at=utc(2025, 6, 21, 9, 0),
            delivered_at=None,
            estimated_delivery=utc(2025, 6, 25, 18, 0),
        ),
    )
    assert not order.changeable and not order.returnable


def test_a_delivered_order_is_in_the_shoppers_currency(adapter: ShopifyAdapter) -> None:
    order = adapter.order_by_number("1003")
    assert order is not None
    assert (order.status, order.customer_id, order.total, order.currency) == ("delivered", BO, Decimal("45.50"), "GBP")
    assert order.lines == (
        OrderLine(sku="MUG-2", title="Enamel mug", quantity=1, unit_price=Decimal("20.50")),
        OrderLine(sku="", title="Gift wrap", quantity=1, unit_price=Decimal("25.00")),
    )
    assert order.shipments == (
        Shipment(
            carrier="DHL Express",
            tracking_number="1234567890",
            tracking_url="https://www.dhl.com/en/express/tracking.html?AWB=1234567890",
            shipped_at=utc(2025, 6, 11, 9, 0),
            delivered_at=utc(2025, 6, 12, 15, 30),
            estimated_delivery=None,
        ),
    )
    assert order.returnable


def test_refund_statuses_come_from_their_transactions(adapter: ShopifyAdapter) -> None:
    cancelled = adapter.order_by_number("#1004")
    assert cancelled is not None
    assert cancelled.status == "cancelled"
    # SUCCESS → succeeded (processed_at from the transaction), PENDING → pending; the 0.00
    # restock-only refund moves no money and is left out.
    assert cancelled.refunds == (
        Refund(
            amount=Decimal("30.00"),
            currency="EUR",
            status="succeeded",
            created_at=utc(2025, 6, 1, 10, 0),
            processed_at=utc(2025, 6, 1, 10, 0, 5),
        ),
        Refund(amount=Decimal("15.00"), currency="EUR", status="pending", created_at=utc(2025, 6, 2, 8, 0)),
    )
    returned = adapter.order_by_number("#1005")
    assert returned is not None
    assert returned.status == "returned"
    assert returned.refunds == (
        Refund(amount=Decimal("80.00"), currency="EUR", status="failed", created_at=utc(2025, 5, 25, 10, 0)),
    )
    assert returned.returns == (
        ReturnRequest(return_id="#1005-R1", status="refunded", created_at=utc(2025, 5, 20, 10)),
    )


@pytest.mark.parametrize(
    ("number", "status"),
    [
        ("#1001", "placed"),
        ("#1006", "packed"),
        ("#1002", "shipped"),
        ("#1003", "delivered"),
        ("#1004", "cancelled"),
        ("#1005", "returned"),
    ],
)
def test_each_order_of_the_fake_shop_has_its_status(adapter: ShopifyAdapter, number: str, status: str) -> None:
    order = adapter.order_by_number(number)
    assert order is not None and order.status == status


def _f(status: str, *, delivered: bool = False) -> dict[str, Any]:
    return {
        "displayStatus": status,
        "createdAt": "2025-01-01T00:00:00Z",
        "deliveredAt": "2025-01-02T00:00:00Z" if delivered else None,
        "trackingInfo": [],
    }


@pytest.mark.parametrize(
    ("node", "status"),
    [
        ({"displayFulfillmentStatus": "UNFULFILLED"}, "placed"),
        ({"displayFulfillmentStatus": "ON_HOLD"}, "placed"),
        ({"displayFulfillmentStatus": "SCHEDULED"}, "placed"),
        ({"displayFulfillmentStatus": "IN_PROGRESS"}, "packed"),
        ({"displayFulfillmentStatus": "PENDING_FULFILLMENT"}, "packed"),
        ({"displayFulfillmentStatus": "UNFULFILLED", "fulfillments": [_f("LABEL_PURCHASED")]}, "packed"),
        ({"displayFulfillmentStatus": "PARTIALLY_FULFILLED", "fulfillments": [_f("LABEL_PRINTED")]}, "packed"),
        ({"displayFulfillmentStatus": "PARTIALLY_FULFILLED", "fulfillments": [_f("DELIVERED")]}, "shipped"),
        ({"displayFulfillmentStatus": "FULFILLED", "fulfillments": [_f("IN_TRANSIT"), _f("DELIVERED")]}, "shipped"),
        ({"displayFulfillmentStatus": "FULFILLED", "fulfillments": []}, "shipped"),
        ({"displayFulfillmentStatus": "FULFILLED", "fulfillments": [_f("OUT_FOR_DELIVERY")]}, "shipped"),
        ({"displayFulfillmentStatus": "FULFILLED", "fulfillments": [_f("DELIVERED"), _f("CANCELED")]}, "delivered"),
        ({"displayFulfillmentStatus": "FULFILLED", "fulfillments": [_f("CONFIRMED", delivered=True)]}, "delivered"),
        ({"displayFulfillmentStatus": "FULFILLED", "fulfillments": [_f("PICKED_UP")]}, "delivered"),
        ({"displayFulfillmentStatus": "UNFULFILLED", "fulfillments": [_f("CANCELED")]}, "placed"),
        ({"cancelledAt": "2025-01-03T00:00:00Z", "displayFulfillmentStatus": "FULFILLED"}, "cancelled"),
    ],
)
def test_status_mapping(node: dict[str, Any], status: str) -> None:
    assert order_status(node) == status


@pytest.mark.parametrize(
    ("return_status", "quantity", "status"),
    [("CLOSED", 3, "returned"), ("CLOSED", 2, "delivered"), ("OPEN", 3, "delivered")],
)
def test_returned_means_every_unit_came_back(return_status: str, quantity: int, status: str) -> None:
    node = {
        "displayFulfillmentStatus": "FULFILLED",
        "subtotalLineItemsQuantity": 3,
        "fulfillments": [_f("DELIVERED")],
        "returns": {
            "nodes": [{"status": return_status, "totalQuantity": quantity, "createdAt": "2025-01-04T00:00:00Z"}]
        },
    }
    assert order_status(node) == status


@pytest.mark.parametrize(
    ("statuses", "status"),
    [
        (["SUCCESS"], "succeeded"),
        (["SUCCESS", "SUCCESS"], "succeeded"),
        (["PENDING"], "pending"),
        (["AWAITING_RESPONSE"], "pending"),
        (["UNKNOWN"], "pending"),
        ([], "pending"),
        (["FAILURE"], "failed"),
        (["ERROR"], "failed"),
        (["SUCCESS", "FAILURE"], "failed"),
        (["PENDING", "FAILURE"], "pending"),
    ],
)
def test_refund_status_mapping(statuses: list[str], status: str) -> None:
    node = {
        "id": "gid://shopify/Order/1",
        "name": "#1",
        "refunds": [
            {
                "createdAt": "2025-01-05T00:00:00Z",
                "totalRefundedSet": {"shopMoney": {"amount": "9.90", "currencyCode": "EUR"}},
                "transactions": {
                    "nodes": [{"kind": "REFUND", "status": s, "processedAt": "2025-01-05T00:01:00Z"} for s in statuses]
                },
            }
        ],
    }
    [refund] = order_from_node(node, admin_base="https://x.myshopify.com").refunds
    assert (refund.amount, refund.currency, refund.status) == (Decimal("9.90"), "EUR", status)
    assert refund.processed_at == (utc(2025, 1, 5, 0, 1) if status == "succeeded" else None)


def test_return_statuses_are_mapped() -> None:
    def ret(status: str, refunded: bool = False) -> dict[str, Any]:
        return {
            "id": "gid://shopify/Return/9",
            "name": f"#1-{status}",
            "status": status,
            "createdAt": "2025-01-06T00:00:00Z",
            "totalQuantity": 1,
            "refunds": {"nodes": [{"id": "gid://shopify/Refund/1"}] if refunded else []},
        }

    node = {
        "id": "gid://shopify/Order/1",
        "name": "#1",
        "returns": {
            "nodes": [
                ret("REQUESTED"),
                ret("OPEN"),
                ret("CLOSED"),
                ret("CLOSED", True),
                ret("DECLINED"),
                ret("CANCELED"),
            ]
        },
    }
    returns = order_from_node(node, admin_base="https://x.myshopify.com").returns
    assert [(r.return_id, r.status) for r in returns] == [
        ("#1-REQUESTED", "requested"),
        ("#1-OPEN", "requested"),
        ("#1-CLOSED", "received"),
        ("#1-CLOSED", "refunded"),
        ("#1-DECLINED", "declined"),
    ]
    assert {r.created_at for r in returns} == {utc(2025, 1, 6)}


# ---------------------------------------------------------------------------------------------
# orders_for_customer, order_by_number
# ---------------------------------------------------------------------------------------------


def test_orders_for_customer_newest_first_and_only_theirs(shop: Any, adapter: ShopifyAdapter) -> None:
    ada = adapter.orders_for_customer(ADA)
    assert [(o.number, o.status) for o in ada] == [("#1001", "placed"), ("#1002", "shipped"), ("#1005", "returned")]
    assert {o.customer_id for o in ada} == {ADA}
    assert shop.sent("customer") == [{"customerId": f"gid://shopify/Customer/{ADA}", "first": 5}]

    bo = adapter.orders_for_customer(f"gid://shopify/Customer/{BO}", limit=2)
    assert [o.number for o in bo] == ["#1006", "#1003"]
    assert shop.sent("customer")[-1] == {"customerId": f"gid://shopify/Customer/{BO}", "first": 2}

    adapter.orders_for_customer(ADA, limit=500)
    assert shop.sent("customer")[-1]["first"] == 10  # MAX_ORDERS: the query-cost bound


def test_orders_for_an_unknown_customer_are_none(shop: Any, adapter: ShopifyAdapter) -> None:
    assert adapter.orders_for_customer("999") == []
    asked = len(shop.requests)
    # Not a Shopify customer id at all: nothing is asked.
    assert adapter.orders_for_customer("ada@example.com") == []
    assert adapter.orders_for_customer(ADA, limit=0) == []
    assert len(shop.requests) == asked


@pytest.mark.parametrize("number", ["#1001", "1001", " #1001 ", "#1001\n"])
def test_order_by_number_accepts_the_printed_forms(shop: Any, adapter: ShopifyAdapter, number: str) -> None:
    order = adapter.order_by_number(number)
    assert order is not None and order.number == "#1001"
    assert shop.sent("orders") == [{"search": 'name:"#1001"'}]


@pytest.mark.parametrize("number", ["#9999", "100", "#100"])
def test_order_by_number_needs_an_exact_name(shop: Any, adapter: ShopifyAdapter, number: str) -> None:
    # Shopify's search matches prefixes ("#100" finds #1001...#1006): none of them is "#100".
    assert adapter.order_by_number(number) is None
    assert len(shop.requests) == 1


@pytest.mark.parametrize("number", ["", "#", "1001 OR name:#1003", 'x"y', "#1001:", "a" * 41])
def test_what_is_not_an_order_name_is_not_searched(shop: Any, adapter: ShopifyAdapter, number: str) -> None:
    assert adapter.order_by_number(number) is None
    assert shop.requests == []


# ---------------------------------------------------------------------------------------------
# order_cancel
# ---------------------------------------------------------------------------------------------


def test_cancel_a_placed_order(shop: Any, adapter: ShopifyAdapter) -> None:
    order = adapter.order_cancel("#1001", idempotency_key="idem-cancel-1")
    assert order.number == "#1001"
    assert order.status == "cancelled"
    assert order.extra["financial_status"] == "REFUNDED"
    assert order.refunds == (
        Refund(amount=Decimal("59.98"), currency="EUR", status="pending", created_at=utc(2025, 7, 2, 12, 0)),
    )
    assert roots(shop) == ["orders", "orderCancel", "job", "orders"]
    [sent] = shop.sent("orderCancel")
    assert sent == {
        "orderId": "gid://shopify/Order/148977776",
        "reason": "CUSTOMER",
        "staffNote": "Cancelled through kefu (kefu ref idem-cancel-1)",
    }
    query = next(r["query"] for r in shop.requests if r["root"] == "orderCancel")
    for argument in ("refund: true", "restock: true", "notifyCustomer: true"):
        assert argument in query


def test_a_repeated_cancel_is_refused_before_any_mutation(shop: Any, adapter: ShopifyAdapter) -> None:
    adapter.order_cancel("#1001", idempotency_key="idem-cancel-2")
    with pytest.raises(StoreError) as again:
        adapter.order_cancel("#1001", idempotency_key="idem-cancel-2")
    assert again.value.code == "not_allowed"
    assert again.value.next_step == "The order is already cancelled."
    assert len(shop.sent("orderCancel")) == 1
    assert len(shop.order("#1001")["refunds"]) == 1  # refunded once


def test_cancel_waits_for_shopifys_job(shop: Any, adapter: ShopifyAdapter) -> None:
    shop.job_polls_needed = 3
    order = adapter.order_cancel("#1001", idempotency_key="idem-cancel-3")
    assert order.status == "cancelled"
    assert roots(shop) == ["orders", "orderCancel", "job", "job", "job", "orders"]


def test_a_cancel_job_still_running_at_the_deadline_is_reported_pending(shop: Any) -> None:
    shop.job_polls_needed = None  # Shopify's job never finishes
    with make_adapter(shop, timeout_s=2.0) as adapter:
        order = adapter.order_cancel("#1001", idempotency_key="idem-cancel-4")
    assert order.status == "placed"
    assert order.extra["cancellation"] == "pending"
    assert order.extra["shopify_job_id"].startswith("gid://shopify/Job/")
    assert roots(shop)[:3] == ["orders", "orderCancel", "job"]
    assert len(shop.sent("orderCancel")) == 1


def test_cancel_of_an_unknown_order_is_not_found(shop: Any, adapter: ShopifyAdapter) -> None:
    with pytest.raises(StoreError) as error:
        adapter.order_cancel("#4040", idempotency_key="k")
    assert error.value.code == "not_found"
    assert error.value.next_step.startswith("Please check the order number")
    assert shop.sent("orderCancel") == []


@pytest.mark.parametrize(
    ("number", "status", "next_step"),
    [
        ("#1006", "packed", "already on its way"),
        ("#1002", "shipped", "already on its way"),
        ("#1003", "delivered", "a return can be opened instead"),
        ("#1004", "cancelled", "already cancelled"),
        ("#1005", "returned", "ask for a person"),
    ],
)
def test_cancel_is_refused_once_packed(
    shop: Any, adapter: ShopifyAdapter, number: str, status: str, next_step: str
) -> None:
    with pytest.raises(StoreError) as error:
        adapter.order_cancel(number, idempotency_key="k")
    assert error.value.code == "not_allowed"
    assert error.value.permanent
    assert f"{number} is {status}" in error.value.message
    assert next_step in error.value.next_step
    assert shop.sent("orderCancel") == []
    assert_clean(error.value, shop)


@pytest.mark.parametrize(
    ("code", "kefu_code"),
    [
        ("INVALID", "not_allowed"),
        ("NO_REFUND_PERMISSION", "not_allowed"),
        ("NOT_FOUND", "not_found"),
        ("INTERNAL_ERROR", "upstream"),
    ],
)
def test_shopifys_cancel_refusals_are_mapped(shop: Any, adapter: ShopifyAdapter, code: str, kefu_code: str) -> None:
    shop.user_errors["orderCancel"] = [
        {"field": ["orderId"], "message": "Order of ada@example.com has pending authorizations", "code": code}
    ]
    with pytest.raises(StoreError) as error:
        adapter.order_cancel("#1001", idempotency_key="k")
    assert error.value.code == kefu_code
    assert f"(orderId: {code})" in error.value.message
    assert_clean(error.value, shop)
    assert shop.order("#1001")["cancelledAt"] is None


# ---------------------------------------------------------------------------------------------
# return_open
# ---------------------------------------------------------------------------------------------


def test_open_a_return_of_a_delivered_order(shop: Any, adapter: ShopifyAdapter) -> None:
    opened = adapter.return_open("#1003", idempotency_key="idem-ret-1", reason="It arrived broken")
    assert opened == ReturnRequest(
        return_id="#1003-R1", status="requested", created_at=utc(2025, 7, 2, 12), label_url=""
    )
    assert roots(shop) == ["orders", "returnableFulfillments", "returnRequest"]
    assert shop.sent("returnableFulfillments") == [{"orderId": "gid://shopify/Order/625362839"}]
    note = "It arrived broken"
    assert shop.sent("returnRequest") == [
        {
            "input": {
                "orderId": "gid://shopify/Order/625362839",
                "returnLineItems": [
                    {
                        "fulfillmentLineItemId": "gid://shopify/FulfillmentLineItem/820022594",
                        "quantity": 1,
                        "returnReason": "DEFECTIVE",
                        "customerNote": note,
                    },
                    {
                        "fulfillmentLineItemId": "gid://shopify/FulfillmentLineItem/820022595",
                        "quantity": 1,
                        "returnReason": "DEFECTIVE",
                        "customerNote": note,
                    },
                ],
            }
        }
    ]
    after = adapter.order_by_number("#1003")
    assert after is not None
    assert after.returns == (opened,)
    assert after.status == "delivered" and not after.returnable


def test_a_repeated_return_is_refused_before_any_mutation(shop: Any, adapter: ShopifyAdapter) -> None:
    adapter.return_open("#1003", idempotency_key="idem-ret-2")
    with pytest.raises(StoreError) as again:
        adapter.return_open("#1003", idempotency_key="idem-ret-2")
    assert again.value.code == "not_allowed"
    assert "already open" in again.value.next_step
    assert len(shop.sent("returnRequest")) == 1


@pytest.mark.parametrize(
    ("reason", "shopify_reason"),
    [
        ("", "UNKNOWN"),
        ("wrong_item", "WRONG_ITEM"),
        ("Size too small", "SIZE_TOO_SMALL"),
        ("It's too big for me", "SIZE_TOO_LARGE"),
        ("I changed my mind", "UNWANTED"),
        ("just because", "OTHER"),
    ],
)
def test_the_return_reason_is_mapped(shop: Any, adapter: ShopifyAdapter, reason: str, shopify_reason: str) -> None:
    adapter.return_open("#1003", idempotency_key="k", reason=reason)
    [sent] = shop.sent("returnRequest")
    lines = sent["input"]["returnLineItems"]
    assert {line["returnReason"] for line in lines} == {shopify_reason}
    assert {line.get("customerNote") for line in lines} == {reason or None}


@pytest.mark.parametrize(
    ("number", "next_step"),
    [
        ("#1001", "once the order has been delivered"),
        ("#1006", "once the order has been delivered"),
        ("#1002", "once the order has been delivered"),
        ("#1004", "ask for a person"),
        ("#1005", "ask for a person"),
    ],
)
def test_return_is_refused_before_delivery(shop: Any, adapter: ShopifyAdapter, number: str, next_step: str) -> None:
    with pytest.raises(StoreError) as error:
        adapter.return_open(number, idempotency_key="k")
    assert error.value.code == "not_allowed"
    assert next_step in error.value.next_step
    assert roots(shop) == ["orders"]  # neither returnableFulfillments nor returnRequest
    assert_clean(error.value, shop)


def test_return_of_an_unknown_order_is_not_found(shop: Any, adapter: ShopifyAdapter) -> None:
    with pytest.raises(StoreError) as error:
        adapter.return_open("4040", idempotency_key="k")
    assert error.value.code == "not_found"
    assert roots(shop) == ["orders"]


def test_return_with_nothing_left_to_return_is_refused(shop: Any, adapter: ShopifyAdapter) -> None:
    shop.order("#1003")["fulfillments"][0]["_lineItems"] = []
    with pytest.raises(StoreError) as error:
        adapter.return_open("#1003", idempotency_key="k")
    assert error.value.code == "not_allowed"
    assert "nothing left to return" in error.value.message
    assert shop.sent("returnRequest") == []


@pytest.mark.parametrize(
    ("code", "kefu_code"),
    [
        ("INVALID_STATE", "not_allowed"),
        ("ALREADY_EXISTS", "not_allowed"),
        ("GREATER_THAN", "invalid"),
        ("BLANK", "invalid"),
        ("NOT_FOUND", "not_found"),
        ("INTERNAL_ERROR", "upstream"),
    ],
)
def test_shopifys_return_refusals_are_mapped(shop: Any, adapter: ShopifyAdapter, code: str, kefu_code: str) -> None:
    shop.user_errors["returnRequest"] = [
        {"field": ["input", "returnLineItems", "0", "quantity"], "message": "Bo Andersen's item: no", "code": code}
    ]
    with pytest.raises(StoreError) as error:
        adapter.return_open("#1003", idempotency_key="k")
    assert error.value.code == kefu_code
    assert f"(input.returnLineItems.0.quantity: {code})" in error.value.message
    assert_clean(error.value, shop)
    assert shop.order("#1003")["returns"]["nodes"] == []


# ---------------------------------------------------------------------------------------------
# shipping_address_change
# ---------------------------------------------------------------------------------------------


def test_change_the_address_of_a_placed_order(shop: Any, adapter: ShopifyAdapter) -> None:
    order = adapter.shipping_address_change("#1001", NEW_ADDRESS, idempotency_key="idem-addr-1")
    expected = Address(name="Ada King Lovelace", line1="5 Avenue Foch", city="Lyon", postcode="69006", country="FR")
    assert (order.number, order.status, order.shipping_address) == ("#1001", "placed", expected)
    assert shop.sent("orderUpdate") == [
        {
            "input": {
                "id": "gid://shopify/Order/148977776",
                "shippingAddress": {
                    "firstName": "Ada King",
                    "lastName": "Lovelace",
                    "address1": "5 Avenue Foch",
                    "address2": "",
                    "city": "Lyon",
                    "zip": "69006",
                    "countryCode": "FR",
                },
            }
        }
    ]
    assert roots(shop) == ["orders", "orderUpdate"]  # the mutation returns the order
    again = adapter.order_by_number("#1001")
    assert again is not None and again.shipping_address == expected


@pytest.mark.parametrize(
    "address",
    [
        Address(name="", line1="5 Avenue Foch", city="Lyon", postcode="69006", country="FR"),
        Address(name="Ada", line1=" ", city="Lyon", postcode="69006", country="FR"),
        Address(name="Ada", line1="5 Avenue Foch", city="", postcode="69006", country="FR"),
        Address(name="Ada", line1="5 Avenue Foch", city="Lyon", postcode="69006", country="France"),
    ],
)
def test_an_incomplete_address_is_invalid_before_anything_is_sent(
    shop: Any, adapter: ShopifyAdapter, address: Address
) -> None:
    with pytest.raises(StoreError) as error:
        adapter.shipping_address_change("#1001", address, idempotency_key="k")
    assert error.value.code == "invalid"
    assert error.value.next_step.startswith("Please check the address")
    assert shop.requests == []
    assert_clean(error.value, shop)


def test_an_address_shopify_rejects_is_invalid(shop: Any, adapter: ShopifyAdapter) -> None:
    shop.user_errors["orderUpdate"] = [
        {"field": ["shippingAddress", "zip"], "message": "Zip 69006 is not valid for 5 Avenue Foch, Lyon"}
    ]
    with pytest.raises(StoreError) as error:
        adapter.shipping_address_change("#1001", NEW_ADDRESS, idempotency_key="k")
    assert error.value.code == "invalid"
    assert error.value.message == "Shopify refused the address change of order #1001 (shippingAddress.zip)"
    assert "69006" not in error.value.message
    assert_clean(error.value, shop)
    assert shop.order("#1001")["shippingAddress"]["address1"] == "12 Rue de Rivoli"


def test_an_order_shopify_will_not_update_is_not_allowed(shop: Any, adapter: ShopifyAdapter) -> None:
    shop.user_errors["orderUpdate"] = [{"field": ["id"], "message": "Order is archived"}]
    with pytest.raises(StoreError) as error:
        adapter.shipping_address_change("#1001", NEW_ADDRESS, idempotency_key="k")
    assert error.value.code == "not_allowed"


@pytest.mark.parametrize("number", ["#1006", "#1002", "#1003", "#1004"])
def test_the_address_cannot_change_once_packed(shop: Any, adapter: ShopifyAdapter, number: str) -> None:
    with pytest.raises(StoreError) as error:
        adapter.shipping_address_change(number, NEW_ADDRESS, idempotency_key="k")
    assert error.value.code == "not_allowed"
    assert shop.sent("orderUpdate") == []
    assert_clean(error.value, shop)


def test_address_change_of_an_unknown_order_is_not_found(shop: Any, adapter: ShopifyAdapter) -> None:
    with pytest.raises(StoreError) as error:
        adapter.shipping_address_change("#4040", NEW_ADDRESS, idempotency_key="k")
    assert error.value.code == "not_found"
    assert shop.sent("orderUpdate") == []


# ---------------------------------------------------------------------------------------------
# Upstream failures, for every action
# ---------------------------------------------------------------------------------------------

ACTIONS: dict[str, Callable[[ShopifyAdapter], Any]] = {
    "orders_for_customer": lambda a: a.orders_for_customer(ADA),
    "order_by_number": lambda a: a.order_by_number("#1001"),
    "order_cancel": lambda a: a.order_cancel("#1001", idempotency_key="k"),
    "return_open": lambda a: a.return_open("#1003", idempotency_key="k"),
    "shipping_address_change": lambda a: a.shipping_address_change("#1001", NEW_ADDRESS, idempotency_key="k"),
}

FAULTS = {
    "http_500": "(HTTP 500)",
    "http_429": "(HTTP 429; retry after 2s)",
    "throttled": "GraphQL THROTTLED",
    "graphql_error": "GraphQL errors (undefinedField)",
    "not_json": "not JSON (HTTP 200, text/html)",
    "http_401": "rejected the Admin API access token (HTTP 401)",
    "drop": "could not reach Shopify",
}


def assert_untouched(shop: Any) -> None:
    assert shop.order("#1001")["cancelledAt"] is None
    assert shop.order("#1001")["shippingAddress"]["city"] == "Paris"
    assert shop.order("#1003")["returns"]["nodes"] == []


@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize("fault", FAULTS)
def test_an_upstream_failure_is_upstream(shop: Any, adapter: ShopifyAdapter, action: str, fault: str) -> None:
    shop.misbehave(fault)
    with pytest.raises(StoreError) as error:
        ACTIONS[action](adapter)
    assert error.value.code == "upstream"
    assert error.value.permanent is (fault == "http_401")  # refused credentials: no retry mends them
    assert FAULTS[fault] in error.value.message
    assert error.value.next_step == RETRY_LATER
    assert_clean(error.value, shop)
    assert_untouched(shop)
    assert len(shop.requests) == 1  # no retry behind the door's back


@pytest.mark.parametrize("action", ACTIONS)
def test_a_slow_shopify_times_out_within_the_budget(shop: Any, action: str) -> None:
    shop.misbehave("slow")  # held for 30 s, or until the fake stops
    with make_adapter(shop, timeout_s=0.5) as adapter:
        started = time.monotonic()
        with pytest.raises(StoreError) as error:
            ACTIONS[action](adapter)
        took = time.monotonic() - started
    assert error.value.code == "upstream"
    assert "did not answer" in error.value.message and "within 0.5s" in error.value.message
    assert took < 10  # bounded by the budget, not by the fake's 30 s
    assert_untouched(shop)


@pytest.mark.parametrize(
    ("action", "root"),
    [("order_cancel", "orderCancel"), ("return_open", "returnRequest"), ("shipping_address_change", "orderUpdate")],
)
@pytest.mark.parametrize("fault", ["http_500", "throttled", "drop"])
def test_a_failed_mutation_is_upstream_and_changes_nothing(
    shop: Any, adapter: ShopifyAdapter, action: str, root: str, fault: str
) -> None:
    shop.misbehave(fault, on=root)
    with pytest.raises(StoreError) as error:
        ACTIONS[action](adapter)
    assert error.value.code == "upstream"
    assert FAULTS[fault] in error.value.message
    assert_untouched(shop)
    assert roots(shop)[-1] == root


def test_a_cancel_whose_follow_up_read_fails_is_reported_pending(shop: Any) -> None:
    # The cancellation was accepted; only polling its job failed. Reporting a failure could make
    # a retry cancel twice, so the adapter says "pending".
    shop.misbehave("http_500", on="job")
    with make_adapter(shop) as adapter:
        order = adapter.order_cancel("#1001", idempotency_key="k")
    assert order.status == "placed"
    assert order.extra["cancellation"] == "pending"
    assert len(shop.sent("orderCancel")) == 1


def test_a_wrong_api_version_is_upstream(shop: Any) -> None:
    with make_adapter(shop, api_version="2024-01") as adapter, pytest.raises(StoreError) as error:
        adapter.order_by_number("#1001")
    assert error.value.code == "upstream"
    assert "for version 2024-01 (HTTP 404)" in error.value.message
    assert shop.requests == []  # the fake only serves 2025-07


def test_a_wrong_token_is_upstream_and_never_printed(shop: Any) -> None:
    wrong = "shpat_wrong_token_00000000000000000"
    with ShopifyAdapter(shop_url=shop.base_url, access_token=wrong, timeout_s=10.0) as adapter:
        assert wrong not in repr(adapter)
        with pytest.raises(StoreError) as error:
            adapter.orders_for_customer(ADA)
    assert error.value.code == "upstream"
    assert "access token (HTTP 401)" in error.value.message
    assert wrong not in f"{error.value.message} {error.value.next_step}"


def test_a_refused_connection_is_upstream() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    adapter = ShopifyAdapter(shop_url=f"http://127.0.0.1:{port}", access_token="t", timeout_s=10.0)
    with adapter, pytest.raises(StoreError) as error:
        adapter.order_by_number("#1001")
    assert error.value.code == "upstream"
    assert "could not reach Shopify for KefuOrderByName (ConnectError)" in error.value.message


# ---------------------------------------------------------------------------------------------
# Construction
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shop_url",
    ["kefu-demo.myshopify.com", "kefu-demo", "https://kefu-demo.myshopify.com/admin", " KEFU-demo.myshopify.com/ "],
)
def test_a_shop_domain_means_the_https_admin_endpoint(shop_url: str) -> None:
    seen: list[httpx2.Request] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return httpx2.Response(200, json={"data": {"orders": {"nodes": []}}})

    with ShopifyAdapter(shop_url=shop_url, access_token="tok", transport=httpx2.MockTransport(handler)) as adapter:
        assert adapter.name == "shopify"
        assert adapter.order_by_number("1001") is None
    [request] = seen
    assert str(request.url) == f"https://kefu-demo.myshopify.com/admin/api/{API_VERSION}/graphql.json"
    assert request.method == "POST"
    assert request.headers["X-Shopify-Access-Token"] == "tok"
    assert json.loads(request.content)["variables"] == {"search": 'name:"#1001"'}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"shop_url": "kefu.myshopify.com", "access_token": " "}, "no Admin API access token"),
        ({"shop_url": "ftp://kefu.myshopify.com", "access_token": "t"}, "must be http(s)://host[:port]"),
        ({"shop_url": "", "access_token": "t"}, "must be a domain"),
        ({"shop_url": "kefu shop", "access_token": "t"}, "must be a domain"),
        ({"shop_url": "kefu.myshopify.com", "access_token": "t", "api_version": "latest"}, "not a Shopify API version"),
        ({"shop_url": "kefu.myshopify.com", "access_token": "t", "timeout_s": 0}, "must be positive"),
    ],
)
def test_a_bad_configuration_is_not_configured(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(StoreError) as error:
        ShopifyAdapter(**kwargs)
    assert error.value.code == "not_configured"
    assert message in error.value.message
