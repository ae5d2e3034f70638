"""Writes of attachments (issue 33): a judged file stored under its conversation's caps, the
files of a message taken for it once, and files deleted with their conversations.

All synchronous (the ORM and the storage API); async callers wrap them in
``database_sync_to_async``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import storages
from django.db import transaction
from django.db.models import Count, Sum

from ..attachments import Judged, TooLarge
from ..errors import AttachmentRefused
from ..models import Attachment, Conversation

log = logging.getLogger(__name__)

#: Most files one message may carry.
MAX_PER_MESSAGE = 10


def attachment_store(*, conversation_id: uuid.UUID, judged: Judged, role: str) -> Attachment:
    """Store a judged file (``chat.attachments.judge``) in ``conversation_id`` as sent by
    ``role`` ("shopper" or "agent"), not yet linked to a message. Raises ``TooLarge`` when the
    conversation would hold more than ``KEFU_ATTACHMENTS_PER_CONVERSATION`` files or
    ``KEFU_ATTACHMENT_BYTES_PER_CONVERSATION`` bytes, ``Conversation.DoesNotExist``.

    The caps are read under the conversation's row lock, so two uploads at once cannot both pass
    the last place. The file is written to the storage first; if the row's write then fails, the
    file is deleted again (nothing stays without its row)."""
    with transaction.atomic():
        Conversation.objects.select_for_update().filter(pk=conversation_id).values_list("pk").get()
        held = Attachment.objects.filter(conversation_id=conversation_id).aggregate(n=Count("pk"), size=Sum("size"))
        count, size = int(held["n"] or 0), int(held["size"] or 0)
        if count + 1 > settings.KEFU_ATTACHMENTS_PER_CONVERSATION:
            raise TooLarge(f"this conversation already holds {count} files, the most it may")
        if size + len(judged.content) > settings.KEFU_ATTACHMENT_BYTES_PER_CONVERSATION:
            raise TooLarge("this conversation holds as many bytes of files as it may")
        attachment = Attachment(
            conversation_id=conversation_id,
            name=judged.name,
            content_type=judged.content_type,
            size=len(judged.content),
            width=judged.width,
            height=judged.height,
            role=role,
        )
        attachment.file.save(judged.name, ContentFile(judged.content), save=False)
        try:
            attachment.save(force_insert=True)
        except BaseException:
            attachment.file.storage.delete(str(attachment.file.name))
            raise
    return attachment


def attachments_take(*, conversation_id: uuid.UUID, ids: list[str], role: str) -> list[dict[str, Any]]:
    """Inside a message's write transaction, before its row: lock the attachments ``ids`` for
    the message about to be stored and return their descriptions in ``ids``' order (what the
    message keeps: ``Attachment.meta``). Each must be of ``conversation_id``, sent by ``role``
    and not used by another message; else ``AttachmentRefused`` (``forbidden``), and the caller's
    transaction rolls back. Link them with :func:`attachments_link` once the message row exists."""
    if len(ids) != len(set(ids)):
        raise AttachmentRefused("the same attachment is named twice")
    rows = {
        a.pk: a
        for a in Attachment.objects.select_for_update().filter(
            pk__in=ids, conversation_id=conversation_id, message__isnull=True, role=role
        )
    }
    missing = [i for i in ids if i not in rows]
    if missing:
        raise AttachmentRefused("an attachment is not this conversation's, or was already sent")
    return [rows[i].meta() for i in ids]


def attachments_link(*, ids: list[str], message_id: int) -> None:
    """Link the attachments ``ids`` (taken by :func:`attachments_take`) to the stored message."""
    Attachment.objects.filter(pk__in=ids).update(message_id=message_id)


def attachment_files(conversation_ids: Iterable[uuid.UUID]) -> list[str]:
    """The storage names of every file of the conversations (to delete them with the rows)."""
    return list(Attachment.objects.filter(conversation_id__in=list(conversation_ids)).values_list("file", flat=True))


def attachment_files_delete(names: list[str]) -> int:
    """Delete stored files by name from the attachments storage; returns how many were deleted.
    A file already gone counts as deleted; a storage error is logged (the name, never the
    content) and the rest go on."""
    storage = storages["attachments"]
    deleted = 0
    for name in names:
        try:
            storage.delete(name)
            deleted += 1
        except OSError as e:
            log.warning("deleting attachment file %s failed (%r)", name, e)
    return deleted
