"""The ``product`` route (docs/routing.md, step 1d): a message that names a catalog product and
asks about its price, stock, options or attributes is answered from the catalog by a template
(``routing.products.answers``), no model, before the FAQ.

- One product named (``routing.products.index``): its facts, read fresh from the catalog (price
  and stock as the latest import left them, whichever process imported), narrowed to the variants
  the message names by option ("in grey", "150x200") or SKU; with no variant named, a short list
  of the variants.
- Several products fit as well: "which one do you mean?" naming them; the choice waits in the
  conversation's task (``routing.orders.task_state``, intent ``product``: ``choices`` the skus,
  ``email`` the facts asked), so "the first", "the floor one" or "the black one" answers it.
- No product named, or none of the facts asked in the catalog: None, and the router goes on as
  it would without a catalog (never an invented product).

Product answers are never shared or cached (``Decision.shareable`` False): stock and price change.

Each product answer carries product cards (``routing.products.cards``, issue 36): the product's,
or one per product of a "which one?" (at most ``MAX_CARDS``); a question about an attribute gets
the card with the product's description and attributes. A descriptive question whose fact the
catalog lacks goes on to the model, or, when no model is configured, gets the product's card with
its description instead of nothing (:func:`_described`). The cards are read after the answer
(two more indexed queries a product, in the same thread hop as their building).
"""

from __future__ import annotations

from dataclasses import replace

from asgiref.sync import sync_to_async

from routing.decide.decision import Decision
from routing.orders import task_state
from routing.orders.tasks import ordinal_in
from routing.products import answers
from routing.products.cards import cards_of
from routing.products.index import GENERIC, Found, ProductKeys, catalog, normalise, terms
from routing.types import MAX_CARDS, ProductCard, Question
from routing.upstream.tiers import configured_tiers
from store.services import product_view

__all__ = ["product_decision"]

SHORT = 6  # a message of at most this many words may answer a pending "which one?"
MAX_CHOICES = 4


def _decision(text: str, locale: str, reason: str) -> Decision:
    return Decision(route="product", locale=locale, text=text, reason=reason, shareable=False)


def _cards(skus: tuple[str, ...], locale: str, describe: bool) -> tuple[ProductCard, ...]:
    """Blocking (two queries a product): the cards of ``skus`` (at most ``MAX_CARDS``)."""
    return cards_of((product_view(sku, locale) for sku in skus[:MAX_CARDS]), describe=describe)


_cards_async = sync_to_async(_cards, thread_sensitive=False)


async def _carded(decision: Decision, skus: tuple[str, ...], asked: answers.Asked) -> Decision:
    """``decision`` with the cards of ``skus`` (described when the question asked attributes)."""
    cards = await _cards_async(skus, decision.locale, "attributes" in asked.kinds)
    return replace(decision, cards=cards) if cards else decision


def _described_text(card: ProductCard, locale: str) -> str:
    """The whole text of :func:`_described`'s answer (the card's description, facts and link)."""
    zh = locale.split("-")[0] == "zh"
    lines = [
        f"目录里没有列出这一点。以下是「{card.title}」的介绍："
        if zh
        else f"The catalog does not list that for the {card.title}. Here is what it says about it:"
    ]
    if card.description:
        lines.append(card.description)
    lines += [f"{label}：{value}" if zh else f"{label}: {value}" for label, value in card.facts]
    if card.url:
        lines.append(f"商品页面：{card.url}" if zh else f"Product page: {card.url}")
    return "\n".join(lines)


async def _described(keys: ProductKeys, locale: str, asked: answers.Asked) -> Decision | None:
    """With no model configured, a descriptive question ("is it dimmable?") about one product
    whose catalog entry lacks the fact asked: the product's card with its description and
    attributes, rather than nothing (issue 36 item 4); None with a model (it answers, grounded)
    or when the product has neither description nor attributes."""
    if "attributes" not in asked.kinds or configured_tiers():
        return None
    cards = await _cards_async((keys.names.sku,), locale, True)
    if not cards or not (cards[0].description or cards[0].facts):
        return None
    return replace(
        _decision(_described_text(cards[0], locale), locale, f"product {keys.names.sku}: described, no model"),
        cards=cards,
    )


def _attribute_keys(found: Found) -> tuple[str, ...]:
    return tuple(dict.fromkeys(k for p in found.products for k in p.names.attribute_keys))


def _only_names(text: str, found: Found) -> bool:
    """Whether ``text`` says nothing but product names, categories and option values ("Ember
    lamp?", "the grey Loom throw"): asked for as a whole (price and stock)."""
    known = set(GENERIC)
    for p in found.products:
        known |= p.naming | p.category | p.tagged | {w for vals in p.options.values() for v in vals for w in terms(v)}
    rest = [w for w in terms(text) if w not in known and not w.isdigit()]
    return not rest


def _answer(keys: ProductKeys, text: str, locale: str, asked: answers.Asked) -> str | None:
    """Blocking (two queries): the catalog's answer about ``keys``' product, or None."""
    view = product_view(keys.names.sku, locale)
    if view is None:  # pruned since the index was loaded
        return None
    variants = answers.variants_named(view, normalise(text), keys.options)
    return answers.product_text(view, asked, variants, locale)


_answer_async = sync_to_async(_answer, thread_sensitive=False)


def _encode(asked: answers.Asked) -> str:
    return ",".join([*asked.kinds, *(f"a:{k}" for k in asked.attributes)])[:254]


def _decode(value: str) -> answers.Asked:
    parts = [p for p in value.split(",") if p]
    return answers.Asked(
        kinds=tuple(p for p in parts if not p.startswith("a:")),
        attributes=tuple(p[2:] for p in parts if p.startswith("a:")),
    )


def _pick(text: str, choices: tuple[str, ...]) -> ProductKeys | None:
    """The product among ``choices`` (skus) that ``text`` picks: by position ("the second one",
    "第一个"), by a word of its name ("the floor one"), or by an option value only it has ("the
    black one"); None when that leaves more or fewer than one."""
    by_sku = catalog.snapshot.by_sku
    pick = ordinal_in(text)
    if pick is not None and -len(choices) <= pick < len(choices):
        return by_sku.get(choices[pick])
    words = set(terms(text))
    named = [by_sku[s] for s in choices if s in by_sku and by_sku[s].naming & words]
    if len(named) == 1:
        return named[0]
    norm = normalise(text)
    with_option = [
        by_sku[s]
        for s in choices
        if s in by_sku and any(v and v in norm for vals in by_sku[s].options.values() for v in vals)
    ]
    return with_option[0] if len(with_option) == 1 else None


async def product_decision(question: Question, locale: str, *, store_actions: bool) -> Decision | None:
    """The ``product`` route's answer to ``question`` (see the module docstring), or None.
    Costs no query for a message that names no product; one indexed query for a short message
    that may answer a pending "which one?"; two to read a product. ``store_actions``: False for
    an agent's draft (no task is read or written)."""
    snapshot = catalog.snapshot
    if not snapshot.products:
        return None
    text = question.text
    found = catalog.find(text)
    asked = answers.asked(text, _attribute_keys(found))
    cid = question.conversation_id
    may_pick = len(terms(text)) <= SHORT and not asked.kinds
    if (
        store_actions
        and cid is not None
        and may_pick
        and (found.products or ordinal_in(text) is not None or catalog.option_named(text))
    ):
        task = await task_state.task_get_async(cid, question.session_from_seq)
        if task is not None and task.intent == "product" and not task.expired and task.choices:
            chosen = _pick(text, task.choices)
            if chosen is not None:
                pending = _decode(task.email)
                reply = await _answer_async(chosen, text, locale, pending)
                if reply is not None:
                    await task_state.task_drop_async(cid)
                    picked = _decision(reply, locale, f"product {chosen.names.sku}, picked from {len(task.choices)}")
                    return await _carded(picked, (chosen.names.sku,), pending)
    if not found.products:
        return None
    if not asked.kinds:
        if not _only_names(text, found):
            return None
        asked = answers.Asked(kinds=("overview",))
    if len(found.products) > 1:
        shown = found.products[:MAX_CHOICES]
        lang = locale.split("-")[0]
        titles = [
            p.names.titles.get(lang) or p.names.titles.get("en") or next(iter(p.names.titles.values())) for p in shown
        ]
        if store_actions and cid is not None:
            await task_state.task_save_async(
                cid,
                question.session_from_seq,
                task_state.Task(intent="product", choices=tuple(p.names.sku for p in shown), email=_encode(asked)),
            )
        skus = ", ".join(p.names.sku for p in shown)
        which = _decision(answers.which_one_text(titles, locale), locale, f"product: which one of {skus}")
        return await _carded(which, tuple(p.names.sku for p in shown), asked)
    keys = found.products[0]
    reply = await _answer_async(keys, text, locale, asked)
    if reply is None:
        return await _described(keys, locale, asked)
    one = _decision(reply, locale, f"product {keys.names.sku}: {'+'.join(asked.kinds)} s={found.scores[0]:.1f}")
    return await _carded(one, (keys.names.sku,), asked)
