"""Canned replies agents manage in the console (issue 32 item 5; docs/console.md, "Canned replies").

A reply is **shared** (``owner`` null: every agent sees it; creating, editing or deleting one
needs ``chat.manage_shared_replies``) or **personal** (its owner's only; any agent manages their
own). It has a default text and per-locale texts; the conversation's language picks one
(:func:`text_for`). ``{name}`` and ``{order_number}`` are filled from the conversation
(:func:`fill`): the shopper's name (a verified customer's) and the last order number named in it;
a placeholder with nothing to fill it stays as written, for the agent to complete.
The console inserts one by ``/shortcut`` in the reply box.
"""

from __future__ import annotations

import re
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q

from .errors import ChatError, NotFound
from .models import CannedReply

MANAGE_SHARED = "chat.manage_shared_replies"
TITLE_MAX = 100
TEXT_MAX = 4000
SHORTCUT_MAX = 32
_SHORTCUT = re.compile(r"^[\w-]{1,32}$")
_LOCALE = re.compile(r"^[a-z]{2,3}(?:[-_][A-Za-z0-9]{2,8})?$")
PLACEHOLDERS = ("name", "order_number")
_PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")


class CannedForbidden(ChatError):
    """A shared reply changed without ``chat.manage_shared_replies``, or another agent's personal one."""

    code = "forbidden"


class InvalidCanned(ChatError):
    """A title, text, shortcut or per-locale text that is missing, too long or badly formed, or a
    shortcut another reply of the same scope has."""

    code = "invalid"


def can_manage_shared(user: Any) -> bool:
    """Whether ``user`` may create, edit and delete shared replies (superusers may)."""
    return bool(user is not None and user.is_active and user.has_perm(MANAGE_SHARED))


def reply_item(reply: CannedReply, *, user: Any = None) -> dict[str, Any]:
    """``{"id", "title", "shortcut", "text", "texts", "locale", "shared", "editable"}``;
    ``editable``: whether ``user`` may change it."""
    shared = reply.owner_id is None
    return {
        "id": reply.pk,
        "title": reply.title,
        "shortcut": reply.shortcut,
        "text": reply.text,
        "texts": dict(reply.texts or {}),
        "locale": reply.locale,
        "shared": shared,
        "editable": can_manage_shared(user) if shared else reply.owner_id == getattr(user, "pk", None),
    }


def replies_for(user: Any) -> list[dict[str, Any]]:
    """The active replies ``user`` sees (shared, then their own, each in display order) as
    :func:`reply_item`. One query (and the permission check)."""
    rows = CannedReply.objects.filter(Q(owner__isnull=True) | Q(owner_id=user.pk), active=True)
    items = [reply_item(r, user=user) for r in rows]
    return sorted(items, key=lambda i: not i["shared"])


def _clean(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise InvalidCanned("a canned reply is a JSON object")
    title = data.get("title")
    text = data.get("text")
    shortcut = data.get("shortcut", "")
    texts = data.get("texts", {}) or {}
    if not isinstance(title, str) or not title.strip() or len(title.strip()) > TITLE_MAX:
        raise InvalidCanned(f"title: 1-{TITLE_MAX} characters")
    if not isinstance(text, str) or not text.strip() or len(text) > TEXT_MAX:
        raise InvalidCanned(f"text: 1-{TEXT_MAX} characters")
    if not isinstance(shortcut, str):
        raise InvalidCanned("shortcut: letters, digits, - or _")
    shortcut = shortcut.strip().lstrip("/")
    if shortcut and not _SHORTCUT.match(shortcut):
        raise InvalidCanned(f"shortcut: 1-{SHORTCUT_MAX} letters, digits, - or _ (no spaces)")
    if not isinstance(texts, dict):
        raise InvalidCanned('texts: {"locale": "text"}')
    clean_texts: dict[str, str] = {}
    for locale, value in texts.items():
        if not isinstance(locale, str) or not _LOCALE.match(locale):
            raise InvalidCanned(f"texts: {locale!r} is not a language code such as en or zh")
        if not isinstance(value, str) or len(value) > TEXT_MAX:
            raise InvalidCanned(f"texts[{locale}]: at most {TEXT_MAX} characters")
        if value.strip():
            clean_texts[locale.lower().replace("_", "-")] = value
    return {"title": title.strip(), "text": text, "shortcut": shortcut, "texts": clean_texts}


def reply_save(*, user: Any, reply_id: int | None, data: Any) -> dict[str, Any]:
    """Create a reply (``reply_id`` None; ``data["shared"]`` true makes it shared, else it is
    ``user``'s own) or edit one ``user`` may edit. ``data``: ``{"title", "text", "shortcut"?,
    "texts"? {locale: text}, "shared"?}``. Returns :func:`reply_item`. Raises
    :class:`InvalidCanned`, :class:`CannedForbidden`, :class:`NotFound` (an unknown reply, or
    another agent's personal one: never revealed)."""
    fields = _clean(data)
    with transaction.atomic():
        if reply_id is None:
            shared = bool(data.get("shared"))
            if shared and not can_manage_shared(user):
                raise CannedForbidden("shared replies need the “manage shared replies” permission")
            reply = CannedReply(owner=None if shared else user)
        else:
            found = CannedReply.objects.select_for_update().filter(pk=reply_id).first()
            if found is None or (found.owner_id is not None and found.owner_id != user.pk):
                raise NotFound("no such canned reply")
            if found.owner_id is None and not can_manage_shared(user):
                raise CannedForbidden("shared replies need the “manage shared replies” permission")
            reply = found
        if fields["shortcut"]:
            clash = CannedReply.objects.filter(shortcut=fields["shortcut"], owner_id=reply.owner_id)
            if reply.pk is not None:
                clash = clash.exclude(pk=reply.pk)
            if clash.exists():
                raise InvalidCanned(f"another reply has the shortcut /{fields['shortcut']}")
        for key, value in fields.items():
            setattr(reply, key, value)
        try:
            with transaction.atomic():
                reply.save()
        except IntegrityError:
            raise InvalidCanned(f"another reply has the shortcut /{fields['shortcut']}") from None
    return reply_item(reply, user=user)


def reply_delete(*, user: Any, reply_id: int) -> None:
    """Delete a reply ``user`` may edit. Raises :class:`CannedForbidden`, :class:`NotFound`."""
    with transaction.atomic():
        reply = CannedReply.objects.select_for_update().filter(pk=reply_id).first()
        if reply is None or (reply.owner_id is not None and reply.owner_id != user.pk):
            raise NotFound("no such canned reply")
        if reply.owner_id is None and not can_manage_shared(user):
            raise CannedForbidden("shared replies need the “manage shared replies” permission")
        reply.delete()


def text_for(item: dict[str, Any], locale: str) -> str:
    """The text of reply ``item`` (:func:`reply_item` shape) for a conversation in ``locale``:
    the per-locale text of exactly that language (``zh-hans``), else of its base language
    (``zh``), else any per-locale text of the same base language, else the default ``text``."""
    texts: dict[str, str] = item.get("texts") or {}
    want = (locale or "").lower().replace("_", "-")
    base = want.split("-")[0]
    if want in texts:
        return texts[want]
    if base in texts:
        return texts[base]
    for key, value in texts.items():
        if key.split("-")[0] == base and base:
            return value
    return str(item["text"])


def fill(text: str, values: dict[str, str]) -> str:
    """``text`` with ``{name}`` and ``{order_number}`` replaced by ``values``' non-empty entries;
    a placeholder with no value (and any other brace) stays as written."""
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1)) or m.group(0), text)


def replies_filled(*, user: Any, locale: str, values: dict[str, str]) -> list[dict[str, Any]]:
    """The replies ``user`` sees for a conversation in ``locale``, each with its ``text`` chosen
    for the language (:func:`text_for`) and filled (:func:`fill`): ``[{"id", "title",
    "shortcut", "text", "shared"}]``. A reply limited to another language (``locale`` set) is left out."""
    base = (locale or "").lower().split("-")[0]
    out = []
    for item in replies_for(user):
        if item["locale"] and item["locale"].lower().split("-")[0] != base:
            continue
        out.append(
            {
                "id": item["id"],
                "title": item["title"],
                "shortcut": item["shortcut"],
                "text": fill(text_for(item, locale), values),
                "shared": item["shared"],
            }
        )
    return out
