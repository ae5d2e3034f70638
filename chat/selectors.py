"""Reads of conversations and messages (no writes here)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.db.models import Aggregate, CharField, Count, OuterRef, Q, QuerySet, Subquery

from routing import services as router

from .attachments import attachment_json
from .errors import NotFound
from .models import (
    Attachment,
    CannedReply,
    Conversation,
    ConversationLabel,
    ConversationStatus,
    InternalNote,
    Message,
    MessageState,
)


def messages_after(*, conversation_id: uuid.UUID, after: int) -> list[Message]:
    """Every message with ``seq > after``, in seq order (finished and streaming ones)."""
    return list(Message.objects.filter(conversation_id=conversation_id, seq__gt=after).order_by("seq"))


def messages_page(
    *, conversation_id: uuid.UUID, after: int = 0, before: int | None = None, limit: int
) -> tuple[list[Message], bool]:
    """The newest ``limit`` messages with ``after < seq < before`` (no upper bound when ``before``
    is None), in seq order (finished and streaming ones), and whether older ones in that range
    exist: one query, reading ``limit + 1`` rows at most (the (conversation, seq) index, newest first)."""
    rows = Message.objects.filter(conversation_id=conversation_id, seq__gt=after)
    if before is not None:
        rows = rows.filter(seq__lt=before)
    page = list(rows.order_by("-seq")[: limit + 1])
    more = len(page) > limit
    page = page[:limit]
    page.reverse()
    return page, more


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
    rows, _ = _recent_turns(conversation_id=conversation_id, before_seq=before_seq, turns=turns, after_seq=after_seq)
    return rows


def _recent_turns(
    *, conversation_id: uuid.UUID, before_seq: int, turns: int, after_seq: int
) -> tuple[list[Message], int | None]:
    """:func:`history_for_prompt`'s rows (one query, a turn's worth of rows more than it keeps,
    each bot answer placed after its question: ``_turn_order``), and the seq of the newest
    finished message older than them (None: there is none; -1: the query's limit hid whether
    there is)."""
    limit = turns * 4 + 4
    read = list(
        Message.objects.filter(conversation_id=conversation_id, seq__gt=after_seq, state=MessageState.DONE)
        .filter(Q(seq__lt=before_seq) | Q(role="bot", reply_to_seq__lt=before_seq))
        .exclude(role="system")
        .order_by("-seq")[:limit]
    )
    read.sort(key=_turn_order)
    rows = read[max(0, len(read) - turns * 4) :] if turns > 0 else []
    shopper_idx = [i for i, m in enumerate(rows) if m.role == "shopper"]
    if len(shopper_idx) > turns:
        rows = rows[shopper_idx[-turns] :]
    older = read[: len(read) - len(rows)]
    if older:
        return rows, max(m.seq for m in older)
    return rows, (-1 if len(read) == limit else None)


def prompt_history(*, conversation_id: uuid.UUID, before_seq: int, turns: int) -> tuple[list[Message], str, bool]:
    """What the router's prompt needs of a conversation: :func:`history_for_prompt` within the
    current session (``Conversation.session_from_seq``), the rolling summary of its older turns
    (``""`` for none), and whether the session holds finished messages older than those rows that
    the summary does not cover (``Conversation.summary_upto_seq``): a prompt made of them leaves
    those out, so a summary is due (``History.older_unsummarised``). Two queries, as before the
    flag: the rows are read with one turn's worth more, which shows what lies before them."""
    row = (
        Conversation.objects.filter(pk=conversation_id)
        .values_list("summary", "session_from_seq", "summary_upto_seq")
        .first()
    )
    summary, session_from, upto = row if row is not None else ("", 0, 0)
    rows, older_seq = _recent_turns(
        conversation_id=conversation_id, before_seq=before_seq, turns=turns, after_seq=session_from
    )
    if older_seq is None:
        older = False
    elif older_seq >= 0:
        older = older_seq > upto
    else:  # the limit hid it: anything between the summary's end and the first row read
        older = bool(rows) and rows[0].seq > max(upto, session_from) + 1
    return rows, summary, older


# --- Agent console (docs/console.md) -------------------------------------------------------------


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


class _IdList(Aggregate):
    """The aggregated ids as one comma-separated string (SQLite ``GROUP_CONCAT``, PostgreSQL
    ``STRING_AGG``): a row's labels in a subquery of the row's own query."""

    function = "GROUP_CONCAT"
    template = "%(function)s(%(expressions)s)"
    output_field = CharField()

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(
            compiler, connection, function="STRING_AGG", template="%(function)s(%(expressions)s::text, ',')", **extra
        )


def label_q(label_id: int) -> Q:
    """The conversations that carry label ``label_id``, as a filter of ``Conversation`` querysets
    (the console's label view, Ops): a subquery on the (label, conversation) index."""
    return Q(pk__in=ConversationLabel.objects.filter(label_id=label_id).values("conversation_id"))


def _label_ids(raw: str | None) -> list[int]:
    return sorted(int(x) for x in raw.split(",") if x) if raw else []


def console_rows(*, queryset: QuerySet[Conversation]) -> list[dict[str, Any]]:
    """Rows of the console list for ``queryset`` (one query, whatever the number of rows):
    ``{"id", "status", "agent", "agent_id" (the holder's user id, or None), "assignee": {"id", "name"} | None (chat.assignment), "locale", "time_zone", "waiting_since", "updated_at", "reason",
    "contact_email", "customer": {"id", "name", "email"} | None (a verified customer, chat.identity),
    "last_message": {"seq", "role", "text" (≤200 code points), "route"?, "agent"?} | None,
    "last_shopper": {"seq", "text" (≤200 code points), "at" (ISO 8601)} | None,
    "labels": [label id, ...] (ascending; chat.labels)}``. ``last_shopper`` is what the shopper last wrote (never a bot answer or a system notice such as
    "No one is online"); ``time_zone`` the widget's IANA time zone ("" when unknown): the console
    names an anonymous shopper "Visitor · time zone · language" with it (issue 31)."""
    last = Message.objects.filter(conversation=OuterRef("pk")).order_by("-seq")
    said = last.filter(role="shopper")
    rows = queryset.annotate(
        said_seq=Subquery(said.values("seq")[:1]),
        said_text=Subquery(said.values("text")[:1]),
        said_at=Subquery(said.values("created_at")[:1]),
        last_seq_v=Subquery(last.values("seq")[:1]),
        last_role=Subquery(last.values("role")[:1]),
        last_text=Subquery(last.values("text")[:1]),
        last_route=Subquery(last.values("route")[:1]),
        last_agent=Subquery(last.values("agent_name")[:1]),
        label_ids=Subquery(
            ConversationLabel.objects.filter(conversation=OuterRef("pk"))
            .values("conversation")
            .annotate(ids=_IdList("label_id"))
            .values("ids")[:1]
        ),
    ).values(
        "id",
        "status",
        "agent_name",
        "agent_id",
        "assignee_id",
        "assignee_name",
        "locale",
        "time_zone",
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
        "said_seq",
        "said_text",
        "said_at",
        "label_ids",
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
                "agent_id": r["agent_id"],
                "assignee": (
                    {"id": r["assignee_id"], "name": r["assignee_name"]} if r["assignee_id"] is not None else None
                ),
                "locale": r["locale"],
                "time_zone": r["time_zone"],
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
                "last_shopper": (
                    {"seq": r["said_seq"], "text": (r["said_text"] or "")[:200], "at": _iso(r["said_at"])}
                    if r["said_seq"] is not None
                    else None
                ),
                "labels": _label_ids(r["label_ids"]),
            }
        )
    return out


def console_row(*, conversation_id: uuid.UUID | str) -> dict[str, Any] | None:
    """One conversation's :func:`console_rows` row, or None when it does not exist. One query."""
    rows = console_rows(queryset=Conversation.objects.filter(pk=conversation_id))
    return rows[0] if rows else None


# --- The console list in pages (docs/console.md#paging) ---------------------------------------------

#: The list's sections, in display order; each is paged on its own. The inbox's views (issue 31):
#: Waiting is ``waiting_agent``; All open is ``waiting_agent``, ``agent`` and ``bot`` together;
#: Mine is ``mine`` (:func:`mine_q`, per agent); Closed is ``closed`` (loaded when its tab opens).
CONSOLE_SECTIONS = (
    ConversationStatus.WAITING_AGENT,
    ConversationStatus.AGENT,
    ConversationStatus.BOT,
    "mine",
    ConversationStatus.CLOSED,
)
#: The sections a console's connect sends the first page of (Closed: its count and a cursor only).
FIRST_PAGE_SECTIONS = CONSOLE_SECTIONS[:4]
#: The Closed count is counted up to this many (a bounded query however many conversations were
#: ever closed); ``counts["closed"] == CLOSED_COUNT_CAP`` reads "at least that many".
CLOSED_COUNT_CAP = 10_000


class BadCursor(ValueError):
    """A ``queue.more`` cursor that this server did not make (or of another section)."""


def mine_q(user: Any) -> Q:
    """The conversations of agent ``user``'s Mine view: those they hold (taken over, status
    ``agent``) and those assigned to them that are still open (issue 32). One filter; every
    conversation it matches is also in All open."""
    pk = getattr(user, "pk", None)
    # Held, or assigned and still open (the same rule as chat.assignment.assigned_q, kept here
    # because chat.assignment reads the selectors).
    open_statuses = (ConversationStatus.WAITING_AGENT, ConversationStatus.AGENT, ConversationStatus.BOT)
    return Q(status=ConversationStatus.AGENT, agent_id=pk) | Q(assignee_id=pk, status__in=open_statuses)


def _section(status: str, user: Any = None) -> QuerySet[Conversation]:
    """The conversations of list section ``status`` in display order: waiting for an agent, the
    longest wait first (``waiting_since``, then id); the others (held by an agent, bot
    conversations with messages, ``user``'s Mine, closed) the most recent activity first
    (``updated_at`` descending, then id descending). A bot test's conversation
    (``Conversation.sandbox``) is in none. Raises :class:`BadCursor` for another name."""
    live = Conversation.objects.filter(sandbox=False)
    if status == ConversationStatus.WAITING_AGENT:
        return live.filter(status=status).order_by("waiting_since", "id")
    if status in (ConversationStatus.AGENT, ConversationStatus.CLOSED):
        return live.filter(status=status).order_by("-updated_at", "-id")
    if status == ConversationStatus.BOT:
        return live.filter(status=status, last_seq__gt=0).order_by("-updated_at", "-id")
    if status == "mine":
        return live.filter(mine_q(user)).order_by("-updated_at", "-id")
    raise BadCursor(f"no list section {status!r}")


def section_cursor(status: str, row: dict[str, Any] | None) -> str:
    """The cursor of the rows of section ``status`` after ``row`` (a :func:`console_rows` row;
    None: from the section's start). Opaque to the console, which sends it back in ``queue.more``."""
    if row is None:
        return f"{status}||"
    key = row["waiting_since"] if status == ConversationStatus.WAITING_AGENT else row["updated_at"]
    return f"{status}|{key or ''}|{row['id']}"


def _after(status: str, cursor: str) -> Q:
    """The rows of section ``status`` after the row ``cursor`` names (keyset paging: a row that
    left the list meanwhile does not shift the next page). Raises :class:`BadCursor`."""
    try:
        section, key, cid = cursor.split("|")
        if section == status and key == cid == "":
            return Q()
        moment = datetime.fromisoformat(key)
        pk = uuid.UUID(cid)
    except ValueError:
        raise BadCursor("not a cursor of this server") from None
    if section != status or moment.tzinfo is None:
        raise BadCursor("not a cursor of this section")
    if status == ConversationStatus.WAITING_AGENT:
        return Q(waiting_since__gt=moment) | Q(waiting_since=moment, id__gt=pk)
    return Q(updated_at__lt=moment) | Q(updated_at=moment, id__lt=pk)


def console_counts(user: Any = None) -> dict[str, int]:
    """How many conversations each view of the list holds: ``{"waiting_agent", "agent", "bot"
    (those with messages), "open" (the three together: All open), "closed" (at most
    :data:`CLOSED_COUNT_CAP`), "mine" (only with ``user``: :func:`mine_q`)}``; no bot test's
    conversation. Two queries (the open sections and Mine in one, Closed bounded by its cap)."""
    aggregates: dict[str, Any] = {
        "waiting_agent": Count("pk", filter=Q(status=ConversationStatus.WAITING_AGENT)),
        "agent": Count("pk", filter=Q(status=ConversationStatus.AGENT)),
        "bot": Count("pk", filter=Q(status=ConversationStatus.BOT, last_seq__gt=0)),
    }
    if user is not None:
        aggregates["mine"] = Count("pk", filter=mine_q(user))
    live = Conversation.objects.filter(sandbox=False)
    got = live.filter(status__in=CONSOLE_SECTIONS[:3]).aggregate(**aggregates)
    counts = {str(k): int(v or 0) for k, v in got.items()}
    counts["open"] = counts["waiting_agent"] + counts["agent"] + counts["bot"]
    counts["closed"] = live.filter(status=ConversationStatus.CLOSED)[:CLOSED_COUNT_CAP].count()
    return counts


def mine_count(user: Any) -> int:
    """How many conversations agent ``user``'s Mine view holds (:func:`mine_q`). One query."""
    return Conversation.objects.filter(mine_q(user)).count()


def console_page(
    *, status: str, after: str | None, limit: int, user: Any = None
) -> tuple[list[dict[str, Any]], str | None]:
    """One page of list section ``status`` (see :func:`_section` for the order; ``mine`` is
    ``user``'s): up to ``limit`` rows (:func:`console_rows` shape) after the row the cursor
    ``after`` names (None: the first page), and the cursor of the page's last row when more
    follow (None at the end). One query. Raises :class:`BadCursor` for an unknown section or a
    cursor this server did not make."""
    qs = _section(status, user)
    if after is not None:
        qs = qs.filter(_after(status, after))
    rows = console_rows(queryset=qs[: limit + 1])
    if len(rows) <= limit:
        return rows, None
    rows = rows[:limit]
    return rows, section_cursor(status, rows[-1])


def console_first_pages(
    *, limit: int, user: Any = None
) -> tuple[list[tuple[str, list[dict[str, Any]]]], dict[str, str | None], dict[str, int]]:
    """What a console gets on connect: the first page of the sections Waiting, with an agent,
    bot and ``user``'s Mine (:data:`FIRST_PAGE_SECTIONS`), as ``[(section, rows)]`` in display
    order (a row held by ``user`` may be in two); the cursor of each section's next page (None:
    nothing more; Closed's is its start: its first page is loaded when its tab opens); and the
    counts (:func:`console_counts`). Six queries."""
    pages: list[tuple[str, list[dict[str, Any]]]] = []
    nexts: dict[str, str | None] = {}
    for status in FIRST_PAGE_SECTIONS:
        page, nexts[str(status)] = console_page(status=status, after=None, limit=limit, user=user)
        pages.append((str(status), page))
    nexts[str(ConversationStatus.CLOSED)] = section_cursor(ConversationStatus.CLOSED, None)
    return pages, nexts, console_counts(user)


def console_history(*, conversation_id: uuid.UUID, before: int | None, limit: int) -> dict[str, Any] | None:
    """A page of a conversation's messages for the console, or None when it does not exist:
    the ``limit`` messages before seq ``before`` (None: the newest ones), in seq order, as
    :func:`message_item` (with ``marked_wrong`` as in :func:`conversation_transcript`);
    ``{"messages", "more" (older messages exist), "before" (the page's oldest seq; None for an
    empty page)}``, and for the newest page also ``"conversation"`` (console row + ``packet``,
    ``created_at``, ``epoch``) and ``"notes"``. Four queries for the newest page, two for an
    older one (a third when a cached answer's question is on an older page)."""
    conv = None
    if before is None:
        conv = Conversation.objects.filter(pk=conversation_id).first()
        if conv is None:
            return None
    elif not Conversation.objects.filter(pk=conversation_id).exists():
        return None
    qs = Message.objects.filter(conversation_id=conversation_id)
    if before is not None:
        qs = qs.filter(seq__lt=before)
    rows = list(qs.order_by("-seq")[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    rows.reverse()
    messages = [message_item(m) for m in rows]
    marks = cache_marks(rows, conversation_id=conversation_id)
    for item in messages:
        if item["id"] in marks:
            item["marked_wrong"] = True
            item["marked_wrong_by"] = marks[item["id"]]
    page: dict[str, Any] = {"messages": messages, "more": more, "before": rows[0].seq if rows else None}
    if conv is not None:
        row = console_rows(queryset=Conversation.objects.filter(pk=conversation_id))[0]
        row.update(
            {"packet": conv.handoff_packet or None, "created_at": _iso(conv.created_at), "epoch": conv.owner_epoch}
        )
        page["conversation"] = row
        page["notes"] = [note_item(n) for n in InternalNote.objects.filter(conversation_id=conversation_id)]
    return page


def message_item(msg: Message) -> dict[str, Any]:
    """A stored message for agents (transcripts, the console's ``history`` frame):
    ``{"id", "seq", "role", "text", "state", "created_at", "route"?, "reason"?, "model"?, "cut"?, "superseded"?, "cached"?,
    "agent"?, "rating"?, "flags"?, "attachments"?, "cards"?}``; ``cards``: product cards (docs/protocol.md, *Product cards*); ``attachments``: the message's files with fresh signed links (``chat.attachments.attachment_json``); ``reason``: why the router chose the route (agents only); ``flags``: e.g. ``["prompt_injection"]`` on a shopper message (routing.decide.injection); ``cached`` is true for a bot answer served from a recorded answer-cache entry."""
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
    if msg.attachments:
        item["attachments"] = [attachment_json(a) for a in msg.attachments]
    if msg.cards:
        item["cards"] = list(msg.cards)
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


def cache_marks(messages: list[Message], *, conversation_id: uuid.UUID | None = None) -> dict[int, str]:
    """Bot messages among ``messages`` (one conversation's) whose cached answer an agent marked
    wrong: ``{bot message id: username of the agent}``. A mark is the router's record (an
    ``agent_wrong`` audit) whose ``message_id`` is the shopper message the answer was served for (the
    bot message's ``reply_to_seq``; see ``services.cache_answer_mark_wrong``). One query, none
    when no message was served from the cache. ``conversation_id`` given (``messages`` is a page
    of it), a question not among ``messages`` is looked up: one query more, only then."""
    shopper_ids = {m.seq: m.pk for m in messages if m.role == "shopper"}
    missing = {
        m.reply_to_seq
        for m in messages
        if m.role == "bot" and m.cache_entry_id is not None and m.reply_to_seq and m.reply_to_seq not in shopper_ids
    }
    if missing and conversation_id is not None:
        shopper_ids.update(
            Message.objects.filter(conversation_id=conversation_id, role="shopper", seq__in=missing).values_list(
                "seq", "pk"
            )
        )
    served = {
        shopper_ids[m.reply_to_seq]: m.pk
        for m in messages
        if m.role == "bot" and m.cache_entry_id is not None and m.reply_to_seq in shopper_ids
    }
    if not served:
        return {}
    marks = router.cached_answer_marks(message_ids=list(served))
    return {served[shopper_id]: by for shopper_id, by in marks.items() if shopper_id in served}


def canned_replies(*, owner_id: int | None = None) -> list[dict[str, Any]]:
    """Active canned replies an agent sees: the shared ones and, with ``owner_id``, that agent's
    own: ``[{"id", "title", "text", "locale", "shortcut", "texts", "shared"}]`` in display order.
    One query."""
    mine = Q(owner__isnull=True) | Q(owner_id=owner_id) if owner_id is not None else Q(owner__isnull=True)
    return [
        {
            "id": c.pk,
            "title": c.title,
            "text": c.text,
            "locale": c.locale,
            "shortcut": c.shortcut,
            "texts": dict(c.texts or {}),
            "shared": c.owner_id is None,
        }
        for c in CannedReply.objects.filter(mine, active=True)
    ]


AGENT_PERMISSION = "chat.handle_conversations"


def conversation_exists(*, conversation_id: uuid.UUID) -> bool:
    """Whether the conversation exists (one query)."""
    return Conversation.objects.filter(pk=conversation_id).exists()


def conversation_task(*, conversation_id: uuid.UUID) -> dict[str, Any] | None:
    """What the conversation's shopper is doing across messages, as the router keeps it
    (``routing.services.conversation_task``), or None. One query."""
    return router.conversation_task(conversation_id=conversation_id)


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


def answer_link_domains() -> list[str]:
    """The domains a bot answer may show as links (the ``conversation`` frame's ``link_domains``):
    the store's own and those in ``KEFU_ANSWER_LINK_DOMAINS``, lower case, IDNA-encoded, sorted
    (``routing.services.answer_link_domains``). No query."""
    return router.answer_link_domains()


def attachment_file(*, attachment_id: str) -> tuple[str, str, str] | None:
    """An attachment's stored file name, content type and shown name, or None when it does not
    exist (deleted with its conversation)."""
    row = Attachment.objects.filter(pk=attachment_id).values_list("file", "content_type", "name").first()
    return None if row is None else (str(row[0]), str(row[1]), str(row[2]))


def card_image_hosts() -> list[str]:
    """Hosts a product card's image may come from besides ``answer_link_domains`` (the
    ``conversation`` frame's ``image_hosts``; ``KEFU_PRODUCT_IMAGE_HOSTS``). No query."""
    return router.product_image_hosts()


def product_cards(*, conversation_id: uuid.UUID, skus: list[str]) -> list[dict[str, Any]]:
    """The product cards an agent inserts into a reply (issue 36), in the conversation's
    language, as frames carry them (``routing.services.product_cards``: unknown SKUs skipped,
    addresses checked). Raises ``NotFound`` for an unknown conversation. Blocking."""
    locale = Conversation.objects.filter(pk=conversation_id).values_list("locale", flat=True).first()
    if locale is None:
        raise NotFound(str(conversation_id))
    return [c.as_json() for c in router.product_cards(skus=skus, locale=locale)]


def product_lookup(*, text: str, locale: str) -> list[dict[str, Any]]:
    """The console's product lookup (issue 36): catalog products by SKU or title words
    (``routing.services.product_lookup``), as card JSON. Blocking."""
    return [c.as_json() for c in router.product_lookup(text=text, locale=locale)]


def cards_text(cards: list[dict[str, Any]]) -> str:
    """The plain text of ``cards`` for a client that does not show cards: a line a card,
    ``"Ember Table Lamp — $129.00 — https://shop.example/p/ember"``."""
    return "\n".join(
        " — ".join(str(x) for x in (c.get("title"), c.get("price_text"), c.get("url")) if x) for c in cards
    )
