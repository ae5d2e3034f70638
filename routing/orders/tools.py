"""Store tools on the remote path: the tiers call the store through the ``openai`` SDK's function
calling, and kefu runs the calls.

A remote answer gets the tools only when its question is about an order (it names an order
number or an e-mail address, or the FAQ entries it is grounded on include an order intent of
``KEFU_ACTION_INTENTS``): the five store definitions cost about 350 prompt tokens a call (the
sixth, ``person_offer``, a few dozen more), which every other question is spared.

The loop (:func:`stream_with_tools`): stream a round; text goes to the shopper as it comes; when
the round ends with ``tool_calls``, each call's arguments are validated (pydantic, unknown fields
refused), the store's door runs it (``store.services``: the shopper's own orders only) within
``KEFU_STORE_TIMEOUT_S``, its result goes back as a ``tool`` message and the next round streams.
At most ``KEFU_TOOL_MAX_CALLS`` calls an answer; the round after the last allowed call is sent
with ``tool_choice="none"``, so the model must answer in words. Every round is a ledger row
(purpose ``answer`` for the first, ``tool`` after a tool's result); every store call is an audit
row (purpose ``tool``).

A change (cancel, return, new address) is never made by a tool call: the call records an offer
(``store.services.pending_offer``) and the answer ends with kefu's own confirmation question
(``routing.orders.replies``), so what the shopper confirms is exactly what will happen; their
"yes" makes it (``routing.orders.tasks``). The calls share the conversation's task with the
template path (``routing.orders.task_state``): an offer makes the task await ``confirm``, a call
missing the e-mail leaves a task the shopper's bare e-mail completes, and an e-mail given for
the task proves the order here too.

An answer in which a tool was called is this shopper's alone: never stored in the answer cache,
never shared with an identical question in flight. Personal data masked in the prompt
(``routing.prompt.privacy``) stays masked: the model's arguments are unmasked before the store sees
them, and the store's results are masked before the model sees them.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncGenerator, Callable
from dataclasses import replace
from typing import Any, Protocol

from asgiref.sync import sync_to_async
from django.conf import settings
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from routing.faq.registry import registry
from routing.orders import actions, replies, task_state
from routing.providers.base import ProviderError, StreamDone, TextDelta, ToolCall, Usage
from routing.types import Question
from routing.upstream import resilience
from routing.upstream.call import Answered, Call, CallItem
from store import services as store
from store.types import Order, Owner, ProductView, StoreError

log = logging.getLogger(__name__)

__all__ = ["PRODUCT_TOOL_NOTE", "TOOL_NOTE", "definitions", "relevant", "run_tool", "stream_with_tools"]

_NUMBER = r"^[#A-Za-z0-9][A-Za-z0-9 #\-]{0,31}$"


class _OrderArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)
    order_number: str = Field(pattern=_NUMBER)
    email: str = Field(default="", max_length=254)


class _AddressArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)
    name: str = Field(min_length=1, max_length=200)
    line1: str = Field(min_length=1, max_length=200)
    line2: str = Field(default="", max_length=200)
    city: str = Field(min_length=1, max_length=200)
    postcode: str = Field(min_length=1, max_length=32)
    country: str = Field(pattern=r"^[A-Za-z]{2}$")


class _AddressChangeArgs(_OrderArgs):
    address: _AddressArgs


class _NoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _SearchArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)
    query: str = Field(min_length=1, max_length=100)


class _ProductArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)
    sku: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,63}$")


_EMAIL_PROP = {
    "type": "string",
    "description": "The e-mail address the order was placed with, exactly as the shopper wrote it (needed when the shopper is not signed in).",
}
_NUMBER_PROP = {"type": "string", "description": "The order number as the shopper wrote it, e.g. KF-1001 or #1001."}
_ADDRESS_PROP = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "line1": {"type": "string", "description": "Street and number"},
        "line2": {"type": "string"},
        "city": {"type": "string"},
        "postcode": {"type": "string"},
        "country": {"type": "string", "description": "ISO 3166-1 alpha-2 code, e.g. NL"},
    },
    "required": ["name", "line1", "city", "postcode", "country"],
    "additionalProperties": False,
}

# name -> (store action, argument model, description, parameters)
_TOOLS: dict[str, tuple[str, type[BaseModel], str, dict[str, Any]]] = {
    "orders_list": (
        "orders",
        _NoArgs,
        "List the signed-in shopper's most recent orders with their status.",
        {"type": "object", "properties": {}, "additionalProperties": False},
    ),
    "order_status": (
        "status",
        _OrderArgs,
        "Look up one order: its status, items, shipment tracking, refunds and returns.",
        {
            "type": "object",
            "properties": {"order_number": _NUMBER_PROP, "email": _EMAIL_PROP},
            "required": ["order_number"],
            "additionalProperties": False,
        },
    ),
    "order_cancel": (
        "cancel",
        _OrderArgs,
        "Offer to cancel an order that has not been packed. The shopper is asked to confirm; nothing changes until they do.",
        {
            "type": "object",
            "properties": {"order_number": _NUMBER_PROP, "email": _EMAIL_PROP},
            "required": ["order_number"],
            "additionalProperties": False,
        },
    ),
    "order_return": (
        "return",
        _OrderArgs,
        "Offer to open a return for a delivered order. The shopper is asked to confirm; nothing changes until they do.",
        {
            "type": "object",
            "properties": {"order_number": _NUMBER_PROP, "email": _EMAIL_PROP},
            "required": ["order_number"],
            "additionalProperties": False,
        },
    ),
    "shipping_address_change": (
        "change_address",
        _AddressChangeArgs,
        "Offer to send an order that has not been packed to a new address. The shopper is asked to confirm; nothing changes until they do.",
        {
            "type": "object",
            "properties": {"order_number": _NUMBER_PROP, "email": _EMAIL_PROP, "address": _ADDRESS_PROP},
            "required": ["order_number", "address"],
            "additionalProperties": False,
        },
    ),
    "person_offer": (
        "offer_person",
        _NoArgs,
        "Offer to pass the shopper to a person from the store's team, when you cannot help. The shopper "
        "is asked; a person takes over only if they say yes.",
        {"type": "object", "properties": {}, "additionalProperties": False},
    ),
}

# The catalog's tools (issue 36 item 3): read-only, offered apart from the order tools.
_PRODUCT_TOOLS: dict[str, tuple[str, type[BaseModel], str, dict[str, Any]]] = {
    "search_products": (
        "search_products",
        _SearchArgs,
        "Search the store's catalog by product name, SKU or a word of its title (e.g. lamp). Returns up to "
        "5 products with their SKU, price range, currency, units in stock and link.",
        {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "Words of a product's name, or a SKU."}},
            "required": ["query"],
            "additionalProperties": False,
        },
    ),
    "get_product": (
        "get_product",
        _ProductArgs,
        "Get one catalog product by SKU: description, attributes, and each variant's options, price and stock.",
        {
            "type": "object",
            "properties": {"sku": {"type": "string", "description": "The product's SKU, from search_products."}},
            "required": ["sku"],
            "additionalProperties": False,
        },
    ),
}
#: How many products ``search_products`` returns.
SEARCH_LIMIT = 5

#: Appended to the system prompt of a request that carries the catalog's tools.
PRODUCT_TOOL_NOTE = (
    "You can look products up in the store's catalog with search_products and get_product. "
    "State a price or a stock level only as the catalog facts or these tools give it; never guess one."
)

#: Appended to the system prompt of a request that carries the tools.
TOOL_NOTE = (
    "You can look up this shopper's orders with the tools. Never guess an order's status, "
    "tracking or refund: look it up. A shopper who is not signed in must give the order number "
    "and the e-mail address it was placed with; ask for them if they are missing. To cancel, "
    "return or re-address an order, call the tool: it asks the shopper to confirm. When you "
    "cannot help, call person_offer instead of promising a person."
)

#: kefu's own offer of a person, ending an answer whose model called ``person_offer``: a question
#: that ``routing.decide.handoff_flow.offers_person`` recognises, so the shopper's short yes hands
#: off (the same path as an offer in the model's own words). English for a language it lacks.
PERSON_OFFERS = {
    "en": "Would you like me to connect you with someone from our team?",
    "zh": "需要我为您转接人工客服吗？",
    "ja": "担当者におつなぎしましょうか？",
    "ko": "상담원에게 연결해 드릴까요?",
    "es": "¿Quieres que te ponga en contacto con una persona del equipo?",
    "fr": "Voulez-vous que je vous mette en relation avec un conseiller ?",
    "de": "Möchten Sie, dass ich Sie mit einem Mitarbeiter verbinde?",
    "it": "Vuoi che ti metta in contatto con un operatore?",
    "pt": "Quer que eu passe você para uma pessoa da equipe?",
    "nl": "Wilt u dat ik u doorverbind met een medewerker?",
    "ru": "Хотите, я соединю вас с сотрудником?",
}


def person_offer_text(locale: str) -> str:
    """kefu's offer of a person in ``locale`` (:data:`PERSON_OFFERS`, English for a language it lacks)."""
    return PERSON_OFFERS.get(locale, PERSON_OFFERS["en"])


def definitions(*, verified: bool, orders: bool = True, products: bool = False) -> list[dict[str, Any]]:
    """The tools in the OpenAI format: the order tools (``orders``; ``orders_list`` only for a
    verified shopper: an anonymous one names each order) and the catalog's ``search_products``
    and ``get_product`` (``products``)."""
    chosen = [(name, spec) for name, spec in _TOOLS.items() if orders and (verified or name != "orders_list")] + [
        (name, spec) for name, spec in _PRODUCT_TOOLS.items() if products
    ]
    return [
        {"type": "function", "function": {"name": name, "description": desc, "parameters": params}}
        for name, (_, _, desc, params) in chosen
    ]


def _money(value: Any) -> str:
    return f"{value:.2f}"


def _product_summary(view: ProductView) -> dict[str, Any]:
    low, high = view.price_range()
    return {
        "sku": view.sku,
        "title": view.title,
        "price_min": _money(low),
        "price_max": _money(high),
        "currency": view.currency,
        "in_stock": view.in_stock(),
        "url": view.url,
    }


def _product_json(view: ProductView) -> dict[str, Any]:
    data: dict[str, Any] = {
        "sku": view.sku,
        "title": view.title,
        "description": view.description[:600],
        "attributes": view.attributes,
        "currency": view.currency,
        "url": view.url,
    }
    if view.variants:
        data["variants"] = [
            {"sku": v.sku, "options": v.options, "price": _money(v.price), "stock": v.stock} for v in view.variants
        ]
    else:
        data["price"] = _money(view.price)
        data["stock"] = view.stock
    return data


def _search(query: str, locale: str) -> list[ProductView]:
    """Blocking: products for ``query`` (the whole of it, then each word of 3+ letters), at most
    :data:`SEARCH_LIMIT`, first found first."""
    found: dict[str, ProductView] = {}
    for q in [query, *[w for w in re.findall(r"\w+", query) if len(w) >= 3 and w.lower() != query.lower()]]:
        for view in store.product_search(q, locale, limit=SEARCH_LIMIT):
            found.setdefault(view.sku, view)
        if len(found) >= SEARCH_LIMIT:
            break
    return list(found.values())[:SEARCH_LIMIT]


def _get(sku: str, locale: str) -> ProductView | None:
    """Blocking: the product ``sku`` (or the product of a variant ``sku``)."""
    view = store.product_view(sku, locale)
    if view is None:
        matches = store.product_search(sku, locale, limit=1)
        view = (
            matches[0]
            if matches and sku.upper() in {matches[0].sku.upper(), *(v.sku.upper() for v in matches[0].variants)}
            else None
        )
    return view


async def run_product_tool(
    call: ToolCall, *, locale: str, on_products: Callable[[list[ProductView]], None] | None = None
) -> str:
    """Run a catalog tool call (``search_products``, ``get_product``): the ``tool`` message's JSON
    text. ``on_products`` is told the products the result states (their prices and stock become
    figures the answer may state, ``routing.products.grounding``). Never raises."""
    action, model, _, _ = _PRODUCT_TOOLS[call.name]
    try:
        args = model.model_validate(json.loads(call.arguments or "{}"))
    except (ValueError, ValidationError) as e:
        first = e.errors()[0] if isinstance(e, ValidationError) else {"loc": (), "msg": str(e)}
        where = ".".join(str(p) for p in first.get("loc", ())) or "arguments"
        return _error("invalid", f"bad arguments for {call.name}: {where}: {first.get('msg')}")
    try:
        if isinstance(args, _SearchArgs):
            views = await sync_to_async(_search, thread_sensitive=False)(args.query, locale)
            if on_products is not None:
                on_products(views)
            return json.dumps({"ok": True, "products": [_product_summary(v) for v in views]}, ensure_ascii=False)
        assert isinstance(args, _ProductArgs)
        view = await sync_to_async(_get, thread_sensitive=False)(args.sku, locale)
        if view is None:
            return _error("not_found", f"no product {args.sku!r} in the catalog", "Search with search_products.")
        if on_products is not None:
            on_products([view])
        return json.dumps({"ok": True, "product": _product_json(view)}, ensure_ascii=False, default=str)
    except Exception:  # the catalog's edge: the model is told, the answer goes on
        log.exception("catalog tool %s failed", action)
        return _error("unavailable", "the catalog could not be read")


def relevant(text: str, grounded_on: list[int]) -> bool:
    """Whether a remote-bound question is about an order: it names an order number or an e-mail
    address, or one of the FAQ entries it is grounded on has an order intent."""
    if actions.order_number_in(text) or actions.email_in(text):
        return True
    intents = settings.KEFU_ACTION_INTENTS
    entries = registry.entries
    return any((e := entries.get(i)) is not None and e.intent in intents for i in grounded_on)


def _order_json(order: Order) -> dict[str, Any]:
    """What a tool returns about an order: no e-mail, customer id, name or street."""
    return {
        "order_number": order.number,
        "status": order.status,
        "placed": order.placed_at.date().isoformat(),
        "items": [{"title": line.title, "quantity": line.quantity} for line in order.lines],
        "total": f"{order.total} {order.currency}",
        "can_still_be_changed_or_cancelled": order.changeable,
        "shipments": [
            {
                "carrier": s.carrier,
                "tracking_number": s.tracking_number,
                "tracking_url": s.tracking_url,
                "shipped": s.shipped_at.date().isoformat(),
                "delivered": s.delivered_at.date().isoformat() if s.delivered_at else None,
                "estimated_delivery": s.estimated_delivery.date().isoformat() if s.estimated_delivery else None,
            }
            for s in order.shipments
        ],
        "refunds": [
            {"amount": f"{r.amount} {r.currency}", "status": r.status, "issued": r.created_at.date().isoformat()}
            for r in order.refunds
        ],
        "returns": [{"return_id": r.return_id, "status": r.status} for r in order.returns],
        "ship_to_city": order.shipping_address.city if order.shipping_address else None,
    }


def _error(code: str, message: str, next_step: str = "") -> str:
    return json.dumps({"ok": False, "error": code, "message": message, "next_step": next_step})


async def _owner(question: Question, number: str, email: str) -> Owner | None:
    """Who asks about order ``number``: the verified shopper, the e-mail the model passed on, an
    owner the conversation proved the order with, or the e-mail the shopper gave for the
    conversation's task (``routing.orders.task_state``: the template path's pieces count here
    too). The store's door still checks the order against it."""
    if question.customer_id:
        return Owner(customer_id=question.customer_id)
    if email:
        return Owner(email=email)
    if question.conversation_id is None:
        return None
    known = await sync_to_async(store.orders_known, thread_sensitive=False)(question.conversation_id)
    wanted = re.sub(r"\D", "", number)
    for known_number, owner in known:
        if re.sub(r"\D", "", known_number) == wanted:
            return owner
    task = await task_state.task_get_async(question.conversation_id, question.session_from_seq)
    if task is not None and task.email and not task.expired:
        return Owner(email=task.email)
    return None


async def _task_save(question: Question, task: task_state.Task) -> None:
    if question.conversation_id is not None:
        await task_state.task_save_async(question.conversation_id, question.session_from_seq, task)


async def run_tool(
    call: ToolCall,
    *,
    question: Question,
    locale: str,
    on_products: Callable[[list[ProductView]], None] | None = None,
) -> tuple[str, str | None]:
    """Run one tool call for ``question``'s shopper: ``(result, final_text)``. ``result`` is the
    ``tool`` message's JSON text (``{"ok": true, ...}`` or ``{"ok": false, "error", "message",
    "next_step"}``); ``final_text`` is set when the call offered a change: the answer then ends
    with it (kefu's confirmation question), and no further round is sent. A catalog tool
    (:func:`run_product_tool`) tells ``on_products`` what it found. Never raises."""
    if call.name in _PRODUCT_TOOLS:
        return await run_product_tool(call, locale=locale, on_products=on_products), None
    spec = _TOOLS.get(call.name)
    if spec is None:
        return _error("invalid", f"unknown tool {call.name!r}"), None
    action, model, _, _ = spec
    try:
        raw = json.loads(call.arguments or "{}")
        args = model.model_validate(raw)
    except (ValueError, ValidationError) as e:
        first = e.errors()[0] if isinstance(e, ValidationError) else {"loc": (), "msg": str(e)}
        where = ".".join(str(p) for p in first.get("loc", ())) or "arguments"
        return _error("invalid", f"bad arguments for {call.name}: {where}: {first.get('msg')}"), None
    if action == "offer_person":
        # No store call: kefu asks the question itself, and the shopper's yes hands off
        # (routing.decide.handoff_flow), as for an offer in the model's own words.
        return json.dumps({"ok": True, "asked_shopper": True}), person_offer_text(locale)
    actor = store.Actor(
        kind="bot", purpose="tool", conversation_id=question.conversation_id, message_id=question.message_id
    )
    try:
        if isinstance(args, _NoArgs):
            if not question.customer_id:
                return _error(
                    "not_allowed", "the shopper is not signed in", "Ask for the order number and e-mail."
                ), None
            orders = await store.orders_list_async(Owner(customer_id=question.customer_id), actor=actor)
            return json.dumps({"ok": True, "orders": [_order_json(o) for o in orders]}), None
        assert isinstance(args, _OrderArgs)
        owner = await _owner(question, args.order_number, args.email)
        if owner is None:
            # The shopper's next message may bring only the e-mail: the template path finishes
            # the task then (routing.orders.tasks), with no second model call.
            await _task_save(question, task_state.Task(intent=action, order_number=args.order_number, source="tool"))
            return _error(
                "needs_email",
                "the order's e-mail address is needed",
                "Ask for the e-mail address the order was placed with.",
            ), None
        order = await store.order_view_async(owner, args.order_number, actor=actor, action="status")
        if question.conversation_id is not None:
            await sync_to_async(store.order_remember, thread_sensitive=False)(
                question.conversation_id, owner, order.number
            )
        if action == "status":
            return json.dumps({"ok": True, "order": _order_json(order)}), None
        possible, why = replies.possible(order, action)
        if not possible:
            return _error("not_allowed", f"order is {why}", replies.not_possible(order, action, locale)), None
        arguments: dict[str, Any] = {}
        if isinstance(args, _AddressChangeArgs):
            address = store.address_from_dict(args.address.model_dump())
            arguments = {"address": args.address.model_dump()}
            text = replies.address_offer(order, address, locale)
        else:
            text = replies.offer(order, action, locale)
        if question.conversation_id is None:
            return _error("not_allowed", "no conversation to confirm in"), None
        await sync_to_async(store.pending_offer, thread_sensitive=False)(
            question.conversation_id, owner, action, order.number, arguments=arguments
        )
        task = task_state.Task(
            intent=action,
            order_number=order.number,
            email="" if owner.customer_id else owner.email,
            awaiting="confirm",
            source="tool",
        )
        await _task_save(question, task)
        return json.dumps({"ok": True, "asked_shopper_to_confirm": True}), text
    except StoreError as e:
        return _error(
            e.code, e.message if e.code != "not_found" else "no such order for this shopper", e.next_step
        ), None


class Masker(Protocol):
    """What masks personal data in a prompt and unmasks it again (``routing.prompt.privacy.Vault``)."""

    def mask(self, text: str) -> str: ...

    def unmask(self, text: str) -> str: ...


async def stream_with_tools(
    call: Call,
    *,
    question: Question,
    locale: str,
    vault: Masker | None = None,
    on_products: Callable[[list[ProductView]], None] | None = None,
) -> AsyncGenerator[CallItem, None]:
    """Stream ``call`` (its request carries the tools) for ``question``'s shopper, the store's
    replies in ``locale`` (the module docstring): ``TextDelta`` items, the rounds'
    :class:`~routing.upstream.call.Answered` items, then one ``StreamDone`` whose usage sums every
    round's (tokens; its ``ttft_ms``/``latency_ms`` add up the rounds', ms). ``call`` is never
    changed: each round after a tool's result is a new ``Call`` (the messages grown by the calls
    and results, purpose ``tool``, on the deployment that answered the round before), and its
    ``Answered`` carries that round's request; once a tool was called the ``Answered`` items say
    ``shareable=False``. ``vault``: the masker of the prompt's personal data (None: nothing
    masked); ``on_products``: told the catalog products a tool's result states (before the
    round that reads it streams). Raises what ``resilience.stream_with_fallback`` raises."""
    calls_made = 0
    prompt_tokens = completion_tokens = cached = 0
    estimated = False
    latency_ms = 0.0
    ttft_ms: float | None = None
    any_text = False
    shareable = True
    answered: Answered | None = None
    for round_number in range(settings.KEFU_TOOL_MAX_CALLS + 1):
        calls: list[ToolCall] = []
        round_text: list[str] = []
        done: StreamDone | None = None
        async for item in resilience.stream_with_fallback(call):
            if isinstance(item, Answered):
                answered = item if shareable else replace(item, shareable=False)
                yield answered
            elif isinstance(item, TextDelta):
                round_text.append(item.text)
                any_text = True
                yield item
            elif isinstance(item, ToolCall):
                calls.append(item)
            else:
                done = item
        assert done is not None
        prompt_tokens += done.usage.prompt_tokens
        completion_tokens += done.usage.completion_tokens
        cached += done.usage.cached_prompt_tokens
        estimated = estimated or done.usage.estimated
        if ttft_ms is None and done.ttft_ms is not None:
            ttft_ms = latency_ms + done.ttft_ms
        latency_ms += done.latency_ms

        total = StreamDone(
            usage=Usage(prompt_tokens, completion_tokens, cached, estimated),
            model=done.model,
            finish_reason=done.finish_reason,
            ttft_ms=ttft_ms,
            latency_ms=latency_ms,
        )
        if not calls:
            yield total
            return
        if round_number == settings.KEFU_TOOL_MAX_CALLS:
            # Asked with tool_choice "none" and still calling: answer with what was said, or,
            # with nothing said at all, fail before the first token (a person answers).
            if not any_text:
                raise ProviderError("the model kept calling tools past the limit", code="malformed", permanent=True)
            yield total
            return
        # A store's answer is this shopper's alone.
        shareable = False
        if answered is not None:
            answered = replace(answered, shareable=False)
            yield answered
        results: list[dict[str, Any]] = []
        final_text: str | None = None
        for asked in calls:
            if calls_made >= settings.KEFU_TOOL_MAX_CALLS:
                result = _error("limit", "no more store calls in this answer: answer with what you know")
            else:
                calls_made += 1
                unmasked = replace(asked, arguments=vault.unmask(asked.arguments)) if vault is not None else asked
                result, final_text = await run_tool(unmasked, question=question, locale=locale, on_products=on_products)
                log.info("tool %s -> %s", asked.name, json.loads(result).get("error") or "ok")
            results.append(
                {"role": "tool", "tool_call_id": asked.call_id, "content": vault.mask(result) if vault else result}
            )
            if final_text is not None:
                break
        if final_text is not None:
            yield TextDelta(("\n\n" if any_text else "") + final_text)
            yield total
            return
        assistant = {
            "role": "assistant",
            "content": "".join(round_text) or None,
            "tool_calls": [
                {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in calls
            ],
        }
        # The next round: a new call, where this round answered (a model that asked for a tool
        # reads its result), its request as last sent grown by the calls and their results.
        assert answered is not None  # a round that called tools answered
        request = answered.request
        call = replace(
            call,
            tier=answered.tier,
            variant=answered.variant,
            provider=answered.provider,
            request=replace(
                request,
                messages=[*request.messages, assistant, *results[: len(calls)]],
                tool_choice="none" if calls_made >= settings.KEFU_TOOL_MAX_CALLS else "auto",
            ),
            context=replace(call.context, purpose="tool"),
        )
    raise AssertionError("unreachable: the last round returns")  # pragma: no cover
