"""How long conversations are kept, and one shopper's data on request (export, erasure).

- :func:`conversations_purge`: conversations idle for longer than the retention period
  (``KEFU_RETENTION_DAYS``; 0 keeps everything) are deleted with their messages, notes and
  attachments (the rows, then their files in the attachments storage), and the
  cache audits that quoted their questions. The cost ledger keeps its rows (tokens and USD, no
  text), unlinked from the deleted conversation. A conversation an agent holds or a shopper waits
  in is never purged, whatever its age. ``manage.py purge_conversations``, and daily on the beat
  schedule when a period is set.
- :func:`shopper_export` / :func:`shopper_erase`: everything kefu holds of one shopper, found by
  the store's customer id (a verified identity, chat.identity) or one conversation id:
  ``manage.py shopper_data export|erase``.

All functions are synchronous (the ORM) and run in batches of :data:`BATCH` conversations, each
in its own transaction, so a purge of a million rows never holds a lock for long.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from routing import services as router
from store import services as store

from .errors import NotFound
from .models import Attachment, Conversation, ConversationStatus, InternalNote, Message
from .services.attachments import attachment_files, attachment_files_delete

__all__ = ["BATCH", "Removed", "conversations_purge", "shopper_erase", "shopper_export"]

BATCH = 500


@dataclass(frozen=True)
class Removed:
    """What a purge or an erasure deleted: conversations, messages, internal notes, attachment files."""

    conversations: int = 0
    messages: int = 0
    notes: int = 0
    files: int = 0

    def describe(self, *, idle_days: float | None = None) -> str:
        """``"2 conversations (5 messages, 1 note)"`` (``, 3 files`` when attachments went too); with ``idle_days``, ``"... idle over N days ..."``."""

        def n(count: int, word: str) -> str:
            return f"{count} {word}{'' if count == 1 else 's'}"

        idle = f" idle over {idle_days:g} days" if idle_days is not None else ""
        files = f", {n(self.files, 'file')}" if self.files else ""
        return f"{n(self.conversations, 'conversation')}{idle} ({n(self.messages, 'message')}, {n(self.notes, 'note')}{files})"

    def __add__(self, other: Removed) -> Removed:
        return Removed(
            self.conversations + other.conversations,
            self.messages + other.messages,
            self.notes + other.notes,
            self.files + other.files,
        )


def _delete(conversations: QuerySet[Conversation], *, dry_run: bool = False) -> Removed:
    """Delete ``conversations`` in batches (see the module docstring); with ``dry_run``, count."""
    total = Removed()
    ids = list(conversations.values_list("pk", flat=True))
    for start in range(0, len(ids), BATCH):
        batch = ids[start : start + BATCH]
        with transaction.atomic():
            message_ids = list(Message.objects.filter(conversation_id__in=batch).values_list("pk", flat=True))
            notes = InternalNote.objects.filter(conversation_id__in=batch).count()
            files = attachment_files(batch)
            if not dry_run:
                router.shopper_messages_forget(message_ids=message_ids)
                router.conversation_tasks_forget(conversation_ids=batch)
                store.conversations_forget(batch)
                Conversation.objects.filter(pk__in=batch).delete()  # messages, notes, attachments cascade
        if not dry_run:
            # The rows are gone (committed): now their files. A file whose delete fails is logged
            # by name; its row no longer exists, so no link can ever serve it again.
            attachment_files_delete(files)
        total = total + Removed(len(batch), len(message_ids), notes, len(files))
    return total


def conversations_purge(*, older_than_days: float | None = None, dry_run: bool = False) -> Removed:
    """Delete the conversations with no activity for ``older_than_days`` days (default
    ``KEFU_RETENTION_DAYS``; 0 or less: nothing). Conversations waiting for or held by an agent
    stay. Returns what was (or, with ``dry_run``, would be) deleted."""
    days = settings.KEFU_RETENTION_DAYS if older_than_days is None else older_than_days
    if days <= 0:
        return Removed()
    cutoff = timezone.now() - timedelta(days=days)
    stale = Conversation.objects.filter(updated_at__lt=cutoff).exclude(
        status__in=[ConversationStatus.AGENT, ConversationStatus.WAITING_AGENT]
    )
    return _delete(stale, dry_run=dry_run)


def _shopper(*, customer_id: str | None, conversation_id: uuid.UUID | None) -> QuerySet[Conversation]:
    """The conversations of a customer id, or the one conversation. Raises ``NotFound`` when there
    is none (so a typo never reads as "nothing held")."""
    if customer_id is not None and conversation_id is None:
        found = Conversation.objects.filter(customer_id=customer_id)
    elif conversation_id is not None and customer_id is None:
        found = Conversation.objects.filter(pk=conversation_id)
    else:
        raise ValueError("give exactly one of customer_id and conversation_id")
    if not found.exists():
        what = f"customer {customer_id!r}" if customer_id is not None else f"conversation {conversation_id}"
        raise NotFound(f"no conversation of {what}")
    return found


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def shopper_export(*, customer_id: str | None = None, conversation_id: uuid.UUID | None = None) -> dict[str, Any]:
    """Everything kefu holds of one shopper, as JSON-ready data::

        {"exported_at", "customer_id" | None, "conversations": [{"id", "status", "locale",
          "created_at", "updated_at", "customer": {"id", "name", "email"} | None,
          "contact_email", "summary", "messages": [{"seq", "role", "text", "route",
          "created_at", "rating", "attachments", "cards"}], "notes": [{"text", "created_at"}],
          "attachments": [{"id", "name", "content_type", "size", "role", "created_at",
          "message_seq" | None, "path"}]}]}

    The files themselves stay in the attachments storage; ``path`` is each one's name there
    (the operator copies them from it with the export)

    Raises ``NotFound`` (no such customer or conversation) and ``ValueError`` (not exactly one
    of the two given)."""
    out = []
    for conv in _shopper(customer_id=customer_id, conversation_id=conversation_id).order_by("created_at"):
        messages = Message.objects.filter(conversation=conv).order_by("seq")
        notes = InternalNote.objects.filter(conversation=conv).order_by("created_at")
        out.append(
            {
                "id": str(conv.pk),
                "status": conv.status,
                "locale": conv.locale,
                "created_at": _iso(conv.created_at),
                "updated_at": _iso(conv.updated_at),
                "customer": (
                    {"id": conv.customer_id, "name": conv.customer_name, "email": conv.customer_email}
                    if conv.customer_id
                    else None
                ),
                "contact_email": conv.contact_email,
                "summary": conv.summary,
                "messages": [
                    {
                        "seq": m.seq,
                        "role": m.role,
                        "text": m.text,
                        "route": m.route,
                        "created_at": _iso(m.created_at),
                        "rating": m.rating,
                        "attachments": [a["id"] for a in m.attachments],
                        "cards": list(m.cards),  # product cards shown with it (issue 36)
                    }
                    for m in messages
                ],
                "notes": [{"text": n.text, "created_at": _iso(n.created_at)} for n in notes],
                "attachments": [
                    {
                        "id": a.pk,
                        "name": a.name,
                        "content_type": a.content_type,
                        "size": a.size,
                        "role": a.role,
                        "created_at": _iso(a.created_at),
                        "message_seq": a.message.seq if a.message is not None else None,
                        "path": a.file.name,
                    }
                    for a in Attachment.objects.filter(conversation=conv)
                    .select_related("message")
                    .order_by("created_at")
                ],
            }
        )
    return {"exported_at": timezone.now().isoformat(), "customer_id": customer_id, "conversations": out}


def shopper_erase(*, customer_id: str | None = None, conversation_id: uuid.UUID | None = None) -> Removed:
    """Delete everything kefu holds of one shopper (their conversations, messages, attachments
    with their files, and the notes on them, the cache audits quoting them); the cost ledger keeps its rows, unlinked. Raises
    like :func:`shopper_export`."""
    return _delete(_shopper(customer_id=customer_id, conversation_id=conversation_id))
