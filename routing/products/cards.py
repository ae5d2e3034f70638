"""Product cards (issue 36, docs/protocol.md, *Product cards*): a catalog product as a
:class:`~routing.types.ProductCard`, the rich part of a ``product`` answer or of an agent's reply.

A card carries plain text and checked addresses only. The catalog is the store's, but it may
come from a shop system anyone with a product editor can write to, so nothing in it is trusted
as markup or as an address: the clients set every field as text, and here an address is kept
only when it is a path on the store's own site (``/products/ember``, never ``//evil.example``)
or an ``http(s)`` address on the store's domains (``routing.services.answer_link_domains``,
``lib.links.host_allowed``); an image may also come from ``KEFU_PRODUCT_IMAGE_HOSTS`` (the shop's
image CDN). An address refused is dropped (""), the card is still shown.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from django.conf import settings

from cache_layer.policy import link_domains
from lib.links import host_allowed, host_of
from routing.products import answers
from routing.types import CARD_DESCRIPTION_CHARS, CARD_FACTS, MAX_CARDS, ProductCard
from store.types import ProductView

__all__ = ["card_of", "cards_of", "image_hosts", "safe_address"]

# Control characters, whitespace, quotes and angle brackets never belong in an address we show.
_BAD_CHARS = re.compile(r"[\x00-\x20\x7f<>\"'`\\]")


def image_hosts() -> list[str]:
    """The hosts a card's image may come from besides the store's domains (normalised):
    ``KEFU_PRODUCT_IMAGE_HOSTS`` (a subdomain of one counts too)."""
    return sorted({h for h in (host_of(x) for x in getattr(settings, "KEFU_PRODUCT_IMAGE_HOSTS", [])) if h})


def safe_address(address: str, domains: Iterable[str]) -> str:
    """``address`` when a card may show it, else "": a path on the store's own site (starting
    with one ``/``) or an ``http://``/``https://`` address whose host is one of ``domains`` or
    under one. Anything holding whitespace, quotes, ``<``, ``>`` or ``\\`` is refused, as is any
    other scheme (``javascript:``, ``data:``) and a protocol-relative ``//host``."""
    a = address.strip()
    if not a or len(a) > 2000 or _BAD_CHARS.search(a):
        return ""
    if a.startswith("/"):
        return a if not a.startswith("//") else ""
    scheme, sep, _rest = a.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        return ""
    return a if host_allowed(host_of(a), [d for d in domains if d]) else ""


def _short(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else f"{text[: limit - 1].rstrip()}…"


def _fact(value: object, zh: bool) -> str:
    if isinstance(value, bool):
        return ("是" if value else "否") if zh else ("yes" if value else "no")
    if isinstance(value, list):
        return ("、" if zh else ", ").join(str(v) for v in value)
    return str(value)


def card_of(
    view: ProductView, *, describe: bool = False, variant_skus: Sequence[str] = (), domains: Sequence[str] | None = None
) -> ProductCard:
    """The card of ``view``: price (a range over its variants, or those of ``variant_skus``),
    units on hand, link and image; with ``describe``, also its description and attributes (a
    descriptive question, issue 36 item 4). ``domains``: the store's (read from the settings when
    None). Pure but for the settings."""
    store_domains = list(link_domains() if domains is None else domains)
    variants = tuple(v for v in view.variants if v.sku in variant_skus) or view.variants
    prices = [v.price for v in variants] or [view.price]
    low, high = min(prices), max(prices)
    price_text = answers.money(low, view.currency)
    if high != low:
        price_text = f"{price_text} – {answers.money(high, view.currency)}"
    stock: int | None = sum(max(v.stock, 0) for v in variants) if variants else view.stock
    zh = view.locale.split("-")[0] == "zh"
    facts: tuple[tuple[str, str], ...] = ()
    if describe:
        labels = answers.LABELS["zh" if zh else "en"]
        facts = tuple(
            (_short(labels.get(k, k.replace("_", " ")), 60), _short(_fact(v, zh), 200))
            for k, v in view.attributes.items()
            if v is not None and v != ""
        )[:CARD_FACTS]
    return ProductCard(
        sku=view.sku,
        title=_short(view.title, 200),
        price=f"{low:.2f}",
        price_max=f"{high:.2f}" if high != low else "",
        currency=view.currency,
        price_text=price_text,
        stock=stock,
        url=safe_address(view.url, store_domains),
        image=safe_address(view.image, [*store_domains, *image_hosts()]),
        description=_short(view.description, CARD_DESCRIPTION_CHARS) if describe else "",
        facts=facts,
    )


def cards_of(views: Iterable[ProductView | None], *, describe: bool = False) -> tuple[ProductCard, ...]:
    """The cards of ``views`` (None skipped), at most ``MAX_CARDS``."""
    domains = link_domains()
    return tuple(card_of(v, describe=describe, domains=domains) for v in views if v is not None)[:MAX_CARDS]
