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
from typing import Any

from django.contrib.auth import get_user_model
from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.db.models import Q as models_Q
from django.utils import timezone

from routing import services as router
from routing.types import AnswerRecord

from .errors import AccessDenied, AgentHolds, InvalidFeedback, NotAgent, NotCached, NotFound, NotOwner
from .models import Conversation, ConversationStatus, InternalNote, Message, MessageState, Role
from .selectors import user_is_agent


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
    pk = Conversation._meta.pk.get_db_prep_value(conversation_id, connection)
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


def _claim_if_none_older(conversation_id: uuid.UUID, *, answered_seq: int, seq: int) -> bool:
    """Inside ``message_receive``'s transaction: claim ``seq`` for answering (``answered_seq =
    seq``) unless an older shopper message (after ``answered_seq``) still waits; True if claimed.
    One statement in SQL, not an EXISTS then an UPDATE through the ORM: this is on the path to
    the first token of every message, and building the two ORM queries cost more than running
    them (profiled)."""
    conv = connection.ops.quote_name(Conversation._meta.db_table)
    msg = connection.ops.quote_name(Message._meta.db_table)
    pk = Conversation._meta.pk.get_db_prep_value(conversation_id, connection)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {conv} SET answered_seq = %s WHERE id = %s AND NOT EXISTS ("
            f"SELECT 1 FROM {msg} WHERE conversation_id = %s AND role = %s AND seq > %s AND seq < %s)",
            [seq, pk, pk, Role.SHOPPER.value, answered_seq, seq],
        )
        return cursor.rowcount == 1


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
            if claim and _claim_if_none_older(conversation_id, answered_seq=answered_seq, seq=seq):
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


def bot_message_begin(*, conversation_id: uuid.UUID, reply_to_seq: int, route: str) -> tuple[Message, int]:
    """Create the row of a bot answer that is about to stream (state ``streaming``, empty text).

    Returns the row and the conversation's ``owner_epoch`` read under the same row lock: the
    fencing epoch the stream runs under (see ``chat.fencing``). Raises ``AgentHolds`` (and writes
    nothing) when an agent holds the conversation, so a take-over that committed before this
    point is never followed by a bot answer.
    """
    with transaction.atomic():
        seq = _next_seq(conversation_id)[0]
        status, epoch = Conversation.objects.filter(pk=conversation_id).values_list("status", "owner_epoch").get()
        if status == ConversationStatus.AGENT:
            transaction.set_rollback(True)
            raise AgentHolds(str(conversation_id))
        msg = Message.objects.create(
            conversation_id=conversation_id,
            seq=seq,
            role=Role.BOT,
            route=route,
            state=MessageState.STREAMING,
            reply_to_seq=reply_to_seq,
        )
    return msg, int(epoch)


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
        cache_entry_id=record.cache_entry_id,
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

    Raises ``InvalidFeedback`` for a bad rating or a message that is not a bot message of this
    conversation.
    """
    if rating not in ("up", "down"):
        raise InvalidFeedback("rating must be 'up' or 'down'")
    if not isinstance(message_id, int) or isinstance(message_id, bool):
        raise InvalidFeedback("message_id must be an integer")
    updated = Message.objects.filter(pk=message_id, conversation_id=conversation_id, role=Role.BOT).update(
        rating=rating
    )
    if not updated:
        raise InvalidFeedback("no such bot message in this conversation")


# --- Agent console (docs/console.md) -------------------------------------------------------------


def agent_display_name(user: Any) -> str:
    """What shoppers and other agents see of an agent: full name, else first name, else username."""
    return (user.get_full_name() or getattr(user, "first_name", "") or user.get_username())[:150]


@dataclass(frozen=True)
class OwnerChange:
    """Result of a take-over / hand-back / close. ``changed`` is False when this call did not
    change the owner (someone else won the take-over, or nothing to do); ``status``, ``agent``
    (display name, "" for none), ``agent_id`` and ``epoch`` are the conversation's state as of
    the end of the call, read in the same transaction."""

    conversation_id: uuid.UUID
    changed: bool
    status: str
    agent: str
    agent_id: int | None
    epoch: int


def _owner_state(conversation_id: uuid.UUID, changed: bool) -> OwnerChange:
    row = (
        Conversation.objects.filter(pk=conversation_id)
        .values("status", "agent_name", "agent_id", "owner_epoch")
        .first()
    )
    if row is None:
        raise NotFound(str(conversation_id))
    return OwnerChange(
        conversation_id, changed, row["status"], row["agent_name"], row["agent_id"], int(row["owner_epoch"])
    )


def conversation_take_over(*, conversation_id: uuid.UUID, agent: Any) -> OwnerChange:
    """``agent`` (a user) takes the conversation: status ``agent``, ``owner_epoch`` + 1.

    The guard is one conditional UPDATE (``... WHERE status <> 'agent'``): of two agents taking
    over at the same moment, exactly one row update succeeds (PostgreSQL row lock, SQLite write
    lock); the other gets ``changed=False`` with the winner's name in ``agent``. Taking over a
    conversation one already holds is a no-op (``changed=False``, ``agent_id`` = own id).
    Raises ``NotFound``.
    """
    name = agent_display_name(agent)
    with transaction.atomic():
        won = (
            Conversation.objects.filter(pk=conversation_id)
            .exclude(status=ConversationStatus.AGENT)
            .update(
                status=ConversationStatus.AGENT,
                agent=agent,
                agent_name=name,
                owner_epoch=F("owner_epoch") + 1,
                waiting_since=None,
                updated_at=timezone.now(),
            )
        )
        return _owner_state(conversation_id, bool(won))


def conversation_hand_back(*, conversation_id: uuid.UUID, agent: Any) -> OwnerChange:
    """The holding agent gives the conversation back to the bot (status ``bot``, epoch + 1).
    Raises ``NotOwner`` when ``agent`` does not hold it, ``NotFound``."""
    with transaction.atomic():
        done = Conversation.objects.filter(pk=conversation_id, status=ConversationStatus.AGENT, agent=agent).update(
            status=ConversationStatus.BOT,
            agent=None,
            agent_name="",
            owner_epoch=F("owner_epoch") + 1,
            updated_at=timezone.now(),
        )
        state = _owner_state(conversation_id, bool(done))
    if not done:
        raise NotOwner(owner=state.agent if state.status == ConversationStatus.AGENT else "", status=state.status)
    return state


def conversation_close(*, conversation_id: uuid.UUID, agent: Any) -> OwnerChange:
    """Close a conversation (status ``closed``, epoch + 1; a later shopper message reopens it).

    Allowed to the agent holding it, and to any agent when no agent holds it (e.g. a waiting
    conversation the shopper left). Closing a closed conversation is a no-op (``changed=False``).
    Raises ``NotOwner`` when another agent holds it, ``NotFound``.
    """
    with transaction.atomic():
        done = (
            Conversation.objects.filter(pk=conversation_id)
            .exclude(status=ConversationStatus.CLOSED)
            .filter(~models_Q(status=ConversationStatus.AGENT) | models_Q(agent=agent))
            .update(
                status=ConversationStatus.CLOSED,
                agent=None,
                agent_name="",
                waiting_since=None,
                owner_epoch=F("owner_epoch") + 1,
                updated_at=timezone.now(),
            )
        )
        state = _owner_state(conversation_id, bool(done))
    if not done and state.status == ConversationStatus.AGENT:
        raise NotOwner(owner=state.agent, status=state.status)
    return state


def agent_message_send(*, conversation_id: uuid.UUID, agent: Any, text: str, client_id: str | None = None) -> Received:
    """Store a message of the agent who holds the conversation (role ``agent``, their display
    name), exactly once per (conversation, ``client_id``) when the console sends one: a resend
    (after a reconnect) returns the stored row with ``created=False`` and stores nothing, even if
    the agent no longer holds the conversation. Raises ``NotOwner`` when ``agent`` does not hold
    it, ``NotFound``. ``text`` must be validated by the caller (not blank, within
    ``KEFU_MAX_MESSAGE_CHARS``)."""
    if client_id is not None:
        known = Message.objects.filter(conversation_id=conversation_id, client_id=client_id, role=Role.AGENT).first()
        if known is not None:
            return Received(known, created=False, reopened=False)
    try:
        with transaction.atomic():
            try:
                seq, _answered, status, _locale = _next_seq(conversation_id)
            except Conversation.DoesNotExist:
                raise NotFound(str(conversation_id)) from None
            owner = Conversation.objects.filter(pk=conversation_id).values_list("agent_id", "agent_name").get()
            if status != ConversationStatus.AGENT or owner[0] != agent.pk:
                transaction.set_rollback(True)
                raise NotOwner(owner=owner[1] if status == ConversationStatus.AGENT else "", status=status)
            msg = Message.objects.create(
                conversation_id=conversation_id,
                seq=seq,
                role=Role.AGENT,
                text=text,
                agent_name=owner[1],
                client_id=client_id,
            )
    except IntegrityError:
        # The same client_id raced in through another socket or worker a moment ago.
        return Received(Message.objects.get(conversation_id=conversation_id, client_id=client_id), False, False)
    return Received(msg, created=True, reopened=False)


@dataclass(frozen=True)
class Escalation:
    """Result of ``conversation_escalate``: ``entered`` is True when the conversation entered
    the queue with this call (it was not waiting before); ``notice`` is the system message
    stored for the shopper when no agent was online (None otherwise)."""

    entered: bool
    status: str
    packet: dict[str, Any]
    waiting_since: Any
    notice: Message | None


def conversation_escalate(
    *, conversation_id: uuid.UUID, reason: str, packet: dict[str, Any], no_agent_notice: str | None
) -> Escalation:
    """Put the conversation in the agents' queue (status ``waiting_agent``) with its escalation
    packet (``chat.handoff.build_packet``). The owner stays the bot, so ``owner_epoch`` is not
    bumped. An agent-held or closed conversation is left as it is (``entered=False``).

    When it newly enters the queue and ``no_agent_notice`` is given (no agent online), that text
    is stored as a ``system`` message for the shopper. Already waiting: only the packet is updated.
    """
    with transaction.atomic():
        now = timezone.now()
        entered = bool(
            Conversation.objects.filter(pk=conversation_id, status=ConversationStatus.BOT).update(
                status=ConversationStatus.WAITING_AGENT,
                waiting_since=now,
                handoff_reason=reason[:200],
                handoff_packet=packet,
                updated_at=now,
            )
        )
        if not entered:
            Conversation.objects.filter(pk=conversation_id, status=ConversationStatus.WAITING_AGENT).update(
                handoff_reason=reason[:200], handoff_packet=packet
            )
        notice = None
        if entered and no_agent_notice:
            seq = _next_seq(conversation_id)[0]
            notice = Message.objects.create(
                conversation_id=conversation_id, seq=seq, role=Role.SYSTEM, text=no_agent_notice
            )
        status, waiting_since = (
            Conversation.objects.filter(pk=conversation_id).values_list("status", "waiting_since").get()
        )
    return Escalation(entered=entered, status=status, packet=packet, waiting_since=waiting_since, notice=notice)


def note_add(*, conversation_id: uuid.UUID, author: Any, text: str) -> InternalNote:
    """Store an internal note (agents only; never sent to the shopper). Raises ``NotFound``."""
    if not Conversation.objects.filter(pk=conversation_id).exists():
        raise NotFound(str(conversation_id))
    return InternalNote.objects.create(
        conversation_id=conversation_id, author=author, author_name=agent_display_name(author), text=text
    )


@dataclass(frozen=True)
class CacheWrongResult:
    """Result of ``cache_answer_mark_wrong``: the bot message, the cached entry it was served
    from, and whether this call evicted it (``False``: the entry was already gone, e.g. another
    agent marked it first, it expired or was purged; nothing was recorded then)."""

    message_id: int
    entry_id: int
    evicted: bool


def cache_answer_mark_wrong(*, conversation_id: uuid.UUID, message_id: int, agent: Any) -> CacheWrongResult:
    """An agent says the cached answer of bot message ``message_id`` was wrong: evict the cached
    entry it was served from and record the mark (``routing.services.cached_answer_mark_wrong``:
    an ``agent_wrong`` audit, a false hit in the measured rate).

    Any agent may do this, not only the one holding the conversation: the agent is re-read from
    the database (a permission taken away since the socket opened counts). The audit row's
    ``message_id`` is the *shopper* message the cached answer was served for (the convention of
    ``CacheAudit.message_id``, as for sampled audits), or None when it cannot be found.

    Raises ``NotAgent``, ``NotFound`` (no such conversation, or no such message in it) and
    ``NotCached`` (not a bot message served from the cache).
    """
    agent_pk = getattr(agent, "pk", None)
    fresh = get_user_model().objects.filter(pk=agent_pk).first() if agent_pk is not None else None
    if fresh is None or not user_is_agent(fresh):
        raise NotAgent(str(getattr(agent, "pk", None)))
    if not Conversation.objects.filter(pk=conversation_id).exists():
        raise NotFound("no such conversation")
    msg = (
        Message.objects.filter(pk=message_id, conversation_id=conversation_id)
        .values("role", "route", "cache_entry_id", "reply_to_seq")
        .first()
    )
    if msg is None:
        raise NotFound("no such message in this conversation")
    if msg["role"] != Role.BOT or not str(msg["route"]).startswith("cache.") or msg["cache_entry_id"] is None:
        raise NotCached(str(message_id))
    question_id = None
    if msg["reply_to_seq"] is not None:
        question_id = (
            Message.objects.filter(conversation_id=conversation_id, seq=msg["reply_to_seq"], role=Role.SHOPPER)
            .values_list("pk", flat=True)
            .first()
        )
    entry_id = int(msg["cache_entry_id"])
    evicted = router.cached_answer_mark_wrong(entry_id=entry_id, by=fresh.get_username(), message_id=question_id)
    return CacheWrongResult(message_id=message_id, entry_id=entry_id, evicted=evicted)
