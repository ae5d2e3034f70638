"""AI-suggested replies for agents: a draft the agent edits before sending. A draft is never
sent to the shopper and never stored; only what the agent sends is.

The draft answers the conversation's latest shopper message the bot could answer, the way the
bot would: the FAQ model, the answer cache, then the ``simple`` tier (when configured). Messages
that only ask for a person (routing's keyword rules) or that the bot would decline or hand off
are skipped in favour of the shopper's earlier ones (up to ``LOOK_BACK``).
"""
from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from channels.db import database_sync_to_async

from routing import strategy
from routing.ledger import CallContext
from routing.providers.base import ProviderError, TextDelta
from routing.resilience import stream_with_fallback

from .models import Conversation, Message, Role

log = logging.getLogger(__name__)

LOOK_BACK = 3


@dataclass(frozen=True)
class Suggestion:
    """``text`` ("" when nothing could be drafted), the ``route`` that drafted it (``faq``,
    ``cache.exact``, ``cache.semantic``, ``llm.simple``...; None with no draft) and ``for_seq``,
    the shopper message it answers."""

    text: str
    route: str | None
    for_seq: int | None


def _recent(conversation_id: uuid.UUID) -> tuple[Conversation, list[Message]] | None:
    conv = Conversation.objects.filter(pk=conversation_id).first()
    if conv is None:
        return None
    rows = list(Message.objects.filter(conversation_id=conversation_id, role=Role.SHOPPER).order_by("-seq")[:LOOK_BACK])
    return conv, rows


async def draft_reply(*, conversation_id: uuid.UUID) -> Suggestion | None:
    """Draft a reply for the agent (see the module docstring). None when the conversation does
    not exist; a ``Suggestion`` with empty text when nothing could be drafted (a remote failure
    included: it is logged, not raised)."""
    found = await database_sync_to_async(_recent)(conversation_id)
    if found is None:
        return None
    conv, shopper_messages = found
    for msg in shopper_messages:
        decision = await strategy.decide(conversation=conv, message=msg)
        if decision.route == "faq" or decision.route.startswith("cache."):
            return Suggestion(decision.text or "", decision.route, msg.seq)
        if decision.provider is not None and decision.request is not None:
            parts: list[str] = []
            try:
                async for item in stream_with_fallback(
                        decision, context=CallContext(conversation_id=conversation_id, purpose="suggestion")):
                    if isinstance(item, TextDelta):
                        parts.append(item.text)
            except ProviderError as e:
                log.warning("suggested reply for %s failed: %s", conversation_id, e)
                return Suggestion("", None, None)
            return Suggestion("".join(parts), decision.route, msg.seq)
    return Suggestion("", None, None)
