"""E-mail kefu sends (docs/email.md): an agent's replies to a shopper who left, with a link that
resumes the conversation.

Every e-mail is first a row (:class:`~chat.models.OutgoingEmail`) with a unique ``key``, written
in the same transaction as what owes it (an agent's message: :func:`reply_owed`), so nothing is
owed twice and nothing is lost by a restart. Rows fall due (``due_at``); the sweep
(:func:`due_emails`, run by every process's sweeper, ``chat.sweeper``, and by Celery beat) claims
each due row (:func:`email_claim`: a conditional UPDATE to ``sending``, ``attempts`` + 1, a claim
that runs out after ``CLAIM_S``) and hands it to ``chat.tasks.send_email`` (Celery with retries
when ``REDIS_URL`` is set; run eagerly in the sweeper's worker thread otherwise), which calls
:func:`email_send`. Only the holder of the claim sends, so a row leaves once across retries and
workers; a claim left by a dead worker runs out and the row is claimed again.

A reply e-mail (``kind`` ``reply``) collects a burst: the agent messages written within
``KEFU_EMAIL_BURST_S`` (40 s) of the burst's first go in one e-mail, sent at the end of that
window, so within a minute of each (the sweep runs every ``KEFU_AGENT_SWEEP_S``, 5 s). It is sent
only when the shopper has had no socket open for ``KEFU_EMAIL_OFFLINE_S`` (30 s,
``chat.shopper_presence``), and carries only the messages written after the shopper was last
seen: what a live socket already showed is never e-mailed. While the shopper is connected the
row waits; once nothing is left unseen it is ``skipped``.

A refused send (the server's error, a timeout) is logged without the address, counted in
``kefu_emails_total{outcome="failed"}`` and on /ops/, and tried again after a back-off until
``KEFU_EMAIL_MAX_ATTEMPTS``; nothing on the answering path ever waits for or fails with it.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import smtplib
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import EmailMultiAlternatives
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from prometheus_client import Counter

from lib.logredact import redact

from . import inbound, presence, shopper_presence
from .errors import AccessDenied
from .identity import customer_token
from .models import Conversation, ConversationStatus, EmailKind, EmailState, Message, OutgoingEmail, ResumeCode, Role

log = logging.getLogger(__name__)

#: How long a claim on a row lasts (seconds): longer than an SMTP exchange (``EMAIL_TIMEOUT``, 20 s).
CLAIM_S = 60.0
#: While the shopper is connected a due reply is looked at again after this many seconds.
RECHECK_S = 5.0
#: A reply still unsent after this long (the shopper kept a tab open all along) is given up.
GIVE_UP_S = 24 * 3600.0

EMAILS = Counter("kefu_emails", "E-mails kefu sent or failed to send, by kind and outcome.", ["kind", "outcome"])


# --- owing an e-mail -----------------------------------------------------------------------------


def reply_owed(*, conversation_id: uuid.UUID, seq: int) -> OutgoingEmail:
    """Agent message ``seq`` of a conversation whose shopper left an address: add it to the
    conversation's open burst (its ``pending`` reply row, if any), or start a burst due in
    ``KEFU_EMAIL_BURST_S``. Call inside the transaction that stores the message (the
    conversation row is locked by ``next_seq``, so two messages never start two bursts)."""
    open_row = (
        OutgoingEmail.objects.filter(conversation_id=conversation_id, kind=EmailKind.REPLY, state=EmailState.PENDING)
        .order_by("-first_seq")
        .first()
    )
    if open_row is not None and open_row.attempts == 0:
        OutgoingEmail.objects.filter(pk=open_row.pk).update(last_seq=max(open_row.last_seq, seq))
        open_row.last_seq = max(open_row.last_seq, seq)
        return open_row
    return OutgoingEmail.objects.create(
        key=f"reply:{conversation_id.hex}:{seq}",
        kind=EmailKind.REPLY,
        conversation_id=conversation_id,
        first_seq=seq,
        last_seq=seq,
        due_at=timezone.now() + timedelta(seconds=settings.KEFU_EMAIL_BURST_S),
    )


def address_of(conversation: Conversation) -> str:
    """Where a conversation's e-mail goes: the address the shopper left, else the verified
    customer's; "" when neither."""
    return conversation.contact_email or conversation.customer_email


# --- the sweep and the claim -------------------------------------------------------------------


def due_emails(*, limit: int = 100) -> list[int]:
    """Ids of the rows to send now: ``pending`` and due, or ``sending`` with a claim that ran out
    (its worker died). Oldest first, at most ``limit``. Blocking."""
    now = timezone.now()
    return list(
        OutgoingEmail.objects.filter(
            Q(state=EmailState.PENDING, due_at__lte=now) | Q(state=EmailState.SENDING, claim_until__lt=now)
        )
        .order_by("due_at")
        .values_list("pk", flat=True)[:limit]
    )


def email_claim(email_id: int) -> int | None:
    """Claim row ``email_id`` for one attempt: returns the attempt's number (the claim's token,
    handed to :func:`email_send`), or None when someone else holds it or it is done. Blocking."""
    now = timezone.now()
    due = Q(state=EmailState.PENDING, due_at__lte=now) | Q(state=EmailState.SENDING, claim_until__lt=now)
    attempts = OutgoingEmail.objects.filter(due, pk=email_id).values_list("attempts", flat=True).first()
    if attempts is None:
        return None
    # Conditional on the attempts read: of two senders that read the same row, one update matches.
    won = OutgoingEmail.objects.filter(due, pk=email_id, attempts=attempts).update(
        state=EmailState.SENDING, attempts=attempts + 1, claim_until=now + timedelta(seconds=CLAIM_S)
    )
    return attempts + 1 if won else None


def _finish(email_id: int, attempt: int, **fields: Any) -> bool:
    return bool(OutgoingEmail.objects.filter(pk=email_id, state=EmailState.SENDING, attempts=attempt).update(**fields))


# --- sending ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What :func:`email_send` did: ``sent``, ``deferred`` (the shopper is connected: due again
    shortly), ``skipped`` (nothing left to send), ``retry`` (refused; tried again later),
    ``failed`` (refused ``KEFU_EMAIL_MAX_ATTEMPTS`` times) or ``lost`` (the claim was gone)."""

    outcome: str


def email_send(email_id: int, attempt: int) -> Outcome:
    """Send row ``email_id`` under claim ``attempt`` (from :func:`email_claim`). Never raises
    for a refused send (the row says what happened; module docstring); raises only what the
    database raises (the Celery task retries it). Blocking."""
    row = OutgoingEmail.objects.select_related("conversation").filter(pk=email_id).first()
    if row is None or row.state != EmailState.SENDING or row.attempts != attempt:
        return Outcome("lost")
    if row.kind == EmailKind.REPLY:
        built = _reply_message(row)
    elif row.kind == EmailKind.DIGEST:
        built = _digest_message(row)
    elif row.kind == EmailKind.TRANSCRIPT:
        built = _transcript_message(row)
    else:  # kinds without a builder yet: nothing to send
        built = None
    if isinstance(built, str):  # "deferred" or "skipped"
        if built == "deferred":
            _finish(
                email_id,
                attempt,
                state=EmailState.PENDING,
                attempts=attempt - 1,
                claim_until=None,
                due_at=timezone.now() + timedelta(seconds=RECHECK_S),
            )
        else:
            _finish(email_id, attempt, state=EmailState.SKIPPED, claim_until=None)
        return Outcome(built)
    if built is None:
        _finish(email_id, attempt, state=EmailState.SKIPPED, claim_until=None)
        return Outcome("skipped")
    try:
        built.send(fail_silently=False)
    except (smtplib.SMTPException, OSError, ValueError) as e:
        why = redact(f"{type(e).__name__}: {e}")[:300]
        EMAILS.labels(row.kind, "failed").inc()
        if attempt >= settings.KEFU_EMAIL_MAX_ATTEMPTS:
            log.error("e-mail %s (%s) refused, attempt %d, given up: %s", email_id, row.kind, attempt, why)
            _finish(email_id, attempt, state=EmailState.FAILED, claim_until=None, error=why)
            return Outcome("failed")
        backoff = min(3600.0, 30.0 * 2 ** (attempt - 1))
        log.warning(
            "e-mail %s (%s) refused, attempt %d, again in %.0f s: %s", email_id, row.kind, attempt, backoff, why
        )
        _finish(
            email_id,
            attempt,
            state=EmailState.PENDING,
            claim_until=None,
            error=why,
            due_at=timezone.now() + timedelta(seconds=backoff),
        )
        return Outcome("retry")
    EMAILS.labels(row.kind, "sent").inc()
    _finish(email_id, attempt, state=EmailState.SENT, claim_until=None, sent_at=timezone.now(), error="")
    log.info("e-mail %s (%s) sent", email_id, row.kind)
    return Outcome("sent")


# --- a reply e-mail -------------------------------------------------------------------------------

REPLY_TEXT = {
    "en": {
        "subject": "Your conversation with {store}",
        "intro": "{store} replied to your message:",
        "resume": "Continue the conversation here (the link works once, for {days} days):",
        "footer": "You left this address in the chat on our website so we could answer you.",
    },
    "zh": {
        "subject": "您与{store}的对话",
        "intro": "{store} 回复了您的消息：",
        "resume": "点击这里继续对话（链接仅可使用一次，{days} 天内有效）：",
        "footer": "您在我们网站的聊天窗口留下了此邮箱，以便我们回复您。",
    },
}


def texts_of(locale: str) -> dict[str, str]:
    """The reply e-mail's texts in ``locale`` (``en``, ``zh``; English for any other)."""
    return REPLY_TEXT.get((locale or "en").split("-")[0].lower(), REPLY_TEXT["en"])


def _domain() -> str:
    sender = settings.KEFU_EMAIL_FROM
    address = sender.rsplit("<", 1)[-1].rstrip(">").strip()
    return address.rsplit("@", 1)[-1] or "localhost"


def thread_id(conversation_id: uuid.UUID) -> str:
    """The ``Message-ID`` every e-mail of a conversation answers (``In-Reply-To``): one thread
    per conversation in the shopper's mail client."""
    return f"<kefu.conversation.{conversation_id.hex}@{_domain()}>"


def _reply_message(row: OutgoingEmail) -> EmailMultiAlternatives | str | None:
    conv = row.conversation
    assert conv is not None
    to = address_of(conv)
    if not to:
        return "skipped"
    seen = shopper_presence.last_seen([conv.pk]).get(conv.pk)
    now = timezone.now()
    if seen is not None and seen > now.timestamp() - settings.KEFU_EMAIL_OFFLINE_S:
        if now - row.created_at > timedelta(seconds=GIVE_UP_S):
            return "skipped"
        return "deferred"  # connected, or only just gone: look again shortly
    messages = Message.objects.filter(
        conversation_id=conv.pk, role=Role.AGENT, seq__gte=row.first_seq, seq__lte=row.last_seq
    ).order_by("seq")
    if seen is not None:  # what a live socket showed is not e-mailed
        messages = messages.filter(created_at__gt=datetime.fromtimestamp(seen, tz=timezone.get_current_timezone()))
    unseen = list(messages)
    if not unseen:
        return "skipped"
    t = texts_of(conv.locale)
    store = settings.KEFU_STORE_NAME
    days = max(1, round(settings.KEFU_RESUME_CODE_TTL_S / 86400))
    link = resume_link(resume_code_issue(conversation_id=conv.pk))
    lines = [t["intro"].format(store=store), ""]
    for msg in unseen:
        lines += [f"{msg.agent_name or store}:", msg.text, ""]
    lines += [t["resume"].format(days=days), link, "", "--", t["footer"]]
    root = thread_id(conv.pk)
    previous = list(
        OutgoingEmail.objects.filter(conversation_id=conv.pk, state=EmailState.SENT)
        .exclude(message_id="")
        .order_by("sent_at")
        .values_list("message_id", flat=True)
    )[-10:]
    message_id = row.message_id or f"<kefu.{row.pk}.{secrets.token_hex(6)}@{_domain()}>"
    if not row.message_id:
        OutgoingEmail.objects.filter(pk=row.pk).update(message_id=message_id)
    email = EmailMultiAlternatives(
        subject=t["subject"].format(store=store),
        body="\n".join(lines),
        from_email=settings.KEFU_EMAIL_FROM,
        to=[to],
        headers={
            "Message-ID": message_id,
            "In-Reply-To": previous[-1] if previous else root,
            "References": " ".join([root, *previous]),
            "Content-Language": "zh-Hans" if t is REPLY_TEXT["zh"] else "en",
            "Auto-Submitted": "auto-generated",
            "X-Kefu-Conversation": str(conv.pk),
        },
        reply_to=[reply_to] if (reply_to := inbound.reply_address(conv.pk)) else None,
    )
    return email


# --- a transcript on request ----------------------------------------------------------------------

TRANSCRIPT_TEXT = {
    "en": {"subject": "Your conversation with {store}: the transcript", "you": "You", "bot": "Assistant"},
    "zh": {"subject": "您与{store}的对话记录", "you": "您", "bot": "智能助手"},
}


def transcript_owed(*, conversation_id: uuid.UUID, email: str) -> bool:
    """The shopper asked for the transcript (``POST /api/chat/transcript``): save ``email``
    (validated by the caller) as the conversation's address and owe one transcript e-mail per
    state of the conversation (asking again with nothing new owes nothing). True when a new one is
    owed. Raises ``Conversation.DoesNotExist``. Blocking."""
    with transaction.atomic():
        last_seq = Conversation.objects.select_for_update().values_list("last_seq", flat=True).get(pk=conversation_id)
        Conversation.objects.filter(pk=conversation_id).update(contact_email=email, updated_at=timezone.now())
        _row, created = OutgoingEmail.objects.get_or_create(
            key=f"transcript:{conversation_id.hex}:{last_seq}",
            defaults={
                "kind": EmailKind.TRANSCRIPT,
                "conversation_id": conversation_id,
                "last_seq": last_seq,
                "due_at": timezone.now(),
            },
        )
    return created


def _transcript_message(row: OutgoingEmail) -> EmailMultiAlternatives | str:
    conv = row.conversation
    assert conv is not None
    to = address_of(conv)
    if not to:
        return "skipped"
    locale = (conv.locale or "en").split("-")[0]
    t = TRANSCRIPT_TEXT.get(locale, TRANSCRIPT_TEXT["en"])
    store = settings.KEFU_STORE_NAME
    zone = conv.time_zone or "UTC"
    try:
        tz: Any = ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        tz, zone = ZoneInfo("UTC"), "UTC"
    lines = [f"{t['subject'].format(store=store)} ({zone})", ""]
    rows = Message.objects.filter(conversation_id=conv.pk, seq__lte=row.last_seq, superseded=False).order_by("seq")
    for msg in rows:
        if not msg.text:
            continue
        names: dict[str, str] = {Role.SHOPPER: t["you"], Role.BOT: t["bot"], Role.AGENT: msg.agent_name or store}
        who = names.get(msg.role, store)
        lines += [f"[{msg.created_at.astimezone(tz):%Y-%m-%d %H:%M}] {who}:", msg.text, ""]
    return EmailMultiAlternatives(
        subject=t["subject"].format(store=store),
        body="\n".join(lines),
        from_email=settings.KEFU_EMAIL_FROM,
        to=[to],
        headers={
            "Message-ID": f"<kefu.{row.pk}.{secrets.token_hex(6)}@{_domain()}>",
            "In-Reply-To": thread_id(conv.pk),
            "References": thread_id(conv.pk),
            "Auto-Submitted": "auto-generated",
            "X-Kefu-Conversation": str(conv.pk),
        },
    )


# --- the agents' digest --------------------------------------------------------------------------


def _waiting_too_long(now: datetime) -> list[Conversation]:
    since = now - timedelta(seconds=settings.KEFU_DIGEST_AFTER_S)
    return list(
        Conversation.objects.filter(status=ConversationStatus.WAITING_AGENT, waiting_since__lte=since).order_by(
            "waiting_since"
        )[:50]
    )


def digest_owed(*, now: datetime | None = None) -> OutgoingEmail | None:
    """Owe the agents a digest when conversations have waited longer than
    ``KEFU_DIGEST_AFTER_S`` with no agent online: one row per interval of that length (its
    ``key`` names the interval), however many sweeps and processes ask. Returns the new row, or
    None (nothing waits too long, someone is online, the interval's digest exists, or the digest
    is off: 0). Blocking."""
    every = settings.KEFU_DIGEST_AFTER_S
    now = now or timezone.now()
    if every <= 0 or presence.agents_online() > 0 or not _waiting_too_long(now):
        return None
    interval = int(now.timestamp() // every)
    row, created = OutgoingEmail.objects.get_or_create(
        key=f"digest:{interval}", defaults={"kind": EmailKind.DIGEST, "due_at": now}
    )
    return row if created else None


def agent_addresses() -> list[str]:
    """E-mail addresses of the active agents (staff with ``chat.handle_conversations``, directly,
    by a group, or as superusers) who have one. Blocking."""
    has_perm = (
        Q(is_superuser=True)
        | Q(user_permissions__codename="handle_conversations", user_permissions__content_type__app_label="chat")
        | Q(groups__permissions__codename="handle_conversations", groups__permissions__content_type__app_label="chat")
    )
    users = get_user_model().objects.filter(has_perm, is_active=True, is_staff=True).exclude(email="")
    return sorted(set(users.values_list("email", flat=True)))


def _digest_message(row: OutgoingEmail) -> EmailMultiAlternatives | str:
    now = timezone.now()
    if presence.agents_online() > 0:
        return "skipped"  # someone came online meanwhile: they see the queue
    waiting = _waiting_too_long(now)
    to = agent_addresses()
    if not waiting or not to:
        return "skipped"
    lines = [
        f"{len(waiting)} conversation(s) waiting for a person, and no agent is online.",
        f"{len(waiting)} 个对话正在等待人工客服，目前没有客服在线。",
        "",
    ]
    for conv in waiting:
        minutes = int((now - conv.waiting_since).total_seconds() // 60) if conv.waiting_since else 0
        left = " · e-mail left / 已留邮箱" if conv.contact_email else ""
        lines.append(f"- {conv.pk} · {conv.locale} · waiting {minutes} min / 已等待 {minutes} 分钟{left}")
    lines += ["", "Console / 客服工作台: /console/"]
    return EmailMultiAlternatives(
        subject=f"[{settings.KEFU_STORE_NAME}] {len(waiting)} waiting / {len(waiting)} 个对话等待中",
        body="\n".join(lines),
        from_email=settings.KEFU_EMAIL_FROM,
        to=to,
        headers={"Auto-Submitted": "auto-generated", "Message-ID": f"<kefu.{row.key.replace(':', '.')}@{_domain()}>"},
    )


# --- resume codes --------------------------------------------------------------------------------


def _hash(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()


def resume_code_issue(*, conversation_id: uuid.UUID) -> str:
    """A new single-use code that resumes ``conversation_id`` for ``KEFU_RESUME_CODE_TTL_S``
    seconds (:func:`resume_exchange`); only its hash is stored. Blocking."""
    code = secrets.token_urlsafe(24)
    ResumeCode.objects.create(
        code_hash=_hash(code),
        conversation_id=conversation_id,
        expires_at=timezone.now() + timedelta(seconds=settings.KEFU_RESUME_CODE_TTL_S),
    )
    return code


def resume_link(code: str) -> str:
    """``KEFU_RESUME_URL`` with ``#kefu-resume=CODE``: the widget on that page exchanges it. In
    the fragment, so the store's server and its logs never see the code."""
    return f"{settings.KEFU_RESUME_URL.split('#', 1)[0]}#kefu-resume={code}"


def resume_exchange(code: object) -> tuple[Conversation, str]:
    """Spend resume ``code``: its conversation and a token that opens it (``hello``'s ``token``).
    An anonymous conversation gets a new token (only a token's hash is kept, so the old one
    cannot be handed out; it stops working); a verified customer's, its customer token. Raises
    ``AccessDenied`` when the code is unknown, spent or expired (the same answer for all three).
    Blocking."""
    if not isinstance(code, str) or not 8 <= len(code) <= 100:
        raise AccessDenied("unknown, used or expired code")
    now = timezone.now()
    with transaction.atomic():
        spent = ResumeCode.objects.filter(code_hash=_hash(code), used_at__isnull=True, expires_at__gt=now).update(
            used_at=now
        )
        if not spent:
            raise AccessDenied("unknown, used or expired code")
        conv = Conversation.objects.select_for_update().get(
            pk=ResumeCode.objects.filter(code_hash=_hash(code)).values_list("conversation_id", flat=True).get()
        )
        if conv.customer_id:
            return conv, customer_token(conv.pk)
        token = secrets.token_urlsafe(32)
        # Stored as chat.services.conversations stores a token: its SHA-256.
        Conversation.objects.filter(pk=conv.pk).update(token_hash=_hash(token))
    return conv, token


def email_counts(*, start: datetime, end: datetime) -> dict[str, int]:
    """For ops: of the e-mail rows created in [start, end), ``sent``, ``refused`` (the server
    refused their last attempt: waiting to be tried again, or given up) and ``given_up``
    (refused ``KEFU_EMAIL_MAX_ATTEMPTS`` times). Blocking."""
    rows = OutgoingEmail.objects.filter(created_at__gte=start, created_at__lt=end)
    return {
        "sent": rows.filter(state=EmailState.SENT).count(),
        "refused": rows.exclude(state=EmailState.SENT).exclude(error="").count(),
        "given_up": rows.filter(state=EmailState.FAILED).count(),
    }
