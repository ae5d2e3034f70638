"""Writes of the agent console (docs/console.md): take over, hand back, close, an agent's message,
internal notes, and marking a cached answer wrong.

All functions are synchronous (the ORM); async callers wrap them in ``database_sync_to_async``.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import Case, F, Value, When
from django.db.models import Q as models_Q
from django.utils import timezone

from lib.search_terms import index_terms
from routing import services as router

from .. import mail, presence
from ..errors import NotAgent, NotCached, NotFound, NotOwner
from ..models import AgentState, Conversation, ConversationStatus, InternalNote, Message, Role
from ..selectors import user_is_agent
from .attachments import attachments_link, attachments_take
from .conversations import next_seq
from .messages import Received

log = logging.getLogger(__name__)


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


@dataclass(frozen=True)
class HandBack:
    """Result of ``conversation_hand_back``: the owner change, the conversation as the bot takes it
    back (status ``bot``, its locale), and ``unanswered``: the shopper's messages after the last
    agent or bot message (oldest first, none when the agent answered everything), which the bot
    answers next, as one question."""

    change: OwnerChange
    conversation: Conversation
    unanswered: tuple[Message, ...]


def unanswered_by_anyone(conversation_id: uuid.UUID) -> list[Message]:
    """The shopper messages after the conversation's last agent message or whole bot answer,
    oldest first (a bot answer cut short, by a take-over or a failure, answered nothing)."""
    last_reply = (
        Message.objects.filter(conversation_id=conversation_id)
        .filter(models_Q(role=Role.AGENT) | models_Q(role=Role.BOT, cut=False))
        .order_by("-seq")
        .values_list("seq", flat=True)
        .first()
    )
    return list(
        Message.objects.filter(conversation_id=conversation_id, role=Role.SHOPPER, seq__gt=last_reply or 0).order_by(
            "seq"
        )
    )


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
    """``agent`` (a user) takes the conversation: status ``agent``, ``owner_epoch`` + 1, and
    ``agent`` is its assignee (``chat.assignment``).

    The guard is one conditional UPDATE (``... WHERE status <> 'agent'``): of two agents taking
    over at the same moment, exactly one row update succeeds (PostgreSQL row lock, SQLite write
    lock); the other gets ``changed=False`` with the winner's name in ``agent``. Taking over a
    conversation one already holds is a no-op (``changed=False``, ``agent_id`` = own id).
    Raises ``NotFound``.
    """
    name = agent_display_name(agent)
    now = timezone.now()
    AgentState.objects.bulk_create([AgentState(agent_id=agent.pk)], ignore_conflicts=True)
    with transaction.atomic():
        # The taker's assignment row first, as auto-assignment locks it (chat.assignment): its
        # count of the agent's open conversations then includes this one.
        list(AgentState.objects.select_for_update().filter(agent_id=agent.pk).values_list("pk"))
        won = (
            Conversation.objects.filter(pk=conversation_id)
            .exclude(status=ConversationStatus.AGENT)
            .update(
                status=ConversationStatus.AGENT,
                agent=agent,
                agent_name=name,
                # The taker owns it now (issue 32: a take-over assigns).
                assignee=agent,
                assignee_name=name,
                owner_epoch=F("owner_epoch") + 1,
                # The wait it had (SQL reads every SET's right side before the row changes).
                queue_waited_from=Case(
                    When(status=ConversationStatus.WAITING_AGENT, then=F("waiting_since")),
                    default=F("queue_waited_from"),
                ),
                waiting_since=None,
                # Taken from the queue: counts in the take-over rate that estimates waits.
                queue_taken_at=Case(
                    When(status=ConversationStatus.WAITING_AGENT, then=Value(now)), default=F("queue_taken_at")
                ),
                updated_at=now,
            )
        )
        return _owner_state(conversation_id, bool(won))


def conversation_hand_back(*, conversation_id: uuid.UUID, agent: Any) -> HandBack:
    """The holding agent gives the conversation back to the bot (status ``bot``, epoch + 1), with
    what the shopper sent since anyone last replied (read in the same transaction, so a message
    stored after the hand-back is answered on its own, never twice). Raises ``NotOwner`` when
    ``agent`` does not hold it, ``NotFound``."""
    with transaction.atomic():
        done = Conversation.objects.filter(pk=conversation_id, status=ConversationStatus.AGENT, agent=agent).update(
            status=ConversationStatus.BOT,
            agent=None,
            agent_name="",
            owner_epoch=F("owner_epoch") + 1,
            updated_at=timezone.now(),
        )
        state = _owner_state(conversation_id, bool(done))
        unanswered = tuple(unanswered_by_anyone(conversation_id)) if done else ()
        conv = Conversation.objects.get(pk=conversation_id) if done else None
    if not done or conv is None:
        raise NotOwner(owner=state.agent if state.status == ConversationStatus.AGENT else "", status=state.status)
    return HandBack(change=state, conversation=conv, unanswered=unanswered)


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


def agent_message_send(
    *,
    conversation_id: uuid.UUID,
    agent: Any,
    text: str,
    client_id: str | None = None,
    attachments: list[str] | None = None,
    cards: list[dict[str, Any]] | None = None,
) -> Received:
    """Store a message of the agent who holds the conversation (role ``agent``, their display
    name), exactly once per (conversation, ``client_id``) when the console sends one: a resend
    (after a reconnect) returns the stored row with ``created=False`` and stores nothing, even if
    the agent no longer holds the conversation. Raises ``NotOwner`` when ``agent`` does not hold
    it, ``NotFound``. ``text`` must be validated by the caller (not blank, within
    ``KEFU_MAX_MESSAGE_CHARS``; it may be empty when ``attachments`` names files). ``attachments``:
    ids of files agents uploaded to this conversation and sent with no other message; any other
    raises ``AttachmentRefused`` and nothing is stored. ``cards``: product cards the agent
    inserted (``chat.selectors.product_cards``), stored with the message (issue 36)."""
    if client_id is not None:
        known = Message.objects.filter(conversation_id=conversation_id, client_id=client_id, role=Role.AGENT).first()
        if known is not None:
            return Received(known, created=False, reopened=False)
    try:
        with transaction.atomic():
            try:
                seq, _answered, status = next_seq(conversation_id)[:3]
            except Conversation.DoesNotExist:
                raise NotFound(str(conversation_id)) from None
            owner = (
                Conversation.objects.filter(pk=conversation_id)
                .values_list("agent_id", "agent_name", "contact_email", "customer_email")
                .get()
            )
            if status != ConversationStatus.AGENT or owner[0] != agent.pk:
                transaction.set_rollback(True)
                raise NotOwner(owner=owner[1] if status == ConversationStatus.AGENT else "", status=status)
            files = (
                attachments_take(conversation_id=conversation_id, ids=attachments, role=Role.AGENT)
                if attachments
                else []
            )
            msg = Message.objects.create(
                conversation_id=conversation_id,
                seq=seq,
                role=Role.AGENT,
                text=text,
                search_terms=index_terms(text),
                agent_name=owner[1],
                client_id=client_id,
                attachments=files,
                cards=cards or [],
            )
            if files:
                attachments_link(ids=[f["id"] for f in files], message_id=msg.pk)
            if owner[2] or owner[3]:  # the shopper left an address: e-mailed if they are gone (chat.mail)
                mail.reply_owed(conversation_id=conversation_id, seq=seq)
    except IntegrityError:
        # The same client_id raced in through another socket or worker a moment ago.
        return Received(Message.objects.get(conversation_id=conversation_id, client_id=client_id), False, False)
    return Received(msg, created=True, reopened=False)


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


def conversations_of_gone_agents(*, action: str) -> list[tuple[HandBack, Message]]:
    """Give back every conversation held by an agent with no live lease (``chat.presence``):
    ``action`` ``queue`` puts it in the agents' queue (status ``waiting_agent``, the bot helps
    meanwhile), ``bot`` gives it to the bot. Each release bumps ``owner_epoch`` and stores the
    shopper's system notice (``presence.gone_notice``), in one transaction per conversation.

    Returns ``(hand-back, notice)`` for each conversation released by this call; the hand-back
    carries what the shopper sent since anyone last replied. A conditional UPDATE (still held by
    that agent) makes the release happen once however many processes sweep. Raises
    ``ValueError`` for an unknown ``action``."""
    if action not in ("queue", "bot"):
        raise ValueError(f"action must be 'queue' or 'bot', not {action!r}")
    held = list(
        Conversation.objects.filter(status=ConversationStatus.AGENT, agent__isnull=False).values_list(
            "pk", "agent_id", "agent_name", "locale"
        )
    )
    if not held:
        return []
    gone = presence.gone_agents(sorted({agent_id for _, agent_id, _, _ in held}))
    released: list[tuple[HandBack, Message]] = []
    for conversation_id, agent_id, agent_name, locale in held:
        if agent_id not in gone:
            continue
        queue = action == "queue"
        with transaction.atomic():
            now = timezone.now()
            done = Conversation.objects.filter(
                pk=conversation_id, status=ConversationStatus.AGENT, agent_id=agent_id
            ).update(
                status=ConversationStatus.WAITING_AGENT if queue else ConversationStatus.BOT,
                agent=None,
                agent_name="",
                owner_epoch=F("owner_epoch") + 1,
                waiting_since=now if queue else None,
                handoff_reason=f"{agent_name} left the conversation"[:200] if queue else "",
                updated_at=now,
            )
            if not done:
                continue  # taken over, handed back or released meanwhile
            state = _owner_state(conversation_id, True)
            unanswered = tuple(unanswered_by_anyone(conversation_id))
            notice = Message.objects.create(
                conversation_id=conversation_id,
                seq=next_seq(conversation_id)[0],
                role=Role.SYSTEM,
                text=presence.gone_notice(agent=agent_name, action=action, locale=locale),
            )
            conversation = Conversation.objects.get(pk=conversation_id)
        released.append((HandBack(change=state, conversation=conversation, unanswered=unanswered), notice))
    return released


def conversation_task_clear(*, conversation_id: uuid.UUID, by: str) -> bool:
    """An agent (``by``: their display name, for the log) clears the conversation's task and any
    change the bot offered in it (``routing.services.conversation_task_clear``); whether there
    was one."""
    cleared = router.conversation_task_clear(conversation_id=conversation_id)
    log.info("agent %s cleared the task of conversation %s (%s)", by, conversation_id, cleared)
    return cleared
