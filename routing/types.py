"""The plain values that cross the router's door (``routing.services``) and its own parts.

Chat builds a :class:`Question` from its stored message and hands the router a
:class:`HistoryLoader`; the router answers with an ``Answer`` (``routing.services``) whose
:meth:`finish` returns an :class:`AnswerRecord`, which Chat stores. Nothing here knows a Django
model: these are dataclasses of plain values (dependency injection through arguments, as
GPTCache's ``Cache.init`` takes its parts).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Protocol

#: The routes of protocol 1 (docs/protocol.md): who answered a message.
ROUTES = (
    "cache.exact",
    "cache.semantic",
    "faq",
    "action",
    "product",
    "llm.simple",
    "llm.medium",
    "llm.complex",
    "decline",
    "handoff",
)

# Routing looks at the first ROUTING_MAX_CHARS code points only: the embedding model reads at
# most 512 tokens anyway, and embedding a 2,000-character message takes ~0.5 s of both cores,
# which a user test showed delaying every other conversation's answers.
ROUTING_MAX_CHARS = 500


@dataclass(frozen=True)
class Question:
    """One stored shopper message to answer.

    ``conversation_id``: the conversation (UUID); ``message_id``: the stored message's id (its
    ledger rows name it); ``seq``: its place in the conversation (1 = the first message, which has
    no history to load); ``text``: what the shopper wrote (at most ``KEFU_MAX_MESSAGE_CHARS``
    code points); ``locale``: the conversation's locale (``"en"``/``"zh"``), the fallback when the
    text itself shows no language; ``customer_id``: the store's customer id of a verified shopper
    ("" for an anonymous one); ``address_key``: a keyed hash of the network the conversation
    came from ("" unknown). The last two say who pays for remote calls (``routing.upstream.budgets``).
    ``session_from_seq``: where the conversation's current session starts (the chat's
    ``Conversation.session_from_seq``; 0 for the first visit): a task a shopper left in an
    earlier session (``routing.orders.tasks``) is not continued. ``complaint_at_seq``,
    ``complaint_kind``, ``complaint_question``: the shopper's last complaint about an answer
    (``Conversation.complaint_*``: the seq when it was made, 0 for none; ``"down"`` for a
    thumbs-down, ``"phrase"`` for a "that's not what I asked"; the question complained about),
    read by ``routing.decide.repeat``."""

    conversation_id: uuid.UUID | None
    message_id: int | None
    seq: int
    text: str
    locale: str = "en"
    customer_id: str = ""
    address_key: str = ""
    session_from_seq: int = 0
    complaint_at_seq: int = 0
    complaint_kind: str = ""
    complaint_question: str = ""


@dataclass(frozen=True)
class History:
    """What came before a question, as the router's prompt needs it.

    ``turns``: ``(role, text)`` pairs oldest first, role ``shopper``/``bot``/``agent`` (system
    notices left out), the last ``turns`` turns before the question; ``summary``: the rolling
    summary of older turns (``""`` for none); ``older_unsummarised``: the current session holds
    messages older than ``turns`` that the summary does not cover yet (a prompt made from this
    history leaves them out: a rolling summary is due, ``chat.summary``); ``last_route``: the route
    of the last message before the question when it is a bot answer (``"llm.simple"``...), else
    ``""``: a "yes" to the question that answer asked goes back to that route
    (``routing.orders.tasks``)."""

    turns: list[tuple[str, str]] = field(default_factory=list)
    summary: str = ""
    older_unsummarised: bool = False
    last_route: str = ""


class HistoryLoader(Protocol):
    """Loads a question's history; Chat supplies it, the router calls it only on the remote path
    (so a cache or FAQ answer costs no history query).

    ``before_seq``: the question's seq; ``turns``: at most this many turns (a turn is a shopper
    message and the answers after it). Raises whatever the database raises."""

    async def __call__(self, *, before_seq: int, turns: int) -> History: ...


@dataclass(frozen=True)
class CallContext:
    """Who a remote call is for, stored on its ledger rows; every field optional.

    ``conversation_id``: the chat conversation (UUID); ``message_id``: the shopper message being
    answered; ``api_key_id``: the gateway key (``routing.models.ApiKey``) for gateway calls;
    ``purpose``: what the call was for (``routing.models.Purpose``: ``answer``, ``rewrite``,
    ``summary``, ``suggestion``, ``audit``, ``judge``, ``remake``, ``gateway``); ``payer``: whose spend budgets the call
    is reserved against besides its tier's store-wide cap (``routing.upstream.budgets``; None: the cap only).
    """

    conversation_id: uuid.UUID | None = None
    message_id: int | None = None
    api_key_id: int | None = None
    purpose: str = "answer"
    payer: Payer | None = None


@dataclass(frozen=True)
class Payer:
    """Who a remote call's cost counts against (``routing.upstream.budgets``): a verified shopper by their
    store ``customer_id``; an anonymous one by ``conversation_id`` and ``address_key`` (both);
    a gateway caller by ``api_key_id``. Empty fields are not counted."""

    customer_id: str = ""
    conversation_id: uuid.UUID | None = None
    address_key: str = ""
    api_key_id: int | None = None

    @classmethod
    def of_question(cls, question: Question) -> Payer:
        """The shopper who asked ``question``: their customer id when verified, else the
        conversation and its address."""
        if question.customer_id:
            return cls(customer_id=question.customer_id)
        return cls(conversation_id=question.conversation_id, address_key=question.address_key)


@dataclass(frozen=True)
class ProductCard:
    """A product shown as a card beside an answer (issue 36, docs/protocol.md, *Product cards*):
    plain text and checked addresses only, never markup; every client sets each field as text.

    ``sku``; ``title``; ``price`` (decimal string, ``"129.00"``; the lowest when ``price_max``
    differs) and ``price_max`` ("" unless the variants' prices differ), ``currency`` (ISO 4217),
    ``price_text`` (``"$129.00"``, ``"$48.00 – $56.00"``); ``stock``: units on hand (None when
    not tracked); ``url`` and ``image``: ``http(s)://`` addresses on the store's domains (an
    image also on ``KEFU_PRODUCT_IMAGE_HOSTS``) or paths starting with ``/``, "" for none or one
    refused; ``description`` (at most :data:`CARD_DESCRIPTION_CHARS` code points) and ``facts``
    (``(label, value)`` pairs from the catalog's attributes, at most :data:`CARD_FACTS`): on a card
    answering a descriptive question, else empty."""

    sku: str
    title: str
    price: str
    currency: str
    price_text: str
    stock: int | None = None
    url: str = ""
    image: str = ""
    price_max: str = ""
    description: str = ""
    facts: tuple[tuple[str, str], ...] = ()

    def as_json(self) -> dict[str, object]:
        """The card as frames and the stored message carry it: ``{"sku", "title", "price",
        "currency", "price_text", "stock", "url", "image"}`` plus ``"price_max"``,
        ``"description"`` and ``"facts"`` (``[[label, value]...]``) when set."""
        out: dict[str, object] = {
            "sku": self.sku,
            "title": self.title,
            "price": self.price,
            "currency": self.currency,
            "price_text": self.price_text,
            "stock": self.stock,
            "url": self.url,
            "image": self.image,
        }
        if self.price_max:
            out["price_max"] = self.price_max
        if self.description:
            out["description"] = self.description
        if self.facts:
            out["facts"] = [list(f) for f in self.facts]
        return out


#: Most cards one message carries, and the longest card description (code points) and most facts.
MAX_CARDS = 3
CARD_DESCRIPTION_CHARS = 400
CARD_FACTS = 8


@dataclass(frozen=True)
class AnswerRecord:
    """How a bot answer ended, as Chat stores it: text as streamed, route, model, usage (tokens),
    cost and saving in USD, ``ttft_ms``/``latency_ms`` from the shopper's message being stored,
    ``cut`` when it stopped before its end, ``faq_entry_id`` the FAQ entry a ``faq`` answer came
    from, ``cache_entry_id`` the cached answer a ``cache.*`` answer was served from, ``reason``
    why the router chose the route (its own words)."""

    text: str
    route: str
    model: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: Decimal = Decimal(0)
    saved_usd: Decimal = Decimal(0)
    ttft_ms: float | None = None
    latency_ms: float | None = None
    estimated: bool = False
    cut: bool = False
    faq_entry_id: int | None = None
    cache_entry_id: int | None = None
    reason: str = ""
    # A remote answer's deployment of its tier: "current" (the tier's own model) or "candidate"
    # (its canary candidate, routing.upstream.canary); "" for an answer no model gave.
    variant: str = ""
    # The product cards shown with the answer (a ``product`` answer's; at most MAX_CARDS).
    cards: tuple[ProductCard, ...] = ()


@dataclass(frozen=True)
class Suggestion:
    """A drafted reply for an agent: ``text`` ("" when nothing could be drafted), the ``route``
    that drafted it (``faq``, ``cache.exact``, ``cache.semantic``, ``llm.simple``...; None with no
    draft) and ``for_seq``, the shopper message it answers."""

    text: str
    route: str | None
    for_seq: int | None
