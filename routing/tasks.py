"""Celery tasks of the router (found by ``app.autodiscover_tasks()`` in config/celery.py)."""
from __future__ import annotations

import uuid

from celery import shared_task


@shared_task(name="routing.tasks.summarise_conversation", ignore_result=True)
def summarise_conversation(conversation_id: str) -> str | None:
    """Fold the turns that left the prompt window into the conversation's rolling summary
    (``routing.context.conversation_summarise``: the ``simple`` tier, a ledger row per attempt).

    ``conversation_id``: the ``chat.Conversation`` UUID as a string (JSON payload). Returns the
    new summary, or None when nothing was due, no model is configured or the call failed.
    Enqueued by ``routing.context.maybe_summarise`` when a bot answer was stored."""
    from .context import conversation_summarise

    return conversation_summarise(conversation_id=uuid.UUID(str(conversation_id)))
