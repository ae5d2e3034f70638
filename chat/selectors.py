"""Reads of conversations and messages (no writes here)."""
from __future__ import annotations

import uuid

from .models import Message, MessageState


def messages_after(*, conversation_id: uuid.UUID, after: int) -> list[Message]:
    """Every message with ``seq > after``, in seq order (finished and streaming ones)."""
    return list(Message.objects.filter(conversation_id=conversation_id, seq__gt=after).order_by("seq"))


def history_for_prompt(*, conversation_id: uuid.UUID, before_seq: int, turns: int) -> list[Message]:
    """The last ``turns`` turns (a turn = a shopper message and the answers after it) before
    ``before_seq``, oldest first, finished messages only, system messages excluded."""
    rows = list(
        Message.objects.filter(conversation_id=conversation_id, seq__lt=before_seq, state=MessageState.DONE)
        .exclude(role="system")
        .order_by("-seq")[: turns * 4]
    )
    rows.reverse()
    shopper_idx = [i for i, m in enumerate(rows) if m.role == "shopper"]
    if len(shopper_idx) > turns:
        rows = rows[shopper_idx[-turns]:]
    return rows
