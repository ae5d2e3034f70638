"""Finding the products a message names (routing/products/index.py) and what it asks
(routing/products/answers.py): pure functions on a hand-made catalog, no database."""

from __future__ import annotations

import pytest

from routing.decide.product_flow import replay
from routing.products import answers
from routing.products.index import build, find
from store.types import ProductNames


def names(sku: str, en: str, zh: str, tags: tuple[str, ...], options: dict[str, tuple[str, ...]]) -> ProductNames:
    return ProductNames(
        sku=sku,
        titles={"en": en, "zh": zh},
        tags=tags,
        variant_skus=tuple(options),
        options=options,
        attribute_keys=("material",),
    )


SNAPSHOT = build(
    [
        names("TL", "Ember Table Lamp", "余烬台灯", ("lamp", "台灯"), {"TL-BK": ("black", "黑色")}),
        names("FL", "Ember Floor Lamp", "余烬落地灯", ("lamp", "落地灯"), {"FL-BR": ("brass", "黄铜色")}),
        names("MS", "Morning Mug Set of 2", "晨光马克杯两只装", ("mug",), {}),
        names("MG", "Morning Mug", "晨光马克杯", ("mug",), {}),
        names("VS", "Tidewater Vase", "潮汐花瓶", ("vase",), {}),
    ]
)


def skus(text: str) -> list[str]:
    return sorted(p.names.sku for p in find(SNAPSHOT, text).products)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Is the Ember Table Lamp dimmable?", ["TL"]),
        ("do you have the embr table lamp in black?", ["TL"]),  # misspelt
        ("how much is the Tidewatr vase", ["VS"]),
        ("Tide vase in stock?", ["VS"]),  # shortened
        ("how much is the Ember lamp?", ["FL", "TL"]),  # two fit: "which one?"
        ("how much is the Morning Mug?", ["MG"]),  # its whole title against the set's
        ("morning mug set price", ["MS"]),
        ("余烬台灯多少钱？", ["TL"]),
        ("余烬灯多少钱", ["FL", "TL"]),
        ("price of TL-BK?", ["TL"]),  # a variant's SKU
        ("how much is the lamp?", []),  # a category word alone
        ("is this item in stock? my order is late", []),  # generic words
        ("这个商品有货吗", []),
        ("I ordered this morning, how much is shipping?", []),  # a common word starting a title
        ("how much is the Zephyr chair?", []),
        ("how much is the Ember floorlamp?", ["FL"]),  # two words written as one
        ("is the embrtablelamp in stock?", ["TL"]),  # three, one misspelt
        ("embrlamp price", ["FL", "TL"]),
        ("tidewatervase price", ["VS"]),
        ("is this itemorder in stock?", []),  # generic words joined name nothing
        ("how much is the lampitem?", []),
        ("do you have the Ember lamp in black?", ["TL"]),  # only the table lamp comes in black
        ("余烬灯黑色的有货吗", ["TL"]),
    ],
)
def test_products_named(text, expected):
    assert skus(text) == expected


def test_what_a_message_asks():
    assert answers.asked("how much is it and is it in stock?").kinds == ("price", "stock")
    assert answers.asked("Is it dimmable, and which bulb?").attributes == ("dimmable", "bulb")
    assert answers.asked("晨光马克杯两只装多少钱？").kinds == ("price",)  # not its capacity
    assert answers.asked("what colours does it come in?").kinds == ("options",)
    assert answers.asked("what is its finish made of", ("finish_material",)).kinds[0] == "attributes"
    assert answers.asked("my lamp arrived broken").kinds == ()


def test_what_the_conversation_is_about_is_read_back_from_its_turns():
    """routing.decide.product_flow.replay: the product and variant a follow-up means."""
    turns = [
        ("shopper", "do you have the Ember table lamp in black?"),
        ("bot", "Sorry, the Ember Table Lamp in black is out of stock at the moment."),
        ("shopper", "how much is it?"),
        ("bot", "The Ember Table Lamp in black costs $129.00."),
    ]
    ctx = replay(turns, SNAPSHOT)
    assert ctx.focus is not None and ctx.focus.names.sku == "TL" and ctx.variants == ("TL-BK",)
    assert ctx.asked.kinds == ("price",)
    # Another product named ends it; a question about something else leaves it.
    assert replay([*turns, ("shopper", "is the Tidewater vase in stock?")], SNAPSHOT).focus.names.sku == "VS"
    assert replay([*turns, ("shopper", "how long is delivery?")], SNAPSHOT).variants == ("TL-BK",)
    # Only kefu's answer is left in the turns read: it names the product and its variant.
    assert replay(turns[3:], SNAPSHOT).variants == ("TL-BK",)
    # A "which one?" opens choices; a pick closes them; a newer "which order?" takes an ordinal.
    asked = [
        ("shopper", "how much is the Ember lamp?"),
        ("bot", "Which one do you mean: the Ember Floor Lamp or the Ember Table Lamp?"),
    ]
    ctx = replay(asked, SNAPSHOT)
    assert [p.names.sku for p in ctx.choices] == ["FL", "TL"] and ctx.choices_asked.kinds == ("price",)
    assert replay([*asked, ("shopper", "the second one")], SNAPSHOT).focus.names.sku == "TL"
    order = [("shopper", "cancel my order"), ("bot", "Which order do you mean?\n1. KF-1002\n2. KF-1001")]
    ctx = replay([*asked, *order, ("shopper", "the first one")], SNAPSHOT)
    assert ctx.focus is None and len(ctx.choices) == 2 and ctx.order_which_at == -1


def test_a_follow_ups_words():
    assert answers.rest_words("how much is it?") == []
    assert answers.rest_words("那个灰色的多少钱？", ("灰色",)) == []
    assert answers.rest_words("what about in oat?", ("oat",)) == []
    assert answers.rest_words("how much is shipping?") == ["shipping"]
