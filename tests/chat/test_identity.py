"""Signed shopper identity (chat/identity.py): HS256 tokens from the store's backend in `hello`.

Real ASGI application and sockets (WebsocketCommunicator), tokens signed with PyJWT as a store's
backend would sign them (docs/security.md's snippet).
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import jwt
import pytest
from channels.db import database_sync_to_async

from chat import identity
from chat.models import Conversation, UsedIdentityToken
from chat.selectors import console_rows

pytestmark = [pytest.mark.django_db(transaction=True)]

SECRET = "store-backend-secret-0123456789abcdef"


@pytest.fixture(autouse=True)
def _identity_on(settings: Any) -> None:
    settings.KEFU_IDENTITY_SECRET = SECRET


def sign(
    sub: str = "cust-42", *, secret: str = SECRET, life_s: int = 600, algorithm: str = "HS256", **claims: Any
) -> str:
    now = int(time.time())
    payload = {"sub": sub, "name": "Alice Wong", "email": "alice@example.com", "iat": now, "exp": now + life_s}
    payload["jti"] = uuid.uuid4().hex
    payload.update(claims)
    payload = {k: v for k, v in payload.items() if v is not None}
    return jwt.encode(payload, secret, algorithm=algorithm)


async def refused(client: Any, **hello: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the error frame, the close) of a hello the server refuses."""
    await client.send({"type": "hello", **hello})
    error = await client.recv(timeout=5)
    closed = await client.comm.receive_output(timeout=5)
    return error, closed


@database_sync_to_async
def row(conversation_id: str) -> Conversation:
    return Conversation.objects.get(pk=conversation_id)


# ------------------------------------------------------------------------- accepted


async def test_a_signed_customer_gets_a_conversation_that_names_them(make_client, faq):
    shopper = await make_client()

    frame = await shopper.hello(identity=sign())

    assert frame["type"] == "conversation"
    assert frame["customer"] == {"id": "cust-42", "name": "Alice Wong"}
    conv = await row(frame["id"])
    assert (conv.customer_id, conv.customer_name, conv.customer_email) == ("cust-42", "Alice Wong", "alice@example.com")
    assert conv.identity_verified_at is not None


async def test_the_customers_conversation_follows_them_to_another_device(make_client, faq):
    phone = await make_client()
    await phone.hello(identity=sign())
    await phone.say("Do you ship to Canada?")
    await phone.until("stream.end")

    laptop = await make_client()
    frame = await laptop.hello(identity=sign())  # a new token: the laptop's page signed its own
    replay = [await laptop.recv() for _ in range(2)]

    assert frame["id"] == phone.conversation
    assert [(m["role"], m["seq"]) for m in replay] == [("shopper", 1), ("bot", 2)]
    assert replay[0]["text"] == "Do you ship to Canada?"
    # Both devices hold the same customer token, and it resumes without a new identity token.
    assert laptop.token == phone.token
    again = await make_client()
    resumed = await again.hello(conversation=phone.conversation, token=phone.token)
    assert resumed["id"] == phone.conversation


async def test_signing_in_starts_the_customers_own_chat_and_leaves_the_anonymous_one_alone(make_client, faq):
    # Issue 29: the anonymous conversation is never adopted (on a shared computer it may be
    # someone else's). It stays anonymous, its token opens it as before, and she gets her own.
    before = await make_client()
    await before.hello()
    await before.say("Do you ship to Canada?")
    await before.until("stream.end")

    after = await make_client()
    frame = await after.hello(conversation=before.conversation, token=before.token, identity=sign("cust-7"))

    assert frame["id"] != before.conversation and frame["customer"]["id"] == "cust-7"
    assert (await row(frame["id"])).customer_id == "cust-7"
    assert (await row(before.conversation)).customer_id == ""
    # Nothing of the anonymous conversation is replayed to her.
    await after.say("Hello?")
    assert all("Canada" not in str(f) for f in await after.until("stream.end"))
    # The anonymous token still opens the anonymous conversation, and only that one.
    again = await make_client()
    reopened = await again.hello(conversation=before.conversation, token=before.token)
    assert reopened["id"] == before.conversation and "customer" not in reopened
    # Signing in again on that browser resumes her own conversation, not the anonymous one.
    later = await make_client()
    resumed = await later.hello(conversation=before.conversation, token=before.token, identity=sign("cust-7"))
    assert resumed["id"] == frame["id"]


async def test_another_customers_chat_on_a_shared_device_is_never_shown(make_client, faq):
    alice = await make_client()
    await alice.hello(identity=sign("alice"))
    await alice.say("My address is 12 Garden Road, please confirm my order")
    await alice.until("stream.end")

    # Bob signs in on the same browser, which still holds Alice's conversation and token.
    bob = await make_client()
    frame = await bob.hello(conversation=alice.conversation, token=alice.token, identity=sign("bob", name="Bob"))

    assert frame["id"] != alice.conversation
    assert frame["customer"]["id"] == "bob"
    assert (await row(alice.conversation)).customer_id == "alice"
    await bob.say("Hello?")
    frames = await bob.until("stream.end")
    assert all("Garden Road" not in str(f) for f in [frame, *frames])


async def test_agents_see_who_the_store_said_the_customer_is(make_client, faq):
    shopper = await make_client()
    frame = await shopper.hello(identity=sign("cust-9", name="Chen Jing", email="chen@example.cn"))
    anonymous = await make_client()
    other = await anonymous.hello()

    rows = await database_sync_to_async(console_rows)(
        queryset=Conversation.objects.filter(pk__in=[frame["id"], other["id"]])
    )

    by_id = {r["id"]: r for r in rows}
    assert by_id[frame["id"]]["customer"] == {"id": "cust-9", "name": "Chen Jing", "email": "chen@example.cn"}
    assert by_id[other["id"]]["customer"] is None


# ------------------------------------------------------------------------- refused


@pytest.mark.parametrize(
    ("token", "code"),
    [
        pytest.param(lambda: sign(secret="not-the-stores-secret-0123456789"), "identity_invalid", id="forged"),
        pytest.param(lambda: sign(life_s=-120), "identity_expired", id="expired"),
        pytest.param(lambda: sign(secret=SECRET * 2, algorithm="HS512"), "identity_invalid", id="other-algorithm"),
        pytest.param(
            lambda: jwt.encode({"sub": "x", "exp": 9e9}, None, algorithm="none"), "identity_invalid", id="alg-none"
        ),
        pytest.param(lambda: sign(jti=None), "identity_invalid", id="no-jti"),
        pytest.param(lambda: sign(life_s=7200), "identity_invalid", id="lives-too-long"),
        pytest.param(lambda: sign(iat=int(time.time()) + 3600, life_s=3000), "identity_invalid", id="issued-in-future"),
        pytest.param(lambda: sign(sub=""), "identity_invalid", id="empty-sub"),
        pytest.param(lambda: "not.a.jwt", "identity_invalid", id="garbage"),
        pytest.param(lambda: 42, "identity_invalid", id="not-a-string"),
    ],
)
async def test_a_bad_identity_token_gets_its_code_and_4401(make_client, faq, token, code):
    shopper = await make_client()

    error, closed = await refused(shopper, identity=token())

    assert error["type"] == "error" and error["code"] == code and error["message"]
    assert closed == {"type": "websocket.close", "code": 4401}
    assert await database_sync_to_async(Conversation.objects.count)() == 0


async def test_a_replayed_identity_token_is_refused(make_client, faq):
    token = sign()
    first = await make_client()
    assert (await first.hello(identity=token))["type"] == "conversation"

    second = await make_client()
    error, closed = await refused(second, identity=token)

    assert error["code"] == "identity_replayed"
    assert closed == {"type": "websocket.close", "code": 4401}


async def test_identity_tokens_are_refused_when_the_store_set_no_secret(make_client, faq, settings):
    settings.KEFU_IDENTITY_SECRET = ""
    shopper = await make_client()

    error, closed = await refused(shopper, identity=sign())

    assert error["code"] == "identity_off"
    assert closed == {"type": "websocket.close", "code": 4401}


async def test_a_customer_token_does_not_open_an_anonymous_conversation(make_client, faq):
    # The derived customer token is valid only for a conversation that belongs to a customer.
    shopper = await make_client()
    frame = await shopper.hello()
    intruder = await make_client()
    await intruder.send(
        {"type": "hello", "conversation": frame["id"], "token": identity.customer_token(uuid.UUID(frame["id"]))}
    )
    assert await intruder.comm.receive_output(timeout=5) == {"type": "websocket.close", "code": 4403}


def test_two_workers_spending_one_token_at_once_accept_it_once(transactional_db, settings):
    settings.KEFU_IDENTITY_SECRET = SECRET
    token = sign()
    outcomes: list[str] = []
    start = threading.Barrier(2)

    def spend() -> None:
        start.wait()
        try:
            identity.identity_verify(token)
            outcomes.append("accepted")
        except identity.IdentityRejected as e:
            outcomes.append(e.code)
        finally:
            from django.db import connection

            connection.close()

    threads = [threading.Thread(target=spend) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    assert sorted(outcomes) == ["accepted", "identity_replayed"]
    assert UsedIdentityToken.objects.count() == 1


def test_spent_tokens_are_forgotten_once_expired(transactional_db, settings):
    from datetime import timedelta

    from django.utils import timezone

    settings.KEFU_IDENTITY_SECRET = SECRET
    identity.identity_verify(sign(life_s=600))

    assert identity.used_tokens_purge(now=timezone.now()) == 0
    assert identity.used_tokens_purge(now=timezone.now() + timedelta(seconds=600 + 61)) == 1
