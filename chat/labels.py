"""Labels on conversations (issue 32 item 3; docs/console.md, "Labels").

The store defines its labels (a name and a colour); staff with ``chat.manage_labels`` create,
rename, recolour and delete them in the console (or the admin). Any agent sets a label on a
conversation or takes it off. The console's rows carry their label ids
(``chat.selectors.console_rows``) and the inbox filters by label (:func:`label_conversations`,
``chat.selectors.label_q``). Ops counts the labels and their outcomes (``ops.labels``).
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from django.db import IntegrityError, transaction

from .errors import ChatError, NotFound
from .models import Conversation, ConversationLabel, Label
from .selectors import console_rows, label_q

MANAGE_LABELS = "chat.manage_labels"
NAME_MAX = 40
_COLOR = re.compile(r"^#[0-9a-fA-F]{6}$")
#: Rows the label view returns at most (newest activity first).
VIEW_LIMIT = 100


class LabelForbidden(ChatError):
    """The agent lacks ``chat.manage_labels`` (defining labels is the store's)."""

    code = "forbidden"


class InvalidLabel(ChatError):
    """A label name that is empty, too long or taken, or a colour that is not ``#rrggbb``."""

    code = "invalid"


def label_item(label: Label) -> dict[str, Any]:
    """``{"id", "name", "color"}``."""
    return {"id": label.pk, "name": label.name, "color": label.color}


def labels_list() -> list[dict[str, Any]]:
    """Every label, in display order (:func:`label_item` shape). One query."""
    return [label_item(label) for label in Label.objects.all()]


def can_manage_labels(user: Any) -> bool:
    """Whether ``user`` may define labels (``chat.manage_labels``; superusers may)."""
    return bool(user is not None and user.is_active and user.has_perm(MANAGE_LABELS))


def _clean(name: Any, color: Any) -> tuple[str, str]:
    if not isinstance(name, str) or not name.strip():
        raise InvalidLabel("a label needs a name")
    name = " ".join(name.split())
    if len(name) > NAME_MAX:
        raise InvalidLabel(f"a label's name is at most {NAME_MAX} characters")
    if not isinstance(color, str) or not _COLOR.match(color):
        raise InvalidLabel("a label's colour is #rrggbb, e.g. #d97706")
    return name, color.lower()


def label_save(*, user: Any, label_id: int | None, name: Any, color: Any) -> dict[str, Any]:
    """Create a label (``label_id`` None) or rename/recolour one; returns :func:`label_item`.
    Raises :class:`LabelForbidden` without ``chat.manage_labels``, :class:`InvalidLabel` for a
    bad name or colour or a name another label has (case-insensitive), :class:`NotFound`."""
    if not can_manage_labels(user):
        raise LabelForbidden("defining labels needs the “manage labels” permission")
    name, color = _clean(name, color)
    taken = Label.objects.filter(name__iexact=name)
    if label_id is not None:
        taken = taken.exclude(pk=label_id)
    if taken.exists():
        raise InvalidLabel(f"a label named {name!r} exists")
    try:
        with transaction.atomic():
            if label_id is None:
                label = Label.objects.create(name=name, color=color)
            else:
                found = Label.objects.select_for_update().filter(pk=label_id).first()
                if found is None:
                    raise NotFound("no such label")
                label = found
                label.name, label.color = name, color
                label.save(update_fields=["name", "color"])
    except IntegrityError:
        raise InvalidLabel(f"a label named {name!r} exists") from None
    return label_item(label)


def label_delete(*, user: Any, label_id: int) -> None:
    """Delete a label (it leaves every conversation). Raises :class:`LabelForbidden`, :class:`NotFound`."""
    if not can_manage_labels(user):
        raise LabelForbidden("defining labels needs the “manage labels” permission")
    deleted, _ = Label.objects.filter(pk=label_id).delete()
    if not deleted:
        raise NotFound("no such label")


def conversation_label_set(*, conversation_id: uuid.UUID, label_id: Any, on: bool, user: Any) -> list[int]:
    """Put label ``label_id`` on the conversation (``on``) or take it off; idempotent. Returns the
    conversation's label ids afterwards, ascending. Raises :class:`InvalidLabel` for a label id
    that is not an integer, :class:`NotFound` for an unknown conversation or label."""
    if isinstance(label_id, bool) or not isinstance(label_id, int):
        raise InvalidLabel("label must be a label id (an integer)")
    with transaction.atomic():
        if not Conversation.objects.filter(pk=conversation_id).exists():
            raise NotFound("no such conversation")
        if not Label.objects.filter(pk=label_id).exists():
            raise NotFound("no such label")
        links = ConversationLabel.objects.filter(conversation_id=conversation_id)
        if on:
            try:
                with transaction.atomic():
                    ConversationLabel.objects.get_or_create(
                        conversation_id=conversation_id, label_id=label_id, defaults={"set_by": user}
                    )
            except IntegrityError:
                pass  # set at the same moment by another agent: it is on either way
        else:
            links.filter(label_id=label_id).delete()
        return sorted(links.values_list("label_id", flat=True))


def conversation_label_ids(*, conversation_id: uuid.UUID) -> list[int]:
    """The conversation's label ids, ascending. One query."""
    return sorted(ConversationLabel.objects.filter(conversation_id=conversation_id).values_list("label_id", flat=True))


def label_conversations(*, label_id: int, limit: int = VIEW_LIMIT) -> list[dict[str, Any]]:
    """The inbox's label view: the conversations that carry the label and are not closed, newest
    activity first, at most ``limit``, as console rows (``chat.selectors.console_rows``). Raises
    :class:`NotFound` for an unknown label. Two queries."""
    if not Label.objects.filter(pk=label_id).exists():
        raise NotFound("no such label")
    qs = (
        Conversation.objects.filter(label_q(label_id))
        .exclude(status="closed")
        .exclude(status="bot", last_seq=0)
        .order_by("-updated_at", "-id")[:limit]
    )
    return console_rows(queryset=qs)
