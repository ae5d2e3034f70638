"""The ``product`` route over the shopper socket (issue 35): facts from the catalog by template,
no model; "which one?" between look-alikes, answered by "the first"; an unknown product goes
where it would without a catalog; a restock imported by another process is in the next answer;
a named option sticks to its variant over the next turns until another product is named (en,
zh); names written as one word; a product's "which one?" and an order task of the same
conversation both kept, a bare "the first one" answering the newer question."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from channels.db import database_sync_to_async
from django.db import connection

from cache_layer.models import CachedAnswer
from routing.models import ConversationTask
from routing.products.index import catalog
from store.catalog import import_catalog
from store.models import DemoOrder

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "store"))
from test_order_actions import ask as say
from test_order_actions import demo_orders, order_faq, order_status, shopper

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

__all__ = ["demo_orders", "order_faq"]  # the order actions' fixtures, used here too

ROOT = Path(__file__).resolve().parents[2]
LAMP = {
    "sku": "EMB-T",
    "title": "Ember Table Lamp",
    "description": "Brass.",
    "price": 129,
    "currency": "USD",
    "url": "https://shop.example/ember-table",
    "tags": ["lamp"],
    "attributes": {"dimmable": True, "material": "brushed brass"},
    "variants": [
        {"sku": "EMB-T-BR", "options": {"finish": "brass"}, "stock": 14},
        {"sku": "EMB-T-BK", "options": {"finish": "black"}, "stock": 0},
    ],
}
FLOOR = {
    **LAMP,
    "sku": "EMB-F",
    "title": "Ember Floor Lamp",
    "price": 219,
    "url": "https://shop.example/ember-floor",
    "variants": [{"sku": "EMB-F-BR", "options": {"finish": "brass"}, "stock": 3}],
}
LAMP_ZH = {**LAMP, "locale": "zh", "title": "余烬台灯", "tags": ["台灯"], "attributes": {"dimmable": True}}
LAMP_ZH["variants"] = [
    {"sku": "EMB-T-BR", "options": {"finish": "黄铜色"}, "stock": 14},
    {"sku": "EMB-T-BK", "options": {"finish": "黑色"}, "stock": 0},
]
# Two look-alike throws; only the wool one comes in grey.
WOOL = {
    "sku": "LOOM-W",
    "title": "Loom Wool Throw",
    "price": 89,
    "currency": "USD",
    "url": "https://shop.example/loom-wool",
    "tags": ["throw", "blanket"],
    "attributes": {"material": "merino wool"},
    "variants": [
        {"sku": "LOOM-W-GRY", "options": {"colour": "grey"}, "price": 95, "stock": 4},
        {"sku": "LOOM-W-OAT", "options": {"colour": "oat"}, "stock": 0},
    ],
}
WOOL_ZH = {**WOOL, "locale": "zh", "title": "织机羊毛盖毯", "tags": ["盖毯"], "attributes": {"material": "美利奴羊毛"}}
WOOL_ZH["variants"] = [
    {"sku": "LOOM-W-GRY", "options": {"colour": "灰色"}, "price": 95, "stock": 4},
    {"sku": "LOOM-W-OAT", "options": {"colour": "燕麦色"}, "stock": 0},
]
COTTON = {
    **WOOL,
    "sku": "LOOM-C",
    "title": "Loom Cotton Throw",
    "price": 59,
    "url": "https://shop.example/loom-cotton",
    "attributes": {"material": "cotton"},
    "variants": [
        {"sku": "LOOM-C-NAT", "options": {"colour": "natural"}, "stock": 11},
        {"sku": "LOOM-C-CHR", "options": {"colour": "charcoal"}, "stock": 1},
    ],
}
COTTON_ZH = {**COTTON, "locale": "zh", "title": "织机棉质盖毯", "tags": ["盖毯"], "attributes": {"material": "棉"}}
COTTON_ZH["variants"] = [
    {"sku": "LOOM-C-NAT", "options": {"colour": "本色"}, "stock": 11},
    {"sku": "LOOM-C-CHR", "options": {"colour": "炭灰色"}, "stock": 1},
]
WHICH_LAMP = (
    "Which one do you mean: the Ember Floor Lamp or the Ember Table Lamp?",
    "Which one do you mean: the Ember Table Lamp or the Ember Floor Lamp?",
)
MEI = "mei.chen@example.com"


def write(path: Path, *records: object) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in records]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def products(tmp_path):
    """The test catalog imported and this process's catalog index loaded on it."""

    def load() -> None:
        result = import_catalog(
            write(tmp_path / "catalog.jsonl", LAMP, LAMP_ZH, FLOOR, WOOL, WOOL_ZH, COTTON, COTTON_ZH)
        )
        assert not result.errors
        catalog.reload()

    yield load
    catalog.snapshot = type(catalog.snapshot)()


async def ask(make_client, text: str, shopper=None, **hello):
    if shopper is None:
        shopper = await make_client()
        await shopper.hello(**hello)
    await shopper.say(text)
    return shopper, (await shopper.until("stream.end"))[-1]


async def test_stock_question_is_answered_from_the_catalog_and_never_cached(make_client, faq, products):
    await database_sync_to_async(products)()
    _, end = await ask(make_client, "Is the Ember Table Lamp in stock?")
    assert end["route"] == "product" and end["model"] is None
    assert end["text"] == (
        "Stock of the Ember Table Lamp:\n1. brass: in stock (14)\n2. black: out of stock\n"
        "Product page: https://shop.example/ember-table"
    )
    assert end["usage"]["cost_usd"] == 0 and end["usage"]["saved_usd"] > 0
    assert await database_sync_to_async(CachedAnswer.objects.count)() == 0


async def test_named_option_sticks_to_its_variant_in_chinese_too(make_client, faq, products):
    await database_sync_to_async(products)()
    _, end = await ask(make_client, "do you have the ember table lamp in black?")
    assert end["route"] == "product"
    assert end["text"].startswith("Sorry, the Ember Table Lamp in black is out of stock at the moment.")
    _, end = await ask(make_client, "余烬台灯黄铜色的有货吗？", locale="zh")
    assert end["route"] == "product"
    assert end["text"].startswith("「余烬台灯」（黄铜色）有货，现有 14 件。")


async def test_two_similar_products_ask_which_one_and_the_first_answers(make_client, faq, products):
    await database_sync_to_async(products)()
    shopper, end = await ask(make_client, "how much is the Ember lamp?")
    assert end["route"] == "product"
    assert end["text"] in (
        "Which one do you mean: the Ember Floor Lamp or the Ember Table Lamp?",
        "Which one do you mean: the Ember Table Lamp or the Ember Floor Lamp?",
    )
    first = end["text"].split(": the ")[1].split(" or ")[0]
    # Read back from the conversation, not stored as its task (an order task stays free).
    assert not await database_sync_to_async(ConversationTask.objects.exists)()
    _, end = await ask(make_client, "the first one", shopper=shopper)
    price = "$129.00" if first == "Ember Table Lamp" else "$219.00"
    assert end["route"] == "product" and end["text"].startswith(f"The {first} costs {price}.")
    # Answered: "the second one" now picks nothing.
    _, end = await ask(make_client, "the second one", shopper=shopper)
    assert end["route"] != "product"
    # A pick naming the whole product keeps the question asked ("how much").
    shopper, end = await ask(make_client, "how much is the Ember lamp?")
    _, end = await ask(make_client, "the Ember Floor Lamp", shopper=shopper)
    assert end["text"] == "The Ember Floor Lamp costs $219.00.\nProduct page: https://shop.example/ember-floor"
    # A pick may ask a fact of its own.
    shopper, end = await ask(make_client, "is the Ember lamp in stock?")
    assert end["text"] in WHICH_LAMP
    _, end = await ask(make_client, "how much is the floor one?", shopper=shopper)
    assert end["route"] == "product" and end["text"].startswith("The Ember Floor Lamp costs $219.00.")


async def test_unknown_product_is_not_answered_by_the_catalog(make_client, faq, products):
    await database_sync_to_async(products)()
    _, end = await ask(make_client, "How much is the Zephyr chair?")
    assert end["route"] != "product"
    assert "Zephyr" not in end["text"] and "Ember" not in end["text"]
    _, end = await ask(make_client, "how much is the lamp?")  # a category word names no product
    assert end["route"] != "product"


async def test_restock_by_another_process_with_a_bad_line_is_in_the_next_answer(make_client, faq, products, tmp_path):
    await database_sync_to_async(products)()
    shopper, end = await ask(make_client, "is the ember table lamp in black in stock?")
    assert "out of stock" in end["text"]
    restock = {**LAMP, "variants": [{**LAMP["variants"][0]}, {**LAMP["variants"][1], "stock": 5}]}
    path = write(tmp_path / "restock.jsonl", restock, {"sku": "BAD", "title": "No price", "currency": "USD"})
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": f"sqlite:///{connection.settings_dict['NAME']}",
    }
    done = subprocess.run(
        [sys.executable, "manage.py", "import_products", str(path)], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 1 and "line 2: 'price' is missing" in done.stderr
    # This process's index was not reloaded: the stock is read from the catalog as it is now.
    _, end = await ask(make_client, "is the ember table lamp in black in stock?", shopper=shopper)
    assert end["route"] == "product"
    assert end["text"].startswith("Yes, the Ember Table Lamp in black is in stock (5).")


async def test_a_named_option_sticks_to_its_variant_until_another_product_is_named(make_client, faq, products):
    await database_sync_to_async(products)()
    # The option tells the look-alikes apart: only the wool throw comes in grey.
    shopper, end = await ask(make_client, "do you have the Loom throw in grey?")
    assert end["route"] == "product"
    assert end["text"].startswith("Yes, the Loom Wool Throw in grey is in stock (4).")
    _, end = await ask(make_client, "how much is it?", shopper=shopper)
    assert end["route"] == "product" and end["model"] is None
    assert end["text"] == "The Loom Wool Throw in grey costs $95.00.\nProduct page: https://shop.example/loom-wool"
    _, end = await ask(make_client, "and is it still in stock?", shopper=shopper)
    assert end["text"].startswith("Yes, the Loom Wool Throw in grey is in stock (4).")
    _, end = await ask(make_client, "what is it made of?", shopper=shopper)  # the product's own fact
    assert end["text"].startswith("The Loom Wool Throw, material: merino wool")
    _, end = await ask(make_client, "how much is it?", shopper=shopper)  # grey still
    assert end["text"].startswith("The Loom Wool Throw in grey costs $95.00.")
    _, end = await ask(make_client, "what about in oat?", shopper=shopper)  # another option: same question
    assert end["text"].startswith("The Loom Wool Throw in oat costs $89.00.")
    # A question about something else is no follow-up.
    _, end = await ask(make_client, "How long does delivery take?", shopper=shopper)
    assert end["route"] == "faq"
    # A new product named ends the carry-over.
    _, end = await ask(make_client, "is the Ember Table Lamp dimmable?", shopper=shopper)
    assert end["text"].startswith("Yes, the Ember Table Lamp is dimmable.")
    _, end = await ask(make_client, "how much is it?", shopper=shopper)
    assert end["route"] == "product" and end["text"].startswith("The Ember Table Lamp costs $129.00.")
    _, end = await ask(make_client, "is it in stock?", shopper=shopper)
    assert end["text"].startswith("Stock of the Ember Table Lamp:\n1. brass: in stock (14)\n2. black: out of stock")
    _, end = await ask(make_client, "do you have it in grey?", shopper=shopper)  # the throw's option
    assert end["text"].startswith("The Ember Table Lamp comes in finish brass, black.")
    # A follow-up with nothing before it is not answered from the catalog.
    _, end = await ask(make_client, "how much is it?")
    assert end["route"] != "product"


async def test_a_named_option_sticks_in_chinese(make_client, faq, products):
    await database_sync_to_async(products)()
    shopper, end = await ask(make_client, "织机羊毛盖毯有哪些颜色？", locale="zh")
    assert end["route"] == "product" and end["text"].startswith("「织机羊毛盖毯」有这些选择：颜色：灰色、燕麦色。")
    _, end = await ask(make_client, "那个灰色的多少钱？", shopper=shopper)
    assert end["route"] == "product"
    assert end["text"] == "「织机羊毛盖毯」（灰色）售价 $95.00。\n商品页面：https://shop.example/loom-wool"
    _, end = await ask(make_client, "有货吗？", shopper=shopper)
    assert end["text"].startswith("「织机羊毛盖毯」（灰色）有货，现有 4 件。")
    # "炭灰色" is the cotton throw's, not the wool throw's "灰色".
    _, end = await ask(make_client, "织机盖毯炭灰色的还有吗", shopper=shopper)
    assert end["text"].startswith("「织机棉质盖毯」（炭灰色）有货，现有 1 件。")
    _, end = await ask(make_client, "多少钱？", shopper=shopper)
    assert end["text"].startswith("「织机棉质盖毯」（炭灰色）售价 $59.00。")


async def test_names_written_as_one_word_are_found_and_generic_words_never(make_client, faq, products):
    await database_sync_to_async(products)()
    _, end = await ask(make_client, "how much is the Ember floorlamp?")
    assert end["route"] == "product" and end["text"].startswith("The Ember Floor Lamp costs $219.00.")
    _, end = await ask(make_client, "is the embrtablelamp in stock?")
    assert end["route"] == "product" and end["text"].startswith("Stock of the Ember Table Lamp:")
    _, end = await ask(make_client, "how much is the embrlamp?")  # one word for two products
    assert end["route"] == "product" and end["text"] in WHICH_LAMP
    _, end = await ask(make_client, "is this itemorder in stock?")
    assert end["route"] != "product"


# ------------------------------------------------------------------ a product's "which one?" and an order task


async def test_a_products_which_one_keeps_the_pending_order_task_and_both_are_answered(
    make_client, order_faq, demo_orders, remote, products
):
    await database_sync_to_async(products)()
    client = await shopper(make_client)
    end = await say(client, "I want to cancel my order KF-1002")
    assert end["text"].endswith("please also tell me the e-mail address you placed it with.")
    end = await say(client, "how much is the Ember lamp?")
    assert end["route"] == "product" and end["text"] in WHICH_LAMP
    task = await database_sync_to_async(ConversationTask.objects.get)(conversation_id=client.conversation)
    assert task.intent == "cancel" and task.order_number == "KF-1002"  # the order task is kept
    end = await say(client, "the table one")
    assert end["route"] == "product" and end["text"].startswith("The Ember Table Lamp costs $129.00.")
    end = await say(client, MEI)  # the older question is still answerable
    assert end["route"] == "action" and end["text"].startswith("Order KF-1002 (Oak table lamp, 129.00 EUR)")
    assert end["text"].endswith('Reply "yes" to confirm or "no" to keep it.')
    end = await say(client, "yes")
    assert end["text"].startswith("Done: order KF-1002 is cancelled.")
    assert await order_status("KF-1002") == "cancelled"


async def test_an_order_step_keeps_the_products_which_one(make_client, order_faq, demo_orders, remote, products):
    await database_sync_to_async(products)()
    client = await shopper(make_client)
    end = await say(client, "is the Ember lamp in stock?")
    assert end["text"] in WHICH_LAMP
    end = await say(client, "I want to cancel my order KF-1002")
    assert end["route"] == "faq"
    end = await say(client, MEI)
    assert end["route"] == "action" and "Shall I cancel it?" in end["text"]
    # Not a piece of the order task: it answers the product's "which one?" (stock was asked),
    # and the offer still waits for its yes.
    end = await say(client, "the floor one")
    assert end["route"] == "product" and end["text"].startswith("Yes, the Ember Floor Lamp in brass is in stock (3).")
    end = await say(client, "yes")
    assert end["text"].startswith("Done: order KF-1002 is cancelled.")


async def test_the_first_one_answers_the_newer_which_one(make_client, order_faq, demo_orders, remote, products):
    await database_sync_to_async(products)()
    await database_sync_to_async(lambda: DemoOrder.objects.filter(number="KF-1001").update(status="placed"))()
    client = await shopper(make_client, "demo-mei")
    which_order = await say(client, "cancel my order")
    assert which_order["text"].startswith("Which order do you mean?\n1. KF-1002 (")
    which_lamp = await say(client, "how much is the Ember lamp?")
    assert which_lamp["text"] in WHICH_LAMP
    first = which_lamp["text"].split(": the ")[1].split(" or ")[0]
    # The product's question is the newer: "the first one" answers it...
    end = await say(client, "the first one")
    assert end["route"] == "product" and end["text"].startswith(f"The {first} costs ")
    # ...and the order's, still open, takes the next one.
    end = await say(client, "the second one")
    assert end["route"] == "action" and end["text"].startswith("Order KF-1001 (")
    assert "Shall I cancel it?" in end["text"]
    # The other way round: an order's "which one?" newer than a product's takes "the first one".
    other = await shopper(make_client, "demo-mei")
    await say(other, "how much is the Ember lamp?")
    which_order = await say(other, "cancel my order")
    assert which_order["text"].startswith("Which order do you mean?")
    end = await say(other, "the first one")
    assert end["route"] == "action" and end["text"].startswith("Order KF-1002 (")
    end = await say(other, "the floor one")  # the product's is still answerable
    assert end["route"] == "product" and end["text"].startswith("The Ember Floor Lamp costs $219.00.")
