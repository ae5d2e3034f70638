"""Writes to conversations and messages. Every user-facing write goes through a function here;
each returns what the caller must publish (frames), and the caller publishes only after the
function returned, i.e. after its transaction committed.

All functions are synchronous (the ORM); async callers wrap them in ``database_sync_to_async``.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from dataclasses import dataclass
from decimal import Decimal

from django.db import IntegrityError, connection, transaction
from django.utils import timezone
from django.db.models import F

from .models import Conversation, ConversationStatus, Message, MessageState, Role


class AccessDenied(Exception):
    """The conversation does not exist or the token is not its token (close code 4403)."""


def _hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def conversation_start(*, locale: str = "en") -> tuple[Conversation, str]:
    """Create a conversation; returns it and the shopper's bearer token (shown once, stored hashed)."""
    token = secrets.token_urlsafe(32)
    conv = Conversation.objects.create(token_hash=_hash_token(token), locale=locale if locale in ("en", "zh") else "en")
    return conv, token


def conversation_authenticate(*, conversation_id: uuid.UUID, token: object) -> Conversation:
    """The conversation whose id and token match. Raises ``AccessDenied`` otherwise (constant-time compare)."""
    if not isinstance(token, str) or not token:
        raise AccessDenied("missing token")
    conv = Conversation.objects.filter(pk=conversation_id).first()
    if conv is None or not hmac.compare_digest(conv.token_hash, _hash_token(token)):
        raise AccessDenied("unknown conversation or wrong token")
    return conv


def _next_seq(conversation_id: uuid.UUID) -> tuple[int, int, str, str]:
    """Allocate the next seq of a conversation; returns ``(seq, answered_seq, status, locale)``.

    Must run inside a transaction: the UPDATE takes the row lock (PostgreSQL) or the database
    write lock (SQLite, IMMEDIATE transactions), so two workers never hand out the same seq.
    One statement (``UPDATE ... RETURNING``, SQLite >= 3.35, PostgreSQL) instead of an UPDATE
    and a SELECT: this runs on every chat message, on the path to the first token.
    Raises ``Conversation.DoesNotExist`` for an unknown conversation.
    """
    table = connection.ops.quote_name(Conversation._meta.db_table)
    pk = Conversation._meta.pk.get_db_prep_value(conversation_id, connection)  # type: ignore[union-attr]
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET last_seq = last_seq + 1, updated_at = %s WHERE id = %s "
            "RETURNING last_seq, answered_seq, status, locale",
            [timezone.now(), pk],
        )
        row = cursor.fetchone()
    if row is None:
        raise Conversation.DoesNotExist(conversation_id)
    return int(row[0]), int(row[1]), str(row[2]), str(row[3])


@dataclass(frozen=True)
class Received:
    """Result of ``message_receive``: the stored shopper message, whether it is new (False for a
    resend of a known ``client_id``), whether a closed conversation reopened, and, when the
    caller asked to claim it and nothing older was waiting, the conversation (status and locale
    as of the write) for answering it at once."""

    message: Message
    created: bool
    reopened: bool
    claimed: Conversation | None = None


def message_receive(*, conversation_id: uuid.UUID, client_id: str, text: str, claim: bool = False) -> Received:
    """Store a shopper message, exactly once per (conversation, client_id).

    A resend of a known ``client_id`` returns the original row with ``created=False`` and stores
    nothing. A message to a closed conversation reopens it (status ``bot``). With ``claim=True``
    the message is also claimed for answering in the same transaction (the compare-and-set of
    ``answer_claim``), provided no older shopper message is still unclaimed.
    """
    try:
        with transaction.atomic():
            seq, answered_seq, status, locale = _next_seq(conversation_id)
            msg = Message.objects.create(
                conversation_id=conversation_id, seq=seq, role=Role.SHOPPER, text=text, client_id=client_id
            )
            reopened = status == ConversationStatus.CLOSED
            if reopened:
                Conversation.objects.filter(pk=conversation_id).update(status=ConversationStatus.BOT, agent_name="")
                status = ConversationStatus.BOT
            claimed = None
            if claim:
                older_waiting = Message.objects.filter(
                    conversation_id=conversation_id, role=Role.SHOPPER, seq__gt=answered_seq, seq__lt=seq
                ).exists()
                if not older_waiting:
                    Conversation.objects.filter(pk=conversation_id).update(answered_seq=seq)
                    claimed = Conversation(id=conversation_id, status=status, locale=locale, answered_seq=seq, last_seq=seq)
    except IntegrityError:
        # A resend of a known client_id (possibly racing in through another socket or worker).
        return Received(Message.objects.get(conversation_id=conversation_id, client_id=client_id), False, False)
    return Received(msg, created=True, reopened=reopened, claimed=claimed)


def answer_claim(*, conversation_id: uuid.UUID) -> tuple[Message, Conversation] | None:
    """Claim the oldest shopper message the bot has not answered yet, or None when there is none.

    The claim is a compare-and-set on ``Conversation.answered_seq``, so two answering loops (in
    two workers) never answer the same message.
    """
    while True:
        conv = Conversation.objects.filter(pk=conversation_id).first()
        if conv is None:
            return None
        msg = (
            Message.objects.filter(conversation_id=conversation_id, role=Role.SHOPPER, seq__gt=conv.answered_seq)
            .order_by("seq")
            .first()
        )
        if msg is None:
            return None
        won = Conversation.objects.filter(pk=conversation_id, answered_seq=conv.answered_seq).update(
            answered_seq=msg.seq
        )
        if won:
            conv.answered_seq = msg.seq
            return msg, conv


def bot_message_begin(*, conversation_id: uuid.UUID, reply_to_seq: int, route: str) -> Message:
    """Create the row of a bot answer that is about to stream (state ``streaming``, empty text)."""
    with transaction.atomic():
        seq = _next_seq(conversation_id)[0]
        return Message.objects.create(
            conversation_id=conversation_id,
            seq=seq,
            role=Role.BOT,
            route=route,
            state=MessageState.STREAMING,
            reply_to_seq=reply_to_seq,
        )


@dataclass(frozen=True)
class AnswerRecord:
    """How a bot answer ended: text as streamed, route, model, usage (tokens), cost and saving in
    USD, ``ttft_ms``/``latency_ms`` from the shopper's message being stored, ``cut`` when it
    stopped before its end."""

    text: str
    route: str
    model: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: Decimal = Decimal("0")
    saved_usd: Decimal = Decimal("0")
    ttft_ms: float | None = None
    latency_ms: float | None = None
    estimated: bool = False
    cut: bool = False
    faq_entry_id: int | None = None


def bot_message_finish(*, message_id: int, record: AnswerRecord) -> Message:
    """Store the end of a bot answer: the whole text and how it was made (state ``done``)."""
    Message.objects.filter(pk=message_id).update(
        text=record.text,
        route=record.route,
        model=record.model,
        prompt_tokens=record.prompt_tokens,
        completion_tokens=record.completion_tokens,
        cost_usd=record.cost_usd,
        saved_usd=record.saved_usd,
        ttft_ms=record.ttft_ms,
        latency_ms=record.latency_ms,
        usage_estimated=record.estimated,
        cut=record.cut,
        faq_entry_id=record.faq_entry_id,
        state=MessageState.DONE,
    )
    return Message.objects.get(pk=message_id)


def conversation_set_status(*, conversation_id: uuid.UUID, status: str, reason: str = "") -> bool:
    """Set a conversation's status; returns True when it changed. Bumps the fencing counter."""
    with transaction.atomic():
        changed = (
            Conversation.objects.filter(pk=conversation_id)
            .exclude(status=status)
            .update(status=status, owner_epoch=F("owner_epoch") + 1, handoff_reason=reason[:200])
        )
    return bool(changed)


def feedback_record(*, conversation_id: uuid.UUID, message_id: object, rating: object) -> None:
    """Store a shopper's rating (``up``/``down``) of a bot message of their own conversation.

    Raises ``ValueError`` for a bad rating or a message that is not a bot message of this conversation.
    """
    if rating not in ("up", "down"):
        raise ValueError("rating must be 'up' or 'down'")
    if not isinstance(message_id, int) or isinstance(message_id, bool):
        raise ValueError("message_id must be an integer")
    updated = Message.objects.filter(pk=message_id, conversation_id=conversation_id, role=Role.BOT).update(rating=rating)
    if not updated:
        raise ValueError("no such bot message in this conversation")
