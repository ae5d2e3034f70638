"""The remote model grounded on the catalog (issue 36, items 3 and 4) over /ws/chat/, in process,
against the project's OpenAI-compatible test upstream: a question the catalog's template cannot
answer goes to the model with the named products' facts in its prompt, and a hostile upstream
that states a wrong price or a wrong stock level reaches the shopper with neither (not in a
delta, not in ``stream.end``, not in the stored row): the answer stops before the figure and a
person takes over; a right figure passes unchanged. English and Chinese figures.

Personas: a shopper on /ws/chat/ (``make_client``); the test upstream (``remote``) scripted per
test.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async

from chat.models import Conversation, ConversationStatus, Message
from routing.decide.answers import handoff_text
from routing.products.index import catalog
from store.catalog import import_catalog

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fake_openai import Behaviour

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

LAMP = {
    "sku": "EMB-T",
    "title": "Ember Table Lamp",
    "description": "A brass table lamp with a linen shade; takes one E27 bulb.",
    "price": 129,
    "currency": "USD",
    "url": "https://shop.example/ember-table",
    "tags": ["lamp"],
    "attributes": {"dimmable": True, "material": "brushed brass"},
    "variants": [
        {"sku": "EMB-T-BR", "options": {"finish": "brass"}, "stock": 14},
        {"sku": "EMB-T-BK", "options": {"finish": "black"}, "stock": 0, "price": 139},
    ],
}
TEAPOT = {
    "sku": "TEA-1",
    "title": "Kiln Teapot",
    "description": "A stoneware teapot, 800 ml.",
    "price": 199,
    "currency": "CNY",
    "url": "https://shop.example/kiln-teapot",
    "tags": ["teapot"],
    "attributes": {"material": "stoneware"},
    "stock": 6,
}
# Questions the catalog's attributes cannot answer by template: they go to the model.
QUESTION = "Would the Ember Table Lamp suit a small bedroom?"
QUESTION_ZH = "Kiln Teapot 适合送给长辈吗？"


@pytest.fixture
def products(tmp_path: Path, settings: Any) -> Any:
    """The test catalog imported and this process's index loaded."""
    settings.KEFU_ANSWER_LINK_DOMAINS = ["shop.example"]

    def load() -> None:
        path = tmp_path / "catalog.jsonl"
        path.write_text("\n".join(json.dumps(r) for r in (LAMP, TEAPOT)) + "\n", encoding="utf-8")
        assert not import_catalog(path).errors
        catalog.reload()

    yield load
    catalog.snapshot = type(catalog.snapshot)()


def deltas(frames: list[dict[str, Any]]) -> str:
    return "".join(f["text"] for f in frames if f["type"] == "stream.delta")


async def answered(shopper: Any, text: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    await shopper.say(text)
    frames = await shopper.until("stream.end")
    return frames, frames[-1]


def request_for(remote: Any, text: str) -> dict[str, Any]:
    return next(r for r in reversed(remote.requests) if r["messages"][-1]["content"] == text)


async def test_grounded_prompt_holds_the_facts_and_a_right_price_passes(make_client, faq, remote, products):
    await database_sync_to_async(products)()
    right = "Yes: it is dimmable, $129 in brass, 14 in stock. The black one is $139."
    # Split inside the figures: "$1" + "29", "1" + "4 in stock".
    remote.push(
        Behaviour(
            text=None, chunks=["Yes: it is dimmable, $1", "29 in brass, 1", "4 in stock. The black one is $", "139."]
        )
    )
    shopper = await make_client()
    await shopper.hello()
    frames, end = await answered(shopper, QUESTION)
    assert end["route"] == "llm.simple"
    assert end["text"] == deltas(frames) == right
    system = request_for(remote, QUESTION)["messages"][0]["content"]
    assert "Catalog facts (the only source of prices and stock levels):" in system
    assert "- Ember Table Lamp (sku EMB-T), https://shop.example/ember-table" in system
    assert "finish brass (EMB-T-BR): 129 USD, 14 in stock; finish black (EMB-T-BK): 139 USD, sold out" in system
    assert "dimmable: yes; material: brushed brass" in system and "takes one E27 bulb" in system
    assert "Kiln Teapot" not in system  # only the product the message is about
    row = await database_sync_to_async(Message.objects.get)(pk=end["id"])
    assert row.text == right and "catalog EMB-T" in row.route_reason


async def wrong_figure_test(make_client, remote, question: str, chunks: list[str], shown: str, wrong: str, locale: str):
    remote.push(Behaviour(chunks=chunks))
    shopper = await make_client()
    await shopper.hello()
    await shopper.say(question)
    frames = await shopper.until("status")
    end = next(f for f in frames if f["type"] == "stream.end")
    text = deltas(frames)
    assert wrong not in text and wrong not in end["text"]
    assert text == end["text"] == shown + handoff_text(locale)
    assert end["route"] == "llm.simple" and not end.get("cut")
    assert frames[-1]["type"] == "status" and frames[-1]["status"] == "waiting_agent"
    row = await database_sync_to_async(Message.objects.get)(pk=end["id"])
    assert row.text == end["text"] and wrong not in row.text
    assert row.route_reason.startswith("the model stated a ") and wrong in row.route_reason
    conv = await database_sync_to_async(Conversation.objects.get)(pk=row.conversation_id)
    assert conv.status == ConversationStatus.WAITING_AGENT
    assert conv.handoff_reason == row.route_reason


async def test_a_wrong_price_never_reaches_the_shopper(make_client, faq, remote, products):
    await database_sync_to_async(products)()
    await wrong_figure_test(
        make_client,
        remote,
        QUESTION,
        ["It would. It costs $", "9", "9 and 14 are in stock."],
        "It would. It costs \n\n",
        "99",
        "en",
    )


async def test_a_wrong_stock_level_never_reaches_the_shopper(make_client, faq, remote, products):
    await database_sync_to_async(products)()
    await wrong_figure_test(
        make_client,
        remote,
        QUESTION,
        ["It would. It costs $129 and we have 5", "0 left", ", order soon."],
        "It would. It costs $129 and we have \n\n",
        "50",
        "en",
    )


async def test_chinese_figures_are_checked_too(make_client, faq, remote, products):
    await database_sync_to_async(products)()
    await wrong_figure_test(
        make_client,
        remote,
        QUESTION_ZH,
        ["很适合。售价 ¥199，现在还剩", "9", "件。"],
        "很适合。售价 ¥199，现在还剩\n\n",
        "9件",
        "zh",
    )


async def test_a_wrong_yuan_price_is_cut_and_a_right_one_passes(make_client, faq, remote, products):
    await database_sync_to_async(products)()
    remote.push(Behaviour(chunks=["很适合，售价 199", " 元，库存 6 件。"]))
    shopper = await make_client()
    await shopper.hello()
    frames, end = await answered(shopper, QUESTION_ZH)
    assert end["text"] == deltas(frames) == "很适合，售价 199 元，库存 6 件。"
    assert "sku TEA-1" in request_for(remote, QUESTION_ZH)["messages"][0]["content"]
    await wrong_figure_test(
        make_client, remote, QUESTION_ZH, ["很适合，售价 ", "99 元", "。"], "很适合，售价 \n\n", "99", "zh"
    )


# --- The catalog's tools (search_products, get_product) ----------------------------------------------


def tool_names(body: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in body.get("tools") or []]


async def test_catalog_tools_answer_and_their_figures_pass(make_client, faq, remote, products):
    await database_sync_to_async(products)()
    question = "Do you have a lamp for a reading corner?"
    remote.push(
        Behaviour(tool_calls=[{"name": "search_products", "arguments": {"query": "lamp"}}]),
        Behaviour(tool_calls=[{"name": "get_product", "arguments": {"sku": "EMB-T"}}]),
        Behaviour(chunks=["The Ember Table Lamp, $", "139 in black (sold out) or $129 in brass, 14 in stock."]),
    )
    shopper = await make_client()
    await shopper.hello()
    frames, end = await answered(shopper, question)
    assert (
        end["text"] == deltas(frames) == "The Ember Table Lamp, $139 in black (sold out) or $129 in brass, 14 in stock."
    )
    first = request_for(remote, question)
    assert "search_products" in tool_names(first) and "get_product" in tool_names(first)
    assert "order_status" not in tool_names(first)  # not an order question
    assert "Catalog facts" not in first["messages"][0]["content"]  # no product named: nothing grounded
    # The tools' results went back to the model: the search's summary, then the product's facts.
    last = remote.requests[-1]["messages"]
    results = [json.loads(m["content"]) for m in last if m["role"] == "tool"]
    assert results[0]["ok"] and results[0]["products"][0]["sku"] == "EMB-T"
    assert results[0]["products"][0]["price_min"] == "129.00" and results[0]["products"][0]["in_stock"] == 14
    variants = results[1]["product"]["variants"]
    assert [(v["sku"], v["price"], v["stock"]) for v in variants] == [
        ("EMB-T-BR", "129.00", 14),
        ("EMB-T-BK", "139.00", 0),
    ]


async def test_a_price_with_no_catalog_source_is_cut_even_with_tools(make_client, faq, remote, products):
    await database_sync_to_async(products)()
    # The model skips the tools and invents a price for a lamp: no figure allows it.
    await wrong_figure_test(
        make_client,
        remote,
        "Do you have a lamp for a reading corner?",
        ["Our reading lamp costs $", "49 and ships fast."],
        "Our reading lamp costs \n\n",
        "49",
        "en",
    )


async def test_a_follow_up_and_a_comparison_are_grounded_on_their_products(make_client, faq, remote, products):
    await database_sync_to_async(products)()
    shopper = await make_client()
    await shopper.hello()
    _, end = await answered(shopper, "Is the Ember Table Lamp in stock?")
    assert end["route"] == "product"  # the catalog's template, no model
    follow_up = "Would it suit a small bedroom?"
    _, end = await answered(shopper, follow_up)
    assert end["route"] == "llm.simple"
    system = request_for(remote, follow_up)["messages"][0]["content"]
    assert "- Ember Table Lamp (sku EMB-T)" in system and "Kiln Teapot" not in system
    compare = "Which makes a better gift, the Ember Table Lamp or the Kiln Teapot?"
    _, end = await answered(shopper, compare)
    system = request_for(remote, compare)["messages"][0]["content"]
    assert "- Ember Table Lamp (sku EMB-T)" in system and "- Kiln Teapot (sku TEA-1)" in system
    assert "199 CNY, 6 in stock" in system
