"""Product cards (issue 36 items 2 and 4) over the sockets, in process: a ``product`` answer's
``stream.end`` carries the product's card (one a product of a "which one?") beside its whole
text, the stored row keeps it so a resumed socket's replay and the agents' history carry it too,
no other answer has one, hostile catalog fields stay plain text and bad addresses are dropped, a
descriptive question the catalog cannot answer gets the described card with no model, and an
agent's looked-up card reaches the shopper.

Personas: a shopper on /ws/chat/ (``make_client``), ``alice`` an agent on /ws/agent/.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from chat.models import Message
from routing.products.index import catalog
from store.catalog import import_catalog

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

LAMP = {
    "sku": "EMB-T",
    "title": "Ember Table Lamp",
    "description": "A brass table lamp with a linen shade.",
    "price": 129,
    "currency": "USD",
    "url": "https://shop.example/ember-table",
    "image": "https://cdn.shop.example/ember.jpg",
    "tags": ["lamp"],
    "attributes": {"dimmable": True, "material": "brushed brass"},
    "variants": [
        {"sku": "EMB-T-BR", "options": {"finish": "brass"}, "stock": 14},
        {"sku": "EMB-T-BK", "options": {"finish": "black"}, "stock": 0, "price": 139},
    ],
}
FLOOR = {
    **LAMP,
    "sku": "EMB-F",
    "title": "Ember Floor Lamp",
    "price": 219,
    "url": "/products/ember-floor",
    "image": "",
    "variants": [{"sku": "EMB-F-BR", "options": {"finish": "brass"}, "stock": 3}],
}
HOSTILE = {
    "sku": "VASE-X",
    "title": 'Zinnia <img src=x onerror="alert(1)"> Vase',
    "description": "<script>alert(2)</script> a vase",
    "price": 30,
    "currency": "USD",
    "url": "//evil.example/pay",
    "image": "https://evil.example/x.png",
    "attributes": {"watertight": True},
    "stock": 2,
}


@pytest.fixture
def products(tmp_path: Path, settings: Any) -> Any:
    """The test catalog imported, this process's index loaded; shop.example is the store's."""
    settings.KEFU_ANSWER_LINK_DOMAINS = ["shop.example"]

    def load() -> None:
        path = tmp_path / "catalog.jsonl"
        path.write_text("\n".join(json.dumps(r) for r in (LAMP, FLOOR, HOSTILE)) + "\n", encoding="utf-8")
        assert not import_catalog(path).errors
        catalog.reload()

    yield load
    catalog.snapshot = type(catalog.snapshot)()


async def ask(shopper: Any, text: str) -> dict[str, Any]:
    await shopper.say(text)
    return (await shopper.until("stream.end"))[-1]


async def test_product_answer_carries_its_card_and_the_replay_keeps_it(make_client, faq, products):
    await database_sync_to_async(products)()
    shopper = await make_client()
    hello = await shopper.hello()
    assert hello["image_hosts"] == []
    end = await ask(shopper, "Is the Ember Table Lamp in stock?")
    assert end["route"] == "product"
    # The whole answer is still in the text, for a client that does not know cards.
    assert end["text"].startswith("Stock of the Ember Table Lamp:\n1. brass: in stock (14)")
    assert end["cards"] == [
        {
            "sku": "EMB-T",
            "title": "Ember Table Lamp",
            "price": "129.00",
            "price_max": "139.00",
            "currency": "USD",
            "price_text": "$129.00 – $139.00",
            "stock": 14,
            "url": "https://shop.example/ember-table",
            "image": "https://cdn.shop.example/ember.jpg",
        }
    ]
    row = await database_sync_to_async(Message.objects.get)(pk=end["id"])
    assert row.cards == end["cards"]

    # A second socket resuming the conversation gets the stored answer with its card.
    again = await make_client()
    await again.hello(conversation=shopper.conversation, token=shopper.token, after=0)
    replayed = [f for f in await again.until("message") if f["type"] == "message"]
    while replayed[-1]["id"] != end["id"]:
        replayed.append(await again.recv())
    assert replayed[-1]["cards"] == end["cards"] and replayed[-1]["text"] == end["text"]
    assert "cards" not in replayed[0]  # the shopper's own question has none


async def test_which_one_has_a_card_each_and_other_answers_none(make_client, faq, products):
    await database_sync_to_async(products)()
    shopper = await make_client()
    await shopper.hello()
    end = await ask(shopper, "how much is the Ember lamp?")
    assert end["text"].startswith("Which one do you mean")
    assert sorted(c["sku"] for c in end["cards"]) == ["EMB-F", "EMB-T"]
    floor = next(c for c in end["cards"] if c["sku"] == "EMB-F")
    assert floor["url"] == "/products/ember-floor" and floor["image"] == "" and floor["price_text"] == "$219.00"
    end = await ask(shopper, "how long does shipping take?")
    assert end["route"] != "product" and "cards" not in end


async def test_hostile_catalog_fields_stay_text_and_bad_addresses_are_dropped(make_client, faq, products):
    await database_sync_to_async(products)()
    shopper = await make_client()
    await shopper.hello()
    end = await ask(shopper, "is the Zinnia vase watertight?")
    assert end["route"] == "product"
    [card] = end["cards"]
    assert card["title"] == 'Zinnia <img src=x onerror="alert(1)"> Vase'  # as text, for textContent
    assert card["description"] == "<script>alert(2)</script> a vase"
    assert card["url"] == "" and card["image"] == ""  # protocol-relative and a foreign image host
    assert card["facts"] == [["watertight", "yes"]]


async def test_descriptive_question_without_the_fact_gets_the_described_card(make_client, faq, products):
    await database_sync_to_async(products)()
    shopper = await make_client()
    await shopper.hello()
    end = await ask(shopper, "can the Ember Table Lamp go in the dishwasher?")
    assert end["route"] == "product"
    assert end["text"] == (
        "The catalog does not list that for the Ember Table Lamp. Here is what it says about it:\n"
        "A brass table lamp with a linen shade.\ndimmable: yes\nmaterial: brushed brass\n"
        "Product page: https://shop.example/ember-table"
    )
    assert end["cards"][0]["description"] == "A brass table lamp with a linen shade."


def make_agent_user(username: str) -> Any:
    from django.contrib.auth.models import Permission, User

    user = User.objects.create_user(username, password="pw", is_staff=True, first_name=username.title())
    user.user_permissions.add(Permission.objects.get(codename="handle_conversations"))
    return User.objects.get(pk=user.pk)


def session_cookie(user: Any) -> bytes:
    from django.test import Client

    c = Client()
    c.force_login(user)
    return f"sessionid={c.cookies['sessionid'].value}".encode()


async def next_frame(comm: WebsocketCommunicator, *kinds: str) -> dict[str, Any]:
    while True:
        frame = await comm.receive_json_from(timeout=20)
        if frame["type"] in kinds:
            return frame


async def test_agent_looks_a_product_up_and_the_shopper_sees_its_card(make_client, faq, products, client):
    from config.asgi import application

    await database_sync_to_async(products)()
    shopper = await make_client()
    await shopper.hello()
    await ask(shopper, "hello, I need some help")

    user = await database_sync_to_async(make_agent_user)("alice")
    await database_sync_to_async(client.force_login)(user)
    found = (await database_sync_to_async(client.get)("/console/api/products", {"q": "emb-t"})).json()["results"]
    assert found[0]["sku"] == "EMB-T" and found[0]["description"].startswith("A brass")
    by_title = (await database_sync_to_async(client.get)("/console/api/products", {"q": "zinnia"})).json()
    assert [c["sku"] for c in by_title["results"]] == ["VASE-X"] and by_title["results"][0]["url"] == ""
    # The console may show a card's image from the store's domains, nowhere else.
    page = await database_sync_to_async(client.get)("/console/")
    assert "img-src 'self' data: " in page["Content-Security-Policy"]
    assert " shop.example *.shop.example" in page["Content-Security-Policy"]
    assert "evil.example" not in page["Content-Security-Policy"]

    headers = [
        (b"host", b"127.0.0.1:8000"),
        (b"origin", b"http://127.0.0.1:8000"),
        (b"cookie", await database_sync_to_async(session_cookie)(user)),
    ]
    alice = WebsocketCommunicator(application, "/ws/agent/", headers=headers)
    assert (await alice.connect())[0]
    try:
        cid = shopper.conversation
        await alice.send_json_to({"type": "take_over", "conversation": cid})
        await next_frame(alice, "status", "conversation.update")
        await alice.send_json_to({"type": "open", "conversation": cid})
        await next_frame(alice, "history")
        await alice.send_json_to(
            {"type": "message", "conversation": cid, "client_id": "c1", "text": " ", "cards": ["EMB-T", "NOPE"]}
        )
        frame = await shopper.until("message")
        sent = frame[-1]
        while sent.get("role") != "agent":
            sent = (await shopper.until("message"))[-1]
        assert [c["sku"] for c in sent["cards"]] == ["EMB-T"]  # built from the catalog; unknown skipped
        assert sent["text"] == "Ember Table Lamp — $129.00 – $139.00 — https://shop.example/ember-table"

        await alice.send_json_to(
            {"type": "message", "conversation": cid, "client_id": "c2", "text": "x", "cards": "EMB-T"}
        )
        assert (await next_frame(alice, "error"))["code"] == "invalid"

        await alice.send_json_to({"type": "open", "conversation": cid})
        history = await next_frame(alice, "history")
        assert [m["cards"][0]["sku"] for m in history["messages"] if "cards" in m] == ["EMB-T"]
    finally:
        await alice.disconnect()
    assert uuid.UUID(cid)
