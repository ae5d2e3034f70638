"""The agent console's orders panel over /ws/agent/ (the real ASGI application, SQLite, the
in-memory channel layer, the demo store on the test database): an agent sees the orders of the
open conversation's shopper and no one else's, and acts on them on the shopper's behalf, once per
click, with every store call in the audit log and the shopper told of every change.

Personas as in test_console.py: ``alice`` and ``bob`` (agents); shoppers ``demo-mei`` (KF-1001
shipped, KF-1002 placed, KF-1003 delivered) and ``demo-sam`` (KF-1004 cancelled, KF-1005 packed)
from store/demo/orders.json, verified by identity tokens signed as the store's backend signs them.
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path
from typing import Any

import jwt
import pytest
from channels.db import database_sync_to_async
from django.core.management import call_command

from chat.models import Message
from chat.protocol import ORDER_ACTIONS
from store import services as store
from store.models import DemoOrder, StoreCall
from store.types import ACTIONS, Owner

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_console

make_agent = test_console.make_agent  # the console tests' fixture: an agent console socket

pytestmark = [pytest.mark.django_db(transaction=True)]

SECRET = "store-backend-secret-0123456789abcdef"


@pytest.fixture
def demo_orders(transactional_db: Any, settings: Any) -> None:
    settings.KEFU_STORE_ADAPTER = "demo"
    settings.KEFU_IDENTITY_SECRET = SECRET
    call_command("load_demo_orders", "--reset", verbosity=0)


def sign(sub: str) -> str:
    now = int(time.time())
    return jwt.encode({"sub": sub, "iat": now, "exp": now + 600, "jti": uuid.uuid4().hex}, SECRET, algorithm="HS256")


async def shopper(make_client: Any, customer: str | None = None) -> Any:
    client = await make_client()
    frame = await client.hello(**({"identity": sign(customer)} if customer else {}))
    assert frame["type"] == "conversation", frame
    return client


async def reply(agent: Any, kind: str, conversation: str, request_id: str | None = None) -> dict[str, Any]:
    """The agent's first ``kind`` or ``error`` frame about ``conversation`` (and ``request_id``)."""
    while True:
        f = await agent.recv()
        mine = request_id is None or f.get("request_id") == request_id
        if f["type"] in (kind, "error") and f.get("conversation") == conversation and mine:
            return f


async def orders(agent: Any, conversation: str) -> dict[str, Any]:
    await agent.send({"type": "orders", "conversation": conversation})
    return await reply(agent, "orders", conversation)


async def act(agent: Any, conversation: str, order: str, action: str, request_id: str, **extra: Any) -> dict[str, Any]:
    frame = {"type": "order.action", "conversation": conversation, "order": order, "action": action}
    await agent.send({**frame, "request_id": request_id, **extra})
    return await reply(agent, "order.action", conversation, request_id)


async def held(agent: Any, client: Any) -> None:
    """``agent`` takes the shopper's conversation over (the shopper sees the ``status``)."""
    await agent.send({"type": "take_over", "conversation": client.conversation})
    assert (await client.until("status"))[-1]["status"] == "agent"


@database_sync_to_async
def order_row(number: str) -> DemoOrder:
    return DemoOrder.objects.get(number=number)


@database_sync_to_async
def calls(**filters: Any) -> list[tuple[str, str, str, str, str, str]]:
    return [
        (c.actor, c.actor_name, c.purpose, c.action, c.order_number, c.outcome)
        for c in StoreCall.objects.filter(**filters).order_by("created_at", "id")
    ]


@database_sync_to_async
def system_messages(conversation: str) -> list[str]:
    return list(
        Message.objects.filter(conversation_id=conversation, role="system")
        .order_by("seq")
        .values_list("text", flat=True)
    )


def numbers(frame: dict[str, Any]) -> list[tuple[str, str]]:
    return [(o["number"], o["status"]) for o in frame["orders"]]


def test_the_protocols_actions_are_the_stores():
    assert ORDER_ACTIONS == ACTIONS


# ------------------------------------------------------------------ what an agent sees


async def test_a_verified_shoppers_orders_and_never_another_customers(make_client, make_agent, demo_orders):
    mei, sam = await shopper(make_client, "demo-mei"), await shopper(make_client, "demo-sam")
    alice = await make_agent("alice", "Alice")
    shown = await orders(alice, mei.conversation)
    assert shown["source"] == "verified"
    assert numbers(shown) == [("KF-1002", "placed"), ("KF-1001", "shipped"), ("KF-1003", "delivered")]
    kf1001 = shown["orders"][1]
    placed_at = (await order_row("KF-1001")).placed_at
    assert kf1001 == {
        "number": "KF-1001",
        "status": "shipped",
        "placed_at": placed_at.isoformat(),
        "total": "86.00",
        "currency": "EUR",
        "items": [
            {"title": "Stoneware mug, sand (set of 2)", "quantity": 1},
            {"title": "Linen napkins, sage (set of 4)", "quantity": 1},
        ],
        "tracking": {
            "carrier": "DHL",
            "number": "JD014600006281230981",
            "url": "https://www.dhl.com/track?tracking-id=JD014600006281230981",
        },
        "refunds": [],
        "can_cancel": False,
        "can_return": False,
        "can_change_address": False,
    }
    assert [(o["can_cancel"], o["can_return"], o["can_change_address"]) for o in shown["orders"]] == [
        (True, False, True),
        (False, False, False),
        (False, True, False),
    ]
    assert numbers(await orders(alice, sam.conversation)) == [("KF-1005", "packed"), ("KF-1004", "cancelled")]
    # Sam's order from Mei's conversation is "not found", a read and a change alike.
    refused = await act(alice, mei.conversation, "KF-1005", "status", "r-status")
    assert (refused["type"], refused["code"], refused["order"]) == ("error", "not_found", "KF-1005")
    await held(alice, mei)
    refused = await act(alice, mei.conversation, "KF-1005", "cancel", "r-cancel")
    assert (refused["type"], refused["code"], refused["order"]) == ("error", "not_found", "KF-1005")
    assert "Stoneware" not in refused["message"] and "sam" not in refused["message"].lower()
    assert (await order_row("KF-1005")).status == "packed"
    # Every call is in the audit log as the agent's, for the console, with its conversation.
    assert await calls(conversation_id=mei.conversation) == [
        ("agent", "alice", "console", "orders", "", "ok"),
        ("agent", "alice", "console", "status", "KF-1005", "not_found"),
        ("agent", "alice", "console", "cancel", "KF-1005", "not_found"),
    ]
    assert await calls(conversation_id=sam.conversation) == [("agent", "alice", "console", "orders", "", "ok")]


async def test_an_anonymous_conversation_shows_only_the_order_it_proved(make_client, make_agent, demo_orders):
    proved, nothing = await shopper(make_client), await shopper(make_client)
    # The shopper gave KF-1001 with its e-mail address (what the bot remembers after the proof).
    await database_sync_to_async(store.order_remember)(
        uuid.UUID(proved.conversation), Owner(email="Mei.Chen@example.com"), "KF-1001"
    )
    alice = await make_agent("alice", "Alice")
    shown = await orders(alice, proved.conversation)
    assert (shown["source"], numbers(shown)) == ("proved", [("KF-1001", "shipped")])
    assert shown["orders"][0]["tracking"]["number"] == "JD014600006281230981"
    # Mei's other orders are not this conversation's: the same e-mail proves only KF-1001.
    refused = await act(alice, proved.conversation, "KF-1002", "status", "r1")
    assert (refused["type"], refused["code"]) == ("error", "not_found")
    assert (await act(alice, proved.conversation, "kf-1001", "status", "r2"))["order"]["number"] == "KF-1001"
    none = await orders(alice, nothing.conversation)
    assert (none["source"], none["orders"]) == ("none", [])
    refused = await act(alice, nothing.conversation, "KF-1001", "status", "r3")
    assert (refused["type"], refused["code"]) == ("error", "not_found")
    assert await calls(conversation_id=nothing.conversation) == []  # nothing to ask the store


# ------------------------------------------------------------------ what an agent does


async def test_an_agent_cancels_a_placed_order_once_and_the_shopper_is_told(make_client, make_agent, demo_orders):
    mei = await shopper(make_client, "demo-mei")
    alice = await make_agent("alice", "Alice")
    await held(alice, mei)
    done = await act(alice, mei.conversation, "KF-1002", "cancel", "click-1")
    assert (done["type"], done["ok"], done["action"], done["repeated"]) == ("order.action", True, "cancel", False)
    assert done["order"]["status"] == "cancelled"
    assert done["order"]["refunds"] == [{"amount": "129.00", "status": "pending"}]
    assert (done["order"]["can_cancel"], done["order"]["can_change_address"]) == (False, False)
    row = await order_row("KF-1002")
    assert row.status == "cancelled" and len(row.refunds) == 1
    told = (await mei.until("message"))[-1]
    assert (told["role"], told["text"]) == ("system", "Order KF-1002 was cancelled by our team.")
    change = await database_sync_to_async(
        lambda: StoreCall.objects.get(action="cancel", idempotency_key__isnull=False)
    )()
    assert (change.actor, change.actor_name, change.purpose, change.outcome) == ("agent", "alice", "console", "ok")
    assert str(change.conversation_id) == mei.conversation and change.order_number == "KF-1002"

    # The same click again (a double click, a resend): nothing changes a second time.
    again = await act(alice, mei.conversation, "KF-1002", "cancel", "click-1")
    assert (again["type"], again["repeated"], again["order"]["status"]) == ("order.action", True, "cancelled")
    assert len((await order_row("KF-1002")).refunds) == 1
    assert await system_messages(mei.conversation) == ["Order KF-1002 was cancelled by our team."]
    # The shopper's next frame is Alice's message, not a second notice.
    await alice.send({"type": "message", "conversation": mei.conversation, "client_id": "m1", "text": "Done!"})
    nxt = await mei.recv()
    assert (nxt["type"], nxt["role"], nxt["text"]) == ("message", "agent", "Done!")
    assert [c[3:] for c in await calls(action="cancel")] == [
        ("cancel", "KF-1002", "ok"),  # the order looked up before the change
        ("cancel", "KF-1002", "ok"),  # the change
        ("cancel", "KF-1002", "ok"),  # the second click's look-up: it found the change made
        ("cancel", "KF-1002", "repeated"),  # and said so, changing nothing
    ]


async def test_a_shipped_order_cannot_be_cancelled_and_nothing_changes(make_client, make_agent, demo_orders):
    mei = await shopper(make_client, "demo-mei")
    alice = await make_agent("alice", "Alice")
    await held(alice, mei)
    refused = await act(alice, mei.conversation, "KF-1001", "cancel", "click-1")
    assert (refused["type"], refused["code"], refused["request_id"], refused["order"]) == (
        "error",
        "not_allowed",
        "click-1",
        "KF-1001",
    )
    assert (await order_row("KF-1001")).status == "shipped"
    assert await system_messages(mei.conversation) == []
    assert [c[5] for c in await calls(action="cancel")] == ["ok", "not_allowed"]


async def test_a_return_and_a_new_address_and_the_shopper_is_told_of_each(make_client, make_agent, demo_orders):
    mei = await shopper(make_client, "demo-mei")
    alice = await make_agent("alice", "Alice")
    await held(alice, mei)
    opened = await act(alice, mei.conversation, "KF-1003", "return", "click-1")
    assert (opened["type"], opened["repeated"], opened["order"]["can_return"]) == ("order.action", False, False)
    returns = (await order_row("KF-1003")).returns
    assert len(returns) == 1 and opened["return_id"] == returns[0]["return_id"]
    assert (await mei.until("message"))[-1]["text"] == "A return of order KF-1003 was opened by our team."
    address = {"name": "Mei Chen", "line1": "Prinsengracht 263", "city": "Amsterdam", "postcode": "1016 GV"}
    bad = await act(alice, mei.conversation, "KF-1002", "change_address", "click-2", address=address)
    assert (bad["type"], bad["code"]) == ("error", "invalid")  # no country
    moved = await act(
        alice, mei.conversation, "KF-1002", "change_address", "click-3", address={**address, "country": "nl"}
    )
    assert (moved["type"], moved["order"]["status"]) == ("order.action", "placed")
    assert (await order_row("KF-1002")).shipping_address["line1"] == "Prinsengracht 263"
    assert (await mei.until("message"))[-1]["text"] == "The delivery address of order KF-1002 was changed by our team."


# ------------------------------------------------------------------ who may


async def test_changes_are_for_the_agent_holding_the_conversation(make_client, make_agent, demo_orders):
    mei = await shopper(make_client, "demo-mei")
    alice, bob = await make_agent("alice", "Alice"), await make_agent("bob", "Bob")
    # Nobody holds it yet: reading is open to every agent, a change is not.
    refused = await act(alice, mei.conversation, "KF-1002", "cancel", "click-1")
    assert (refused["type"], refused["code"]) == ("error", "not_owner")
    await held(alice, mei)
    assert numbers(await orders(bob, mei.conversation))[0] == ("KF-1002", "placed")
    refused = await act(bob, mei.conversation, "KF-1002", "cancel", "click-2")
    assert (refused["type"], refused["code"], refused["agent"]) == ("error", "not_owner", "Alice")
    assert (await order_row("KF-1002")).status == "placed"
    assert await calls(action="cancel") == []  # refused before any store call


async def test_an_agent_whose_permission_was_taken_away_is_refused(make_client, make_agent, demo_orders):
    mei = await shopper(make_client, "demo-mei")
    alice = await make_agent("alice", "Alice")
    await held(alice, mei)

    @database_sync_to_async
    def revoke() -> None:
        from django.contrib.auth.models import Permission

        alice.user.user_permissions.remove(Permission.objects.get(codename="handle_conversations"))

    await revoke()
    refused = await orders(alice, mei.conversation)
    assert (refused["type"], refused["code"]) == ("error", "forbidden")
    refused = await act(alice, mei.conversation, "KF-1002", "cancel", "click-1")
    assert (refused["type"], refused["code"], refused["request_id"]) == ("error", "forbidden", "click-1")
    assert (await order_row("KF-1002")).status == "placed"
    assert await calls() == []


async def test_bad_order_frames_and_an_unknown_conversation(make_client, make_agent, demo_orders):
    mei = await shopper(make_client, "demo-mei")
    alice = await make_agent("alice", "Alice")
    cid = mei.conversation
    base = {"type": "order.action", "conversation": cid, "order": "KF-1002", "action": "cancel", "request_id": "r"}
    for frame in (
        {**base, "action": "refund_everything"},
        {**base, "request_id": ""},
        {**base, "request_id": "x" * 65},
        {**base, "order": ""},
        {**base, "order": 1002},
        {**base, "order": "KF-\ud800"},
        {**base, "action": "change_address", "address": "Prinsengracht 263"},
    ):
        await alice.send(frame)
        err = await reply(alice, "order.action", cid)
        assert (err["type"], err["code"]) == ("error", "invalid"), frame
    unknown = str(uuid.uuid4())
    assert (await orders(alice, unknown))["code"] == "not_found"
    assert await calls() == []


async def test_without_a_store_the_panel_says_so(make_client, make_agent, demo_orders, settings):
    mei = await shopper(make_client, "demo-mei")
    alice = await make_agent("alice", "Alice")
    settings.KEFU_STORE_ADAPTER = ""
    refused = await orders(alice, mei.conversation)
    assert (refused["type"], refused["code"]) == ("error", "not_configured")
