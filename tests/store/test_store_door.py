"""The store part's door (store/services.py), its rules tested on both adapters.

Every test runs twice through the ``door`` fixture: once on the demo adapter (kefu's own
``DemoOrder`` table, loaded with ``load_demo_orders --reset``), once on the Shopify adapter against
the local fake Admin GraphQL server (tests/store/shopify_fake.py). The door is configured the way
the app configures it, through ``KEFU_STORE_ADAPTER``/``KEFU_STORE_OPTIONS``.

What is checked, with exact values: each action found / not found / not allowed / failing
upstream, and what it left in the store and in the audit log (``StoreCall``: one row per store
call, two for a change, never an e-mail address); that someone else's order is "not found" exactly
like a number that does not exist; that an idempotency key changes an order once and a failed
change frees it; the confirm store (``pending_*``); the orders a conversation proved
(``order_remember``/``orders_known``); and ``address_from_dict``.
"""

from __future__ import annotations

import copy
import re
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import DatabaseError
from django.utils import timezone

from store import services
from store.models import DemoOrder, KnownOrder, PendingAction, StoreCall
from store.services import (
    ActionResult,
    Actor,
    Pending,
    action_run,
    address_from_dict,
    conversations_forget,
    order_remember,
    order_view,
    orders_known,
    orders_list,
    pending_drop,
    pending_offer,
    pending_peek,
    pending_take,
    store_adapter,
)
from store.types import Address, Owner, StoreError

HERE = Path(__file__).resolve().parent

pytestmark = pytest.mark.django_db(transaction=True)

CONVERSATION = uuid.UUID("0b7a3c1e-5d2f-4e8a-9c6b-1f0e2d3c4b5a")
BOT = Actor()
AGENT = Actor(kind="agent", name="lin", purpose="console", conversation_id=CONVERSATION, message_id=42)
CONFIRM = Actor(kind="bot", purpose="confirm", conversation_id=CONVERSATION, message_id=7)

NOT_FOUND = "no such order for this shopper"
NEXT_VERIFIED = "Check the order number: I can only see orders placed with your account."
NEXT_ANONYMOUS = "Reply with the order number and the e-mail address the order was placed with."

# What a shopper asks for as a new address, and what the door makes of it.
NEW_ADDRESS_IN = {"name": " Pat Doe ", "line1": "5 Avenue Foch", "city": "Lyon", "postcode": "69006", "country": "fr"}
NEW_ADDRESS = Address(name="Pat Doe", line1="5 Avenue Foch", line2="", city="Lyon", postcode="69006", country="FR")

MUTATION_ROOTS = ("orderCancel", "returnRequest", "orderUpdate")
# The Shopify root field and GraphQL operation of each change.
SHOPIFY_CHANGE = {
    "cancel": ("orderCancel", "KefuOrderCancel"),
    "return": ("returnRequest", "KefuReturnRequest"),
    "change_address": ("orderUpdate", "KefuOrderUpdate"),
}


@dataclass(frozen=True)
class Known:
    """An order of the store the tests use: its number and whose it is."""

    number: str
    customer_id: str
    email: str

    @property
    def owner(self) -> Owner:
        return Owner(customer_id=self.customer_id)

    @property
    def anonymous(self) -> Owner:
        return Owner(email=self.email)


@dataclass
class Door:
    """The door configured on one adapter, and the facts of that adapter's store.

    ``a``/``b``: the two customers' ids (``a`` owns the placed and the shipped order, ``b`` does
    not); ``orders``: one order per status (``placed``, ``shipped``, ``delivered``,
    ``cancelled``: cancelled with a refund); ``missing``: a number that does not exist;
    ``lists``: each customer's orders as ``orders_list`` gives them; the rest: values the
    tests compare exactly."""

    kind: str
    a: str
    b: str
    orders: dict[str, Known]
    missing: str
    lists: dict[str, list[str]]
    tracking_number: str
    cancelled_refunds: tuple[tuple[Decimal, str, str], ...]
    placed_total: Decimal
    not_allowed: dict[str, tuple[str, str]]
    emails: tuple[str, ...]
    monkeypatch: pytest.MonkeyPatch
    fake: Any = None
    _broken: list[Callable[[], None]] = field(default_factory=list)

    # ------------------------------------------------------------------ the store's own state

    def state(self) -> Any:
        """Everything the store holds, deeply copied: compared before/after to show nothing
        changed."""
        if self.kind == "demo":
            return list(DemoOrder.objects.order_by("number").values())
        return copy.deepcopy(self.fake.orders)

    def mutations(self) -> list[str]:
        """The changes sent to Shopify so far (root fields); always [] for the demo store, which
        changes its rows in place (see ``state``)."""
        if self.kind == "demo":
            return []
        return [r["root"] for r in self.fake.requests if r["root"] in MUTATION_ROOTS]

    def requests(self) -> list[str]:
        """Requests the adapter sent (Shopify); [] for the demo store."""
        return [] if self.kind == "demo" else [r["root"] for r in self.fake.requests]

    # ------------------------------------------------------------------ failures on demand

    def fail_reads(self) -> str:
        """Make the next read of the store fail; the message the adapter's ``upstream`` error
        carries."""
        if self.kind == "demo":
            self.monkeypatch.setattr("store.adapters.demo.DemoOrder", _broken_model({"filter"}))
            return "demo orders unavailable: DatabaseError"
        self.fake.misbehave("http_500")
        return "Shopify failed on KefuOrderByName (HTTP 500)"

    def fail_list(self) -> str:
        if self.kind == "demo":
            self.monkeypatch.setattr("store.adapters.demo.DemoOrder", _broken_model({"filter"}))
            return "demo orders unavailable: DatabaseError"
        self.fake.misbehave("http_500", on="customer")
        return "Shopify failed on KefuCustomerOrders (HTTP 500)"

    def fail_change(self, action: str) -> str:
        """Make the next change (``action``) fail in the store while reads still work; the
        message of the adapter's ``upstream`` error."""
        if self.kind == "demo":
            # Reads use DemoOrder.objects.filter, changes lock the row with select_for_update().
            self.monkeypatch.setattr("store.adapters.demo.DemoOrder", _broken_model({"select_for_update"}))
            return "demo orders unavailable: DatabaseError"
        root, operation = SHOPIFY_CHANGE[action]
        self.fake.misbehave("http_500", on=root)
        return f"Shopify failed on {operation} (HTTP 500)"

    def mend(self) -> None:
        """The store works again (the demo's broken model is put back; a Shopify fault is used
        up by the one request it failed)."""
        if self.kind == "demo":
            self.monkeypatch.setattr("store.adapters.demo.DemoOrder", DemoOrder)


def _broken_model(broken: set[str]) -> Any:
    """A stand-in for ``DemoOrder`` in the demo adapter's module whose manager raises
    ``DatabaseError`` from the named methods (and is the real one otherwise)."""

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise DatabaseError("database disk image is malformed")

    class Manager:
        def __getattr__(self, name: str) -> Any:
            return fail if name in broken else getattr(DemoOrder.objects, name)

    class Model:
        objects = Manager()

    return Model


def _demo_door(monkeypatch: pytest.MonkeyPatch) -> Door:
    mei = ("demo-mei", "mei.chen@example.com")
    sam = ("demo-sam", "sam.okafor@example.com")
    return Door(
        kind="demo",
        a=mei[0],
        b=sam[0],
        orders={
            "placed": Known("KF-1002", *mei),
            "shipped": Known("KF-1001", *mei),
            "delivered": Known("KF-1003", *mei),
            "cancelled": Known("KF-1004", *sam),
        },
        missing="KF-9999",
        lists={mei[0]: ["KF-1002", "KF-1001", "KF-1003"], sam[0]: ["KF-1005", "KF-1004"]},
        tracking_number="JD014600006281230981",
        cancelled_refunds=((Decimal("56.00"), "EUR", "succeeded"),),
        placed_total=Decimal("129.00"),
        not_allowed={
            "cancel": ("KF-1001", "order is shipped, only a placed order can be cancelled"),
            "return": ("KF-1002", "no return possible: order is placed"),
            "change_address": ("KF-1001", "order is shipped, only a placed order can be redirected"),
        },
        emails=(mei[1], sam[1]),
        monkeypatch=monkeypatch,
    )


def _shopify_door(monkeypatch: pytest.MonkeyPatch, fake: Any) -> Door:
    ada = ("544365967", "ada@example.com")
    bo = ("624407574", "bo@example.com")
    return Door(
        kind="shopify",
        a=ada[0],
        b=bo[0],
        orders={
            "placed": Known("#1001", *ada),
            "shipped": Known("#1002", *ada),
            "delivered": Known("#1003", *bo),
            "cancelled": Known("#1004", *bo),
        },
        missing="#9999",
        lists={ada[0]: ["#1001", "#1002", "#1005"], bo[0]: ["#1006", "#1003", "#1004"]},
        tracking_number="1Z1234512345123456",
        cancelled_refunds=((Decimal("30.00"), "EUR", "succeeded"), (Decimal("15.00"), "EUR", "pending")),
        placed_total=Decimal("59.98"),
        not_allowed={
            "cancel": ("#1002", "Shopify order #1002 is shipped: only an order not yet packed can be cancelled"),
            "return": ("#1001", "Shopify order #1001 is placed: a return can be opened once it is delivered"),
            "change_address": (
                "#1002",
                "Shopify order #1002 is shipped: the address can only change before it is packed",
            ),
        },
        emails=(ada[1], bo[1]),
        monkeypatch=monkeypatch,
        fake=fake,
    )


@pytest.fixture(params=["demo", "shopify"])
def door(request: Any, settings: Any, monkeypatch: pytest.MonkeyPatch, transactional_db: Any) -> Iterator[Door]:
    """The door on the demo adapter or on the Shopify adapter (against a fresh fake shop)."""
    settings.KEFU_STORE_CONFIRM_TTL_S = 900
    if request.param == "demo":
        settings.KEFU_STORE_ADAPTER = "demo"
        settings.KEFU_STORE_OPTIONS = {}
        call_command("load_demo_orders", "--reset", verbosity=0)
        yield _demo_door(monkeypatch)
        services._adapter.cache_clear()
        return
    if str(HERE) not in sys.path:  # imported as test_shopify_adapter.py imports it
        sys.path.insert(0, str(HERE))
    from shopify_fake import running_fake_shopify

    with running_fake_shopify() as fake:
        settings.KEFU_STORE_ADAPTER = "shopify"
        # A generous budget: the fake answers at once, a loaded machine may not.
        settings.KEFU_STORE_OPTIONS = {"shop_url": fake.base_url, "access_token": fake.token, "timeout_s": 20.0}
        adapter = store_adapter()
        try:
            yield _shopify_door(monkeypatch, fake)
        finally:
            adapter.close()  # type: ignore[attr-defined]
            services._adapter.cache_clear()


# ---------------------------------------------------------------------------------------------
# The audit log
# ---------------------------------------------------------------------------------------------


def calls() -> list[tuple[Any, ...]]:
    """The audit rows, oldest first: (adapter, actor, actor_name, purpose, action, order_number,
    conversation_id, message_id, outcome, idempotency_key)."""
    return [
        (
            c.adapter,
            c.actor,
            c.actor_name,
            c.purpose,
            c.action,
            c.order_number,
            c.conversation_id,
            c.message_id,
            c.outcome,
            c.idempotency_key,
        )
        for c in StoreCall.objects.order_by("id")
    ]


def call(
    door: Door, action: str, number: str, outcome: str, key: str | None = None, actor: Actor = BOT
) -> tuple[Any, ...]:
    """One expected audit row (see :func:`calls`)."""
    return (
        door.kind,
        actor.kind,
        actor.name,
        actor.purpose,
        action,
        number,
        actor.conversation_id,
        actor.message_id,
        outcome,
        key,
    )


def details() -> list[str]:
    return list(StoreCall.objects.order_by("id").values_list("detail", flat=True))


def assert_no_email_in_audit(door: Door) -> None:
    """No audit row holds an e-mail address (nor any part of the new address)."""
    rows = list(StoreCall.objects.values())
    assert rows
    for row in rows:
        for value in row.values():
            text = str(value).casefold()
            assert "@" not in text, row
            for personal in (*door.emails, "pat doe", "avenue foch"):
                assert personal.casefold() not in text, row


def expect_error(fn: Callable[[], Any]) -> StoreError:
    with pytest.raises(StoreError) as caught:
        fn()
    return caught.value


def arguments_for(action: str) -> dict[str, Any] | None:
    return {"address": dict(NEW_ADDRESS_IN)} if action == "change_address" else None


# ---------------------------------------------------------------------------------------------
# Found: the right order, and for a change, the store really changed
# ---------------------------------------------------------------------------------------------


def test_status_of_a_shipped_order(door: Door) -> None:
    shipped = door.orders["shipped"]
    result = action_run(shipped.owner, "status", shipped.number, actor=AGENT)
    assert result.action == "status" and not result.repeated and result.return_request is None
    order = result.order
    assert order is not None
    assert (order.number, order.customer_id, order.email, order.status) == (
        shipped.number,
        door.a,
        shipped.email,
        "shipped",
    )
    assert [s.tracking_number for s in order.shipments] == [door.tracking_number]
    assert calls() == [call(door, "status", shipped.number, "ok", actor=AGENT)]
    assert StoreCall.objects.get().latency_ms is not None
    assert_no_email_in_audit(door)


def test_order_view_names_the_action_it_was_asked_for(door: Door) -> None:
    cancelled = door.orders["cancelled"]
    order = order_view(cancelled.owner, cancelled.number, actor=BOT, action="refund_status")
    assert (order.number, order.status) == (cancelled.number, "cancelled")
    assert calls() == [call(door, "refund_status", cancelled.number, "ok")]


def test_refund_status_of_a_cancelled_order(door: Door) -> None:
    cancelled = door.orders["cancelled"]
    result = action_run(cancelled.owner, "refund_status", cancelled.number, actor=BOT)
    assert result.action == "refund_status" and not result.repeated
    assert result.order is not None
    assert (result.order.number, result.order.status, result.order.customer_id) == (
        cancelled.number,
        "cancelled",
        door.b,
    )
    assert tuple((r.amount, r.currency, r.status) for r in result.order.refunds) == door.cancelled_refunds
    assert calls() == [call(door, "refund_status", cancelled.number, "ok")]
    assert_no_email_in_audit(door)


def test_cancel_a_placed_order(door: Door) -> None:
    placed = door.orders["placed"]
    result = action_run(placed.owner, "cancel", placed.number, actor=CONFIRM, idempotency_key="cancel-1")
    assert result.action == "cancel" and not result.repeated and result.return_request is None
    assert result.order is not None
    assert (result.order.number, result.order.status) == (placed.number, "cancelled")
    assert [(r.amount, r.currency, r.status, r.processed_at) for r in result.order.refunds] == [
        (door.placed_total, "EUR", "pending", None)
    ]
    if door.kind == "demo":
        row = DemoOrder.objects.get(number=placed.number)
        assert row.status == "cancelled"
        assert [(r["amount"], r["status"]) for r in row.refunds] == [("129.00", "pending")]
    else:
        node = door.fake.order(placed.number)
        assert node["cancelledAt"] == door.fake.now
        assert node["displayFinancialStatus"] == "REFUNDED"
        assert door.fake.sent("orderCancel") == [
            {
                "orderId": "gid://shopify/Order/148977776",
                "reason": "CUSTOMER",
                "staffNote": "Cancelled through kefu (kefu ref cancel-1)",
            }
        ]
    assert calls() == [
        call(door, "cancel", placed.number, "ok", actor=CONFIRM),
        call(door, "cancel", placed.number, "ok", "cancel-1", actor=CONFIRM),
    ]
    assert StoreCall.objects.get(idempotency_key="cancel-1").latency_ms is not None
    assert_no_email_in_audit(door)


def test_return_a_delivered_order(door: Door) -> None:
    delivered = door.orders["delivered"]
    result = action_run(delivered.owner, "return", delivered.number, actor=BOT, idempotency_key="return-1")
    assert result.action == "return" and result.order is None and not result.repeated
    returned = result.return_request
    assert returned is not None and returned.status == "requested"
    if door.kind == "demo":
        assert re.fullmatch(r"R-[0-9A-F]{8}", returned.return_id)
        row = DemoOrder.objects.get(number=delivered.number)
        assert [(r["return_id"], r["status"]) for r in row.returns] == [(returned.return_id, "requested")]
        assert row.status == "delivered"
    else:
        assert returned.return_id == "#1003-R1"
        assert returned.created_at == datetime(2025, 7, 2, 12, 0, tzinfo=UTC)
        nodes = door.fake.order(delivered.number)["returns"]["nodes"]
        assert [(n["name"], n["status"]) for n in nodes] == [("#1003-R1", "REQUESTED")]
        assert door.fake.sent("returnRequest") == [
            {
                "input": {
                    "orderId": "gid://shopify/Order/625362839",
                    "returnLineItems": [
                        {
                            "fulfillmentLineItemId": "gid://shopify/FulfillmentLineItem/820022594",
                            "quantity": 1,
                            "returnReason": "UNKNOWN",
                        },
                        {
                            "fulfillmentLineItemId": "gid://shopify/FulfillmentLineItem/820022595",
                            "quantity": 1,
                            "returnReason": "UNKNOWN",
                        },
                    ],
                }
            }
        ]
    # Seen from the door afterwards: the return is open.
    after = order_view(delivered.owner, delivered.number, actor=BOT)
    assert [(r.return_id, r.status) for r in after.returns] == [(returned.return_id, "requested")]
    assert not after.returnable
    assert calls() == [
        call(door, "return", delivered.number, "ok"),
        call(door, "return", delivered.number, "ok", "return-1"),
        call(door, "status", delivered.number, "ok"),
    ]
    assert_no_email_in_audit(door)


def test_change_the_address_of_a_placed_order(door: Door) -> None:
    placed = door.orders["placed"]
    result = action_run(
        placed.owner,
        "change_address",
        placed.number,
        actor=AGENT,
        idempotency_key="address-1",
        arguments={"address": dict(NEW_ADDRESS_IN)},
    )
    assert result.action == "change_address" and not result.repeated
    assert result.order is not None
    assert (result.order.number, result.order.status) == (placed.number, "placed")
    assert result.order.shipping_address == NEW_ADDRESS
    if door.kind == "demo":
        assert DemoOrder.objects.get(number=placed.number).shipping_address == {
            "name": "Pat Doe",
            "line1": "5 Avenue Foch",
            "line2": "",
            "city": "Lyon",
            "postcode": "69006",
            "country": "FR",
        }
    else:
        assert door.fake.order(placed.number)["shippingAddress"] == {
            "name": "Pat Doe",
            "address1": "5 Avenue Foch",
            "address2": None,
            "city": "Lyon",
            "zip": "69006",
            "countryCodeV2": "FR",
        }
        assert door.fake.sent("orderUpdate") == [
            {
                "input": {
                    "id": "gid://shopify/Order/148977776",
                    "shippingAddress": {
                        "firstName": "Pat",
                        "lastName": "Doe",
                        "address1": "5 Avenue Foch",
                        "address2": "",
                        "city": "Lyon",
                        "zip": "69006",
                        "countryCode": "FR",
                    },
                }
            }
        ]
    assert order_view(placed.owner, placed.number, actor=BOT).shipping_address == NEW_ADDRESS
    assert calls() == [
        call(door, "change_address", placed.number, "ok", actor=AGENT),
        call(door, "change_address", placed.number, "ok", "address-1", actor=AGENT),
        call(door, "status", placed.number, "ok"),
    ]
    assert_no_email_in_audit(door)


# ---------------------------------------------------------------------------------------------
# Not found, not allowed, upstream
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("action", ["status", "refund_status", "cancel", "return", "change_address"])
def test_a_number_that_does_not_exist_is_not_found(door: Door, action: str) -> None:
    before = door.state()
    error = expect_error(
        lambda: action_run(
            Owner(customer_id=door.a),
            action,
            door.missing,
            actor=BOT,
            idempotency_key="nf-1",
            arguments=arguments_for(action),
        )
    )
    assert (error.code, error.message, error.next_step, error.permanent) == (
        "not_found",
        NOT_FOUND,
        NEXT_VERIFIED,
        True,
    )
    assert door.state() == before and door.mutations() == []
    assert calls() == [call(door, action, door.missing, "not_found")]
    assert_no_email_in_audit(door)


@pytest.mark.parametrize("action", ["cancel", "return", "change_address"])
def test_a_change_the_orders_state_forbids_is_not_allowed(door: Door, action: str) -> None:
    number, message = door.not_allowed[action]
    before = door.state()
    error = expect_error(
        lambda: action_run(
            Owner(customer_id=door.a),
            action,
            number,
            actor=AGENT,
            idempotency_key="na-1",
            arguments=arguments_for(action),
        )
    )
    assert (error.code, error.message, error.permanent) == ("not_allowed", message, True)
    assert door.state() == before and door.mutations() == []
    # The lookup, and the change refused (its key freed).
    assert calls() == [
        call(door, action, number, "ok", actor=AGENT),
        call(door, action, number, "not_allowed", actor=AGENT),
    ]
    assert details() == ["", message]
    assert_no_email_in_audit(door)


@pytest.mark.parametrize("action", ["status", "refund_status", "cancel", "return", "change_address"])
def test_a_store_failing_on_the_lookup_is_upstream(door: Door, action: str) -> None:
    placed = door.orders["placed"]
    before = door.state()
    message = door.fail_reads()
    error = expect_error(
        lambda: action_run(
            placed.owner,
            action,
            placed.number,
            actor=BOT,
            idempotency_key="up-1",
            arguments=arguments_for(action),
        )
    )
    assert (error.code, error.message, error.permanent) == ("upstream", message, False)
    door.mend()
    assert door.state() == before and door.mutations() == []
    assert calls() == [call(door, action, placed.number, "upstream")]
    assert details() == [message]
    assert_no_email_in_audit(door)


@pytest.mark.parametrize("action", ["cancel", "return", "change_address"])
def test_a_store_failing_on_the_change_is_upstream_and_frees_the_key(door: Door, action: str) -> None:
    known = door.orders["delivered" if action == "return" else "placed"]
    before = door.state()
    message = door.fail_change(action)
    error = expect_error(
        lambda: action_run(
            known.owner,
            action,
            known.number,
            actor=CONFIRM,
            idempotency_key="up-2",
            arguments=arguments_for(action),
        )
    )
    assert (error.code, error.message, error.permanent) == ("upstream", message, False)
    door.mend()
    assert door.state() == before
    assert calls() == [
        call(door, action, known.number, "ok", actor=CONFIRM),
        call(door, action, known.number, "upstream", actor=CONFIRM),
    ]
    assert details() == ["", message]
    # The key was freed: trying again with it makes the change (once).
    again = action_run(
        known.owner, action, known.number, actor=CONFIRM, idempotency_key="up-2", arguments=arguments_for(action)
    )
    assert not again.repeated
    assert door.state() != before
    assert calls()[2:] == [
        call(door, action, known.number, "ok", actor=CONFIRM),
        call(door, action, known.number, "ok", "up-2", actor=CONFIRM),
    ]
    if door.kind == "shopify":
        root, _ = SHOPIFY_CHANGE[action]
        assert len(door.fake.sent(root)) == 2  # the failed one and the retry
    assert_no_email_in_audit(door)


def test_an_adapter_crashing_is_upstream_and_frees_the_key(door: Door) -> None:
    placed = door.orders["placed"]
    adapter = store_adapter()

    def crash(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom")

    door.monkeypatch.setattr(adapter, "order_cancel", crash)
    error = expect_error(lambda: action_run(placed.owner, "cancel", placed.number, actor=BOT, idempotency_key="c-1"))
    assert (error.code, error.message, error.permanent) == ("upstream", "store call failed: RuntimeError", False)
    assert calls() == [
        call(door, "cancel", placed.number, "ok"),
        call(door, "cancel", placed.number, "upstream"),
    ]
    assert details() == ["", "RuntimeError"]
    door.monkeypatch.undo()
    assert not action_run(placed.owner, "cancel", placed.number, actor=BOT, idempotency_key="c-1").repeated


def test_a_list_the_store_fails_to_give_is_upstream(door: Door) -> None:
    message = door.fail_list()
    error = expect_error(lambda: orders_list(Owner(customer_id=door.a), actor=AGENT))
    assert (error.code, error.message, error.permanent) == ("upstream", message, False)
    assert calls() == [call(door, "orders", "", "upstream", actor=AGENT)]
    assert details() == [message]


def test_unknown_actions_and_changes_without_a_key_are_invalid(door: Door) -> None:
    placed = door.orders["placed"]
    before = door.state()
    error = expect_error(lambda: action_run(placed.owner, "refund", placed.number, actor=BOT))
    assert (error.code, error.message) == ("invalid", "unknown action 'refund'")
    assert calls() == []  # refused before any store call
    for key in ("", "k" * 65):
        error = expect_error(
            lambda key=key: action_run(placed.owner, "cancel", placed.number, actor=BOT, idempotency_key=key)
        )
        assert (error.code, error.message) == ("invalid", "a change needs an idempotency key of 1-64 characters")
    assert door.state() == before and door.mutations() == []
    # Each refusal came after the lookup, which is logged; no change was attempted.
    assert calls() == [call(door, "cancel", placed.number, "ok")] * 2


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ({**NEW_ADDRESS_IN, "postcode": "  "}, "address postcode is missing"),
        ({**NEW_ADDRESS_IN, "country": "FRA"}, "country must be a two-letter code"),
        ("5 Avenue Foch, Lyon", "address must be an object"),
    ],
)
def test_a_bad_new_address_is_invalid_and_changes_nothing(door: Door, address: Any, message: str) -> None:
    placed = door.orders["placed"]
    before = door.state()
    error = expect_error(
        lambda: action_run(
            placed.owner,
            "change_address",
            placed.number,
            actor=BOT,
            idempotency_key="addr-bad",
            arguments={"address": address},
        )
    )
    assert (error.code, error.message) == ("invalid", message)
    assert door.state() == before and door.mutations() == []
    assert calls() == [call(door, "change_address", placed.number, "ok")]
    # The key was never reserved: it still works for a good address.
    result = action_run(
        placed.owner,
        "change_address",
        placed.number,
        actor=BOT,
        idempotency_key="addr-bad",
        arguments={"address": dict(NEW_ADDRESS_IN)},
    )
    assert result.order is not None and result.order.shipping_address == NEW_ADDRESS


# ---------------------------------------------------------------------------------------------
# Someone else's order is never shown
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("action", ["status", "refund_status", "cancel", "return", "change_address"])
def test_a_verified_shopper_never_sees_another_shoppers_order(door: Door, action: str) -> None:
    intruder = Owner(customer_id=door.b)
    before = door.state()
    theirs = door.orders["placed"]  # a's
    missing = expect_error(
        lambda: action_run(
            intruder, action, door.missing, actor=BOT, idempotency_key="x-1", arguments=arguments_for(action)
        )
    )
    foreign = expect_error(
        lambda: action_run(
            intruder, action, theirs.number, actor=BOT, idempotency_key="x-2", arguments=arguments_for(action)
        )
    )
    expected = ("not_found", NOT_FOUND, NEXT_VERIFIED, True)
    assert (missing.code, missing.message, missing.next_step, missing.permanent) == expected
    assert (foreign.code, foreign.message, foreign.next_step, foreign.permanent) == expected
    assert door.state() == before and door.mutations() == []
    assert calls() == [
        call(door, action, door.missing, "not_found"),
        call(door, action, theirs.number, "not_found"),
    ]
    assert_no_email_in_audit(door)


def test_an_anonymous_shopper_needs_the_orders_email(door: Door) -> None:
    shipped = door.orders["shipped"]  # a's
    other_email = door.orders["cancelled"].email  # b's
    wrong = Owner(email=other_email)
    missing = expect_error(lambda: order_view(wrong, door.missing, actor=BOT))
    foreign = expect_error(lambda: order_view(wrong, shipped.number, actor=BOT))
    expected = ("not_found", NOT_FOUND, NEXT_ANONYMOUS)
    assert (missing.code, missing.message, missing.next_step) == expected
    assert (foreign.code, foreign.message, foreign.next_step) == expected
    # No e-mail at all proves nothing either.
    assert expect_error(lambda: order_view(Owner(), shipped.number, actor=BOT)).next_step == NEXT_ANONYMOUS
    # The right e-mail, in any case and with spaces around it, does.
    order = order_view(Owner(email=f"  {shipped.email.upper()} "), shipped.number, actor=BOT)
    assert (order.number, order.status) == (shipped.number, "shipped")
    assert [c[5:9] for c in calls()] == [
        (door.missing, None, None, "not_found"),
        (shipped.number, None, None, "not_found"),
        (shipped.number, None, None, "not_found"),
        (shipped.number, None, None, "ok"),
    ]
    assert_no_email_in_audit(door)


def test_an_anonymous_shopper_with_the_wrong_email_cannot_change_the_order(door: Door) -> None:
    placed = door.orders["placed"]
    before = door.state()
    error = expect_error(
        lambda: action_run(
            Owner(email=door.orders["cancelled"].email), "cancel", placed.number, actor=BOT, idempotency_key="w-1"
        )
    )
    assert (error.code, error.message, error.next_step) == ("not_found", NOT_FOUND, NEXT_ANONYMOUS)
    assert door.state() == before and door.mutations() == []
    # With the order's own e-mail, the same shopper may cancel it.
    result = action_run(placed.anonymous, "cancel", placed.number, actor=BOT, idempotency_key="w-2")
    assert result.order is not None and result.order.status == "cancelled"
    assert calls() == [
        call(door, "cancel", placed.number, "not_found"),
        call(door, "cancel", placed.number, "ok"),
        call(door, "cancel", placed.number, "ok", "w-2"),
    ]
    assert_no_email_in_audit(door)


def test_orders_list_gives_only_the_shoppers_own_orders(door: Door) -> None:
    for customer in (door.a, door.b):
        orders = orders_list(Owner(customer_id=customer), actor=AGENT)
        assert [o.number for o in orders] == door.lists[customer]
        assert {o.customer_id for o in orders} == {customer}
    assert (
        orders_list(Owner(customer_id=door.a), actor=BOT, limit=2)
        == orders_list(Owner(customer_id=door.a), actor=BOT)[:2]
    )
    assert calls() == [
        call(door, "orders", "", "ok", actor=AGENT),
        call(door, "orders", "", "ok", actor=AGENT),
        call(door, "orders", "", "ok"),
        call(door, "orders", "", "ok"),
    ]
    assert details() == [
        f"{len(door.lists[door.a])} orders",
        f"{len(door.lists[door.b])} orders",
        "2 orders",
        f"{len(door.lists[door.a])} orders",
    ]
    assert_no_email_in_audit(door)


def test_orders_list_does_not_trust_the_adapters_query(door: Door) -> None:
    # An adapter that answers with every order it has, whoever asked: the door keeps the asker's.
    adapter = store_adapter()
    everyone = [adapter.order_by_number(n) for n in (*door.lists[door.a], *door.lists[door.b])]
    door.monkeypatch.setattr(adapter, "orders_for_customer", lambda customer_id, *, limit=5: list(everyone))
    orders = orders_list(Owner(customer_id=door.b), actor=BOT, limit=10)
    assert sorted(o.number for o in orders) == sorted(door.lists[door.b])
    assert details() == [f"{len(door.lists[door.b])} orders"]


def test_an_anonymous_shopper_gets_no_list(door: Door) -> None:
    assert orders_list(Owner(), actor=BOT) == []
    assert orders_list(Owner(email=door.orders["placed"].email), actor=BOT) == []
    assert calls() == [] and door.requests() == []


# ---------------------------------------------------------------------------------------------
# Idempotency
# ---------------------------------------------------------------------------------------------


def test_one_key_cancels_once(door: Door) -> None:
    placed = door.orders["placed"]
    first = action_run(placed.owner, "cancel", placed.number, actor=CONFIRM, idempotency_key="k1")
    second = action_run(placed.owner, "cancel", placed.number, actor=CONFIRM, idempotency_key="k1")
    assert (first.repeated, second.repeated) == (False, True)
    assert second.action == "cancel"
    assert second.order is not None and (second.order.number, second.order.status) == (placed.number, "cancelled")
    assert [(r.amount, r.status) for r in second.order.refunds] == [(door.placed_total, "pending")]
    if door.kind == "demo":
        assert len(DemoOrder.objects.get(number=placed.number).refunds) == 1
    else:
        assert len(door.fake.sent("orderCancel")) == 1
        assert len(door.fake.order(placed.number)["refunds"]) == 1
    # The second call's lookup is logged, and that it was a repeat; no second change was attempted.
    assert calls() == [
        call(door, "cancel", placed.number, "ok", actor=CONFIRM),
        call(door, "cancel", placed.number, "ok", "k1", actor=CONFIRM),
        call(door, "cancel", placed.number, "ok", actor=CONFIRM),
        call(door, "cancel", placed.number, "repeated", actor=CONFIRM),
    ]
    assert_no_email_in_audit(door)


def test_one_key_opens_one_return(door: Door) -> None:
    delivered = door.orders["delivered"]
    first = action_run(delivered.owner, "return", delivered.number, actor=BOT, idempotency_key="r1")
    second = action_run(delivered.owner, "return", delivered.number, actor=BOT, idempotency_key="r1")
    assert (first.repeated, second.repeated) == (False, True)
    assert first.return_request is not None
    if door.kind == "demo":
        assert len(DemoOrder.objects.get(number=delivered.number).returns) == 1
    else:
        assert len(door.fake.sent("returnRequest")) == 1
    after = order_view(delivered.owner, delivered.number, actor=BOT)
    assert [(r.return_id, r.status) for r in after.returns] == [(first.return_request.return_id, "requested")]
    # A repeated return answers with the return the key opened, as the first call did.
    assert second.order is None and second.return_request is not None
    assert second.return_request.return_id == first.return_request.return_id
    assert [c[4:] for c in calls()] == [
        ("return", delivered.number, None, None, "ok", None),
        ("return", delivered.number, None, None, "ok", "r1"),
        ("return", delivered.number, None, None, "ok", None),
        ("return", delivered.number, None, None, "repeated", None),
        ("status", delivered.number, None, None, "ok", None),
    ]


def test_a_failed_change_frees_its_key(door: Door) -> None:
    shipped, placed = door.orders["shipped"], door.orders["placed"]
    error = expect_error(lambda: action_run(shipped.owner, "cancel", shipped.number, actor=BOT, idempotency_key="k2"))
    assert error.code == "not_allowed"
    result = action_run(placed.owner, "cancel", placed.number, actor=BOT, idempotency_key="k2")
    assert not result.repeated
    assert result.order is not None and (result.order.number, result.order.status) == (placed.number, "cancelled")
    if door.kind == "shopify":
        assert [v["orderId"] for v in door.fake.sent("orderCancel")] == ["gid://shopify/Order/148977776"]
    assert calls() == [
        call(door, "cancel", shipped.number, "ok"),
        call(door, "cancel", shipped.number, "not_allowed"),
        call(door, "cancel", placed.number, "ok"),
        call(door, "cancel", placed.number, "ok", "k2"),
    ]


def test_a_key_another_worker_is_running_is_not_run_twice(door: Door) -> None:
    placed = door.orders["placed"]
    # Another worker reserved the key and is making the change now.
    StoreCall.objects.create(
        adapter=door.kind,
        actor="bot",
        purpose="confirm",
        action="cancel",
        order_number=placed.number,
        outcome="running",
        idempotency_key="k3",
    )
    before = door.state()
    error = expect_error(lambda: action_run(placed.owner, "cancel", placed.number, actor=BOT, idempotency_key="k3"))
    assert (error.code, error.message, error.next_step, error.permanent) == (
        "upstream",
        "this change is already being made",
        "Try again in a moment.",
        False,
    )
    assert door.state() == before and door.mutations() == []
    assert [c[4:] for c in calls()] == [
        ("cancel", placed.number, None, None, "running", "k3"),
        ("cancel", placed.number, None, None, "ok", None),
    ]


# ---------------------------------------------------------------------------------------------
# The confirm store
# ---------------------------------------------------------------------------------------------


def test_an_offer_is_taken_once_and_confirms_one_change(door: Door) -> None:
    placed = door.orders["placed"]
    offered = pending_offer(CONVERSATION, placed.owner, "cancel", placed.number)
    assert offered == Pending("cancel", placed.number, placed.owner, {}, offered.idempotency_key)
    assert re.fullmatch(r"[0-9a-f]{32}", offered.idempotency_key)
    assert pending_peek(CONVERSATION) == offered  # peeking leaves it
    taken = pending_take(CONVERSATION)
    assert taken == offered
    assert pending_take(CONVERSATION) is None
    assert pending_peek(CONVERSATION) is None
    assert PendingAction.objects.count() == 0
    assert taken is not None
    result = action_run(
        taken.owner, taken.action, taken.order_number, actor=CONFIRM, idempotency_key=taken.idempotency_key
    )
    assert isinstance(result, ActionResult) and not result.repeated
    assert result.order is not None and result.order.status == "cancelled"
    assert calls()[-1] == call(door, "cancel", placed.number, "ok", offered.idempotency_key, actor=CONFIRM)


def test_an_anonymous_offer_keeps_the_email_and_a_verified_one_does_not(door: Door) -> None:
    placed = door.orders["placed"]
    address = {"address": dict(NEW_ADDRESS_IN)}
    pending_offer(CONVERSATION, placed.anonymous, "change_address", placed.number, arguments=address)
    taken = pending_take(CONVERSATION)
    assert taken is not None
    assert (taken.action, taken.order_number, taken.owner, taken.arguments) == (
        "change_address",
        placed.number,
        Owner(email=placed.email),
        address,
    )
    result = action_run(
        taken.owner,
        taken.action,
        taken.order_number,
        actor=CONFIRM,
        idempotency_key=taken.idempotency_key,
        arguments=taken.arguments,
    )
    assert result.order is not None and result.order.shipping_address == NEW_ADDRESS
    # A verified shopper's offer keeps no e-mail address, even when the identity carried one.
    offered = pending_offer(CONVERSATION, Owner(customer_id=door.a, email=placed.email), "cancel", placed.number)
    assert PendingAction.objects.get().owner_email == ""
    assert pending_take(CONVERSATION) == Pending(
        "cancel", placed.number, Owner(customer_id=door.a), {}, offered.idempotency_key
    )


def test_a_newer_offer_replaces_the_older_one(door: Door) -> None:
    placed, delivered = door.orders["placed"], door.orders["delivered"]
    first = pending_offer(CONVERSATION, placed.owner, "cancel", placed.number)
    second = pending_offer(CONVERSATION, delivered.owner, "return", delivered.number)
    assert first.idempotency_key != second.idempotency_key
    assert PendingAction.objects.count() == 1
    assert pending_take(CONVERSATION) == second
    assert pending_take(CONVERSATION) is None


def test_an_expired_offer_is_not_taken(door: Door, settings: Any) -> None:
    placed = door.orders["placed"]
    before = door.state()
    settings.KEFU_STORE_CONFIRM_TTL_S = 0
    pending_offer(CONVERSATION, placed.owner, "cancel", placed.number)
    assert pending_peek(CONVERSATION) is None
    assert pending_take(CONVERSATION) is None
    assert PendingAction.objects.count() == 1  # still there, for pending_drop to forget
    assert pending_drop(CONVERSATION) is True
    # One valid for 15 minutes, then moved into the past.
    settings.KEFU_STORE_CONFIRM_TTL_S = 900
    other = uuid.uuid4()
    offered = pending_offer(other, placed.owner, "cancel", placed.number)
    assert pending_peek(other) == offered
    PendingAction.objects.filter(conversation_id=other).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert pending_peek(other) is None and pending_take(other) is None
    assert door.state() == before and door.mutations() == []


def test_pending_drop_forgets_the_offer(door: Door) -> None:
    placed = door.orders["placed"]
    assert pending_drop(CONVERSATION) is False
    pending_offer(CONVERSATION, placed.owner, "cancel", placed.number)
    kept = uuid.uuid4()
    pending_offer(kept, placed.owner, "cancel", placed.number)
    assert pending_drop(CONVERSATION) is True
    assert pending_drop(CONVERSATION) is False
    assert pending_take(CONVERSATION) is None
    assert pending_peek(kept) is not None  # another conversation's offer stays


# ---------------------------------------------------------------------------------------------
# Orders a conversation proved
# ---------------------------------------------------------------------------------------------


def test_orders_a_conversation_proved(door: Door) -> None:
    placed, shipped = door.orders["placed"], door.orders["shipped"]
    other = uuid.uuid4()
    order_remember(CONVERSATION, placed.anonymous, placed.number)
    order_remember(CONVERSATION, Owner(customer_id=door.a, email=shipped.email), shipped.number)
    order_remember(other, placed.owner, placed.number)
    # Latest first: make the order of the two rows explicit rather than trust the clock.
    KnownOrder.objects.filter(conversation_id=CONVERSATION, order_number=placed.number).update(
        seen_at=timezone.now() - timedelta(minutes=5)
    )
    assert orders_known(CONVERSATION) == [
        (shipped.number, Owner(customer_id=door.a)),  # a verified owner's row keeps no e-mail
        (placed.number, Owner(email=placed.email)),
    ]
    # Remembering an order again refreshes it (one row, now the latest).
    order_remember(CONVERSATION, placed.anonymous, placed.number)
    assert KnownOrder.objects.filter(conversation_id=CONVERSATION).count() == 2
    assert [n for n, _ in orders_known(CONVERSATION)][0] == placed.number
    # The owner it proved with can see it through the door.
    number, owner = orders_known(other)[0]
    assert order_view(owner, number, actor=AGENT).number == placed.number
    assert conversations_forget([CONVERSATION]) == 2
    assert orders_known(CONVERSATION) == [] and len(orders_known(other)) == 1


# ---------------------------------------------------------------------------------------------
# address_from_dict
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"name": ""}, "address name is missing"),
        ({"line1": "   "}, "address line1 is missing"),
        ({"city": None}, "address city must be text"),
        ({"postcode": ""}, "address postcode is missing"),
        ({"postcode": 69006}, "address postcode must be text"),
        ({"country": ""}, "address country is missing"),
        ({"country": "F1"}, "country must be a two-letter code"),
        ({"country": "FRA"}, "country must be a two-letter code"),
        ({"line2": ["Apt 4"]}, "address line2 must be text"),
    ],
)
def test_address_errors_name_the_field(changes: dict[str, Any], message: str) -> None:
    error = expect_error(lambda: address_from_dict({**NEW_ADDRESS_IN, **changes}))
    assert (error.code, error.message) == ("invalid", message)
    assert error.next_step in ("Tell me the full new address.", "Tell me the country too.")


def test_address_without_a_postcode_names_it() -> None:
    without = {k: v for k, v in NEW_ADDRESS_IN.items() if k != "postcode"}
    error = expect_error(lambda: address_from_dict(without))
    assert error.code == "invalid" and "postcode" in error.message
    assert error.next_step == "Tell me the full new address."


@pytest.mark.parametrize("value", [None, "5 Avenue Foch", ["5 Avenue Foch"]])
def test_an_address_must_be_an_object(value: Any) -> None:
    error = expect_error(lambda: address_from_dict(value))
    assert (error.code, error.message) == ("invalid", "address must be an object")


def test_an_address_is_trimmed_and_its_country_upper_cased() -> None:
    assert address_from_dict({**NEW_ADDRESS_IN, "line2": " Apt 4 ", "country": " gb "}) == Address(
        name="Pat Doe", line1="5 Avenue Foch", line2="Apt 4", city="Lyon", postcode="69006", country="GB"
    )
    assert address_from_dict(NEW_ADDRESS_IN) == NEW_ADDRESS
