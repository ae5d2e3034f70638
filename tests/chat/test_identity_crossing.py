"""Identity never crosses people (issue 29, item 1): a shared computer hands no one's rights or
history to another.

The outside trial's two reproductions, on the real ASGI application over real sockets, the demo
store on the test database, the project's test upstream for model answers, identity tokens signed
as a store's backend signs them:

* the take-over: an anonymous conversation is started on a shared browser, a customer signs in on
  it, and the anonymous token, used elsewhere, could read her messages and cancel her order;
* the history merge: an anonymous shopper's questions about someone else's order (with that
  person's e-mail) were shown to the customer who signed in next, and were in her model prompt.

The same take-over across two Daphne workers on PostgreSQL and Redis is in
``test_identity_crossing_live.py``.
"""

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

from chat import services
from chat.models import Conversation
from store.models import DemoOrder
from tests.store.test_order_actions import ORDER_FAQ

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from conftest import TEST_FAQ

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

SECRET = "store-backend-secret-0123456789abcdef"
#: A question no FAQ answers: the model answers it, with the conversation's turns in its prompt.
MODEL_QUESTION = "Does the walnut floor lamp come with a dimmer switch?"


@pytest.fixture
def order_faq(db: Any) -> Any:
    from routing.faq.importer import faq_import, validate
    from routing.faq.registry import registry

    records = [r for r in TEST_FAQ if r["intent"] != "return_policy"] + ORDER_FAQ
    faq_import([validate(r, i) for i, r in enumerate(records, 1)])
    registry.reload()
    yield registry
    registry.model = None


@pytest.fixture
def demo_orders(transactional_db: Any, settings: Any) -> None:
    settings.KEFU_STORE_ADAPTER = "demo"
    settings.KEFU_IDENTITY_SECRET = SECRET
    call_command("load_demo_orders", "--reset", verbosity=0)


def sign(sub: str) -> str:
    now = int(time.time())
    return jwt.encode({"sub": sub, "iat": now, "exp": now + 600, "jti": uuid.uuid4().hex}, SECRET, algorithm="HS256")


async def ask(client: Any, text: str) -> list[dict[str, Any]]:
    """Every frame the socket gets up to the answer's ``stream.end`` (a replay still on its way
    after ``hello`` comes first: a socket's frames are handled in order)."""
    await client.say(text)
    return await client.until("stream.end")


def texts(frames: list[dict[str, Any]]) -> str:
    return json.dumps(frames, ensure_ascii=False)


@database_sync_to_async
def order_status(number: str) -> str:
    return DemoOrder.objects.get(number=number).status


@database_sync_to_async
def customer_of(conversation_id: str) -> str:
    return Conversation.objects.get(pk=conversation_id).customer_id


async def test_a_customer_signing_in_on_a_shared_browser_gives_the_anonymous_token_none_of_her_rights(
    make_client, order_faq, demo_orders, remote
):
    # Someone chats anonymously on a shared computer; the conversation's token is theirs (they
    # can copy it, or it was synced to their other device).
    anon = await make_client()
    await anon.hello()
    assert (await ask(anon, "Do you ship to Canada?"))[-1]["text"]
    anon_conv, anon_token = anon.conversation, anon.token
    await anon.close()

    # Mei signs in on that browser: the widget's hello carries the stored conversation and her
    # identity. She gets her own conversation, and sees nothing of the anonymous one.
    mei = await make_client()
    frame = await mei.hello(conversation=anon_conv, token=anon_token, after=0, identity=sign("demo-mei"))
    assert frame["type"] == "conversation" and frame["customer"]["id"] == "demo-mei"
    seen = await ask(mei, "where is my parcel?")
    assert seen[-1]["route"] == "action" and seen[-1]["text"].startswith("Order KF-1002 (Oak table lamp)")

    # Elsewhere, the anonymous shopper reopens their conversation with the old token and tries
    # to cancel "my order", then confirms.
    thief = await make_client()
    reopened = await thief.hello(conversation=anon_conv, token=anon_token, after=0)
    got = [reopened, *await ask(thief, "please cancel the order I placed")]
    got += await ask(thief, "yes")

    # The order is not cancelled, and nothing of Mei's reached that socket.
    assert await order_status("KF-1002") == "placed"
    assert "customer" not in reopened
    assert await customer_of(anon_conv) == ""
    assert "KF-1002" not in texts(got) and "Oak table lamp" not in texts(got)
    assert "where is my parcel" not in texts(got)
    # Mei was shown nothing of the anonymous conversation: it is not hers.
    assert "Canada" not in texts(seen)
    assert frame["id"] != anon_conv and frame["token"] != anon_token
    # Her conversation does not open with the anonymous token either.
    probe = await make_client()
    await probe.send({"type": "hello", "conversation": frame["id"], "token": anon_token})
    assert await probe.comm.receive_output(timeout=5) == {"type": "websocket.close", "code": 4403}


async def test_an_anonymous_shoppers_questions_are_never_shown_to_the_customer_who_signs_in_next(
    make_client, order_faq, demo_orders, remote
):
    # An anonymous shopper asks about Mei's order, with Mei's e-mail (which the demo store accepts
    # as proof for that one order).
    anon = await make_client()
    await anon.hello()
    looked_up = (await ask(anon, "Where is my order KF-1001? My e-mail is mei.chen@example.com"))[-1]
    assert looked_up["route"] == "action" and "Stoneware mug" in looked_up["text"]

    # Sam signs in next on that browser; a new page's widget asks for everything (after 0).
    sam = await make_client()
    frame = await sam.hello(conversation=anon.conversation, token=anon.token, after=0, identity=sign("demo-sam"))
    assert frame["customer"]["id"] == "demo-sam"
    remote.reset()
    got = [frame, *await ask(sam, MODEL_QUESTION)]

    assert got[-1]["route"].startswith("llm.")
    # Neither shown nor replayed to Sam ...
    for leaked in ("KF-1001", "mei.chen", "Stoneware mug", "DHL", "Where is my order"):
        assert leaked not in texts(got), leaked
    # ... nor in his model prompt (not even as a masked placeholder of the e-mail).
    assert len(remote.requests) >= 1
    prompts = texts([r["messages"] for r in remote.requests])
    assert MODEL_QUESTION in prompts
    for leaked in ("KF-1001", "mei.chen", "[EMAIL", "Stoneware", "My e-mail is"):
        assert leaked not in prompts, leaked
    # And the order the anonymous shopper proved stays with the anonymous conversation: Sam's
    # "cancel my order" is about his own orders, never KF-1001.
    cancel = (await ask(sam, "please cancel the order I placed"))[-1]
    assert "KF-1001" not in cancel["text"]
    assert await customer_of(anon.conversation) == ""
    assert frame["id"] != anon.conversation


async def test_a_customers_conversation_never_opens_with_the_token_it_was_started_with(make_client, demo_orders):
    # A conversation adopted before this rule existed: started anonymously (its token handed to
    # whoever started it), then made a customer's. Only her identity or her customer token opens it.
    conv, start_token = await database_sync_to_async(services.conversation_start)()
    await database_sync_to_async(Conversation.objects.filter(pk=conv.pk).update)(customer_id="demo-mei")

    old = await make_client()
    await old.send({"type": "hello", "conversation": str(conv.pk), "token": start_token})
    assert await old.comm.receive_output(timeout=5) == {"type": "websocket.close", "code": 4403}

    mei = await make_client()
    frame = await mei.hello(identity=sign("demo-mei"))
    assert frame["id"] == str(conv.pk) and frame["token"] != start_token
    again = await make_client()
    assert (await again.hello(conversation=str(conv.pk), token=frame["token"]))["id"] == str(conv.pk)
