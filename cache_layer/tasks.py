"""Celery tasks of the answer cache (found by ``app.autodiscover_tasks()`` in config/celery.py)."""
from __future__ import annotations

from celery import shared_task


@shared_task(name="cache_layer.tasks.audit_semantic_hit", ignore_result=True)
def audit_semantic_hit(entry_id: int, question: str, message_id: int | None) -> str | None:
    """Re-answer a served semantic hit and record the verdict (``cache_layer.audit.audit_hit``).

    Arguments are JSON (the broker's serializer): the ``CachedAnswer`` id that was served, the
    question it was served for, the shopper ``Message`` id (or None). Returns the verdict
    (``same``/``different``/``error``), or None when the entry was gone. Never raises.
    """
    from .audit import audit_hit

    row = audit_hit(entry_id=int(entry_id), question=str(question),
                    message_id=int(message_id) if message_id is not None else None)
    return row.verdict if row is not None else None
