"""Where a conversation's task is stored (``routing.models.ConversationTask``): what the shopper
is trying to do across messages, shared by the template path (``routing.orders.actions``), the
remote model's tool path (``routing.orders.tools``) and the agents' console.

One row per conversation; a row made in an earlier session of the conversation (its
``session_from_seq`` differs from the question's) is not the shopper's task any more. Every
function here is blocking (one or two indexed queries); the ``*_async`` ones run it in a worker
thread.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.utils import timezone

from routing.models import ConversationTask

__all__ = ["AWAITING", "INTENTS", "Task", "task_drop", "task_get", "task_save", "task_view", "tasks_forget"]

#: The intents a task can have: the store actions of ``KEFU_ACTION_INTENTS``. (A product's "which
#: one do you mean?" is no task: ``routing.decide.product_flow`` reads it back from the
#: conversation, so it never replaces an order task; a ``product`` row an earlier version stored
#: is left alone by the order paths until it expires.)
INTENTS = ("cancel", "return", "change", "change_address", "status", "refund_status")
#: What a task waits for: a missing piece (""), a yes/no to an offered change, a yes/no to
#: checking an expired task again.
AWAITING = ("", "confirm", "recheck")


@dataclass(frozen=True, slots=True)
class Task:
    """A conversation's task as the router reads it (frozen): ``intent`` (one of :data:`INTENTS`),
    ``order_number``/``email`` given so far ("" for none), ``awaiting`` (one of :data:`AWAITING`),
    ``source`` (``action`` or ``tool``), ``choices`` (the order numbers kefu listed to choose
    from, in the order shown), ``expires_at`` (aware datetime) and ``expired``
    (``expires_at`` had passed when it was read)."""

    intent: str
    order_number: str = ""
    email: str = ""
    awaiting: str = ""
    source: str = "action"
    choices: tuple[str, ...] = ()
    expires_at: datetime | None = None
    expired: bool = False


def task_get(conversation_id: uuid.UUID, session_from_seq: int) -> Task | None:
    """The conversation's task in its current session (expired ones too: ``Task.expired``), or
    None. One indexed query."""
    row = ConversationTask.objects.filter(conversation_id=conversation_id, session_from_seq=session_from_seq).first()
    if row is None:
        return None
    return Task(
        intent=row.intent,
        order_number=row.order_number,
        email=row.email,
        awaiting=row.awaiting,
        source=row.source,
        choices=tuple(str(n) for n in row.choices or ()),
        expires_at=row.expires_at,
        expired=row.expires_at <= timezone.now(),
    )


def task_save(conversation_id: uuid.UUID, session_from_seq: int, task: Task) -> Task:
    """Store ``task`` as the conversation's only task (replacing any earlier one, of any session),
    valid ``KEFU_STORE_CONFIRM_TTL_S`` seconds from now. Returns it as stored. Raises
    ``ValueError`` for an intent or ``awaiting`` kefu does not know."""
    if task.intent not in INTENTS or task.awaiting not in AWAITING:
        raise ValueError(f"unknown task intent {task.intent!r} or awaiting {task.awaiting!r}")
    expires_at = timezone.now() + timedelta(seconds=settings.KEFU_STORE_CONFIRM_TTL_S)
    ConversationTask.objects.update_or_create(
        conversation_id=conversation_id,
        defaults={
            "session_from_seq": session_from_seq,
            "intent": task.intent,
            "order_number": task.order_number[:32],
            "email": task.email[:254],
            "awaiting": task.awaiting,
            "source": task.source,
            "choices": list(task.choices),
            "expires_at": expires_at,
        },
    )
    return Task(**{**asdict(task), "expires_at": expires_at, "expired": False})


def task_drop(conversation_id: uuid.UUID) -> bool:
    """Forget the conversation's task (done, refused, declined, cleared by an agent); whether
    there was one."""
    deleted, _ = ConversationTask.objects.filter(conversation_id=conversation_id).delete()
    return bool(deleted)


def tasks_forget(conversation_ids: list[uuid.UUID]) -> int:
    """Forget the tasks of conversations being deleted (retention, erasure); the rows deleted."""
    deleted, _ = ConversationTask.objects.filter(conversation_id__in=conversation_ids).delete()
    return int(deleted)


def task_view(conversation_id: uuid.UUID) -> dict[str, Any] | None:
    """The conversation's task for the agents' console, whatever its session: ``{"intent",
    "order_number", "email", "awaiting", "source", "choices", "session_from_seq", "updated_at",
    "expires_at" (ISO 8601), "expired"}``, or None."""
    row = ConversationTask.objects.filter(conversation_id=conversation_id).first()
    if row is None:
        return None
    return {
        "intent": row.intent,
        "order_number": row.order_number,
        "email": row.email,
        "awaiting": row.awaiting,
        "source": row.source,
        "choices": list(row.choices or ()),
        "session_from_seq": row.session_from_seq,
        "updated_at": row.updated_at.isoformat(),
        "expires_at": row.expires_at.isoformat(),
        "expired": row.expires_at <= timezone.now(),
    }


task_get_async = sync_to_async(task_get, thread_sensitive=False)
task_save_async = sync_to_async(task_save, thread_sensitive=False)
task_drop_async = sync_to_async(task_drop, thread_sensitive=False)
