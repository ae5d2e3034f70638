"""The store part's one door: everything the router (the bot) and chat (the agents' console) ask of
a store goes through here, and here alone it is decided who may see or change an order.

Rules (docs/store-actions.md):

* a verified shopper (signed identity, ``Owner.customer_id``) sees and changes only orders whose
  customer id is theirs;
* an anonymous shopper sees one order at a time, named by its number, and only when the e-mail
  they gave is the order's (compared case-insensitively); someone else's order is "not found",
  exactly like a number that does not exist, so a guess learns nothing;
* an agent sees the orders of the conversation's verified shopper, or the one order the shopper
  proved in the conversation, through the same checks (``Owner`` of the conversation);
* every call, read or change, by the bot or an agent, is a row of the audit log
  (``StoreCall``) with its purpose; no personal data is written there;
* a change (cancel, return, new address) carries an idempotency key: one key changes an order
  once, even when two workers or two sockets confirm it at the same moment;
* inside a bot test's sandbox (``lib.sandbox``) the store is read but never changed: a change is
  simulated (the same rules of the order's state), written to the sandbox's log and seen by the
  sandbox's later reads of that order; no audit row is written.

All functions here are blocking (the adapter's database or HTTP calls); ``*_async`` variants run
them in a worker thread under ``KEFU_STORE_TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import logging
import re
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import IntegrityError, close_old_connections, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from lib import sandbox

from . import catalog
from .adapters.base import StoreAdapter
from .models import KnownOrder, PendingAction, StoreCall
from .types import (
    ACTIONS,
    MUTATING_ACTIONS,
    Address,
    Order,
    Owner,
    ProductNames,
    ProductView,
    Refund,
    ReturnRequest,
    StoreError,
)

log = logging.getLogger(__name__)

__all__ = [
    "ActionResult",
    "Actor",
    "Pending",
    "action_run",
    "action_run_async",
    "address_from_dict",
    "catalog_fingerprint",
    "catalog_names",
    "conversations_forget",
    "idempotency_key_for",
    "order_peek",
    "order_remember",
    "order_view",
    "order_view_async",
    "orders_known",
    "orders_list",
    "orders_list_async",
    "pending_drop",
    "pending_offer",
    "pending_peek",
    "pending_take",
    "product_search",
    "product_view",
    "product_view_async",
    "store_adapter",
    "store_on",
]

ADAPTERS = {"demo": "store.adapters.demo.DemoAdapter", "shopify": "store.adapters.shopify.ShopifyAdapter"}


@dataclass(frozen=True)
class Actor:
    """Who makes a store call, for the audit log: ``kind`` ``bot`` or ``agent``; ``name`` the
    agent's username ("" for the bot); ``purpose`` ``action`` (the bot's template path),
    ``tool`` (a remote model's tool call), ``confirm`` (a shopper confirmed a change),
    ``console`` (an agent); ``conversation_id``/``message_id`` what it was for."""

    kind: str = "bot"
    name: str = ""
    purpose: str = "action"
    conversation_id: uuid.UUID | None = None
    message_id: int | None = None


@dataclass(frozen=True)
class ActionResult:
    """What an action did: ``action``; ``order`` as it stands after it (None for a return, whose
    ``return_request`` is set); ``repeated``: the same idempotency key had already done it, so
    nothing changed this time."""

    action: str
    order: Order | None
    return_request: ReturnRequest | None = None
    repeated: bool = False


@dataclass(frozen=True)
class Pending:
    """A change offered to a shopper and waiting for their "yes" (see :func:`pending_offer`)."""

    action: str
    order_number: str
    owner: Owner
    arguments: dict[str, Any]
    idempotency_key: str


@functools.cache
def _adapter(path: str, options: tuple[tuple[str, Any], ...]) -> StoreAdapter:
    cls = import_string(ADAPTERS.get(path, path))
    adapter: StoreAdapter = cls(**dict(options))
    return adapter


def store_on() -> bool:
    """Whether a store adapter is configured (``KEFU_STORE_ADAPTER`` not empty)."""
    return bool(settings.KEFU_STORE_ADAPTER)


def store_adapter() -> StoreAdapter:
    """The configured adapter (one per process): ``KEFU_STORE_ADAPTER`` is ``demo``,
    ``shopify`` or a dotted path to a class taking ``KEFU_STORE_OPTIONS`` as keyword arguments.

    Raises:
        StoreError: ``not_configured`` when none is set.
    """
    path = settings.KEFU_STORE_ADAPTER
    if not path:
        raise StoreError("not_configured", "no store adapter is configured (KEFU_STORE_ADAPTER)")
    return _adapter(path, tuple(sorted(settings.KEFU_STORE_OPTIONS.items())))


def _owns(order: Order, owner: Owner) -> bool:
    if owner.customer_id:
        return bool(order.customer_id) and order.customer_id == owner.customer_id
    return bool(owner.email) and bool(order.email) and order.email.casefold() == owner.email.strip().casefold()


_NOT_FOUND_NEXT = {
    True: "Check the order number: I can only see orders placed with your account.",
    False: "Reply with the order number and the e-mail address the order was placed with.",
}


def _not_found(owner: Owner) -> StoreError:
    return StoreError("not_found", "no such order for this shopper", next_step=_NOT_FOUND_NEXT[owner.verified])


_LOGGABLE_NUMBER = re.compile(r"^[#A-Za-z0-9][A-Za-z0-9 #\-]{0,31}$")


def _log(actor: Actor, adapter: str, action: str, number: str, outcome: str, **fields: Any) -> StoreCall | None:
    box = sandbox.current()
    if box is not None:  # a bot test's calls go to its sandbox, not the audit log (module docstring)
        box.calls.append({"action": action, "order": number.strip(), "purpose": actor.purpose, "outcome": outcome})
        return None
    # Only what looks like an order number is written: the audit log holds no personal data,
    # whatever a caller passed as the number.
    number = number.strip() if _LOGGABLE_NUMBER.match(number.strip()) else ("(not an order number)" if number else "")
    try:
        return StoreCall.objects.create(
            adapter=adapter,
            actor=actor.kind,
            actor_name=actor.name,
            purpose=actor.purpose,
            action=action,
            order_number=number[:32],
            conversation_id=actor.conversation_id,
            message_id=actor.message_id,
            outcome=outcome,
            **fields,
        )
    except IntegrityError:
        raise
    except Exception:  # the audit log must not turn a shopper's answer into an error
        log.exception("writing the store audit log failed")
        return None


def _timed(call: Any) -> tuple[Any, float]:
    started = time.perf_counter()
    return call(), (time.perf_counter() - started) * 1000


def orders_list(owner: Owner, *, actor: Actor, limit: int = 5) -> list[Order]:
    """A verified shopper's newest orders (at most ``limit``), newest first; ``[]`` for an
    anonymous owner (they name one order at a time). Raises ``StoreError`` (``upstream``,
    ``not_configured``)."""
    if not owner.verified:
        return []
    adapter = store_adapter()
    try:
        orders, ms = _timed(lambda: adapter.orders_for_customer(owner.customer_id, limit=limit))
    except StoreError as e:
        _log(actor, adapter.name, "orders", "", e.code, detail=e.message[:200])
        raise
    mine = [_as_sandboxed(o) for o in orders if _owns(o, owner)]  # an adapter's query is not trusted blindly
    _log(actor, adapter.name, "orders", "", "ok", detail=f"{len(mine)} orders", latency_ms=ms)
    return mine


def order_view(owner: Owner, number: str, *, actor: Actor, action: str = "status") -> Order:
    """The order ``number`` when ``owner`` may see it (module docstring). ``action``
    (``status``/``refund_status``) is what the audit row says was asked.

    Raises:
        StoreError: ``not_found`` (no such order, or not this owner's: the same answer),
            ``upstream``, ``not_configured``.
    """
    adapter = store_adapter()
    try:
        order, ms = _timed(lambda: adapter.order_by_number(number))
    except StoreError as e:
        _log(actor, adapter.name, action, number, e.code, detail=e.message[:200])
        raise
    if order is None or not _owns(order, owner):
        _log(actor, adapter.name, action, number, "not_found", latency_ms=ms)
        raise _not_found(owner)
    _log(actor, adapter.name, action, order.number, "ok", latency_ms=ms)
    return _as_sandboxed(order)


def _as_sandboxed(order: Order) -> Order:
    """``order`` as the running sandbox's simulated changes left it (itself outside one)."""
    box = sandbox.current()
    if box is None:
        return order
    changed: Order | None = box.orders.get(order.number)
    return changed if changed is not None else order


def _simulated(box: sandbox.Sandbox, order: Order, action: str, key: str, address: Address | None) -> ActionResult:
    """A change made in a bot test's sandbox: the rules of the demo store's changes (a ``placed``
    order may be cancelled or sent elsewhere; a ``delivered`` one with none open, returned),
    applied to a copy kept in the sandbox and logged there; the store is not called.

    Raises:
        StoreError: ``not_allowed`` when the order's state forbids it (logged too).
    """
    entry: dict[str, Any] = {"action": action, "order": order.number, "repeated": False, "outcome": "ok"}
    if key in box.keys:
        entry["repeated"] = True
        box.writes.append(entry)
        return ActionResult(action=action, order=order, repeated=True)
    now = timezone.now()
    if action == "return":
        if not order.returnable:
            why = "a return is already open" if order.status == "delivered" else f"order is {order.status}"
            box.writes.append({**entry, "outcome": "not_allowed"})
            raise StoreError("not_allowed", f"no return possible: {why}")
        ret = ReturnRequest(return_id=f"R-TEST-{uuid.uuid4().hex[:6].upper()}", status="requested", created_at=now)
        box.orders[order.number] = dataclasses.replace(order, returns=(*order.returns, ret))
        result = ActionResult(action, None, return_request=ret)
    else:
        if not order.changeable:
            box.writes.append({**entry, "outcome": "not_allowed"})
            raise StoreError("not_allowed", f"order is {order.status}, only a placed order can be changed")
        if action == "cancel":
            refund = Refund(amount=order.total, currency=order.currency, status="pending", created_at=now)
            changed = dataclasses.replace(order, status="cancelled", refunds=(*order.refunds, refund))
        else:
            changed = dataclasses.replace(order, shipping_address=address)
        box.orders[order.number] = changed
        result = ActionResult(action, changed)
    box.keys.add(key)
    box.writes.append(entry)
    return result


def order_peek(number: str) -> Order | None:
    """The order ``number`` as the running sandbox sees it (``lib.sandbox``: the store's order with
    the sandbox's simulated changes), for a bot test's expectations; None when the store has no
    such order. No owner check and no audit row: only a bot test, inside its sandbox, may ask.

    Raises:
        StoreError: ``not_allowed`` outside a sandbox; ``upstream``, ``not_configured``.
    """
    if not sandbox.active():
        raise StoreError("not_allowed", "order_peek is for a bot test's sandbox only")
    order = store_adapter().order_by_number(number)
    return None if order is None else _as_sandboxed(order)


def idempotency_key_for(*parts: object) -> str:
    """A stable idempotency key (64 hex digits, SHA-256) from ``parts`` (e.g. the conversation,
    the action, the order and the offer's id)."""
    return hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()


def action_run(
    owner: Owner,
    action: str,
    number: str,
    *,
    actor: Actor,
    idempotency_key: str = "",
    arguments: dict[str, Any] | None = None,
) -> ActionResult:
    """Run ``action`` (``store.types.ACTIONS``) on order ``number`` for ``owner``.

    Reads (``status``, ``refund_status``) return the order. Changes (``cancel``, ``return``,
    ``change_address`` with ``arguments["address"]``, see :func:`address_from_dict`) need an
    ``idempotency_key``: a key that already succeeded changes nothing and returns the order as
    it stands (for a return: its open return) with ``repeated=True`` (audit outcome
    ``repeated``); a key another worker is running now raises ``upstream`` ("try again"), never
    runs twice; a key that cannot be reserved (the audit log fails) is not run.

    Raises:
        StoreError: ``not_found`` (no such order or not the owner's), ``not_allowed`` (the
            order's state forbids it), ``invalid`` (unknown action, bad address, no key),
            ``upstream``, ``not_configured``.
    """
    if action not in ACTIONS:
        raise StoreError("invalid", f"unknown action {action!r}")
    order = order_view(owner, number, actor=actor, action=action)
    if action not in MUTATING_ACTIONS:
        return ActionResult(action=action, order=order)
    if not idempotency_key or len(idempotency_key) > 64:
        raise StoreError("invalid", "a change needs an idempotency key of 1-64 characters")
    address = address_from_dict((arguments or {}).get("address")) if action == "change_address" else None
    adapter = store_adapter()
    box = sandbox.current()
    if box is not None:
        return _simulated(box, order, action, idempotency_key, address)
    # Reserve the key first: a second confirmation of the same change finds it taken.
    if StoreCall.objects.filter(idempotency_key=idempotency_key, outcome="ok").exists():
        _log(actor, adapter.name, action, order.number, "repeated")
        if action == "return":
            # The return this key opened: the order's open one (the lookup above is fresh).
            opened = next((r for r in reversed(order.returns) if r.status in ("requested", "received")), None)
            return ActionResult(action=action, order=None if opened else order, return_request=opened, repeated=True)
        return ActionResult(action=action, order=order, repeated=True)
    try:
        with transaction.atomic():
            row = _log(actor, adapter.name, action, order.number, "running", idempotency_key=idempotency_key)
    except IntegrityError as e:
        raise StoreError("upstream", "this change is already being made", next_step="Try again in a moment.") from e
    if row is None:
        # Without its key reserved a change could be made twice: not made at all.
        raise StoreError("upstream", "the audit log could not be written", next_step="Please try again in a minute.")
    started = time.perf_counter()
    try:
        result: ActionResult
        if action == "cancel":
            result = ActionResult(action, adapter.order_cancel(order.number, idempotency_key=idempotency_key))
        elif action == "return":
            ret = adapter.return_open(order.number, idempotency_key=idempotency_key)
            result = ActionResult(action, None, return_request=ret)
        else:
            assert address is not None
            result = ActionResult(
                action, adapter.shipping_address_change(order.number, address, idempotency_key=idempotency_key)
            )
    except StoreError as e:
        if row is not None:
            # A failed change frees its key: the shopper may try again.
            StoreCall.objects.filter(pk=row.pk).update(
                outcome=e.code,
                detail=e.message[:200],
                idempotency_key=None,
                latency_ms=(time.perf_counter() - started) * 1000,
            )
        raise
    except Exception as e:
        if row is not None:
            StoreCall.objects.filter(pk=row.pk).update(
                outcome="upstream", detail=type(e).__name__, idempotency_key=None
            )
        raise StoreError("upstream", f"store call failed: {type(e).__name__}") from e
    if row is not None:
        StoreCall.objects.filter(pk=row.pk).update(outcome="ok", latency_ms=(time.perf_counter() - started) * 1000)
    return result


def address_from_dict(value: object) -> Address:
    """An :class:`Address` from ``{"name", "line1", "line2"?, "city", "postcode", "country"}``
    (strings; ``country`` an ISO 3166-1 alpha-2 code).

    Raises:
        StoreError: ``invalid``, naming the first missing or bad field.
    """
    if not isinstance(value, dict):
        raise StoreError("invalid", "address must be an object", next_step="Tell me the full new address.")
    fields: dict[str, str] = {}
    for name in ("name", "line1", "line2", "city", "postcode", "country"):
        raw = value.get(name, "")
        if not isinstance(raw, str):
            raise StoreError("invalid", f"address {name} must be text", next_step="Tell me the full new address.")
        fields[name] = raw.strip()[:200]
        if name != "line2" and not fields[name]:
            raise StoreError("invalid", f"address {name} is missing", next_step="Tell me the full new address.")
    country = fields["country"].upper()
    if len(country) != 2 or not country.isalpha():
        raise StoreError("invalid", "country must be a two-letter code", next_step="Tell me the country too.")
    fields["country"] = country
    return Address(**fields)


# --- orders a conversation has proved ---------------------------------------------------------


def order_remember(conversation_id: uuid.UUID, owner: Owner, number: str) -> None:
    """Remember that ``owner`` proved order ``number`` in this conversation (see
    ``KnownOrder``); a second call only refreshes when."""
    KnownOrder.objects.update_or_create(
        conversation_id=conversation_id,
        order_number=number,
        defaults={"customer_id": owner.customer_id, "email": "" if owner.customer_id else owner.email},
    )


def orders_known(conversation_id: uuid.UUID) -> list[tuple[str, Owner]]:
    """The orders proved in this conversation, latest first, each with the owner that proved
    it: ``[(number, Owner)]`` (one indexed query)."""
    return [
        (row.order_number, Owner(customer_id=row.customer_id, email=row.email))
        for row in KnownOrder.objects.filter(conversation_id=conversation_id)[:5]
    ]


def conversations_forget(conversation_ids: list[uuid.UUID]) -> int:
    """Chat is deleting these conversations (retention, an erasure on request): forget the orders
    they proved and the changes they were offered (those rows hold the e-mail an anonymous
    shopper gave). The audit log keeps its rows: they hold no personal data. Returns the rows
    deleted."""
    known, _ = KnownOrder.objects.filter(conversation_id__in=conversation_ids).delete()
    pending, _ = PendingAction.objects.filter(conversation_id__in=conversation_ids).delete()
    return int(known + pending)


# --- changes waiting for the shopper's "yes" -------------------------------------------------


def pending_offer(
    conversation_id: uuid.UUID, owner: Owner, action: str, number: str, *, arguments: dict[str, Any] | None = None
) -> Pending:
    """Remember that the bot offered ``action`` on ``number`` in this conversation (replacing any
    earlier offer), valid ``KEFU_STORE_CONFIRM_TTL_S`` seconds. Its idempotency key is new per
    offer, so confirming the same offer twice changes the order once."""
    key = uuid.uuid4().hex
    PendingAction.objects.update_or_create(
        conversation_id=conversation_id,
        defaults={
            "action": action,
            "order_number": number,
            "customer_id": owner.customer_id,
            "owner_email": "" if owner.customer_id else owner.email,
            "arguments": arguments or {},
            "idempotency_key": key,
            "expires_at": timezone.now() + timedelta(seconds=settings.KEFU_STORE_CONFIRM_TTL_S),
        },
    )
    return Pending(action, number, owner, arguments or {}, key)


def _pending(row: PendingAction) -> Pending:
    return Pending(
        action=row.action,
        order_number=row.order_number,
        owner=Owner(customer_id=row.customer_id, email=row.owner_email),
        arguments=dict(row.arguments or {}),
        idempotency_key=row.idempotency_key,
    )


def pending_peek(conversation_id: uuid.UUID) -> Pending | None:
    """The conversation's unexpired offer, or None (one indexed query)."""
    row = PendingAction.objects.filter(conversation_id=conversation_id, expires_at__gt=timezone.now()).first()
    return _pending(row) if row is not None else None


def pending_take(conversation_id: uuid.UUID) -> Pending | None:
    """Remove and return the conversation's unexpired offer; None when there is none (or another
    socket took it first: only one caller gets it)."""
    with transaction.atomic():
        row = (
            PendingAction.objects.select_for_update()
            .filter(conversation_id=conversation_id, expires_at__gt=timezone.now())
            .first()
        )
        if row is None:
            return None
        deleted, _ = PendingAction.objects.filter(pk=row.pk).delete()
    return _pending(row) if deleted else None


def pending_drop(conversation_id: uuid.UUID) -> bool:
    """Forget the conversation's offer (the shopper said no, or asked something else); whether
    there was one."""
    deleted, _ = PendingAction.objects.filter(conversation_id=conversation_id).delete()
    return bool(deleted)


# --- async variants, with the store's deadline ----------------------------------------------


def _in_thread(fn: Any, *args: Any, **kwargs: Any) -> Any:
    close_old_connections()  # this worker thread keeps its own connection, within CONN_MAX_AGE
    try:
        return fn(*args, **kwargs)
    finally:
        close_old_connections()


async def _deadline(fn: Any, *args: Any, **kwargs: Any) -> Any:
    # Not Django's one sync thread: a store that hangs must not hold up every other database
    # call of this process; the deadline frees the shopper, the thread ends with the adapter's
    # own timeout.
    try:
        return await asyncio.wait_for(
            sync_to_async(_in_thread, thread_sensitive=False)(fn, *args, **kwargs),
            timeout=settings.KEFU_STORE_TIMEOUT_S,
        )
    except TimeoutError as e:
        raise StoreError(
            "upstream", "the store did not answer in time", next_step="Please try again in a minute."
        ) from e


async def orders_list_async(owner: Owner, *, actor: Actor, limit: int = 5) -> list[Order]:
    """:func:`orders_list` in a worker thread, within ``KEFU_STORE_TIMEOUT_S`` (else ``upstream``)."""
    result: list[Order] = await _deadline(orders_list, owner, actor=actor, limit=limit)
    return result


async def order_view_async(owner: Owner, number: str, *, actor: Actor, action: str = "status") -> Order:
    """:func:`order_view` in a worker thread, within ``KEFU_STORE_TIMEOUT_S`` (else ``upstream``)."""
    result: Order = await _deadline(order_view, owner, number, actor=actor, action=action)
    return result


async def action_run_async(
    owner: Owner,
    action: str,
    number: str,
    *,
    actor: Actor,
    idempotency_key: str = "",
    arguments: dict[str, Any] | None = None,
) -> ActionResult:
    """:func:`action_run` in a worker thread, within ``KEFU_STORE_TIMEOUT_S`` (else
    ``upstream``; a change already sent may still complete, and its key keeps it single)."""
    result: ActionResult = await _deadline(
        action_run, owner, action, number, actor=actor, idempotency_key=idempotency_key, arguments=arguments
    )
    return result


# The product catalog (store.catalog): read by the router's catalog index and product answers.
def catalog_fingerprint() -> tuple[int, int, str]:
    """``(products, product texts, latest update)``: differs after any import that changed the
    catalog. One query. Blocking."""
    return catalog.catalog_fingerprint()


def catalog_names() -> list[ProductNames]:
    """Every catalog product's names (``store.types.ProductNames``), for finding products in a
    shopper's words. Three queries. Blocking."""
    return catalog.catalog_names()


def product_view(sku: str, locale: str) -> ProductView | None:
    """The product ``sku`` in ``locale`` (falling back to English, then any language), with its
    price and stock as stored now; None when the catalog has no such product. Two queries.
    Blocking."""
    return catalog.product_view(sku, locale)


product_view_async = sync_to_async(product_view, thread_sensitive=False)


def product_search(text: str, locale: str, *, limit: int = 8) -> list[ProductView]:
    """Catalog products for an agent's lookup by SKU or title words (``store.catalog.product_search``:
    an exact SKU first), in ``locale``; at most ``limit``. Blocking."""
    return catalog.product_search(text, locale, limit=limit)
