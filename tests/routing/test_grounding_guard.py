"""The catalog grounding of remote answers (routing/products/grounding.py, routing/prompt/build.py):
the figure guard holds back only a possible price or stock figure, releases a right one and any
other number unchanged, reports a wrong one and releases nothing of it, however the stream is
split; the catalog facts in the prompt are counted and left out, last product first, when the
tier's budget cannot hold them. Pure: no database, no server."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from lib.tokens import count_tokens
from routing.products.grounding import FigureGuard, Figures, figures_in_text
from routing.prompt.build import CATALOG_HEADING, build_prompt
from routing.upstream import tokens as router_tokens

FIGURES = Figures(prices=frozenset({Decimal(129), Decimal("139.50")}), stocks=frozenset({0, 3, 14}))


def streamed(text: str, pieces: int) -> tuple[str, str | None, list[str]]:
    """``text`` fed in ``pieces``-code-point pieces: (released text, wrong figure, each release)."""
    guard, out = FigureGuard(FIGURES), []
    for i in range(0, len(text), pieces):
        released, wrong = guard.feed(text[i : i + pieces])
        out.append(released)
        if wrong is not None:
            return "".join(out), wrong.text, out
    released, wrong = guard.end()
    out.append(released)
    return "".join(out), wrong.text if wrong else None, out


@pytest.mark.parametrize("pieces", [1, 2, 5, 1000])
@pytest.mark.parametrize(
    "text",
    [
        "Yes. It costs $129 in brass and 14 are in stock.",
        "The black one is US$139.50, only 3 left!",
        "It takes 2 bulbs (E27) and ships in 3 days.",
        "售价 ¥129，库存 14 件。",
        "黑色款 139.50 元，还剩3件",
        "Use the USB port; price USD 129.",
        "It was designed in 2019 by 4 people.",
    ],
)
def test_right_figures_and_other_numbers_pass_unchanged(text: str, pieces: int) -> None:
    assert streamed(text, pieces)[:2] == (text, None)


@pytest.mark.parametrize("pieces", [1, 3, 1000])
@pytest.mark.parametrize(
    ("text", "shown", "wrong"),
    [
        ("It costs $99 today.", "It costs ", "$99"),
        ("It costs $1,290 today.", "It costs ", "$1,290"),
        ("It costs $129.99 today.", "It costs ", "$129.99"),
        ("Price: CNY 199", "Price: ", "CNY 199"),
        ("Only 50 left in brass.", "Only ", "50 left"),
        ("We have 7 in stock.", "We have ", "7 in stock"),
        ("售价 99 元。", "售价 ", "99 元"),
        ("库存 8 件。", "库存 ", "8 件"),
        ("现在还剩5件", "现在还剩", "5件"),
        ("Stock level: 12.", "Stock level: ", "12"),
    ],
)
def test_a_wrong_figure_is_reported_and_never_released(text: str, shown: str, wrong: str, pieces: int) -> None:
    released, found, _ = streamed(text, pieces)
    assert (released, found) == (shown, wrong)


def test_text_before_a_figure_is_released_at_once() -> None:
    guard = FigureGuard(FIGURES)
    assert guard.feed("Hello, it costs ") == ("Hello, it costs ", None)
    assert guard.feed("$12") == ("", None)  # held: the number may go on
    assert guard.feed("9 in brass, ") == ("$129 in brass, ", None)  # a price: judged once whole
    assert guard.feed("1") == ("", None)
    assert guard.feed("4 in") == ("", None)  # no currency: held while the words after it come
    assert guard.feed(" brass. Yes") == ("14 in brass. Yes", None)


def test_store_information_prices_are_allowed() -> None:
    assert figures_in_text("Free shipping on orders over $50. 满 300 元包邮。Ships in 3 days.") == {
        Decimal(50),
        Decimal(300),
    }


@pytest.fixture
def _tiers(settings: Any) -> None:
    settings.KEFU_TIERS = {tier: cfg.with_current(model=f"fake-{tier}") for tier, cfg in settings.KEFU_TIERS.items()}
    settings.KEFU_CONTEXT_TURNS = 5
    router_tokens.warm_tokenizer("fake-simple")


@pytest.mark.usefixtures("_tiers")
def test_catalog_facts_are_counted_and_left_out_when_they_do_not_fit(settings: Any) -> None:
    products = [
        "- Ember Table Lamp (sku EMB-T)\n  Price: 129 USD, 14 in stock",
        "- Kiln Teapot (sku TEA-1)\n" + "x " * 400,
    ]
    settings.KEFU_CONTEXT_TOKENS = {"simple": 3000, "medium": 6000, "complex": 12000}
    plain = build_prompt(grounding=[], history=[], text="hi", locale="en")
    full = build_prompt(grounding=[], history=[], text="hi", locale="en", products=products)
    system = full.messages[0]["content"]
    assert CATALOG_HEADING in system and "sku EMB-T" in system and "sku TEA-1" in system
    assert full.catalog_products == 2 and full.catalog_tokens == full.tokens - plain.tokens > 0
    assert full.catalog_tokens == count_tokens(system, "fake-simple") - count_tokens(
        plain.messages[0]["content"], "fake-simple"
    )
    # A budget that holds the first product's facts but not the second's.
    settings.KEFU_CONTEXT_TOKENS = {"simple": plain.tokens + 200, "medium": 6000, "complex": 12000}
    one = build_prompt(grounding=[], history=[], text="hi", locale="en", products=products)
    assert one.catalog_products == 1 and "sku EMB-T" in one.messages[0]["content"]
    assert "sku TEA-1" not in one.messages[0]["content"] and one.tokens <= plain.tokens + 200
