"""Catalog grounding for the remote model (issue 36, item 3): the few products a message is
about go into the prompt as catalog facts, and every price or stock level the model streams is
checked against them before it reaches the shopper.

- :func:`skus_about` / :func:`product_views`: the products a message names (``routing.products.index``; at most
  :data:`MAX_PRODUCTS`), or, for a follow-up that names none ("is it dimmable?"), the ones the
  last shopper messages named; read fresh from the catalog (``store.services.product_view``).
- :func:`facts_text`: their facts as the prompt states them (title, link, description, attributes,
  each variant's options, price, currency and stock), one block a product, for
  ``routing.prompt.build.build_prompt(products=...)``.
- :class:`Figures`: the prices and stock levels those facts allow.
- :class:`FigureGuard`: a filter over the streamed answer. Text is released as it comes, except
  while a possible price or stock figure is being written (from a currency sign or code, or a
  number, until the words after it say what it is): a price (``$129``, ``¥129``, ``129 元``,
  ``USD 129``) or a stock level (``14 in stock``, ``3 left``, ``库存 14 件``, ``还剩3件``) is
  released when it is one the catalog gave (any variant of the grounded products, or a figure the
  store information of the prompt states), else the guard reports it and releases nothing of it.
  Any other number ("2 bulbs", "in 3 days", "E27") is released as soon as the words after it show
  it is neither.

Known limits (docs/products.md): a figure written in words ("fourteen") or a stock level whose
unit is far from the number ("14 of them are in stock") is not recognised; a quantity written
like a stock level ("buy 2 件") is checked as one (a false alarm hands the answer to a person,
never shows a wrong figure).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from routing.products.index import GENERIC, catalog, terms
from store.services import product_view
from store.types import ProductView

__all__ = [
    "MAX_PRODUCTS",
    "FigureGuard",
    "Figures",
    "WrongFigure",
    "about_catalog",
    "facts_text",
    "figures_in_text",
    "product_views",
    "skus_about",
]

MAX_PRODUCTS = 3
#: A product's description is cut to this many code points in the prompt.
DESCRIPTION_CHARS = 600
#: The shopper messages (newest first) read for a follow-up that names no product.
FOLLOW_UP_MESSAGES = 2


def skus_about(text: str, *, earlier: Sequence[str] = ()) -> tuple[str, ...]:
    """The skus of the catalog products ``text`` is about, best first, at most
    :data:`MAX_PRODUCTS`: every product it names (a comparison names several), else those the newest of ``earlier`` (the
    conversation's shopper messages, oldest first; the newest :data:`FOLLOW_UP_MESSAGES` are
    read) named. ``()`` when none. Pure (the catalog index in memory); no database."""
    found = catalog.find(text, every=True)
    if not found.products:
        for before in list(reversed(earlier))[:FOLLOW_UP_MESSAGES]:
            found = catalog.find(before, every=True)
            if found.products:
                break
    return tuple(p.names.sku for p in found.products[:MAX_PRODUCTS])


def about_catalog(text: str, *, named: bool) -> bool:
    """Whether a remote-bound message is about the catalog, so the catalog's tools are offered:
    it names a product (``named``), or holds a word of the catalog's titles, categories or tags
    ("lamp", "台灯"). False with an empty catalog. Pure."""
    snapshot = catalog.snapshot
    if not snapshot.products:
        return False
    if named:
        return True
    vocabulary = snapshot.vocabulary
    return any(w in vocabulary for w in terms(text) if w not in GENERIC)


def product_views(skus: Sequence[str], locale: str) -> list[ProductView]:
    """The catalog products ``skus`` in ``locale``, read fresh (price and stock as stored now),
    in order; a sku the catalog no longer has is left out. Blocking (two queries a product)."""
    views = []
    for sku in skus:
        view = product_view(sku, locale)
        if view is not None:
            views.append(view)
    return views


def _money(value: Decimal) -> str:
    return f"{value:.2f}".removesuffix(".00")


def facts_text(views: Sequence[ProductView]) -> list[str]:
    """The catalog facts of ``views`` for the system prompt, one block a product::

    - Ember Table Lamp (sku EMB-T), https://shop.example/ember-table
      Description: A brass table lamp...
      Attributes: dimmable: yes; material: brushed brass
      Variants: finish brass (EMB-T-BR): 129 USD, 14 in stock; finish black (EMB-T-BK): 139 USD, sold out
    """
    blocks = []
    for v in views:
        lines = [f"- {v.title} (sku {v.sku})" + (f", {v.url}" if v.url else "")]
        if v.description.strip():
            description = " ".join(v.description.split())
            if len(description) > DESCRIPTION_CHARS:
                description = description[: DESCRIPTION_CHARS - 1].rstrip() + "…"
            lines.append(f"  Description: {description}")
        if v.attributes:
            shown = {True: "yes", False: "no"}
            attrs = "; ".join(f"{k}: {shown.get(a, a) if isinstance(a, bool) else a}" for k, a in v.attributes.items())
            lines.append(f"  Attributes: {attrs}")
        if v.variants:
            parts = []
            for var in v.variants:
                options = ", ".join(f"{k} {o}" for k, o in var.options.items()) or var.sku
                stock = f"{var.stock} in stock" if var.stock > 0 else "sold out"
                parts.append(f"{options} ({var.sku}): {_money(var.price)} {v.currency}, {stock}")
            lines.append("  Variants: " + "; ".join(parts))
        else:
            stock = "stock not tracked" if v.stock is None else (f"{v.stock} in stock" if v.stock > 0 else "sold out")
            lines.append(f"  Price: {_money(v.price)} {v.currency}, {stock}")
        blocks.append("\n".join(lines))
    return blocks


# --- Figures ---------------------------------------------------------------------------------------

_CURRENCY = r"(?:US\$|HK\$|\$|¥|￥|€|£|USD|CNY|RMB|EUR|GBP)"
_NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
_PRICE_AFTER = re.compile(r"\s*(?:元|块|美元|人民币|USD|CNY|RMB|EUR|GBP|dollars?\b|yuan\b|euros?\b)", re.IGNORECASE)
_STOCK_AFTER = re.compile(
    r"\s*(?:(?:units?|pieces?|pcs|items?|of them)\s+)?(?:(?:are|is)\s+(?:still\s+)?)?"
    r"(?:件|个|台|只|套|盏|张|units?\b|pieces?\b|pcs\b|items?\b|in[ -]stock\b|left\b|available\b|remaining\b|on hand\b)",
    re.IGNORECASE,
)
_STOCK_BEFORE = re.compile(r"(?:库存|剩|还有|现货|stock(?: level)?(?: of| is)?:?|inventory(?: of| is)?:?)\s*$", re.I)
_FIGURE = re.compile(rf"(?P<cur>{_CURRENCY})?\s?(?P<num>{_NUMBER})", re.IGNORECASE)
_CODES = ("US$", "HK$", "USD", "CNY", "RMB", "EUR", "GBP")
_SIGNS = "$¥￥€£"
#: The words after a number that say what it is are read up to this many code points, or to the
#: end of the sentence, whichever comes first.
LOOKAHEAD = 24
_SENTENCE_END = re.compile(r"[\n。！？!?;；]|\.(?:\s|$)")


def _amount(num: str) -> Decimal | None:
    try:
        return Decimal(num.replace(",", ""))
    except InvalidOperation:
        return None


def figures_in_text(text: str) -> set[Decimal]:
    """The prices ``text`` states with a currency (``$50``, ``50 元``): figures the store's own
    information gives, which an answer may repeat."""
    found: set[Decimal] = set()
    guard = FigureGuard(Figures(prices=frozenset(), stocks=frozenset()), collect=found)
    guard.feed(text)
    guard.end()
    return found


@dataclass(frozen=True)
class Figures:
    """The figures an answer may state: ``prices`` (any variant's, the product's, and the prices
    the store information states) and ``stocks`` (each variant's units, the product's, and the
    products' totals)."""

    prices: frozenset[Decimal]
    stocks: frozenset[int]

    @classmethod
    def of(cls, views: Sequence[ProductView], *, also: Iterable[Decimal] = ()) -> Figures:
        prices = {v.price for v in views} | {var.price for v in views for var in v.variants} | set(also)
        stocks = {var.stock for v in views for var in v.variants}
        stocks |= {s for v in views for s in (v.stock, v.in_stock()) if s is not None}
        return cls(prices=frozenset(prices), stocks=frozenset(stocks))


@dataclass(frozen=True)
class WrongFigure:
    """A figure the catalog did not give: ``kind`` ``price`` or ``stock``, ``text`` as written."""

    kind: str
    text: str

    def describe(self) -> str:
        return f"{self.kind} {self.text!r}"


class FigureGuard:
    """Hold back a streamed answer only while a possible price or stock figure is being written,
    and check it against ``figures`` (module docstring).

    :meth:`feed` takes the next piece and returns ``(text to release, wrong figure or None)``;
    after a wrong figure nothing more is released (the caller cuts the answer there). :meth:`end`
    releases what is held at the end of the stream, checked the same way. ``collect``: record
    every price found instead of judging (for :func:`figures_in_text`)."""

    def __init__(self, figures: Figures, *, collect: set[Decimal] | None = None) -> None:
        self.figures = figures
        self._held = ""
        self._before = ""  # the last released code points: what precedes a held figure
        self._collect = collect
        self.wrong: WrongFigure | None = None

    def allow(self, views: Sequence[ProductView]) -> None:
        """Allow the figures of ``views`` too (products a catalog tool's result stated to the
        model, ``routing.orders.tools.run_product_tool``)."""
        more = Figures.of(views)
        self.figures = Figures(prices=self.figures.prices | more.prices, stocks=self.figures.stocks | more.stocks)

    def feed(self, text: str) -> tuple[str, WrongFigure | None]:
        if self.wrong is not None:
            return "", self.wrong
        self._held += text
        return self._scan(final=False)

    def end(self) -> tuple[str, WrongFigure | None]:
        if self.wrong is not None:
            return "", self.wrong
        return self._scan(final=True)

    def _release(self, upto: int, out: list[str]) -> None:
        piece, self._held = self._held[:upto], self._held[upto:]
        if piece:
            out.append(piece)
            self._before = (self._before + piece)[-32:]

    def _trigger(self) -> int:
        """Where in the held text a figure may start (a currency sign or code, or a number not
        inside a word), or ``len`` of it when nowhere."""
        held = self._held
        for i, ch in enumerate(held):
            prev = held[i - 1] if i else (self._before[-1:] or " ")
            if ch in _SIGNS:
                return i
            if ch.isdigit() and ch.isascii():
                if not (prev.isascii() and (prev.isalnum() or prev in "_-")):
                    return i
            elif ch.upper() in "UHCREG" and not (prev.isascii() and prev.isalpha()):
                rest = held[i:].upper()
                for code in _CODES:
                    if code.startswith(rest):  # a code still being written, at the end
                        return i
                    nxt = rest[len(code) : len(code) + 1]
                    if rest.startswith(code) and not (nxt.isascii() and nxt.isalpha()):
                        return i
        return len(held)

    def _scan(self, *, final: bool) -> tuple[str, WrongFigure | None]:
        out: list[str] = []
        while self._held:
            start = self._trigger()
            self._release(start, out)
            if not self._held:
                break
            match = _FIGURE.match(self._held)
            if match is None:
                # A sign or code with no number yet: wait while it may still become one.
                if not final and len(self._held) < 6 and re.fullmatch(rf"{_CURRENCY}?\s?|[A-Za-z$]{{1,3}}", self._held):
                    break
                self._release(1, out)
                continue
            end = match.end()
            tail = self._held[end:]
            if not final:
                # The number may go on ("12" -> "129", "12." -> "12.5"), or the words after it,
                # which say what it is, are still coming.
                if not tail or re.fullmatch(r"[.,]\d*", tail):
                    break
                # After a currency sign or code it is a price whatever follows: judged at once.
                stop = _SENTENCE_END.search(tail)
                if not match.group("cur") and stop is None and len(tail) < LOOKAHEAD:
                    break
            wrong = self._judge(match, tail)
            if wrong is not None:
                self.wrong = wrong
                self._held = ""
                return "".join(out), wrong
            self._release(end, out)
        if final and self._held:
            self._release(len(self._held), out)
        return "".join(out), None

    def _judge(self, match: re.Match[str], tail: str) -> WrongFigure | None:
        num = match.group("num")
        amount = _amount(num)
        if amount is None:
            return None
        stop = _SENTENCE_END.search(tail)
        after = tail[: stop.start()] if stop else tail[:LOOKAHEAD]
        price = bool(match.group("cur")) or _PRICE_AFTER.match(after) is not None
        if price:
            if self._collect is not None:
                self._collect.add(amount)
                return None
            if amount in self.figures.prices:
                return None
            written = match.group(0).strip()
            unit = _PRICE_AFTER.match(after)
            return WrongFigure("price", written + (unit.group(0) if unit and not match.group("cur") else ""))
        stock = _STOCK_AFTER.match(after) is not None or _STOCK_BEFORE.search(self._before) is not None
        if not stock or self._collect is not None:
            return None
        if amount == amount.to_integral_value() and int(amount) in self.figures.stocks:
            return None
        unit = _STOCK_AFTER.match(after)
        return WrongFigure("stock", num + (unit.group(0) if unit else ""))
