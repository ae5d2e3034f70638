"""Reads of conversations and messages (no writes here)."""

from __future__ import annotations

import uuid
from typing import Any

from django.db.models import OuterRef, Q, QuerySet, Subquery

from routing import services as router

from .models import CannedReply, Conversation, ConversationStatus, InternalNote, Message, MessageState


def messages_after(*, conversation_id: uuid.UUID, after: int) -> list[Message]:
    """Every message with ``seq > after``, in seq order (finished and streaming ones)."""
    return list(Message.objects.filter(conversation_id=conversation_id, seq__gt=after).order_by("seq"))


def _turn_order(message: Message) -> tuple[int, int, int]:
    """Where a message belongs in a prompt: a bot answer right after the question it replies to
    (``reply_to_seq``), whatever seq it took, else at its seq."""
    if message.role == "bot" and message.reply_to_seq is not None:
        return (message.reply_to_seq, 1, message.seq)
    return (message.seq, 0, message.seq)


def history_for_prompt(*, conversation_id: uuid.UUID, before_seq: int, turns: int, after_seq: int = 0) -> list[Message]:
    """The last ``turns`` turns (a turn = a shopper message and the answers after it) before
    ``before_seq`` and after ``after_seq`` (the session's start), oldest first, finished messages
    only, system messages excluded. One query.

    A bot answer to a question before ``before_seq`` is in it even when its row took a later seq
    (the message at ``before_seq`` was stored while the answer was being prepared), and it is
    placed after its question (issue 29: the second of two messages sent 50 ms apart waits for the
    first answer, and its prompt reads question 1, answer 1, question 2). An answer to
    ``before_seq`` or a later message never is."""
    rows = list(
        Message.objects.filter(conversation_id=conversation_id, seq__gt=after_seq, state=MessageState.DONE)
        .filter(Q(seq__lt=before_seq) | Q(role="bot", reply_to_seq__lt=before_seq))
        .exclude(role="system")
        .order_by("-seq")[: turns * 4]
    )
    rows.sort(key=_turn_order)
    shopper_idx = [i for i, m in enumerate(rows) if m.role == "shopper"]
    if len(shopper_idx) > turns:
        rows = rows[shopper_idx[-turns] :]
    return rows


def prompt_history(*, conversation_id: uuid.UUID, before_seq: int, turns: int) -> tuple[list[Message], str]:
    """What the router's prompt needs of a conversation: :func:`history_for_prompt` within the
    current session (``Conversation.session_from_seq``) and the rolling summary of its older turns
    (``""`` for none). Two queries."""
    row = Conversation.objects.filter(pk=conversation_id).values_list("summary", "session_from_seq").first()
    summary, session_from = row if row is not None else ("", 0)
    rows = history_for_prompt(
        conversation_id=conversation_id, before_seq=before_seq, turns=turns, after_seq=session_from
    )
    return rows, summary


# --- Agent console (docs/console.md) -------------------------------------------------------------

CONSOLE_BOT_ROWS = 100  # active bot conversations listed, most recent first


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def console_rows(*, queryset: QuerySet[Conversation]) -> list[dict[str, Any]]:
    """Rows of the console list for ``queryset`` (one query, whatever the number of rows):
    ``{"id", "status", "agent", "locale", "waiting_since", "updated_at", "reason", "contact_email",
    "customer": {"id", "name", "email"} | None (a verified customer, chat.identity),
    "last_message": {"seq", "role", "text" (≤200 code points), "route"?, "agent"?} | None}``."""
    last = Message.objects.filter(conversation=OuterRef("pk")).order_by("-seq")
    rows = queryset.annotate(
        last_seq_v=Subquery(last.values("seq")[:1]),
        last_role=Subquery(last.values("role")[:1]),
        last_text=Subquery(last.values("text")[:1]),
        last_route=Subquery(last.values("route")[:1]),
        last_agent=Subquery(last.values("agent_name")[:1]),
    ).values(
        "id",
        "status",
        "agent_name",
        "locale",
        "waiting_since",
        "updated_at",
        "handoff_reason",
        "contact_email",
        "customer_id",
        "customer_name",
        "customer_email",
        "last_seq_v",
        "last_role",
        "last_text",
        "last_route",
        "last_agent",
    )
    out = []
    for r in rows:
        last_message: dict[str, Any] | None = None
        if r["last_seq_v"] is not None:
            last_message = {"seq": r["last_seq_v"], "role": r["last_role"], "text": (r["last_text"] or "")[:200]}
            if r["last_route"]:
                last_message["route"] = r["last_route"]
            if r["last_agent"] and r["last_role"] == "agent":
                last_message["agent"] = r["last_agent"]
        out.append(
            {
                "id": str(r["id"]),
                "status": r["status"],
                "agent": r["agent_name"],
                "locale": r["locale"],
                "waiting_since": _iso(r["waiting_since"]),
                "updated_at": _iso(r["updated_at"]),
                "reason": r["handoff_reason"],
                "contact_email": r["contact_email"],
                "customer": (
                    {"id": r["customer_id"], "name": r["customer_name"], "email": r["customer_email"]}
                    if r["customer_id"]
                    else None
                ),
                "last_message": last_message,
            }
        )
    return out


def console_queue(*, bot_rows: int = CONSOLE_BOT_ROWS) -> list[dict[str, Any]]:
    """The console list, in display order: waiting for an agent (longest wait first), then held
    by an agent (most recent activity first), then the ``bot_rows`` most recently active bot
    conversations that have messages. Closed conversations are not listed. Three queries."""
    waiting = console_rows(
        queryset=Conversation.objects.filter(status=ConversationStatus.WAITING_AGENT).order_by(
            "waiting_since", "updated_at"
        )
    )
    held = console_rows(queryset=Conversation.objects.filter(status=ConversationStatus.AGENT).order_by("-updated_at"))
    bot = console_rows(
        queryset=Conversation.objects.filter(status=ConversationStatus.BOT, last_seq__gt=0).order_by("-updated_at")[
            :bot_rows
        ]
    )
    return waiting + held + bot


def message_item(msg: Message) -> dict[str, Any]:
    """A stored message for agents (transcripts, the console's ``history`` frame):
    ``{"id", "seq", "role", "text", "state", "created_at", "route"?, "reason"?, "model"?, "cut"?, "superseded"?, "cached"?,
    "agent"?, "rating"?, "flags"?}``; ``reason``: why the router chose the route (agents only); ``flags``: e.g. ``["prompt_injection"]`` on a shopper message (routing.decide.injection); ``cached`` is true for a bot answer served from a recorded answer-cache entry."""
    item: dict[str, Any] = {
        "id": msg.pk,
        "seq": msg.seq,
        "role": msg.role,
        "text": msg.text,
        "state": msg.state,
        "created_at": _iso(msg.created_at),
    }
    if msg.route:
        item["route"] = msg.route
    if msg.route_reason:
        item["reason"] = msg.route_reason
    if msg.model:
        item["model"] = msg.model
    if msg.cut:
        item["cut"] = True
    if msg.superseded:
        item["superseded"] = True
    if msg.cache_entry_id is not None:
        item["cached"] = True
    if msg.role == "agent":
        item["agent"] = msg.agent_name or "Agent"
    if msg.rating:
        item["rating"] = msg.rating
    if msg.flags:
        item["flags"] = list(msg.flags)
    return item


def note_item(note: InternalNote) -> dict[str, Any]:
    """An internal note: ``{"id", "author", "text", "created_at"}``."""
    return {"id": note.pk, "author": note.author_name, "text": note.text, "created_at": _iso(note.created_at)}


def conversation_transcript(*, conversation_id: uuid.UUID) -> dict[str, Any] | None:
    """Everything stored about a conversation, for agents, or None when it does not exist:
    ``{"conversation": console row + {"packet", "created_at", "epoch"}, "messages": [message_item...],
    "notes": [note_item...]}`` (messages in seq order, streaming ones with their text so far as stored).
    A cached bot answer an agent marked wrong also has ``"marked_wrong": true`` and ``"marked_wrong_by"``
    (the agent's username; see ``cache_marks``)."""
    conv = Conversation.objects.filter(pk=conversation_id).first()
    if conv is None:
        return None
    row = console_rows(queryset=Conversation.objects.filter(pk=conversation_id))[0]
    row.update({"packet": conv.handoff_packet or None, "created_at": _iso(conv.created_at), "epoch": conv.owner_epoch})
    rows = list(Message.objects.filter(conversation_id=conversation_id).order_by("seq"))
    messages = [message_item(m) for m in rows]
    marks = cache_marks(rows)
    for item in messages:
        if item["id"] in marks:
            item["marked_wrong"] = True
            item["marked_wrong_by"] = marks[item["id"]]
    notes = [note_item(n) for n in InternalNote.objects.filter(conversation_id=conversation_id)]
    return {"conversation": row, "messages": messages, "notes": notes}


def cache_marks(messages: list[Message]) -> dict[int, str]:
    """Bot messages among ``messages`` (one conversation's) whose cached answer an agent marked
    wrong: ``{bot message id: username of the agent}``. A mark is the router's record (an
    ``agent_wrong`` audit) whose ``message_id`` is the shopper message the answer was served for (the
    bot message's ``reply_to_seq``; see ``services.cache_answer_mark_wrong``). One query, none
    when no message was served from the cache."""
    shopper_ids = {m.seq: m.pk for m in messages if m.role == "shopper"}
    served = {
        shopper_ids[m.reply_to_seq]: m.pk
        for m in messages
        if m.role == "bot" and m.cache_entry_id is not None and m.reply_to_seq in shopper_ids
    }
    if not served:
        return {}
    marks = router.cached_answer_marks(message_ids=list(served))
    return {served[shopper_id]: by for shopper_id, by in marks.items() if shopper_id in served}


def canned_replies() -> list[dict[str, Any]]:
    """Active canned replies: ``[{"id", "title", "text", "locale"}]`` in display order."""
    return [
        {"id": c.pk, "title": c.title, "text": c.text, "locale": c.locale}
        for c in CannedReply.objects.filter(active=True)
    ]


AGENT_PERMISSION = "chat.handle_conversations"


def user_is_agent(user: Any) -> bool:
    """True for an active staff user with the agents' permission (``chat.handle_conversations``;
    superusers have every permission). Anonymous users and None are not agents."""
    return bool(
        user is not None
        and getattr(user, "is_authenticated", False)
        and user.is_active
        and user.is_staff
        and user.has_perm(AGENT_PERMISSION)
    )


def conversation_owner(*, conversation_id: uuid.UUID) -> tuple[str, int | None, str] | None:
    """``(status, agent_id, agent_name)`` of a conversation, or None when it does not exist."""
    return Conversation.objects.filter(pk=conversation_id).values_list("status", "agent_id", "agent_name").first()
