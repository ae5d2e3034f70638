"""The agent console's orders panel (docs/console.md, *Orders*): the open conversation's shopper's
recent orders, and the actions the bot can run on them, made by an agent on the shopper's behalf.

Whose orders they are comes from the conversation, never from the agent: a verified customer
(``Conversation.customer_id``, from the store's signed identity) has their recent orders shown;
an anonymous shopper only the orders they proved in this conversation with the order's e-mail
address (``store.services.orders_known``), each checked with that e-mail again. Every call goes
through the store's door (``store.services``), which checks each order against that owner and
writes a row of the audit log (``StoreCall``: actor ``agent``, the agent's username, purpose
``console``, the conversation).

Reading is open to every agent, as opening a conversation is; a change (cancel, return, new
address) only to the agent who holds the conversation (the rule of an agent's message), since
the shopper is told of it in the conversation. The agent is re-read from the database at every
call: a permission taken away since the socket opened is refused (``NotAgent``). A change is
made once per ``request_id`` (the console's id of one click): the same id again changes nothing
and returns the order as it stands, ``repeated``.

Unlike the rest of ``chat.services``, :func:`console_orders` and :func:`console_order_action` are
coroutines: the store's calls run in worker threads under ``KEFU_STORE_TIMEOUT_S`` (the door's
``*_async``), never in Django's one sync thread, so a slow store holds up no other database call
of the process. Store errors come out as ``chat.errors.OrderRefused`` with the store's code.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.db import transaction

from lib.search_terms import index_terms
from lib.text import language_code
from store import services as store
from store.types import MUTATING_ACTIONS, Order, Owner, StoreError

from ..errors import NotAgent, NotFound, NotOwner, OrderRefused
from ..models import Conversation, ConversationStatus, Message, Role
from ..protocol import OrderInfo
from ..selectors import user_is_agent
from .conversations import next_seq

log = logging.getLogger(__name__)

#: Newest orders of a verified customer shown in the console.
ORDERS_SHOWN = 10

#: The system message the shopper gets after an agent's change, per action and language.
ORDER_NOTICES: dict[str, dict[str, str]] = {
    "cancel": {
        "en": "Order {number} was cancelled by our team.",
        "zh": "我们的团队已取消订单 {number}。",
    },
    "return": {
        "en": "A return of order {number} was opened by our team.",
        "zh": "我们的团队已为订单 {number} 办理退货。",
    },
    "change_address": {
        "en": "The delivery address of order {number} was changed by our team.",
        "zh": "我们的团队已修改订单 {number} 的收货地址。",
    },
}


@dataclass(frozen=True)
class ConsoleOrders:
    """What the console shows of a conversation's shopper's orders. ``source``: ``verified`` (a
    verified customer's recent orders, newest first), ``proved`` (the orders an anonymous
    shopper proved in the conversation) or ``none`` (an anonymous shopper who proved none)."""

    source: Literal["verified", "proved", "none"]
    orders: list[OrderInfo]


@dataclass(frozen=True)
class ConsoleOrderAction:
    """An agent's action on an order: ``order`` as it stands afterwards; ``repeated``: the same
    request had already made this change, nothing changed now; ``return_id`` of a return opened
    now ("" otherwise); ``notice``: the system message stored for the shopper (a change made
    now), for the caller to publish; None otherwise."""

    action: str
    order: OrderInfo
    repeated: bool
    return_id: str
    notice: Message | None


@dataclass(frozen=True)
class _Shopper:
    agent_name: str  # the acting agent's username, for the audit log
    customer_id: str  # "" for an anonymous shopper
    proved: tuple[tuple[str, Owner], ...]  # an anonymous shopper's proved orders (number, owner)
    locale: str


def order_info(order: Order) -> OrderInfo:
    """An order as the console shows it (``chat.protocol.OrderInfo``): no address, no e-mail."""
    shipment = order.shipments[-1] if order.shipments else None
    return {
        "number": order.number,
        "status": order.status,
        "placed_at": order.placed_at.isoformat(),
        "total": str(order.total),
        "currency": order.currency,
        "items": [{"title": line.title, "quantity": line.quantity} for line in order.lines],
        "tracking": (
            {"carrier": shipment.carrier, "number": shipment.tracking_number, "url": shipment.tracking_url}
            if shipment is not None
            else None
        ),
        "refunds": [{"amount": str(r.amount), "status": r.status} for r in order.refunds],
        "can_cancel": order.changeable,
        "can_return": order.returnable,
        "can_change_address": order.changeable,
    }


def order_notice(*, action: str, number: str, locale: str) -> str:
    """The shopper's system message after an agent's ``action`` on order ``number``, in
    ``locale`` (English when it has no text). Raises ``KeyError`` for a reading action."""
    texts = ORDER_NOTICES[action]
    return texts.get(language_code(locale), texts["en"]).format(number=number)


def conversation_shopper(*, conversation_id: uuid.UUID, agent: Any, change: bool) -> _Shopper:
    """Who the conversation's shopper is, for ``agent`` to act on their orders (blocking).

    Raises ``NotAgent`` (the user is no longer an agent, re-read from the database),
    ``NotFound`` (no such conversation) and, when ``change``, ``NotOwner`` (``agent`` does not
    hold the conversation)."""
    agent_pk = getattr(agent, "pk", None)
    fresh = get_user_model().objects.filter(pk=agent_pk).first() if agent_pk is not None else None
    if fresh is None or not user_is_agent(fresh):
        raise NotAgent(str(agent_pk))
    row = (
        Conversation.objects.filter(pk=conversation_id)
        .values_list("customer_id", "locale", "status", "agent_id", "agent_name")
        .first()
    )
    if row is None:
        raise NotFound(str(conversation_id))
    customer_id, locale, status, agent_id, agent_name = row
    if change and (status != ConversationStatus.AGENT or agent_id != fresh.pk):
        raise NotOwner(owner=agent_name if status == ConversationStatus.AGENT else "", status=status)
    proved: tuple[tuple[str, Owner], ...] = ()
    if not customer_id:
        # Only orders proved with an e-mail address: an anonymous shopper's own proof.
        proved = tuple((n, o) for n, o in store.orders_known(conversation_id) if not o.customer_id and o.email)
    return _Shopper(fresh.get_username(), customer_id, proved, locale)


def order_notice_add(*, conversation_id: uuid.UUID, action: str, number: str, locale: str) -> Message:
    """Store the shopper's system message about an agent's change (``order_notice``); the caller
    publishes it. Raises ``NotFound``."""
    with transaction.atomic():
        try:
            seq = next_seq(conversation_id)[0]
        except Conversation.DoesNotExist:
            raise NotFound(str(conversation_id)) from None
        text = order_notice(action=action, number=number, locale=locale)
        # Indexed for staff search (chat.search): the notice names the order number.
        return Message.objects.create(
            conversation_id=conversation_id, seq=seq, role=Role.SYSTEM, text=text, search_terms=index_terms(text)
        )


def _actor(shopper: _Shopper, conversation_id: uuid.UUID) -> store.Actor:
    return store.Actor(kind="agent", name=shopper.agent_name, purpose="console", conversation_id=conversation_id)


def _refused(e: StoreError) -> OrderRefused:
    return OrderRefused(e.code, e.message)


async def console_orders(*, conversation_id: uuid.UUID, agent: Any) -> ConsoleOrders:
    """The orders of the conversation's shopper (module docstring): a verified customer's newest
    ``ORDERS_SHOWN``, or the orders an anonymous shopper proved here (newest first; one the
    store no longer finds is left out). Each store call is a row of the audit log.

    Raises ``NotAgent``, ``NotFound`` and ``OrderRefused`` (``upstream``, ``not_configured``)."""
    shopper = await database_sync_to_async(conversation_shopper)(
        conversation_id=conversation_id, agent=agent, change=False
    )
    actor = _actor(shopper, conversation_id)
    try:
        if shopper.customer_id:
            orders = await store.orders_list_async(
                Owner(customer_id=shopper.customer_id), actor=actor, limit=ORDERS_SHOWN
            )
            return ConsoleOrders("verified", [order_info(o) for o in orders])
        if not shopper.proved:
            return ConsoleOrders("none", [])
        found: list[Order] = []
        for number, owner in shopper.proved:
            try:
                found.append(await store.order_view_async(owner, number, actor=actor))
            except StoreError as e:
                if e.code != "not_found":
                    raise
    except StoreError as e:
        raise _refused(e) from None
    found.sort(key=lambda o: o.placed_at, reverse=True)
    return ConsoleOrders("proved", [order_info(o) for o in found])


def _owner_of(shopper: _Shopper, number: str) -> Owner:
    """The owner to ask the store with: the verified customer, or the e-mail the anonymous
    shopper proved this very order with. Raises ``OrderRefused("not_found")`` otherwise."""
    if shopper.customer_id:
        return Owner(customer_id=shopper.customer_id)
    wanted = number.strip().casefold()
    for known, owner in shopper.proved:
        if known.casefold() == wanted:
            return owner
    raise OrderRefused("not_found", "no such order for this conversation's shopper")


async def console_order_action(
    *,
    conversation_id: uuid.UUID,
    agent: Any,
    number: str,
    action: str,
    request_id: str,
    address: dict[str, Any] | None = None,
) -> ConsoleOrderAction:
    """Run ``action`` (``store.types.ACTIONS``) on order ``number`` of the conversation's shopper
    for ``agent``. A change needs the conversation held by ``agent`` and is made once per
    (conversation, action, order, ``request_id``); made now, the shopper's system message is
    stored (``notice``, for the caller to publish). ``address``: the new address of
    ``change_address`` (``store.services.address_from_dict``).

    Raises ``NotAgent``, ``NotFound`` (no such conversation), ``NotOwner`` (a change by an agent
    who does not hold the conversation) and ``OrderRefused`` (``not_found``: not an order of
    this conversation's shopper; ``not_allowed``, ``invalid``, ``upstream``, ``not_configured``).
    """
    change = action in MUTATING_ACTIONS
    shopper = await database_sync_to_async(conversation_shopper)(
        conversation_id=conversation_id, agent=agent, change=change
    )
    owner = _owner_of(shopper, number)
    actor = _actor(shopper, conversation_id)
    key = store.idempotency_key_for("console", conversation_id, action, number, request_id) if change else ""
    try:
        result = await store.action_run_async(
            owner,
            action,
            number,
            actor=actor,
            idempotency_key=key,
            arguments={"address": address} if action == "change_address" else None,
        )
        order = result.order
        if order is None:  # a return opened: the order as it now stands
            order = await store.order_view_async(owner, number, actor=actor)
    except StoreError as e:
        raise _refused(e) from None
    notice = None
    if change and not result.repeated:
        try:
            notice = await database_sync_to_async(order_notice_add)(
                conversation_id=conversation_id, action=action, number=order.number, locale=shopper.locale
            )
        except Exception:  # the change is made: the agent is told, even if the shopper's notice failed
            log.exception("storing the shopper's notice of an agent's %s failed", action)
    return ConsoleOrderAction(
        action=action,
        order=order_info(order),
        repeated=result.repeated,
        return_id=result.return_request.return_id if result.return_request is not None else "",
        notice=notice,
    )
