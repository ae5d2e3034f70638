"""Store tools on the remote path (routing/orders/tools.py): the real ``openai`` client streams scripted
``tool_calls`` from the test server; kefu validates the arguments, runs the store's door for the
shopper's own orders, sends the results back and streams the model's answer. Changes end with
kefu's own confirmation question, and a "yes" makes them once."""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import jwt
import pytest
from channels.db import database_sync_to_async
from django.core.management import call_command

from cache_layer.models import CachedAnswer
from routing.models import UpstreamCall
from store.models import DemoOrder, PendingAction, StoreCall

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fake_openai import Behaviour

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

SECRET = "store-backend-secret-0123456789abcdef"
NEW_ADDRESS = {
    "name": "Mei Chen",
    "line1": "Herengracht 500",
    "city": "Amsterdam",
    "postcode": "1017 CB",
    "country": "nl",
}


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


async def ask(client: Any, text: str) -> dict[str, Any]:
    await client.say(text)
    return (await client.until("stream.end"))[-1]


def tool_messages(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [json.loads(m["content"]) for m in request["messages"] if m["role"] == "tool"]


@database_sync_to_async
def ledger_purposes() -> list[str]:
    return list(UpstreamCall.objects.order_by("id").values_list("purpose", flat=True))


@database_sync_to_async
def store_calls() -> list[tuple[str, str, str]]:
    return [(c.purpose, c.action, c.outcome) for c in StoreCall.objects.order_by("created_at", "id")]


QUESTION = "Quick one about KF-1001 (mei.chen@example.com): did the napkins go in the same box as the mugs?"


async def test_a_model_looks_an_order_up_and_answers_from_it(make_client, faq, demo_orders, remote):
    remote.push(
        # The model saw a placeholder for the e-mail (routing.prompt.privacy) and calls the tool with it.
        Behaviour(
            tool_calls=[{"name": "order_status", "arguments": {"order_number": "KF-1001", "email": "[EMAIL_1]"}}]
        ),
        Behaviour(text="Yes: both items shipped together with DHL, tracking JD014600006281230981."),
    )
    end = await ask(await shopper(make_client), QUESTION)
    assert end["route"] == "llm.simple"
    assert end["text"] == "Yes: both items shipped together with DHL, tracking JD014600006281230981."
    first, second = remote.requests
    assert "mei.chen@example.com" not in json.dumps(first["messages"])  # masked on the way out
    assert [t["function"]["name"] for t in first["tools"]] == [
        "order_status",
        "order_cancel",
        "order_return",
        "shipping_address_change",
        "person_offer",
    ]  # no list of orders for an anonymous shopper
    [result] = tool_messages(second)
    assert result["ok"] is True
    order = result["order"]
    assert order["order_number"] == "KF-1001" and order["status"] == "shipped"
    assert order["shipments"][0]["tracking_number"] == "JD014600006281230981"
    assert order["items"] == [
        {"title": "Stoneware mug, sand (set of 2)", "quantity": 1},
        {"title": "Linen napkins, sage (set of 4)", "quantity": 1},
    ]
    # What the model sees about an order holds no e-mail, name or street.
    sent = json.dumps(second["messages"][-1])
    assert "mei.chen@example.com" not in sent and "Keizersgracht" not in sent and "Mei Chen" not in sent
    assistant = second["messages"][-2]
    assert assistant["role"] == "assistant" and assistant["tool_calls"][0]["function"]["name"] == "order_status"
    # Every round is a ledger row with its purpose; the store call is in the audit log.
    assert await ledger_purposes() == ["answer", "tool"]
    assert await store_calls() == [("tool", "status", "ok")]
    # Usage is both rounds' together.
    assert end["usage"]["prompt_tokens"] > 0 and end["usage"]["completion_tokens"] > 0
    # An answer made from a store's data never enters the answer cache.
    assert not await database_sync_to_async(CachedAnswer.objects.exists)()


async def test_a_tool_never_sees_another_shoppers_order(make_client, faq, demo_orders, remote):
    remote.push(
        Behaviour(
            tool_calls=[{"name": "order_status", "arguments": {"order_number": "KF-1001", "email": "[EMAIL_1]"}}]
        ),
        Behaviour(text="I could not find that order."),
    )
    text = "Quick one about KF-1001 (sam.okafor@example.com): did the napkins go in the same box as the mugs?"
    end = await ask(await shopper(make_client), text)
    assert end["text"] == "I could not find that order."
    [result] = tool_messages(remote.requests[1])
    assert result == {
        "ok": False,
        "error": "not_found",
        "message": "no such order for this shopper",
        "next_step": "Reply with the order number and the e-mail address the order was placed with.",
    }
    assert "DHL" not in json.dumps(remote.requests[1]["messages"])
    assert await store_calls() == [("tool", "status", "not_found")]


async def test_a_verified_shopper_may_list_their_orders_and_only_theirs(make_client, faq, demo_orders, remote):
    remote.push(
        Behaviour(tool_calls=[{"name": "orders_list", "arguments": {}}]),
        Behaviour(text="You have two orders on their way."),
    )
    text = "Could you tell me about KF-1005 and anything else I have coming, before I book a holiday?"
    end = await ask(await shopper(make_client, "demo-sam"), text)
    assert end["text"] == "You have two orders on their way."
    assert "orders_list" in [t["function"]["name"] for t in remote.requests[0]["tools"]]
    [result] = tool_messages(remote.requests[1])
    assert [o["order_number"] for o in result["orders"]] == ["KF-1005", "KF-1004"]


async def test_bad_arguments_are_refused_with_the_field_named(make_client, faq, demo_orders, remote):
    remote.push(
        Behaviour(
            tool_calls=[{"name": "order_status", "arguments": {"order_number": "KF-1001", "drop_table": "orders"}}]
        ),
        Behaviour(tool_calls=[{"name": "order_status", "arguments": "{not json"}]),
        Behaviour(text="Sorry, I could not look that up."),
    )
    end = await ask(await shopper(make_client), QUESTION)
    assert end["text"] == "Sorry, I could not look that up."
    [first] = tool_messages(remote.requests[1])
    assert first["error"] == "invalid" and "drop_table" in first["message"]
    assert tool_messages(remote.requests[2])[1]["error"] == "invalid"
    assert await store_calls() == []  # nothing reached the store


async def test_at_most_n_calls_then_the_model_must_answer_in_words(make_client, faq, demo_orders, remote, settings):
    settings.KEFU_TOOL_MAX_CALLS = 1
    call = {"name": "order_status", "arguments": {"order_number": "KF-1001", "email": "mei.chen@example.com"}}
    remote.push(Behaviour(tool_calls=[call]), Behaviour(text="It shipped with DHL."))
    end = await ask(await shopper(make_client), QUESTION)
    assert end["text"] == "It shipped with DHL."
    assert remote.requests[0]["tool_choice"] == "auto"
    assert remote.requests[1]["tool_choice"] == "none"


async def test_an_address_change_is_offered_confirmed_and_made_once(make_client, faq, demo_orders, remote):
    remote.push(
        Behaviour(
            tool_calls=[
                {"name": "shipping_address_change", "arguments": {"order_number": "KF-1002", "address": NEW_ADDRESS}}
            ]
        )
    )
    client = await shopper(make_client, "demo-mei")
    text = "Can you send order KF-1002 to my office instead? Mei Chen, Herengracht 500, 1017 CB Amsterdam, NL"
    offer = await ask(client, text)
    assert offer["route"] == "llm.simple"
    assert offer["text"] == (
        "Order KF-1002 has not been packed yet, so I can send it to: Mei Chen, Herengracht 500, 1017 CB Amsterdam, NL. "
        'Shall I change the address? Reply "yes" to confirm or "no" to keep the old one.'
    )
    assert len(remote.requests) == 1  # kefu asks for the confirmation itself: no second round
    city = await database_sync_to_async(lambda: DemoOrder.objects.get(number="KF-1002").shipping_address["line1"])()
    assert city == "Keizersgracht 120"
    pending = await database_sync_to_async(PendingAction.objects.get)()
    assert pending.action == "change_address" and pending.arguments["address"]["country"] == "nl"

    done = await ask(client, "yes")
    assert done["route"] == "action"
    assert done["text"] == "Done: order KF-1002 will now go to Herengracht 500, 1017 CB Amsterdam, NL."
    address = await database_sync_to_async(lambda: DemoOrder.objects.get(number="KF-1002").shipping_address)()
    assert address["line1"] == "Herengracht 500" and address["country"] == "NL"
    assert await store_calls() == [
        ("tool", "status", "ok"),
        ("confirm", "change_address", "ok"),
        ("confirm", "change_address", "ok"),
    ]


@pytest.mark.parametrize(
    "locale, yes, offer",
    [
        ("en", "yes please", "Would you like me to connect you with someone from our team?"),
        ("zh", "好的", "需要我为您转接人工客服吗？"),
    ],
)
async def test_a_yes_to_the_person_the_model_offered_by_a_tool_call_hands_off(
    make_client, faq, demo_orders, remote, locale, yes, offer
):
    # The model cannot help and calls person_offer: kefu's own offer ends the answer, and the
    # shopper's yes goes to a person without another model call.
    remote.push(Behaviour(tool_calls=[{"name": "person_offer", "arguments": {}}]))
    client = await make_client()
    await client.hello(locale=locale)
    end = await ask(
        client,
        QUESTION
        if locale == "en"
        else "想问一下订单 KF-1001（mei.chen@example.com）：餐巾和杯子是放在同一个箱子里寄出的吗？",
    )
    assert end["route"] == "llm.simple" and end["text"] == offer
    await client.say(yes)
    frames = await client.until("status")
    assert next(f for f in frames if f["type"] == "stream.end")["route"] == "handoff"
    assert frames[-1]["status"] == "waiting_agent"
    assert len(remote.requests) == 1
    assert await store_calls() == []  # an offer of a person calls no store
