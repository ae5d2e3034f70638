"""The ``product`` route (docs/routing.md, step 1d): a message that names a catalog product and
asks about its price, stock, options or attributes is answered from the catalog by a template
(``routing.products.answers``), no model, before the FAQ.

- One product named (``routing.products.index``): its facts, read fresh from the catalog (price
  and stock as the latest import left them, whichever process imported), narrowed to the variants
  the message names by option ("in grey", "150x200") or SKU; with no variant named, a short list
  of the variants.
- Several products fit as well: "which one do you mean?" naming them. "The first", "the floor
  one" or "the black one" answers it later with the question first asked.
- A follow-up that names no product ("how much is it?", "is it in stock?", "what about in
  blue?", "那个灰色的多少钱？"): the conversation's product, narrowed to the variant it was last
  narrowed to, or to the option the follow-up names (an option it does not come in: the options
  it does).
- No product named or meant, or none of the facts asked in the catalog: None, and the router goes
  on as it would without a catalog (never an invented product).

What the conversation is about is read back from its last turns (``HistoryLoader``, the
router's own prompt history, :data:`TURNS` turns of the current session): :func:`replay` goes
through the shopper's messages and kefu's "which one?" questions as the route went through them
(and kefu's product answers, which name their product, when the message that named it lies
before the turns read).
Nothing is stored, so a product question never touches the conversation's order task
(``routing.orders.task_state``) and an order step never loses a product's "which one?": both stay
answerable, and a bare "the first one" answers the newer of the two "which one?" questions.
The history is read only for a message that may be such a follow-up (two queries); a message
naming a product, or asking nothing of one, costs none.

Product answers are never shared or cached (``Decision.shareable`` False): stock and price change.

Each product answer carries product cards (``routing.products.cards``, issue 36): the product's,
or one per product of a "which one?" (at most ``MAX_CARDS``); a question about an attribute gets
the card with the product's description and attributes. A descriptive question whose fact the
catalog lacks goes on to the model, or, when no model is configured, gets the product's card with
its description instead of nothing (:func:`_described`). The cards are read after the answer
(two more indexed queries a product, in the same thread hop as their building).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from asgiref.sync import sync_to_async

from routing.decide.decision import Decision
from routing.orders.replies import is_which_order
from routing.orders.tasks import ordinal_in
from routing.products import answers
from routing.products.cards import cards_of
from routing.products.index import (
    GENERIC,
    CatalogSnapshot,
    Found,
    ProductKeys,
    catalog,
    find,
    normalise,
    options_named,
    terms,
)
from routing.types import MAX_CARDS, HistoryLoader, ProductCard, Question
from routing.upstream.tiers import configured_tiers
from store.services import product_view

__all__ = ["Context", "product_decision", "replay"]

SHORT = 6  # a message of at most this many words may answer a pending "which one?"
MAX_CHOICES = 4
TURNS = 8  # the turns a follow-up reads back (a shopper message and the answers after it each)
FOLLOW_UP_WORDS = 14  # a longer message is never a follow-up about the conversation's product
OVERVIEW = answers.Asked(kinds=("overview",))


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


def _attribute_keys(products: tuple[ProductKeys, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(k for p in products for k in p.names.attribute_keys))


def _only_names(text: str, found: Found) -> bool:
    """Whether ``text`` says nothing but product names, categories and option values ("Ember
    lamp?", "the grey Loom throw"): asked for as a whole (price and stock)."""
    known = set(GENERIC)
    for p in found.products:
        known |= p.naming | p.category | p.tagged | {w for vals in p.options.values() for v in vals for w in terms(v)}
    rest = [w for w in terms(text) if w not in known and not w.isdigit()]
    return not rest


def _variants(keys: ProductKeys, norm_text: str) -> tuple[str, ...]:
    return answers.variants_named(keys.names.variant_skus, norm_text, keys.options)


def _answer(keys: ProductKeys, asked: answers.Asked, locale: str, variants: tuple[str, ...]) -> str | None:
    """Blocking (two queries): the catalog's answer about ``keys``' product, narrowed to
    ``variants`` (none: all), or None."""
    view = product_view(keys.names.sku, locale)
    if view is None:  # pruned since the index was loaded
        return None
    known = {v.sku for v in view.variants}
    return answers.product_text(view, asked, tuple(s for s in variants if s in known), locale)


_answer_async = sync_to_async(_answer, thread_sensitive=False)


def _pick(text: str, choices: tuple[ProductKeys, ...]) -> ProductKeys | None:
    """The product among ``choices`` that ``text`` picks: by position ("the second one",
    "第一个"), by a word of its name only it has ("the floor one", "落地的那个", a misspelt one),
    or by an option value only it has ("the black one"); None when that leaves more or fewer
    than one."""
    pick = ordinal_in(text)
    if pick is not None:
        return choices[pick] if -len(choices) <= pick < len(choices) else None
    words = set(terms(text))
    own = [p.naming | p.category | p.tagged for p in choices]
    shared = frozenset.intersection(*own) if own else frozenset()
    named = [p for p, mine in zip(choices, own, strict=True) if (mine - shared) & words]
    if len(named) == 1:
        return named[0]
    found = find(catalog.snapshot, text, among=tuple(p.names.sku for p in choices))
    if len(found.products) == 1:
        return found.products[0]
    with_option = options_named(choices, normalise(text))
    return next(p for p in choices if p.names.sku in with_option) if len(with_option) == 1 else None


@dataclass(frozen=True)
class Context:
    """What a conversation's last turns say about products (:func:`replay`): ``focus`` the
    product it is about (None: none, or a "which one?" is open), ``variants`` the variant skus
    it was last narrowed to (() for the whole product), ``asked`` what was last asked of it;
    ``choices`` the products of an open "which one?" (in the order kefu named them) and
    ``choices_asked`` what that question asked; ``choices_at``/``order_which_at``: the turn
    index of that "which one?" and of an open "which order?" (-1 for none)."""

    focus: ProductKeys | None = None
    variants: tuple[str, ...] = ()
    asked: answers.Asked = OVERVIEW
    choices: tuple[ProductKeys, ...] = ()
    choices_asked: answers.Asked = OVERVIEW
    choices_at: int = -1
    order_which_at: int = -1


def _said(snapshot: CatalogSnapshot, norm_text: str) -> tuple[str, ...]:
    """The option values of any product the message holds (taken out of a follow-up's words)."""
    return tuple(v for vals in options_named(snapshot.products, norm_text).values() for v in vals)


def _follow_up_rest(snapshot: CatalogSnapshot, text: str) -> list[str] | None:
    """The words of a possible follow-up ("how much is it?", "what about in blue?") besides its
    asking phrases, small words and option values (they must be words of the conversation's
    product for it to be one: "is the lamp dimmable?"); None when ``text`` cannot be one (too
    long, or a word no product has: "how much is shipping?")."""
    if len(terms(text)) > FOLLOW_UP_WORDS:
        return None
    norm = normalise(text)
    said = _said(snapshot, norm)
    rest = answers.rest_words(norm, said)
    if any(c.isdigit() for v in said for c in v):  # a size written compactly ("150x200")
        rest = [w for w in rest if not any(c.isdigit() for c in w)]
    if any(w not in snapshot.vocabulary and w not in GENERIC for w in rest if w.isascii()):
        return None
    return rest


def _belongs(rest: list[str], focus: ProductKeys) -> bool:
    """Whether the rest of a follow-up's words are all words of ``focus`` (its naming, category
    and tag words; Chinese: characters of its titles and tags)."""
    words = focus.naming | focus.category | focus.tagged | GENERIC
    chars = {c for t in (*focus.names.titles.values(), *focus.names.tags) for c in normalise(t)}
    return all((w in words) if w.isascii() else (w in chars) for w in rest)


def _may_pick(snapshot: CatalogSnapshot, text: str, found: Found, asked: answers.Asked) -> bool:
    """Whether ``text`` may answer an open "which one?": a short message asking nothing ("the
    first one", "the black one"), or a follow-up asking a fact of one ("how much is the floor
    one?")."""
    if len(terms(text)) <= SHORT and not asked.kinds:
        return True
    return not found.products and bool(asked.kinds) and _follow_up_rest(snapshot, text) is not None


def _step(ctx: Context, text: str, at: int, snapshot: CatalogSnapshot) -> Context:
    """``ctx`` after the shopper's message ``text`` (turn ``at``), as the route took it."""
    found = find(snapshot, text)
    asked = answers.asked(text, _attribute_keys(found.products or ((ctx.focus,) if ctx.focus else ())))
    norm = normalise(text)
    if ctx.choices and _may_pick(snapshot, text, found, asked):
        ordinal = ordinal_in(text) is not None
        if ordinal and ctx.order_which_at > ctx.choices_at:
            return replace(ctx, order_which_at=-1)  # it answered the newer "which order?"
        chosen = _pick(text, ctx.choices)
        if chosen is not None:
            return Context(
                focus=chosen,
                variants=_variants(chosen, norm),
                asked=asked if asked.kinds else ctx.choices_asked,
                order_which_at=ctx.order_which_at,
            )
    if len(found.products) == 1:
        keys = found.products[0]
        return Context(
            focus=keys,
            variants=_variants(keys, norm),
            asked=asked if asked.kinds else OVERVIEW,
            order_which_at=ctx.order_which_at,
        )
    if len(found.products) > 1:
        # "Which one?" follows (when something was asked): kefu's turn after this one opens it.
        return Context(choices_asked=asked if asked.kinds else OVERVIEW, order_which_at=ctx.order_which_at)
    if ctx.focus is not None:
        rest = _follow_up_rest(snapshot, text)
        if rest is not None and _belongs(rest, ctx.focus):
            variants = _variants(ctx.focus, norm) or ctx.variants
            return replace(ctx, variants=variants, asked=asked if asked.kinds else ctx.asked)
    return ctx


def _bot_step(ctx: Context, text: str, at: int, snapshot: CatalogSnapshot) -> Context:
    """``ctx`` after kefu's answer ``text`` (turn ``at``): a "which one?" opens its choices, a
    "which order?" is remembered (a bare ordinal answers the newer one)."""
    titles = answers.which_one_titles(text)
    if titles is not None:
        skus = [snapshot.by_title.get(normalise(t).strip()) for t in titles]
        choices = tuple(snapshot.by_sku[s] for s in skus if s is not None and s in snapshot.by_sku)
        if len(choices) == len(titles):
            return replace(ctx, focus=None, variants=(), choices=choices, choices_at=at)
        return ctx
    if is_which_order(text):
        return replace(ctx, order_which_at=at)
    if ctx.focus is None and not ctx.choices:
        # The shopper's message that named the product may lie before the turns read: kefu's
        # product answer names it by its whole title (and its variant: "... in grey costs").
        found = find(snapshot, text)
        keys = found.one
        norm = normalise(text)
        if keys is not None and any(normalise(t) in norm for t in keys.names.titles.values()):
            return replace(ctx, focus=keys, variants=_variants(keys, norm))
    return ctx


def replay(turns: list[tuple[str, str]], snapshot: CatalogSnapshot) -> Context:
    """What ``turns`` (``(role, text)``, oldest first: a conversation's last turns) say about
    products: the shopper's messages and kefu's "which one?" questions taken as the route took
    them, and a product answer of kefu's while no product is in view (an agent's words are left
    out). Pure; no database."""
    ctx = Context()
    for at, (role, text) in enumerate(turns):
        if role == "shopper":
            ctx = _step(ctx, text, at, snapshot)
        elif role == "bot":
            ctx = _bot_step(ctx, text, at, snapshot)
    return ctx


async def _context(question: Question, history: HistoryLoader) -> Context:
    past = await history(before_seq=question.seq, turns=TURNS)
    return replay(past.turns, catalog.snapshot)


async def product_decision(question: Question, locale: str, *, history: HistoryLoader | None = None) -> Decision | None:
    """The ``product`` route's answer to ``question`` (see the module docstring), or None.
    Costs no query for a message that names no product and cannot be a follow-up; two (the
    conversation's last turns, ``history``) for one that may be; two to read a product.
    ``history`` None: the message alone is read (no follow-ups). Raises what ``history`` raises."""
    snapshot = catalog.snapshot
    if not snapshot.products:
        return None
    text = question.text
    found = catalog.find(text)
    asked = answers.asked(text, _attribute_keys(found.products))
    ordinal = ordinal_in(text) is not None
    words = terms(text)
    may_pick = len(words) <= SHORT and not asked.kinds
    if history is not None and question.seq > 1 and (may_pick or not found.one):
        pick_like = may_pick and (
            found.products or ordinal or snapshot.vocabulary & set(words) or _said(snapshot, normalise(text))
        )
        rest = None if found.products else _follow_up_rest(snapshot, text)
        follow_up = rest is not None and (asked.kinds or _said(snapshot, normalise(text)))
        if pick_like or follow_up:
            ctx = await _context(question, history)
            if ctx.choices and (may_pick or follow_up) and not (ordinal and ctx.order_which_at > ctx.choices_at):
                chosen = _pick(text, ctx.choices)
                if chosen is not None:
                    wanted = asked if asked.kinds else ctx.choices_asked
                    reply = await _answer_async(chosen, wanted, locale, _variants(chosen, normalise(text)))
                    if reply is not None:
                        skus = ", ".join(p.names.sku for p in ctx.choices)
                        picked = _decision(reply, locale, f"product {chosen.names.sku}, picked from {skus}")
                        return await _carded(picked, (chosen.names.sku,), wanted)
            if follow_up and rest is not None and ctx.focus is not None and _belongs(rest, ctx.focus):
                keys = ctx.focus
                norm = normalise(text)
                named = _variants(keys, norm)
                variants = named or ctx.variants
                wanted = asked if asked.kinds else ctx.asked
                if not named and _said(snapshot, norm):
                    # An option it does not come in ("is it in grey?" of a brass lamp): what it
                    # comes in, never the whole product's stock as if that were the answer.
                    variants, wanted = (), answers.Asked(kinds=("options",))
                reply = await _answer_async(keys, wanted, locale, variants)
                if reply is not None:
                    kinds = "+".join(wanted.kinds)
                    carried = _decision(reply, locale, f"product {keys.names.sku}: {kinds}, from the conversation")
                    return await _carded(carried, (keys.names.sku,), wanted)
    if ordinal or not found.products:
        return None
    if not asked.kinds:
        if not _only_names(text, found):
            return None
        asked = OVERVIEW
    if len(found.products) > 1:
        shown = found.products[:MAX_CHOICES]
        lang = locale.split("-")[0]
        titles = [
            p.names.titles.get(lang) or p.names.titles.get("en") or next(iter(p.names.titles.values())) for p in shown
        ]
        skus = ", ".join(p.names.sku for p in shown)
        which = _decision(answers.which_one_text(titles, locale), locale, f"product: which one of {skus}")
        return await _carded(which, tuple(p.names.sku for p in shown), asked)
    keys = found.products[0]
    reply = await _answer_async(keys, asked, locale, _variants(keys, normalise(text)))
    if reply is None:
        return await _described(keys, locale, asked)
    one = _decision(reply, locale, f"product {keys.names.sku}: {'+'.join(asked.kinds)} s={found.scores[0]:.1f}")
    return await _carded(one, (keys.names.sku,), asked)
