"""Finding the products a message names (routing/products/index.py) and what it asks
(routing/products/answers.py): pure functions on a hand-made catalog, no database."""

from __future__ import annotations

import pytest

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
