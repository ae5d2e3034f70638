"""A bot test's conversations (``manage.py bot_test``, docs/bot-tests.md): each scenario is a new
conversation flagged ``sandbox``, and each of its turns takes the path a shopper's message takes
over the socket (``services.message_receive`` with the answering claim, then the answering loop:
the router, the store, the cache, the tiers), in this process, without a socket.

Call inside ``lib.sandbox.entered()``: the store's changes are then simulated, the ledger marks the
calls ``test`` and the answer cache is only read. The conversation's flag keeps it out of the
agents' queue, alerts, search and the ops figures. Every write is a short transaction of its own
(the same services a shopper's message uses), so a server on the same database keeps answering.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from decimal import Decimal

from channels.db import database_sync_to_async

from lib import sandbox
from routing import services as router

from . import answering, services
from .models import Conversation, ConversationStatus, Message, Role


@dataclass(frozen=True)
class Turn:
    """What one shopper message got: ``seq`` of the shopper's message; ``text``, the bot's answers
    to it joined by blank lines ("" when none came); ``route`` the route of its last answer ("" none)
    and ``routes`` of each, in order; ``notices``: the system messages after it (e.g. no agent is
    online); ``status``, the conversation's status after it (``bot``, ``waiting_agent``...);
    ``locale``, the conversation's locale after it; ``cost_usd``, what its answers cost (USD)."""

    seq: int
    text: str
    route: str
    routes: tuple[str, ...]
    notices: tuple[str, ...]
    status: str
    locale: str
    cost_usd: Decimal

    @property
    def handoff(self) -> bool:
        """Whether the conversation now waits for a person."""
        return self.status == ConversationStatus.WAITING_AGENT


async def ready() -> None:
    """Load the router as a server's start-up does (the FAQ model, the warm-up) when this
    process has not, and wait until it is ready: a management command's router has no FAQ model
    until then, and would hand every question off."""
    if not router.router_started():
        router.router_start()
    await router.router_wait_ready()


def _require_sandbox() -> None:
    if not sandbox.active():
        raise RuntimeError("a bot test's conversation runs inside lib.sandbox.entered()")


def conversation_start(*, locale: str = "en") -> uuid.UUID:
    """A new bot test's conversation (flagged ``sandbox``) in ``locale``; returns its id. Blocking.

    Raises:
        RuntimeError: outside a sandbox.
    """
    _require_sandbox()
    conv, _token = services.conversation_start(locale=locale, sandbox=True)
    return conv.id


def _after(conversation_id: uuid.UUID, seq: int) -> tuple[list[Message], str, str]:
    rows = list(Message.objects.filter(conversation_id=conversation_id, seq__gt=seq).order_by("seq"))
    status, locale = Conversation.objects.values_list("status", "locale").get(pk=conversation_id)
    return rows, str(status), str(locale)


async def turn(*, conversation_id: uuid.UUID, text: str) -> Turn:
    """Send ``text`` as the shopper of bot test conversation ``conversation_id`` and wait until
    this process answered it (and every later message), the ledger rows included.

    Raises:
        RuntimeError: outside a sandbox, or the conversation is not a bot test's.
        chat.errors.NotFound and what ``services.message_receive`` raises for bad input.
    """
    _require_sandbox()
    if not await database_sync_to_async(Conversation.objects.filter(pk=conversation_id, sandbox=True).exists)():
        raise RuntimeError("not a bot test's conversation")
    answering.shopper_message(conversation_id)
    received = await database_sync_to_async(services.message_receive)(
        conversation_id=conversation_id,
        client_id=uuid.uuid4().hex,
        text=text,
        claim=answering.is_idle(conversation_id),
    )
    if received.claimed is not None:
        answering.enqueue_claimed(received.message, received.claimed)
    else:
        answering.kick(conversation_id)
    await answering.settled(conversation_id)
    await router.router_drain()
    seq = received.message.seq
    rows, status, locale = await database_sync_to_async(_after)(conversation_id, seq)
    bots = [m for m in rows if m.role == Role.BOT and not m.superseded]
    return Turn(
        seq=seq,
        text="\n\n".join(m.text for m in bots if m.text),
        route=bots[-1].route if bots else "",
        routes=tuple(m.route for m in bots),
        notices=tuple(m.text for m in rows if m.role == Role.SYSTEM),
        status=status,
        locale=locale,
        cost_usd=sum((Decimal(m.cost_usd) for m in bots), Decimal(0)),
    )
