"""Replies by e-mail (docs/email.md, "Replies by e-mail"): a shopper answers an e-mailed reply, the
provider posts it to kefu's inbound webhook (Mailgun's, through django-anymail: signature checked
there), and the text, without the quoted e-mail and the signature, becomes the shopper's message
in the conversation, answered as usual.

Which conversation: the ``Reply-To`` of every reply e-mail is ``KEFU_EMAIL_REPLY_TO`` with a
signed tag (``reply+<conversation hex>.<signature>@domain``, :func:`reply_address`); failing
that, the e-mail's ``In-Reply-To`` / ``References`` naming an e-mail kefu sent.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import uuid

from django.conf import settings

from .models import OutgoingEmail

#: Where a quoted e-mail or a signature starts (a line matching one of these ends the reply).
_CUT = [
    re.compile(r"^\s*>"),  # quoted lines
    re.compile(r"^\s*On .{1,200} wrote:\s*$", re.I),  # Gmail, Apple Mail
    re.compile(r"^\s*在.{1,200}写道[:：]\s*$"),  # the same in Chinese mail clients
    re.compile(r"^\s*-{2,}\s*Original Message\s*-{2,}", re.I),  # Outlook
    re.compile(r"^\s*-{2,}\s*原始邮件\s*-{2,}"),
    re.compile(r"^\s*From:\s.+", re.I),  # Outlook's header block of the quoted e-mail
    re.compile(r"^\s*发件人[:：]"),
    re.compile(r"^-- ?$"),  # the signature separator (RFC 3676: "-- ")
    re.compile(r"^\s*Sent from my ", re.I),
    re.compile(r"^\s*发自我的"),
]


def strip_reply(text: str) -> str:
    """The new text of an e-mail reply: everything before the first quoted line, "On ... wrote:",
    a forwarded header block or the signature separator; surrounding blank lines trimmed."""
    kept: list[str] = []
    for line in (text or "").replace("\r\n", "\n").split("\n"):
        if any(p.match(line) for p in _CUT):
            break
        kept.append(line.rstrip())
    return "\n".join(kept).strip()


def _tag(conversation_id: uuid.UUID) -> str:
    key = f"kefu-email-reply:{settings.SECRET_KEY}".encode()
    return hmac.new(key, conversation_id.hex.encode(), hashlib.sha256).hexdigest()[:20]


def reply_address(conversation_id: uuid.UUID) -> str | None:
    """The ``Reply-To`` of the conversation's e-mails: ``KEFU_EMAIL_REPLY_TO``'s local part
    ``+<conversation hex>.<tag>``; None when that setting is empty (replies by e-mail off)."""
    base = settings.KEFU_EMAIL_REPLY_TO
    if not base or "@" not in base:
        return None
    local, domain = base.rsplit("@", 1)
    return f"{local}+{conversation_id.hex}.{_tag(conversation_id)}@{domain}"


_TAGGED = re.compile(r"\+([0-9a-f]{32})\.([0-9a-f]{20})@", re.I)
_MESSAGE_ID = re.compile(r"<[^<>\s]+>")


def conversation_of(*, recipients: list[str], in_reply_to: str = "", references: str = "") -> uuid.UUID | None:
    """The conversation an inbound e-mail answers: a recipient with a valid tag
    (:func:`reply_address`), else an ``In-Reply-To`` / ``References`` id of an e-mail kefu sent.
    None when neither names one. Blocking (one query for the second way)."""
    for address in recipients:
        match = _TAGGED.search(address or "")
        if match:
            cid = uuid.UUID(match.group(1).lower())
            if hmac.compare_digest(_tag(cid), match.group(2).lower()):
                return cid
    ids = _MESSAGE_ID.findall(f"{in_reply_to} {references}")
    if ids:
        found = (
            OutgoingEmail.objects.filter(message_id__in=ids, conversation__isnull=False)
            .values_list("conversation_id", flat=True)
            .first()
        )
        if found is not None:
            return found
    return None
