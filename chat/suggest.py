"""AI-suggested replies for agents: a draft the agent edits before sending. A draft is never
sent to the shopper and never stored; only what the agent sends is.

The draft answers the conversation's latest shopper message the bot could answer, the way the
bot would (``routing.services.reply_suggest``: the FAQ model, the answer cache, then the
``simple`` tier when configured), looking back over at most ``LOOK_BACK`` shopper messages.
"""

from __future__ import annotations

import uuid

from channels.db import database_sync_to_async

from routing import services as router
from routing.types import Question, Suggestion

from .answering import history_loader, question_of
from .models import Conversation, Message, Role

LOOK_BACK = 3


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
    questions: list[Question] = [question_of(m, conv) for m in shopper_messages]
    return await router.reply_suggest(questions=questions, history=history_loader(conversation_id))
