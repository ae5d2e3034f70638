"""A product card's addresses (issue 36, routing/products/cards.py): only a path on the store's
site or an http(s) address on the store's domains is kept; every other catalog value is dropped."""

from __future__ import annotations

import pytest

from routing.products.cards import safe_address

STORE = ["shop.example"]


@pytest.mark.parametrize(
    "address",
    [
        "/products/ember",
        "https://shop.example/p/ember",
        "http://www.shop.example/p/ember?x=1",
        "HTTPS://cdn.shop.example/e.jpg",
    ],
)
def test_the_stores_own_addresses_are_kept(address):
    assert safe_address(address, STORE) == address


@pytest.mark.parametrize(
    "address",
    [
        "javascript:alert(1)",
        "data:text/html,<b>x</b>",
        "//evil.example/pay",
        "https://evil.example/pay",
        "https://shop.example.evil.example/pay",
        "https://evil-shop.example/pay",
        'https://shop.example/p" onerror="alert(1)',
        "/p/<script>",
        "https://shop.example/a b",
        "/\\evil.example",
        "ftp://shop.example/x",
        "",
    ],
)
def test_anything_else_is_dropped(address):
    assert safe_address(address, STORE) == ""
