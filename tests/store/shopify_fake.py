"""A local fake of Shopify's Admin GraphQL endpoint, for the Shopify store adapter's tests.

A real HTTP server (``http.server.ThreadingHTTPServer``) on 127.0.0.1 and a free port, in a thread.
It answers ``POST /admin/api/<version>/graphql.json`` like Shopify does for the handful of
operations kefu's adapter sends, on a small in-memory shop (six orders of two customers), and
applies the mutations to that shop. It is not a GraphQL engine: it routes on the root field named
in the query text (``orderCancel(``, ``returnRequest(``, ``orderUpdate(``, ``returnableFulfillments(``,
``job(``, ``customer(``, ``orders(``), reads the variables, and answers with whole ``Order`` nodes
in the shape of the adapter's ``KefuOrder`` fragment (it does not trim to the selection).

The payload shapes and the sample values come from Shopify's documented examples:

* ``orderCancel``: https://shopify.dev/docs/api/admin-graphql/latest/mutations/orderCancel
  (example "Cancel an order": ``job {id done: false}``, ``orderCancelUserErrors: []``;
  order ``gid://shopify/Order/148977776``, job ``gid://shopify/Job/1fb9ff6d-…``);
* ``returnRequest``: https://shopify.dev/docs/api/admin-graphql/2025-07/mutations/returnRequest
  (example "Request a return": order ``625362839``, fulfillment line item ``820022594``,
  return ``gid://shopify/Return/945000961`` with status ``REQUESTED``);
* ``returnableFulfillments``: https://shopify.dev/docs/apps/build/orders-fulfillment/returns-apps/build-return-management
  (step 1, "Query returnable fulfillments");
* ``orderUpdate``: https://shopify.dev/docs/api/admin-graphql/latest/mutations/orderUpdate
  (example "Update an order's shipping address and note": ``order {…}``, ``userErrors: []``);
* fulfillments and tracking: https://shopify.dev/docs/api/admin-graphql/latest/queries/fulfillment
  (example "Receive a single Fulfillment": UPS ``1Z1234512345123456`` and its tracking URL,
  ``estimatedDeliveryAt``); enum values from FulfillmentDisplayStatus and
  OrderDisplayFulfillmentStatus (2025-07 reference);
* refunds: https://shopify.dev/docs/api/admin-graphql/latest/mutations/refundCreate (refund
  ``943333859``/``943333863``, ``totalRefundedSet``, ``transactions {nodes {status: SUCCESS}}``);
* errors: https://shopify.dev/docs/api/usage/response-codes (401 body
  ``{"errors": "[API] Invalid API key or access token (unrecognized login or wrong password)"}``)
  and https://shopify.dev/docs/api/usage/limits (a throttled query: HTTP 200,
  ``errors[0].extensions.code == "THROTTLED"`` and ``extensions.cost.throttleStatus``; the REST
  style 429 with ``Retry-After``).

The catalog (issue 36): ``products(first, after, query: "status:active")`` page by page (opaque
base64 cursors like Shopify's, ``pageInfo { hasNextPage endCursor }``), ``product(id:)``,
``inventoryItem(id:)`` and ``shop { currencyCode }``, on a small catalog (:func:`initial_products`:
Shopify's documented example products "Example T-Shirt" and "Burton Custom Freestyle 151", a
draft, and fillers for a second page), with ``translations(locale:) { key value }`` answered for
each alias the query names. Stock is kept per location (``_levels``) and ``inventoryQuantity`` is
their sum. And it makes webhook deliveries as Shopify sends them (:meth:`FakeShopify.webhook`): the
REST-shaped payloads of ``products/update``, ``products/delete`` and ``inventory_levels/update``
(https://shopify.dev/docs/api/webhooks?reference=toml, each topic's example payload) with the
headers ``X-Shopify-Topic``, ``X-Shopify-Hmac-Sha256`` (base64 HMAC-SHA256 of the raw body with
the app's secret), ``X-Shopify-Shop-Domain``, ``X-Shopify-API-Version``, ``X-Shopify-Webhook-Id``,
``X-Shopify-Triggered-At`` and ``X-Shopify-Event-Id``
(https://shopify.dev/docs/apps/build/webhooks/subscribe/https, "Shopify webhook headers").

It checks the ``X-Shopify-Access-Token`` header (401 otherwise) and the API version in the path
(404 otherwise), records every request (``requests``: operation root, variables, headers), and
misbehaves on demand (:meth:`FakeShopify.misbehave`): HTTP 500, 429 with ``Retry-After``, a
GraphQL ``THROTTLED`` error, another GraphQL error, a body that is not JSON, a 401, a slow answer
(held until the client gave up, or the server stops), a dropped connection. ``user_errors`` makes
the next mutation of a kind answer with the given ``userErrors`` instead of applying it.

Use::

    with running_fake_shopify() as shop:
        adapter = ShopifyAdapter(shop_url=shop.base_url, access_token=shop.token)
        shop.misbehave("http_500", on="orderCancel")
"""

from __future__ import annotations

import base64
import copy
import hashlib
import hmac
import json
import re
import socket
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = [
    "API_VERSION",
    "LOCATION",
    "NOW",
    "SHOP_DOMAIN",
    "TOKEN",
    "FakeShopify",
    "initial_products",
    "running_fake_shopify",
]

API_VERSION = "2025-07"
TOKEN = "shpat_fake0123456789abcdef0123456789ab"
#: The fake's clock: every change it applies happens at this instant.
NOW = "2025-07-02T12:00:00Z"

CUSTOMER_ADA = "gid://shopify/Customer/544365967"
CUSTOMER_BO = "gid://shopify/Customer/624407574"

# The 401 body: https://shopify.dev/docs/api/usage/response-codes
UNAUTHORIZED = {"errors": "[API] Invalid API key or access token (unrecognized login or wrong password)"}
# A throttled GraphQL query: https://shopify.dev/docs/api/usage/limits ("Rate limits")
THROTTLED = {
    "errors": [
        {
            "message": "Throttled",
            "extensions": {"code": "THROTTLED", "documentation": "https://shopify.dev/api/usage/rate-limits"},
        }
    ],
    "extensions": {
        "cost": {
            "requestedQueryCost": 752,
            "actualQueryCost": None,
            "throttleStatus": {"maximumAvailable": 1000.0, "currentlyAvailable": 666, "restoreRate": 50.0},
        }
    },
}
UNDEFINED_FIELD = {
    "errors": [
        {
            "message": "Field 'kefu' doesn't exist on type 'Order'",
            "locations": [{"line": 3, "column": 5}],
            "path": ["query KefuOrderByName", "orders", "nodes", "kefu"],
            "extensions": {"code": "undefinedField", "typeName": "Order", "fieldName": "kefu"},
        }
    ]
}

KINDS = ("http_500", "http_429", "throttled", "graphql_error", "not_json", "http_401", "slow", "drop")


def _money(amount: str, currency: str = "EUR", presentment: str | None = None) -> dict[str, Any]:
    """A ``MoneyBag``; the presentment currency differs from the shop's when given."""
    return {
        "shopMoney": {"amount": amount, "currencyCode": currency},
        "presentmentMoney": {"amount": amount, "currencyCode": presentment or currency},
    }


def _line(sku: str | None, title: str, quantity: int, price: str, presentment: str | None = None) -> dict[str, Any]:
    return {"sku": sku, "title": title, "quantity": quantity, "originalUnitPriceSet": _money(price, "EUR", presentment)}


def _address(
    name: str, address1: str, city: str, zip_: str, country: str, address2: str | None = None
) -> dict[str, Any]:
    return {
        "name": name,
        "address1": address1,
        "address2": address2,
        "city": city,
        "zip": zip_,
        "countryCodeV2": country,
    }


def _order(
    number: int,
    numeric_id: int,
    customer: str,
    email: str,
    created: str,
    total: str,
    *,
    lines: list[dict[str, Any]],
    address: dict[str, Any],
    fulfillment_status: str = "UNFULFILLED",
    financial_status: str = "PAID",
    presentment: str | None = None,
) -> dict[str, Any]:
    """An ``Order`` node as the adapter's fragment reads it (keys starting with "_" are the
    fake's own bookkeeping and never sent)."""
    return {
        "id": f"gid://shopify/Order/{numeric_id}",
        "name": f"#{number}",
        "email": email,
        "createdAt": created,
        "processedAt": created,
        "cancelledAt": None,
        "displayFinancialStatus": financial_status,
        "displayFulfillmentStatus": fulfillment_status,
        "subtotalLineItemsQuantity": sum(line["quantity"] for line in lines),
        "customer": {"id": customer},
        "totalPriceSet": _money(total, "EUR", presentment),
        "shippingAddress": address,
        "lineItems": {"nodes": lines},
        "fulfillments": [],
        "refunds": [],
        "returns": {"nodes": []},
    }


def _fulfillment(
    status: str,
    created: str,
    *,
    tracking: list[dict[str, Any]],
    line_items: list[tuple[int, int]],
    in_transit: str | None = None,
    delivered: str | None = None,
    eta: str | None = None,
) -> dict[str, Any]:
    return {
        "createdAt": created,
        "inTransitAt": in_transit,
        "deliveredAt": delivered,
        "estimatedDeliveryAt": eta,
        "displayStatus": status,
        "trackingInfo": tracking,
        # (FulfillmentLineItem numeric id, quantity): what returnableFulfillments offers.
        "_lineItems": line_items,
    }


def _refund(created: str, amount: str, status: str, processed: str | None, currency: str = "EUR") -> dict[str, Any]:
    return {
        "createdAt": created,
        "totalRefundedSet": _money(amount, currency),
        "transactions": {"nodes": [{"kind": "REFUND", "status": status, "processedAt": processed}]},
    }


# The tracking entry of Shopify's "Receive a single Fulfillment" example.
UPS = {
    "company": "UPS",
    "number": "1Z1234512345123456",
    "url": "https://www.ups.com/WebTracking?loc=en_US&requester=ST&trackNums=1Z1234512345123456",
}
DHL = {
    "company": "DHL Express",
    "number": "1234567890",
    "url": "https://www.dhl.com/en/express/tracking.html?AWB=1234567890",
}


def initial_orders() -> list[dict[str, Any]]:
    """The shop: Ada (544365967) has #1001 placed, #1002 shipped, #1005 returned; Bo (624407574)
    has #1003 delivered (paid in GBP), #1004 cancelled and refunded, #1006 being packed."""
    ada_home = _address("Ada Lovelace", "12 Rue de Rivoli", "Paris", "75001", "FR", "Apt 4")
    bo_home = _address("Bo Andersen", "190 MacLaren", "Sudbury", "K2P0V6", "CA")

    placed = _order(
        1001,
        148977776,
        CUSTOMER_ADA,
        "ada@example.com",
        "2025-07-01T10:00:00Z",
        "59.98",
        lines=[_line("SOCK-1", "Wool socks", 2, "29.99")],
        address=ada_home,
    )
    shipped = _order(
        1002,
        450789469,
        CUSTOMER_ADA,
        "ada@example.com",
        "2025-06-20T08:30:00Z",
        "120.00",
        lines=[_line("SNOW-1", "Snowboard", 1, "120.00")],
        address=ada_home,
        fulfillment_status="FULFILLED",
    )
    shipped["fulfillments"] = [
        _fulfillment(
            "IN_TRANSIT",
            "2025-06-21T09:00:00Z",
            in_transit="2025-06-21T15:00:00Z",
            eta="2025-06-25T18:00:00Z",
            tracking=[UPS],
            line_items=[(761422146, 1)],
        )
    ]
    delivered = _order(
        1003,
        625362839,
        CUSTOMER_BO,
        "bo@example.com",
        "2025-06-10T12:00:00Z",
        "45.50",
        lines=[_line("MUG-2", "Enamel mug", 1, "20.50", "GBP"), _line(None, "Gift wrap", 1, "25.00", "GBP")],
        address=bo_home,
        fulfillment_status="FULFILLED",
        presentment="GBP",
    )
    delivered["fulfillments"] = [
        _fulfillment(
            "DELIVERED",
            "2025-06-11T09:00:00Z",
            in_transit="2025-06-11T16:00:00Z",
            delivered="2025-06-12T15:30:00Z",
            tracking=[DHL],
            # The returnRequest example's fulfillment line item, and a second one.
            line_items=[(820022594, 1), (820022595, 1)],
        )
    ]
    refunded = _order(
        1004,
        734509473,
        CUSTOMER_BO,
        "bo@example.com",
        "2025-06-01T09:00:00Z",
        "45.00",
        lines=[_line("CAP-1", "Cap", 3, "15.00")],
        address=bo_home,
        financial_status="PARTIALLY_REFUNDED",
    )
    refunded["cancelledAt"] = "2025-06-01T10:00:00Z"
    refunded["refunds"] = [
        _refund("2025-06-01T10:00:00Z", "30.00", "SUCCESS", "2025-06-01T10:00:05Z"),
        _refund("2025-06-02T08:00:00Z", "15.00", "PENDING", None),
        # A restock-only refund: no money moves.
        _refund("2025-06-02T09:00:00Z", "0.00", "SUCCESS", "2025-06-02T09:00:00Z"),
    ]
    returned = _order(
        1005,
        1073459983,
        CUSTOMER_ADA,
        "ada@example.com",
        "2025-05-10T14:00:00Z",
        "80.00",
        lines=[_line("BAG-1", "Tote bag", 2, "40.00")],
        address=ada_home,
        fulfillment_status="FULFILLED",
        financial_status="PAID",
    )
    returned["fulfillments"] = [
        _fulfillment(
            "DELIVERED",
            "2025-05-11T09:00:00Z",
            delivered="2025-05-13T11:00:00Z",
            tracking=[UPS],
            line_items=[(930011001, 2)],
        )
    ]
    returned["returns"] = {
        "nodes": [
            {
                "id": "gid://shopify/Return/945000960",
                "name": "#1005-R1",
                "status": "CLOSED",
                "createdAt": "2025-05-20T10:00:00Z",
                "totalQuantity": 2,
                "refunds": {"nodes": [{"id": "gid://shopify/Refund/943333863"}]},
            }
        ]
    }
    returned["refunds"] = [_refund("2025-05-25T10:00:00Z", "80.00", "FAILURE", "2025-05-25T10:00:03Z")]
    packed = _order(
        1006,
        1073460000,
        CUSTOMER_BO,
        "bo@example.com",
        "2025-06-30T07:00:00Z",
        "19.90",
        lines=[_line("TEA-1", "Green tea", 1, "19.90")],
        address=bo_home,
        fulfillment_status="IN_PROGRESS",
    )
    return [placed, shipped, delivered, refunded, returned, packed]


SHOP_DOMAIN = "kefu-fake.myshopify.com"
LOCATION = 24826418  # the inventory_levels/update example's location
LOCATION_2 = 24826419


def _variant(
    numeric_id: int, sku: str, price: str, options: list[tuple[str, str]], levels: dict[int, int], item: int
) -> dict[str, Any]:
    return {
        "id": f"gid://shopify/ProductVariant/{numeric_id}",
        "sku": sku,
        "price": price,
        "selectedOptions": [{"name": n, "value": v} for n, v in options],
        "_inventoryItem": item,
        "_levels": dict(levels),
    }


def _product(
    numeric_id: int,
    handle: str,
    title: str,
    description_html: str,
    variants: list[dict[str, Any]],
    *,
    tags: list[str],
    status: str = "ACTIVE",
    translations: dict[str, dict[str, str]] | None = None,
    vendor: str = "Acme",
    product_type: str = "",
) -> dict[str, Any]:
    text = re.sub(r"<[^>]+>", "", description_html)
    return {
        "id": f"gid://shopify/Product/{numeric_id}",
        "handle": handle,
        "title": title,
        "description": text,
        "status": status,
        "onlineStoreUrl": f"https://{SHOP_DOMAIN}/products/{handle}" if status == "ACTIVE" else None,
        "tags": tags,
        "featuredMedia": {"preview": {"image": {"url": f"https://cdn.shopify.com/s/files/1/{handle}.jpg"}}},
        "variants": {"nodes": variants},
        "_descriptionHtml": description_html,
        "_vendor": vendor,
        "_productType": product_type,
        "_translations": translations or {},
        "_updatedAt": "2021-12-31T19:00:00-05:00",
    }


def initial_products() -> list[dict[str, Any]]:
    """The fake shop's catalog. "Example T-Shirt" is the products/update example payload's
    product (https://shopify.dev/docs/api/webhooks?reference=toml, topic products/update: id
    788032119674292922, variants example-shirt-s/-m at 19.99, 75 and 50 in stock); "Burton
    Custom Freestyle 151" the Admin API examples' product 108828309 (one variant: Shopify's
    ``Title: Default Title``), its inventory item the inventory_levels/update example's
    271878346596884015, stocked at two locations; a draft; four fillers (a second page)."""
    shirt = _product(
        788032119674292922,
        "example-t-shirt",
        "Example T-Shirt",
        "<p>An example T-Shirt</p>",
        [
            _variant(642667041472713922, "example-shirt-s", "19.99", [("Size", "Small")], {LOCATION: 75}, 39072856),
            _variant(757650484644203962, "example-shirt-m", "19.99", [("Size", "Medium")], {LOCATION: 50}, 43729076),
        ],
        tags=["example", "mens", "t-shirt"],
        translations={"zh-CN": {"title": "示例T恤", "body_html": "<p>一件示例T恤</p>"}},
        product_type="Shirts",
    )
    burton = _product(
        108828309,
        "burton-custom-freestyle-151",
        "Burton Custom Freestyle 151",
        "<strong>Good snowboard!</strong>",
        [
            _variant(
                39072857,
                "BCF-151",
                "599.00",
                [("Title", "Default Title")],
                {LOCATION: 4, LOCATION_2: 2},
                271878346596884015,
            )
        ],
        tags=["snowboard"],
        translations={"zh-CN": {"title": "伯顿自由式151滑雪板"}},
        vendor="Burton",
    )
    draft = _product(
        912855135,
        "draft-lamp",
        "Unreleased Lamp",
        "",
        [_variant(912855136, "DRAFT-1", "10.00", [("Title", "Default Title")], {LOCATION: 1}, 912855137)],
        tags=[],
        status="DRAFT",
    )
    fillers = [
        _product(
            632910392 + i,
            f"filler-mug-{i}",
            f"Filler Mug {i}",
            "",
            [
                _variant(
                    808950810 + i, f"MUG-{i}", f"{12 + i}.00", [("Title", "Default Title")], {LOCATION: i}, 49148385 + i
                )
            ],
            tags=["mug"],
        )
        for i in range(1, 5)
    ]
    return [shirt, burton, draft, *fillers]


def _public(node: Any) -> Any:
    """``node`` without the fake's own ("_") keys, deeply copied."""
    if isinstance(node, dict):
        return {k: _public(v) for k, v in node.items() if not k.startswith("_")}
    if isinstance(node, list):
        return [_public(v) for v in node]
    return copy.deepcopy(node)


@dataclass
class _Fault:
    kind: str
    on: str | None
    times: int
    retry_after: str
    hold_s: float
    after: int = 0


class FakeShopify:
    """The fake shop and its server. Attributes: ``base_url`` (``http://127.0.0.1:PORT``),
    ``token``, ``api_version``, ``orders`` (Order nodes by gid), ``requests`` (one dict per
    request that reached the GraphQL route: ``root``, ``operation``, ``query``, ``variables``,
    ``headers``),
    ``now`` (:data:`NOW`), ``job_polls_needed`` (how many ``job`` polls until a cancellation job is done and applied;
    None: never), ``cancel_refund_status`` (the status of the refund a cancellation creates)."""

    def __init__(self, *, token: str = TOKEN, api_version: str = API_VERSION) -> None:
        self.token = token
        self.api_version = api_version
        self.now = NOW
        self.orders: dict[str, dict[str, Any]] = {o["id"]: o for o in initial_orders()}
        self.products: dict[str, dict[str, Any]] = {p["id"]: p for p in initial_products()}
        self.currency = "USD"
        self.requests: list[dict[str, Any]] = []
        self.job_polls_needed: int | None = 1
        self.cancel_refund_status = "PENDING"
        self.user_errors: dict[str, list[dict[str, Any]]] = {}
        self._faults: list[_Fault] = []
        self._jobs: dict[str, dict[str, Any]] = {}
        self._next_return = 945000961  # the returnRequest example's return id
        self._lock = threading.Lock()
        self._release = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.base_url = ""

    # ------------------------------------------------------------------ control

    def start(self) -> FakeShopify:
        fake = self

        class Handler(_Handler):
            shop = fake

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}"
        # A short poll interval: stop() (server.shutdown) waits up to one interval.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-shopify", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._release.set()  # let held ("slow") answers go
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(10)

    def misbehave(
        self,
        kind: str,
        *,
        on: str | None = None,
        times: int = 1,
        retry_after: str = "2.0",
        hold_s: float = 30.0,
        after: int = 0,
    ) -> None:
        """Make the next ``times`` requests (of root field ``on``, e.g. ``"orderCancel"``; any
        when None) fail as ``kind``: one of :data:`KINDS`, once ``after`` such requests were
        answered normally (a sync's second page). ``slow`` holds the answer for ``hold_s`` seconds
        or until the server stops; ``retry_after`` is the 429's header."""
        assert kind in KINDS, kind
        with self._lock:
            self._faults.append(_Fault(kind, on, times, retry_after, hold_s, after))

    def order(self, number: str) -> dict[str, Any]:
        """The stored node of order ``"#1001"`` (the live one: changes show)."""
        return next(o for o in self.orders.values() if o["name"] == number)

    def sent(self, root: str) -> list[dict[str, Any]]:
        """The variables of each request to root field ``root`` so far."""
        return [r["variables"] for r in self.requests if r["root"] == root]

    # ------------------------------------------------------------------ the GraphQL routes

    def _take_fault(self, root: str) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.on in (None, root):
                    if fault.after > 0:
                        fault.after -= 1
                        return None
                    fault.times -= 1
                    if fault.times <= 0:
                        self._faults.remove(fault)
                    return fault
        return None

    def answer(self, root: str, variables: dict[str, Any], query: str = "") -> dict[str, Any]:
        """The JSON body for one GraphQL request (the state lock held)."""
        handler = getattr(self, f"_{root}")
        with self._lock:
            if root in _CATALOG_ROOTS:
                return handler(variables, query)
            return handler(variables)

    # ------------------------------------------------------------------ the catalog

    def product(self, handle: str) -> dict[str, Any]:
        """The stored node of the product ``handle`` (the live one: changes show)."""
        return next(p for p in self.products.values() if p["handle"] == handle)

    def _product_node(self, product: dict[str, Any], query: str) -> dict[str, Any]:
        """``product`` as the KefuProduct fragment reads it: ``inventoryQuantity`` the sum of the
        levels, one ``translations`` list per alias the query names."""
        node = _public(product)
        for variant, stored in zip(node["variants"]["nodes"], product["variants"]["nodes"], strict=True):
            variant["inventoryQuantity"] = sum(stored["_levels"].values())
        for alias, locale in re.findall(r'(\w+)\s*:\s*translations\(locale:\s*"([^"]+)"\)', query):
            texts = product["_translations"].get(locale, {})
            node[alias] = [{"key": k, "value": v, "locale": locale} for k, v in texts.items()]
        return node

    def _shop(self, query: str) -> dict[str, Any]:
        return {"shop": {"currencyCode": self.currency}} if re.search(r"\bshop\s*\{", query) else {}

    def _products(self, v: dict[str, Any], query: str) -> dict[str, Any]:
        first = int(v.get("first") or 0)
        if not 0 < first <= 250:
            return {
                "errors": [
                    {"message": "The first argument must be between 1 and 250", "extensions": {"code": "BAD_REQUEST"}}
                ]
            }
        found = sorted(self.products.values(), key=lambda p: int(p["id"].rsplit("/", 1)[-1]))
        if re.search(r'query:\s*"status:active"', query):
            found = [p for p in found if p["status"] == "ACTIVE"]
        after = v.get("after")
        if after:
            last = json.loads(base64.b64decode(after))["last_id"]
            found = [p for p in found if int(p["id"].rsplit("/", 1)[-1]) > last]
        page = found[:first]
        end = (
            base64.b64encode(json.dumps({"last_id": int(page[-1]["id"].rsplit("/", 1)[-1])}).encode()).decode()
            if page
            else None
        )
        connection = {
            "pageInfo": {"hasNextPage": len(found) > first, "endCursor": end},
            "nodes": [self._product_node(p, query) for p in page],
        }
        return {"data": {**self._shop(query), "products": connection}}

    def _product(self, v: dict[str, Any], query: str) -> dict[str, Any]:
        product = self.products.get(v.get("id", ""))
        return {"data": {**self._shop(query), "product": self._product_node(product, query) if product else None}}

    def _inventoryItem(self, v: dict[str, Any], query: str) -> dict[str, Any]:
        for product in self.products.values():
            for variant in product["variants"]["nodes"]:
                if f"gid://shopify/InventoryItem/{variant['_inventoryItem']}" == v.get("id"):
                    return {
                        "data": {
                            "inventoryItem": {
                                "id": v["id"],
                                "variant": {"id": variant["id"], "product": {"id": product["id"]}},
                            }
                        }
                    }
        return {"data": {"inventoryItem": None}}

    # ------------------------------------------------------------------ changes and their webhooks

    def set_stock(self, sku: str, available: int, location: int = LOCATION) -> dict[str, Any]:
        """Set variant ``sku``'s available units at ``location``; the ``inventory_levels/update``
        payload Shopify sends for it (the topic's documented example shape)."""
        with self._lock:
            for product in self.products.values():
                for variant in product["variants"]["nodes"]:
                    if variant["sku"] == sku:
                        variant["_levels"][location] = available
                        item = variant["_inventoryItem"]
                        return {
                            "inventory_item_id": item,
                            "location_id": location,
                            "available": available,
                            "updated_at": "2021-12-31T19:00:00-05:00",
                            "admin_graphql_api_id": f"gid://shopify/InventoryLevel/{location}?inventory_item_id={item}",
                        }
        raise KeyError(sku)

    def update_product(self, handle: str, **fields: Any) -> dict[str, Any]:
        """Change the product ``handle``'s fields (GraphQL names: ``title``, ``status``, ``tags``...;
        a variant's ``price`` as ``price_of={sku: "24.00"}``); the ``products/update`` payload."""
        with self._lock:
            product = next(p for p in self.products.values() if p["handle"] == handle)
            for sku, price in (fields.pop("price_of", None) or {}).items():
                next(x for x in product["variants"]["nodes"] if x["sku"] == sku)["price"] = price
            product.update(fields)
            return self.product_payload(product)

    def delete_product(self, handle: str) -> dict[str, Any]:
        """Delete the product ``handle``; the ``products/delete`` payload (its numeric id only)."""
        with self._lock:
            product = next(p for p in self.products.values() if p["handle"] == handle)
            del self.products[product["id"]]
            return {"id": int(product["id"].rsplit("/", 1)[-1])}

    def product_payload(self, product: dict[str, Any]) -> dict[str, Any]:
        """``product`` in the REST shape of the ``products/update`` webhook's documented example."""
        numeric = int(product["id"].rsplit("/", 1)[-1])
        options: dict[str, list[str]] = {}
        variants = []
        for position, v in enumerate(product["variants"]["nodes"]):
            values = [o["value"] for o in v["selectedOptions"]] + [None, None, None]
            for o in v["selectedOptions"]:
                options.setdefault(o["name"], []).append(o["value"])
            vid = int(v["id"].rsplit("/", 1)[-1])
            quantity = sum(v["_levels"].values())
            variants.append(
                {
                    "admin_graphql_api_id": v["id"],
                    "barcode": None,
                    "compare_at_price": None,
                    "created_at": None,
                    "id": vid,
                    "inventory_policy": "deny",
                    "position": position,
                    "price": v["price"],
                    "product_id": numeric,
                    "sku": v["sku"],
                    "taxable": True,
                    "title": " / ".join(o["value"] for o in v["selectedOptions"]),
                    "updated_at": None,
                    "option1": values[0],
                    "option2": values[1],
                    "option3": values[2],
                    "image_id": None,
                    "inventory_item_id": v["_inventoryItem"],
                    "inventory_quantity": quantity,
                    "old_inventory_quantity": quantity,
                }
            )
        return {
            "admin_graphql_api_id": product["id"],
            "body_html": product["_descriptionHtml"],
            "created_at": None,
            "handle": product["handle"],
            "id": numeric,
            "product_type": product["_productType"],
            "published_at": "2021-12-31T19:00:00-05:00",
            "template_suffix": None,
            "title": product["title"],
            "updated_at": product["_updatedAt"],
            "vendor": product["_vendor"],
            "status": product["status"].lower(),
            "published_scope": "web",
            "tags": ", ".join(product["tags"]),
            "variants": variants,
            "options": [
                {"name": name, "id": numeric * 10 + i, "product_id": numeric, "position": i + 1, "values": values}
                for i, (name, values) in enumerate(options.items())
            ],
            "images": [],
            "image": None,
            "media": [],
            "variant_gids": [
                {"admin_graphql_api_id": v["id"], "updated_at": None} for v in product["variants"]["nodes"]
            ],
        }

    def webhook(
        self, topic: str, payload: dict[str, Any], secret: str, *, webhook_id: str | None = None
    ) -> tuple[bytes, dict[str, str]]:
        """One delivery as Shopify makes it: ``(raw JSON body, headers)``, signed with ``secret``
        (``X-Shopify-Hmac-Sha256``: base64 of the body's HMAC-SHA256). ``webhook_id``: the same
        id for a retry or a replay (a new one by default)."""
        body = json.dumps(payload, separators=(",", ":")).encode()
        digest = base64.b64encode(hmac.new(secret.encode(), body, hashlib.sha256).digest()).decode()
        return body, {
            "X-Shopify-Topic": topic,
            "X-Shopify-Hmac-Sha256": digest,
            "X-Shopify-Shop-Domain": SHOP_DOMAIN,
            "X-Shopify-API-Version": self.api_version,
            "X-Shopify-Webhook-Id": webhook_id or str(uuid.uuid4()),
            "X-Shopify-Triggered-At": "2021-12-31T19:00:00.000000000Z",
            "X-Shopify-Event-Id": str(uuid.uuid4()),
        }

    def _orderCancel(self, v: dict[str, Any]) -> dict[str, Any]:
        override = self.user_errors.pop("orderCancel", None)
        order = self.orders.get(v.get("orderId", ""))
        errors = override
        if errors is None and order is None:
            errors = [{"field": ["orderId"], "message": "Order does not exist", "code": "NOT_FOUND"}]
        elif errors is None and order is not None and order["cancelledAt"]:
            errors = [{"field": ["orderId"], "message": "Order has already been cancelled", "code": "INVALID"}]
        elif errors is None and order is not None and order["fulfillments"]:
            errors = [{"field": ["orderId"], "message": "Cannot cancel an order with fulfillments", "code": "INVALID"}]
        if errors:
            return {"data": {"orderCancel": {"job": None, "orderCancelUserErrors": errors}}}
        job_id = f"gid://shopify/Job/1fb9ff6d-d99c-49cf-80c5-{len(self._jobs):012x}"
        self._jobs[job_id] = {"order": v["orderId"], "polls": 0, "done": False}
        return {"data": {"orderCancel": {"job": {"id": job_id, "done": False}, "orderCancelUserErrors": []}}}

    def _job(self, v: dict[str, Any]) -> dict[str, Any]:
        job = self._jobs.get(v.get("id", ""))
        if job is None:
            return {"data": {"job": None}}
        job["polls"] += 1
        if not job["done"] and self.job_polls_needed is not None and job["polls"] >= self.job_polls_needed:
            job["done"] = True
            order = self.orders[job["order"]]
            order["cancelledAt"] = NOW
            order["displayFinancialStatus"] = "REFUNDED"
            order["refunds"].append(
                _refund(NOW, order["totalPriceSet"]["shopMoney"]["amount"], self.cancel_refund_status, None)
            )
        return {"data": {"job": {"id": v["id"], "done": job["done"]}}}

    def _returnableFulfillments(self, v: dict[str, Any]) -> dict[str, Any]:
        order = self.orders.get(v.get("orderId", ""))
        nodes = []
        if order is not None and order["displayFulfillmentStatus"] == "FULFILLED":
            requested = self._returned_quantities(order)
            for i, f in enumerate(order["fulfillments"]):
                if f["displayStatus"] not in ("DELIVERED", "PICKED_UP"):
                    continue
                items = [
                    {"quantity": q - requested.get(line_id, 0), "fulfillmentLineItem": {"id": line_id}}
                    for line_id, q in ((f"gid://shopify/FulfillmentLineItem/{n}", q) for n, q in f["_lineItems"])
                    if q - requested.get(line_id, 0) > 0
                ]
                if items:
                    nodes.append(
                        {
                            "id": f"gid://shopify/ReturnableFulfillment/{order['id'].rsplit('/', 1)[-1]}{i}",
                            "returnableFulfillmentLineItems": {"nodes": items},
                        }
                    )
        return {"data": {"returnableFulfillments": {"nodes": nodes}}}

    @staticmethod
    def _returned_quantities(order: dict[str, Any]) -> dict[str, int]:
        quantities: dict[str, int] = {}
        for r in order["returns"]["nodes"]:
            if r["status"] in ("CANCELED", "DECLINED"):
                continue
            for line_id, q in r.get("_lineItems", []):
                quantities[line_id] = quantities.get(line_id, 0) + q
        return quantities

    def _returnRequest(self, v: dict[str, Any]) -> dict[str, Any]:
        override = self.user_errors.pop("returnRequest", None)
        data = v.get("input") or {}
        order = self.orders.get(data.get("orderId", ""))
        errors = override or []
        lines = data.get("returnLineItems") or []
        if not errors and order is None:
            errors = [{"field": ["input", "orderId"], "message": "Order does not exist", "code": "NOT_FOUND"}]
        elif not errors and not lines:
            errors = [{"field": ["input", "returnLineItems"], "message": "can't be blank", "code": "BLANK"}]
        if not errors and order is not None:
            returnable = {
                item["fulfillmentLineItem"]["id"]: item["quantity"]
                for node in self._returnableFulfillments({"orderId": order["id"]})["data"]["returnableFulfillments"][
                    "nodes"
                ]
                for item in node["returnableFulfillmentLineItems"]["nodes"]
            }
            for i, line in enumerate(lines):
                if line.get("quantity", 0) > returnable.get(line.get("fulfillmentLineItemId"), 0):
                    errors.append(
                        {
                            "field": ["input", "returnLineItems", str(i), "quantity"],
                            "message": "Quantity is greater than the returnable quantity",
                            "code": "GREATER_THAN",
                        }
                    )
        if errors:
            return {"data": {"returnRequest": {"return": None, "userErrors": errors}}}
        assert order is not None
        return_id = self._next_return
        self._next_return += 1
        node = {
            "id": f"gid://shopify/Return/{return_id}",
            "name": f"{order['name']}-R{len(order['returns']['nodes']) + 1}",
            "status": "REQUESTED",
            "createdAt": NOW,
            "totalQuantity": sum(line["quantity"] for line in lines),
            "refunds": {"nodes": []},
            "_lineItems": [(line["fulfillmentLineItemId"], line["quantity"]) for line in lines],
        }
        order["returns"]["nodes"].append(node)
        return {"data": {"returnRequest": {"return": _public(node), "userErrors": []}}}

    def _orderUpdate(self, v: dict[str, Any]) -> dict[str, Any]:
        override = self.user_errors.pop("orderUpdate", None)
        data = v.get("input") or {}
        order = self.orders.get(data.get("id", ""))
        errors = override or []
        address = data.get("shippingAddress")
        if not errors and order is None:
            errors = [{"field": ["id"], "message": "Order does not exist"}]
        elif not errors and isinstance(address, dict) and not re.fullmatch("[A-Z]{2}", address.get("countryCode", "")):
            errors = [{"field": ["shippingAddress", "countryCode"], "message": "Country is invalid"}]
        if errors:
            return {"data": {"orderUpdate": {"order": None, "userErrors": errors}}}
        assert order is not None
        if isinstance(address, dict):
            name = " ".join(p for p in (address.get("firstName"), address.get("lastName")) if p)
            order["shippingAddress"] = _address(
                name,
                address.get("address1", ""),
                address.get("city", ""),
                address.get("zip", ""),
                address.get("countryCode", ""),
                address.get("address2") or None,
            )
        return {"data": {"orderUpdate": {"order": _public(order), "userErrors": []}}}

    def _customer(self, v: dict[str, Any]) -> dict[str, Any]:
        customer_id = v.get("customerId", "")
        mine = [o for o in self.orders.values() if o["customer"]["id"] == customer_id]
        if not mine:  # Shopify answers null for an unknown customer
            return {"data": {"customer": None}}
        mine.sort(key=lambda o: o["processedAt"], reverse=True)
        return {"data": {"customer": {"orders": {"nodes": _public(mine[: int(v.get("first", 10))])}}}}

    def _orders(self, v: dict[str, Any]) -> dict[str, Any]:
        # Shopify's search syntax, for the one filter the adapter uses: name:"#1001" or name:#1001.
        match = re.fullmatch(r'name:(?:"((?:[^"\\]|\\.)*)"|(\S+))', v.get("search", "").strip())
        if match is None:
            return {"data": {"orders": {"nodes": []}}}
        wanted = (match.group(1) if match.group(1) is not None else match.group(2)).replace('\\"', '"').casefold()
        # Like Shopify's search, a prefix matches too ("#100" finds #1001): the adapter must pick.
        found = [o for o in self.orders.values() if o["name"].casefold().startswith(wanted)]
        found.sort(key=lambda o: o["name"])
        return {"data": {"orders": {"nodes": _public(found[:5])}}}


# Root fields, the mutations first (an orderUpdate payload also names "order {").
_ROOTS = (
    "orderCancel",
    "returnRequest",
    "orderUpdate",
    "returnableFulfillments",
    "job",
    "customer",
    "orders",
    "products",
    "product",
    "inventoryItem",
)
# The catalog's roots: their answers depend on the query text too (aliases, filters, shop).
_CATALOG_ROOTS = ("products", "product", "inventoryItem")


def _root_of(query: str) -> str | None:
    for root in _ROOTS:
        if re.search(rf"\b{root}\s*\(", query):
            return root
    return None


class _Handler(BaseHTTPRequestHandler):
    shop: FakeShopify
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None, raw: bytes | None = None) -> None:
        data = raw if raw is not None else json.dumps(body, default=str).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/html" if raw is not None else "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Shopify-API-Version", self.shop.api_version)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        try:
            self.wfile.write(data)
        except OSError:  # the client gave up (a slow answer)
            self.close_connection = True

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if self.path != f"/admin/api/{self.shop.api_version}/graphql.json":
            self._send(404, {"errors": "Not Found"})
            return
        if self.headers.get("X-Shopify-Access-Token") != self.shop.token:
            self._send(401, UNAUTHORIZED)
            return
        try:
            body = json.loads(raw)
            query = body["query"]
            variables = body.get("variables") or {}
        except (ValueError, KeyError, TypeError):
            self._send(400, {"errors": {"query": "Required parameter missing or invalid"}})
            return
        root = _root_of(query)
        if root is None:
            self._send(200, UNDEFINED_FIELD)
            return
        self.shop.requests.append(
            {
                "root": root,
                "operation": body.get("operationName"),
                "query": query,
                "variables": variables,
                "headers": dict(self.headers.items()),
            }
        )
        fault = self.shop._take_fault(root)
        if fault is not None and self._misbehave(fault):
            return
        self._send(200, self.shop.answer(root, variables, query))

    def _misbehave(self, fault: _Fault) -> bool:
        """Answer (or not) as ``fault`` says; True once the request is dealt with."""
        if fault.kind == "http_500":
            self._send(500, {"errors": "Internal Server Error"})
        elif fault.kind == "http_429":
            self._send(
                429,
                {
                    "errors": "Exceeded 2 calls per second for api client. Reduce request rates to resume uninterrupted service."
                },
                {"Retry-After": fault.retry_after},
            )
        elif fault.kind == "throttled":
            self._send(200, THROTTLED)
        elif fault.kind == "graphql_error":
            self._send(200, UNDEFINED_FIELD)
        elif fault.kind == "not_json":
            # A proxy or captive portal in the way: HTTP 200, but HTML.
            self._send(200, None, raw=b"<html><body><h1>Please sign in</h1></body></html>")
        elif fault.kind == "http_401":
            self._send(401, UNAUTHORIZED)
        elif fault.kind == "slow":
            self.shop._release.wait(fault.hold_s)
            self.close_connection = True  # the client is gone (or the server stops): no answer
        elif fault.kind == "drop":
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        return True


@contextmanager
def running_fake_shopify(**kwargs: Any) -> Iterator[FakeShopify]:
    """A started :class:`FakeShopify`, stopped on exit."""
    shop = FakeShopify(**kwargs).start()
    try:
        yield shop
    finally:
        shop.stop()
