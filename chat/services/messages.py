"""Writes to messages: a shopper's message stored exactly once, claimed for answering, and the
bot's answer begun and finished; a shopper's rating.

All functions are synchronous (the ORM); async callers wrap them in ``database_sync_to_async``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from lib.search_terms import index_terms
from routing.types import AnswerRecord

from ..errors import AgentHolds, AnswerInFlight, InvalidFeedback
from ..models import Conversation, ConversationStatus, Message, MessageState, Role
from .attachments import attachments_link, attachments_take
from .conversations import next_seq


def _claim_deadline() -> datetime:
    """Until when a new claim (or a renewed one) holds: ``KEFU_ANSWER_LEASE_S`` from now."""
    return timezone.now() + timedelta(seconds=settings.KEFU_ANSWER_LEASE_S)


def _claim_deadline_db() -> Any:
    return connection.ops.adapt_datetimefield_value(_claim_deadline())


def _no_answer_in_flight(conv: str, msg: str) -> str:
    """The SQL condition, on conversation row ``c`` (alias or table name ``conv``), that no answer
    of the conversation is in flight: no claim holds (``claim_until`` null: a claim ends when its
    answer's row is written, or a sweep takes it over when its process died) and no answer row
    is still ``streaming`` (its lease runs out and a sweep finishes it when its process died).
    Issue 29: one answer at a time per conversation, across workers, so the next prompt sees the
    answer before it. The state is a literal so PostgreSQL plans the partial index
    ``message_streaming_conversation`` for it."""
    return (
        f"{conv}.claim_until IS NULL AND NOT EXISTS (SELECT 1 FROM {msg} s WHERE s.conversation_id = {conv}.id "
        f"AND s.state = '{MessageState.STREAMING.value}')"
    )


def _claim_if_none_older(
    conversation_id: uuid.UUID, *, answered_seq: int, seq: int
) -> tuple[int, str, str, int] | None:
    """Inside ``message_receive``'s transaction: claim ``seq`` for answering (``answered_seq =
    seq``) unless an older shopper message (after ``answered_seq``) still waits or another answer
    of the conversation is in flight (:func:`_no_answer_in_flight`). Returns the conversation's
    complaint (``complaint_at_seq``, ``complaint_kind``, ``complaint_question``) and its session's
    first seq (``session_from_seq``), read by the same statement, if claimed, else None. One
    statement in SQL, not an EXISTS then an UPDATE through the ORM: this is on the path to the
    first token of every message, and building the two ORM queries cost more than running them
    (profiled). The in-flight test adds no statement: it is two more conditions of this one
    (bench/answer_in_flight.py measures what they cost). The transaction already holds the
    conversation's row lock (``next_seq``), so no answer row can appear between the test and the
    claim."""
    conv = connection.ops.quote_name(Conversation._meta.db_table)
    msg = connection.ops.quote_name(Message._meta.db_table)
    pk = Conversation._meta.pk.get_db_prep_value(conversation_id, connection)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {conv} SET answered_seq = %s, claim_until = %s WHERE id = %s AND NOT EXISTS ("
            f"SELECT 1 FROM {msg} WHERE conversation_id = %s AND role = %s AND seq > %s AND seq < %s) "
            f"AND {_no_answer_in_flight(conv, msg)} "
            "RETURNING complaint_at_seq, complaint_kind, complaint_question, session_from_seq",
            [seq, _claim_deadline_db(), pk, pk, Role.SHOPPER.value, answered_seq, seq],
        )
        row = cursor.fetchone()
    return None if row is None else (int(row[0]), str(row[1]), str(row[2]), int(row[3]))


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


def message_receive(
    *, conversation_id: uuid.UUID, client_id: str, text: str, claim: bool = False, attachments: list[str] | None = None
) -> Received:
    """Store a shopper message, exactly once per (conversation, client_id).

    A resend of a known ``client_id`` returns the original row with ``created=False`` and stores
    nothing. A message to a closed conversation reopens it (status ``bot``). With ``claim=True``
    the message is also claimed for answering in the same transaction (the compare-and-set of
    ``answer_claim``), provided no older shopper message is still unclaimed. ``attachments``:
    ids of files the shopper uploaded to this conversation and sent with no other message
    (``services.attachments.attachments_take``); any other id raises ``AttachmentRefused`` and
    nothing is stored.
    """
    try:
        with transaction.atomic():
            seq, answered_seq, status, locale, customer_id, address_key = next_seq(conversation_id, shopper=True)
            if attachments and Message.objects.filter(conversation_id=conversation_id, client_id=client_id).exists():
                raise IntegrityError("a resend")  # its attachments are the original's: handled below
            files = (
                attachments_take(conversation_id=conversation_id, ids=attachments, role=Role.SHOPPER)
                if attachments
                else []
            )
            msg = Message.objects.create(
                conversation_id=conversation_id,
                seq=seq,
                role=Role.SHOPPER,
                text=text,
                search_terms=index_terms(text),
                client_id=client_id,
                attachments=files,
            )
            if files:
                attachments_link(ids=[f["id"] for f in files], message_id=msg.pk)
            reopened = status == ConversationStatus.CLOSED
            if reopened:
                Conversation.objects.filter(pk=conversation_id).update(status=ConversationStatus.BOT, agent_name="")
                status = ConversationStatus.BOT
            claimed = None
            complaint = _claim_if_none_older(conversation_id, answered_seq=answered_seq, seq=seq) if claim else None
            if complaint is not None:
                claimed = Conversation(
                    id=conversation_id,
                    status=status,
                    locale=locale,
                    answered_seq=seq,
                    last_seq=seq,
                    customer_id=customer_id,
                    address_key=address_key,
                    complaint_at_seq=complaint[0],
                    complaint_kind=complaint[1],
                    complaint_question=complaint[2],
                    session_from_seq=complaint[3],
                )
    except IntegrityError:
        # A resend of a known client_id (possibly racing in through another socket or worker).
        return Received(Message.objects.get(conversation_id=conversation_id, client_id=client_id), False, False)
    return Received(msg, created=True, reopened=reopened, claimed=claimed)


def answer_claim(*, conversation_id: uuid.UUID) -> tuple[Message, Conversation] | None:
    """Claim the oldest shopper message the bot has not answered yet, or None when there is none.

    The claim is a compare-and-set on ``Conversation.answered_seq``, so two answering loops (in
    two workers) never answer the same message. Two statements in SQL (one when there is nothing
    to claim), not three ORM queries: this runs after every answer. The first reads the message
    and the ``answered_seq`` it follows in one join, and whether another answer of the
    conversation is in flight; the second moves ``answered_seq`` only if it and ``last_seq`` are
    still those values and no claim holds (``UPDATE ... RETURNING``, SQLite >= 3.35,
    PostgreSQL), else the loop reads again. The ``last_seq`` compare stands for the streaming
    test in the UPDATE: every answer row takes a seq, so one written since the read moved it
    (and on PostgreSQL an UPDATE that waited for the row lock re-checks the row's own columns,
    not a NOT EXISTS over the messages). The conversation returned carries ``id``, ``status``,
    ``locale``, ``answered_seq``, ``last_seq``, ``customer_id`` and ``address_key`` (what
    answering reads), as ``message_receive``'s claim does.

    Raises ``AnswerInFlight`` when a message waits but another answer of the conversation is in
    flight (claimed, or its row still streaming; issue 29): the caller waits for it to end and
    asks again (``chat.answering``).
    """
    conv_table = connection.ops.quote_name(Conversation._meta.db_table)
    msg_table = connection.ops.quote_name(Message._meta.db_table)
    columns = ", ".join(f"m.{connection.ops.quote_name(str(f.column))}" for f in Message._meta.concrete_fields)
    pk = Conversation._meta.pk.get_db_prep_value(conversation_id, connection)
    while True:
        rows = list(
            Message.objects.raw(
                f"SELECT {columns}, c.answered_seq AS claimed_after, c.last_seq AS last_seq_then, "
                f"CASE WHEN {_no_answer_in_flight('c', msg_table)} THEN 0 ELSE 1 END AS in_flight "
                f"FROM {conv_table} c JOIN {msg_table} m ON m.conversation_id = c.id "
                "WHERE c.id = %s AND m.role = %s AND m.seq > c.answered_seq ORDER BY m.seq LIMIT 1",
                [pk, Role.SHOPPER.value],
            )
        )
        if not rows:
            return None
        msg = rows[0]
        if msg.in_flight:  # type: ignore[attr-defined]
            raise AnswerInFlight(str(conversation_id))
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {conv_table} SET answered_seq = %s, claim_until = %s "
                "WHERE id = %s AND answered_seq = %s AND last_seq = %s AND claim_until IS NULL "
                "RETURNING status, locale, last_seq, customer_id, address_key, "
                "complaint_at_seq, complaint_kind, complaint_question, session_from_seq",
                [msg.seq, _claim_deadline_db(), pk, msg.claimed_after, msg.last_seq_then],  # type: ignore[attr-defined]
            )
            won = cursor.fetchone()
        if won is not None:
            conv = Conversation(
                id=conversation_id,
                status=won[0],
                locale=won[1],
                answered_seq=msg.seq,
                last_seq=int(won[2]),
                customer_id=won[3],
                address_key=won[4],
                complaint_at_seq=int(won[5]),
                complaint_kind=won[6],
                complaint_question=won[7],
                session_from_seq=int(won[8]),
            )
            return msg, conv


def bot_message_begin(
    *, conversation_id: uuid.UUID, reply_to_seq: int, route: str, variant: str = ""
) -> tuple[Message, int]:
    """Create the row of a bot answer that is about to stream (state ``streaming``, empty text),
    with its ``route`` and ``variant`` (the deployment of a remote tier it was sent to: a sweep
    that finds it orphaned books the lost call to that deployment).

    Returns the row and the conversation's ``owner_epoch`` read under the same row lock: the
    fencing epoch the stream runs under (see ``chat.fencing``). Raises ``AgentHolds`` (and writes
    nothing) when an agent holds the conversation, so a take-over that committed before this
    point is never followed by a bot answer.
    """
    with transaction.atomic():
        seq = next_seq(conversation_id)[0]
        status, epoch = Conversation.objects.filter(pk=conversation_id).values_list("status", "owner_epoch").get()
        if status == ConversationStatus.AGENT:
            transaction.set_rollback(True)
            raise AgentHolds(str(conversation_id))
        msg = Message.objects.create(
            conversation_id=conversation_id,
            seq=seq,
            role=Role.BOT,
            route=route,
            variant=variant,
            state=MessageState.STREAMING,
            reply_to_seq=reply_to_seq,
            lease_until=timezone.now() + timedelta(seconds=settings.KEFU_ANSWER_LEASE_S),
        )
        # The answer's own lease takes over from the claim on its question.
        Conversation.objects.filter(pk=conversation_id, answered_seq=reply_to_seq).update(claim_until=None)
    return msg, int(epoch)


def claim_renew(*, conversation_id: uuid.UUID, seq: int) -> bool:
    """Extend the claim on shopper message ``seq`` (its answer is still being prepared: the router
    is starting); False when it is no longer this claim (a sweep took it, or it was answered)."""
    return bool(
        Conversation.objects.filter(pk=conversation_id, answered_seq=seq, claim_until__isnull=False).update(
            claim_until=_claim_deadline()
        )
    )


def claim_release(*, conversation_id: uuid.UUID, seq: int) -> None:
    """Drop the claim on shopper message ``seq`` without an answer row (an agent holds the
    conversation: the message is theirs, and a hand-back or a gone agent answers it)."""
    Conversation.objects.filter(pk=conversation_id, answered_seq=seq).update(claim_until=None)


@dataclass(frozen=True)
class OrphanClaim:
    """A claimed shopper message whose claim ran out before its answer's row was written."""

    conversation: Conversation
    question: Message
    claim_until: datetime


def orphaned_claims() -> list[OrphanClaim]:
    """Claims that ran out (``claim_until`` past) on conversations no agent holds, whose claimed
    message has no bot or agent message after it: the process that claimed it died before it
    wrote the answer's row. Oldest first, at most 100. A bot test's conversation is left alone
    (``Conversation.sandbox``: answered again outside its sandbox, it could change a real order)."""
    out = []
    for conv in (
        Conversation.objects.filter(claim_until__lt=timezone.now(), sandbox=False)
        .exclude(status=ConversationStatus.AGENT)
        .order_by("claim_until")[:100]
    ):
        question = Message.objects.filter(conversation_id=conv.pk, seq=conv.answered_seq, role=Role.SHOPPER).first()
        replied = Message.objects.filter(
            conversation_id=conv.pk, seq__gt=conv.answered_seq, role__in=(Role.BOT, Role.AGENT)
        ).exists()
        if question is None or replied:
            Conversation.objects.filter(pk=conv.pk, claim_until=conv.claim_until).update(claim_until=None)
            continue
        assert conv.claim_until is not None
        out.append(OrphanClaim(conv, question, conv.claim_until))
    return out


def orphan_claim_take(*, conversation_id: uuid.UUID, claim_until: datetime) -> bool:
    """Take an orphaned claim for answering (a conditional update: of several sweeping processes
    exactly one gets True). The claim is renewed for the taker (``KEFU_ANSWER_LEASE_S`` from now),
    not dropped: until the question's answer row is written, no later message of the
    conversation is claimed before it (one answer at a time, issue 29), and if the taker dies too,
    the next sweep takes it again."""
    return bool(
        Conversation.objects.filter(pk=conversation_id, claim_until=claim_until).update(claim_until=_claim_deadline())
    )


def answer_lease_renew(*, message_id: int) -> bool:
    """Extend a streaming answer's lease by ``KEFU_ANSWER_LEASE_S`` from now (the process
    streaming it is alive). False when the row is no longer streaming (a sweep took it as an
    orphan, or it ended)."""
    until = timezone.now() + timedelta(seconds=settings.KEFU_ANSWER_LEASE_S)
    return bool(Message.objects.filter(pk=message_id, state=MessageState.STREAMING).update(lease_until=until))


def answer_leases_end(*, message_ids: list[int]) -> int:
    """End the leases of these streaming answers now (their process is stopping without finishing
    them): the next sweep of a live process takes them as orphans. How many were ended."""
    return int(
        Message.objects.filter(pk__in=message_ids, state=MessageState.STREAMING).update(
            lease_until=timezone.now() - timedelta(seconds=1)
        )
    )


def _finished(record: AnswerRecord) -> dict[str, Any]:
    """The columns that end a streaming bot row as ``record`` says (state ``done``, lease off)."""
    return {
        "text": record.text,
        "search_terms": index_terms(record.text),
        "route": record.route,
        "model": record.model,
        "variant": record.variant,
        "prompt_tokens": record.prompt_tokens,
        "completion_tokens": record.completion_tokens,
        "cost_usd": record.cost_usd,
        "saved_usd": record.saved_usd,
        "ttft_ms": record.ttft_ms,
        "latency_ms": record.latency_ms,
        "usage_estimated": record.estimated,
        "cut": record.cut,
        "faq_entry_id": record.faq_entry_id,
        "cache_entry_id": record.cache_entry_id,
        "route_reason": record.reason[:200],
        "cards": [c.as_json() for c in record.cards],
        "state": MessageState.DONE,
        "lease_until": None,
    }


def bot_message_finish(*, message_id: int, record: AnswerRecord) -> Message | None:
    """Store the end of a bot answer: the whole text and how it was made (state ``done``).

    The row, or None when it was no longer streaming: its lease ran out and a sweep finished it
    as an orphan (and asked the question again), so this end must not be published."""
    done = Message.objects.filter(pk=message_id, state=MessageState.STREAMING).update(**_finished(record))
    return Message.objects.get(pk=message_id) if done else None


def bot_message_answered(*, conversation_id: uuid.UUID, reply_to_seq: int, record: AnswerRecord) -> tuple[Message, int]:
    """Store a bot answer whose whole text is known before it is shown (a fixed answer: FAQ,
    cache, decline, handoff) in one transaction: the row is written done, as ``record`` says, and
    never streams. Three statements where ``bot_message_begin`` + ``bot_message_finish`` take
    seven: one ``UPDATE ... RETURNING`` allocates the seq, ends the claim on ``reply_to_seq`` and
    reads the owner epoch under the row lock, refusing a conversation an agent holds; then the
    INSERT. A process that dies before it commits leaves the claim to run out, and a sweep asks
    the question again (``orphaned_claims``); after it, the answer is stored.

    Returns the row and the conversation's ``owner_epoch`` (``chat.fencing``). Raises
    ``AgentHolds`` (and writes nothing) when an agent holds the conversation, and
    ``Conversation.DoesNotExist`` for an unknown one."""
    table = connection.ops.quote_name(Conversation._meta.db_table)
    pk = Conversation._meta.pk.get_db_prep_value(conversation_id, connection)
    now = timezone.now()
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} SET last_seq = last_seq + 1, updated_at = %s, "
                "claim_until = CASE WHEN answered_seq = %s THEN NULL ELSE claim_until END "
                "WHERE id = %s AND status <> %s RETURNING last_seq, owner_epoch",
                [now, reply_to_seq, pk, ConversationStatus.AGENT.value],
            )
            row = cursor.fetchone()
        if row is None:
            if Conversation.objects.filter(pk=conversation_id).exists():
                raise AgentHolds(str(conversation_id))
            raise Conversation.DoesNotExist(conversation_id)
        msg = Message.objects.create(
            conversation_id=conversation_id,
            seq=int(row[0]),
            role=Role.BOT,
            reply_to_seq=reply_to_seq,
            **_finished(record),
        )
    return msg, int(row[1])


def bot_message_supersede(*, message_id: int, record: AnswerRecord, hold_s: float) -> Message | None:
    """End a bot answer that showed no text because the shopper went on typing (burst debounce,
    ``chat.answering``): stored done, empty, cut and ``superseded``, with the cost of its abandoned
    call (``record``); and the claim on its question is held again for ``hold_s`` seconds (at
    least ``KEFU_ANSWER_LEASE_S``), so that if this process dies while it waits for the shopper's
    pause, a sweep answers the question (``orphaned_claims``). The row, or None when it was no
    longer streaming (a sweep took it)."""
    with transaction.atomic():
        dropped = replace(record, text="", ttft_ms=None, cut=True)
        done = Message.objects.filter(pk=message_id, state=MessageState.STREAMING).update(
            **_finished(dropped), superseded=True
        )
        if not done:
            return None
        msg = Message.objects.get(pk=message_id)
        hold = timedelta(seconds=max(hold_s, settings.KEFU_ANSWER_LEASE_S))
        if msg.reply_to_seq is not None:
            Conversation.objects.filter(pk=msg.conversation_id, answered_seq=msg.reply_to_seq).update(
                claim_until=timezone.now() + hold
            )
    return msg


def answer_claim_through(*, conversation_id: uuid.UUID, after_seq: int) -> list[Message]:
    """Claim, for one answer, every shopper message after ``after_seq`` not yet answered (the
    fragments of a burst; ``answered_seq`` moves to the last of them, a compare-and-set as in
    ``answer_claim``). Oldest first; empty when there are none or another loop claimed them."""
    while True:
        conv = Conversation.objects.filter(pk=conversation_id).values_list("answered_seq", flat=True).first()
        if conv is None:
            return []
        rows = list(
            Message.objects.filter(
                conversation_id=conversation_id, role=Role.SHOPPER, seq__gt=max(conv, after_seq)
            ).order_by("seq")
        )
        if not rows:
            return []
        won = Conversation.objects.filter(pk=conversation_id, answered_seq=conv).update(
            answered_seq=rows[-1].seq, claim_until=_claim_deadline()
        )
        if won:
            return rows


def message_flags_set(*, message_id: int, flags: list[str]) -> None:
    """Store ``flags`` (e.g. ``["prompt_injection"]``, routing.decide.injection) on shopper message
    ``message_id``, for agents to see in the transcript. One UPDATE."""
    Message.objects.filter(pk=message_id).update(flags=list(flags))


def feedback_record(*, conversation_id: uuid.UUID, message_id: object, rating: object) -> None:
    """Store a shopper's rating (``up``/``down``) of a bot message of their own conversation.

    Raises ``InvalidFeedback`` for a bad rating or a message that is not a bot message of this
    conversation.
    """
    if rating not in ("up", "down"):
        raise InvalidFeedback("rating must be 'up' or 'down'")
    if not isinstance(message_id, int) or isinstance(message_id, bool):
        raise InvalidFeedback("message_id must be an integer")
    with transaction.atomic():
        updated = Message.objects.filter(pk=message_id, conversation_id=conversation_id, role=Role.BOT).update(
            rating=rating, rated_at=timezone.now()
        )
        if not updated:
            raise InvalidFeedback("no such bot message in this conversation")
        if rating == "down":
            answer_seq = Message.objects.filter(pk=message_id).values_list("seq", flat=True).get()
            complaint_record(conversation_id=conversation_id, before_seq=answer_seq, kind="down")


def complaint_record(*, conversation_id: uuid.UUID, before_seq: int, kind: str) -> bool:
    """Remember the shopper's complaint (``kind``: ``"down"``, a thumbs-down of the bot answer at
    ``before_seq``; ``"phrase"``, the "that's not what I asked" at ``before_seq``): the question
    complained about (the last shopper message before ``before_seq``) and the conversation's last
    seq now (``Conversation.complaint_*``, read by routing.decide.repeat). A later complaint
    replaces an earlier one. Two queries. Returns False (nothing stored) when no shopper message
    comes before ``before_seq``."""
    question = (
        Message.objects.filter(conversation_id=conversation_id, role=Role.SHOPPER, seq__lt=before_seq)
        .order_by("-seq")
        .values_list("text", flat=True)
        .first()
    )
    if not question:
        return False
    Conversation.objects.filter(pk=conversation_id).update(
        complaint_at_seq=F("last_seq"), complaint_kind=kind, complaint_question=question
    )
    return True


def csat_record(*, conversation_id: uuid.UUID, score: object, comment: object = "") -> int:
    """Store the shopper's satisfaction with a closed conversation: ``score`` 1-5 (integers),
    ``comment`` at most 500 code points (optional). The latest answer wins. Returns the score.

    Raises ``InvalidFeedback`` for a bad score or comment, or a conversation that is not closed
    (the widget asks when it closes)."""
    if not isinstance(score, int) or isinstance(score, bool) or not 1 <= score <= 5:
        raise InvalidFeedback("score must be an integer from 1 to 5")
    if not isinstance(comment, str) or len(comment) > 500:
        raise InvalidFeedback("comment must be text of at most 500 characters")
    updated = Conversation.objects.filter(pk=conversation_id, status=ConversationStatus.CLOSED).update(
        csat_score=score, csat_comment=comment.strip(), csat_at=timezone.now()
    )
    if not updated:
        raise InvalidFeedback("satisfaction is asked once the conversation is closed")
    return score


@dataclass(frozen=True)
class Orphan:
    """An answer left streaming by a process that died: the bot row, the shopper message it
    answers (None when it cannot be found) and its conversation."""

    answer: Message
    question: Message | None
    conversation: Conversation


def orphaned_answers() -> list[Orphan]:
    """Bot rows still ``streaming`` whose lease ran out (``lease_until`` past: the process
    streaming them stopped renewing it, so it died), oldest first, at most 100. A row without a
    lease (written before leases existed) counts from its creation."""
    now = timezone.now()
    rows = list(
        Message.objects.filter(state=MessageState.STREAMING)
        .filter(
            Q(lease_until__lt=now)
            | Q(lease_until__isnull=True, created_at__lt=now - timedelta(seconds=settings.KEFU_ANSWER_LEASE_S))
        )
        .select_related("conversation")
        .order_by("created_at")[:100]
    )
    out = []
    for row in rows:
        question = (
            Message.objects.filter(conversation_id=row.conversation_id, seq=row.reply_to_seq, role=Role.SHOPPER).first()
            if row.reply_to_seq is not None
            else None
        )
        out.append(Orphan(answer=row, question=question, conversation=row.conversation))
    return out


def orphan_finish(*, message_id: int, text: str, answer_again: bool = False) -> Message | None:
    """Finish an orphaned answer as cut with ``text`` (what the shopper had of it, "" when
    nothing is left): the row, or None when another process finished it first (a conditional
    update on ``state``).

    ``answer_again``: the caller answers its question again; in the same transaction the
    question is claimed for it (``claim_until``, ``KEFU_ANSWER_LEASE_S`` from now, when
    ``answered_seq`` is still that question), so a later message waiting for this answer to end
    (issue 29, one answer at a time) is not answered before the question is answered again."""
    with transaction.atomic():
        done = Message.objects.filter(pk=message_id, state=MessageState.STREAMING).update(
            text=text, search_terms=index_terms(text), cut=True, state=MessageState.DONE, lease_until=None
        )
        if not done:
            return None
        row = Message.objects.get(pk=message_id)
        if answer_again and row.reply_to_seq is not None:
            Conversation.objects.filter(pk=row.conversation_id, answered_seq=row.reply_to_seq).exclude(
                status=ConversationStatus.AGENT
            ).update(claim_until=_claim_deadline())
    return row
