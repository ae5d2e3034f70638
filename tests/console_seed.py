"""A busy day for the agent console, bulk-loaded into a kefu database (tests/chat/test_console_paging.py,
tests/e2e/test_console_browser.py, bench/console_open.py).

Run inside the project (``manage.py shell -c "from tests.console_seed import seed; seed(...)"``):
``seed(waiting=N, long_messages=M)`` creates N conversations waiting for an agent, each with one
shopper message, the one that waits longest first (``waiting_since`` one second apart, ending a
minute ago), and one bot conversation of M messages (shopper and bot in turn, seq 1..M). It
prints one JSON line: ``{"long": UUID, "first_waiting": UUID, "last_waiting": UUID}``.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import timedelta
from typing import Any

BATCH = 2000


def shopper_text(i: int) -> str:
    """The text of waiting conversation ``i``'s message (0: the longest wait)."""
    return f"Waiting shopper {i}: where is my parcel? It was due on Monday and the tracking page says nothing."


def long_text(seq: int) -> str:
    """Message ``seq`` of the long conversation (odd: the shopper, even: the bot), ~300 bytes."""
    if seq % 2:
        return f"Question {seq}: " + "could you tell me more about the oak side table, its size and its finish? " * 3
    return f"Answer {seq}: " + "the oak side table is 60 cm wide, 45 cm deep and oiled by hand in our workshop. " * 3


def seed(*, waiting: int, long_messages: int) -> dict[str, Any]:
    """Bulk-create the conversations (see the module's docstring); returns (and prints) their ids."""
    from django.db import transaction
    from django.utils import timezone

    from chat.models import Conversation, Message

    now = timezone.now()
    token = hashlib.sha256(b"seeded").hexdigest()
    ids = [uuid.uuid4() for _ in range(waiting)]
    with transaction.atomic():
        Conversation.objects.bulk_create(
            [
                Conversation(
                    id=cid,
                    token_hash=token,
                    status="waiting_agent",
                    last_seq=1,
                    answered_seq=1,
                    waiting_since=now - timedelta(seconds=60 + waiting - i),
                    handoff_reason="asked for a person",
                )
                for i, cid in enumerate(ids)
            ],
            batch_size=BATCH,
        )
        Message.objects.bulk_create(
            [Message(conversation_id=cid, seq=1, role="shopper", text=shopper_text(i)) for i, cid in enumerate(ids)],
            batch_size=BATCH,
        )
        long_id = uuid.uuid4()
        Conversation.objects.create(
            id=long_id, token_hash=token, status="bot", last_seq=long_messages, answered_seq=long_messages
        )
        for start in range(1, long_messages + 1, BATCH):
            Message.objects.bulk_create(
                [
                    Message(
                        conversation_id=long_id,
                        seq=seq,
                        role="shopper" if seq % 2 else "bot",
                        text=long_text(seq),
                        route="" if seq % 2 else "faq",
                    )
                    for seq in range(start, min(start + BATCH, long_messages + 1))
                ]
            )
    out = {
        "long": str(long_id),
        "first_waiting": str(ids[0]) if ids else None,
        "last_waiting": str(ids[-1]) if ids else None,
    }
    print(json.dumps(out))
    return out
