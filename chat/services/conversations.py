"""Writes to conversations: start, authenticate, status, the agents' queue, and the seq counter
every stored message takes its place from.

All functions are synchronous (the ORM); async callers wrap them in ``database_sync_to_async``.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NamedTuple

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from lib.text import supported_locale

from ..errors import AccessDenied, NotFound
from ..identity import ShopperIdentity, customer_token
from ..models import Conversation, ConversationStatus, Message, Role


def _hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def conversation_start(
    *, locale: str = "en", address_key: str = "", time_zone: str = "", sandbox: bool = False
) -> tuple[Conversation, str]:
    """Create a conversation; returns it and the shopper's bearer token (shown once, stored hashed).
    ``address_key``: the keyed hash of the network it was started from (``chat.identity.address_key``);
    ``time_zone``: the shopper's IANA time zone as the widget reported it (``chat.protocol.
    valid_time_zone``; "" when unknown); ``sandbox``: a bot test's conversation (``Conversation.sandbox``)."""
    token = secrets.token_urlsafe(32)
    conv = Conversation.objects.create(
        token_hash=_hash_token(token),
        locale=supported_locale(locale),
        address_key=address_key,
        time_zone=time_zone,
        sandbox=sandbox,
    )
    return conv, token


def conversation_locale_set(*, conversation_id: uuid.UUID, locale: str) -> None:
    """Remember the language the shopper now writes in (``locale``, one of ``KEFU_LANGUAGES``),
    so that their next short or ambiguous message ("ok", "y el azul?") is taken in it too."""
    locale = supported_locale(locale)
    Conversation.objects.filter(pk=conversation_id).exclude(locale=locale).update(locale=locale)


def conversation_authenticate(*, conversation_id: uuid.UUID, token: object) -> Conversation:
    """The conversation whose id and token match. Raises ``AccessDenied`` otherwise
    (constant-time compares).

    Which token opens it depends on whose it is, never on how it began:

    * an anonymous conversation: the random token it was started with (stored hashed);
    * a verified customer's conversation: only the customer token (``chat.identity.customer_token``),
      which kefu hands out only after her signed identity was checked. The token it was started
      with never opens it: a token issued to an anonymous shopper must not gain a customer's
      rights (issue 29: a conversation adopted on a shared computer kept answering the anonymous
      token, which then read her messages and cancelled her order; docs/security.md)."""
    if not isinstance(token, str) or not token:
        raise AccessDenied("missing token")
    conv = Conversation.objects.filter(pk=conversation_id).first()
    if conv is None:
        raise AccessDenied("unknown conversation or wrong token")
    if conv.customer_id:
        matches = hmac.compare_digest(customer_token(conv.id), token)
    else:
        matches = hmac.compare_digest(conv.token_hash, _hash_token(token))
    if not matches:
        raise AccessDenied("unknown conversation or wrong token")
    return conv


def conversation_identify(
    *, identity: ShopperIdentity, locale: str = "en", conversation: Conversation | None = None, address_key: str = ""
) -> tuple[Conversation, str, bool]:
    """The conversation of a verified customer, and its customer token: ``(conversation, token,
    resumed)``.

    ``conversation``: the one this browser resumed (already authenticated), if any. It is kept
    only when it is already this customer's own. Any other is left as it is and never shown to
    her: an anonymous one (on a shared computer it may be someone else's, and kefu cannot tell
    that it was hers: it is never adopted, so its token gains no rights and its questions reach
    neither her screen nor her prompts), or another customer's. The customer's own latest
    conversation is resumed instead, or a new one started (``resumed`` False). The name and
    e-mail the store sent replace the stored ones."""
    with transaction.atomic():
        if conversation is not None and conversation.customer_id != identity.customer_id:
            conversation = None
        if conversation is None:
            conversation = Conversation.objects.filter(customer_id=identity.customer_id).order_by("-updated_at").first()
        resumed = conversation is not None
        if conversation is None:
            # Its random start token is never handed out: a customer's conversation opens only with
            # the customer token (conversation_authenticate).
            conversation, _ = conversation_start(locale=locale, address_key=address_key)
        fields = {
            "customer_id": identity.customer_id,
            "customer_name": identity.name,
            "customer_email": identity.email,
            "identity_verified_at": timezone.now(),
        }
        # customer_id is set only on a row that is new or already hers (a guard, in the statement
        # itself, against ever adopting someone else's conversation).
        owner_before = identity.customer_id if resumed else ""
        updated = Conversation.objects.filter(pk=conversation.pk, customer_id=owner_before).update(**fields)
        if not updated:
            raise AccessDenied("the conversation changed hands")
        for name, value in fields.items():
            setattr(conversation, name, value)
    return conversation, customer_token(conversation.id), resumed


class Allocated(NamedTuple):
    """What :func:`next_seq` returns: the new ``seq`` and the conversation as of the write."""

    seq: int
    answered_seq: int
    status: str
    locale: str
    customer_id: str
    address_key: str


def next_seq(conversation_id: uuid.UUID, *, shopper: bool = False) -> Allocated:
    """Allocate the next seq of a conversation; returns ``(seq, answered_seq, status, locale,
    customer_id, address_key)`` (:class:`Allocated`).

    ``shopper``: the seq is for a shopper's message, which starts a new session when the
    conversation is closed or has been idle for ``KEFU_SESSION_IDLE_S`` seconds: in the same
    statement ``session_from_seq`` moves to the seq before it, and the summary, the handoff packet
    and its reason are cleared (``Conversation.session_from_seq``).

    Must run inside a transaction: the UPDATE takes the row lock (PostgreSQL) or the database
    write lock (SQLite, IMMEDIATE transactions), so two workers never hand out the same seq.
    One statement (``UPDATE ... RETURNING``, SQLite >= 3.35, PostgreSQL) instead of an UPDATE
    and a SELECT: this runs on every chat message, on the path to the first token. Every
    expression of the SET list reads the row as it was before the statement (SQL's rule).
    Raises ``Conversation.DoesNotExist`` for an unknown conversation.
    """
    table = connection.ops.quote_name(Conversation._meta.db_table)
    pk = Conversation._meta.pk.get_db_prep_value(conversation_id, connection)
    now = timezone.now()
    session = ""
    params: list[Any] = [now]
    if shopper:
        new_session = "(status = %s OR updated_at < %s)"
        cut = connection.ops.adapt_datetimefield_value(now - timedelta(seconds=settings.KEFU_SESSION_IDLE_S))
        session = (
            f", session_from_seq = CASE WHEN {new_session} THEN last_seq ELSE session_from_seq END"
            f", summary_upto_seq = CASE WHEN {new_session} THEN last_seq ELSE summary_upto_seq END"
            f", summary = CASE WHEN {new_session} THEN '' ELSE summary END"
            f", handoff_reason = CASE WHEN {new_session} THEN '' ELSE handoff_reason END"
            f", handoff_packet = CASE WHEN {new_session} THEN %s ELSE handoff_packet END"
        )
        closed = ConversationStatus.CLOSED.value
        params += [closed, cut, closed, cut, closed, cut, closed, cut, closed, cut, "{}"]
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET last_seq = last_seq + 1, updated_at = %s{session} WHERE id = %s "
            "RETURNING last_seq, answered_seq, status, locale, customer_id, address_key",
            [*params, pk],
        )
        row = cursor.fetchone()
    if row is None:
        raise Conversation.DoesNotExist(conversation_id)
    return Allocated(int(row[0]), int(row[1]), str(row[2]), str(row[3]), str(row[4]), str(row[5]))


def conversation_set_status(*, conversation_id: uuid.UUID, status: str, reason: str = "") -> bool:
    """Set a conversation's status; returns True when it changed. Bumps the fencing counter."""
    with transaction.atomic():
        changed = (
            Conversation.objects.filter(pk=conversation_id)
            .exclude(status=status)
            .update(status=status, owner_epoch=F("owner_epoch") + 1, handoff_reason=reason[:200])
        )
    return bool(changed)


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
            seq = next_seq(conversation_id)[0]
            notice = Message.objects.create(
                conversation_id=conversation_id, seq=seq, role=Role.SYSTEM, text=no_agent_notice
            )
        status, waiting_since = (
            Conversation.objects.filter(pk=conversation_id).values_list("status", "waiting_since").get()
        )
    return Escalation(entered=entered, status=status, packet=packet, waiting_since=waiting_since, notice=notice)


def contact_save(*, conversation_id: uuid.UUID, email: str) -> bool:
    """Store ``email`` (validated by the caller: ``chat.protocol.validate_contact``) as the address
    the shopper left for a reply (``Conversation.contact_email``; a later one replaces it). True
    when it changed. Raises ``NotFound``."""
    with transaction.atomic():
        current = Conversation.objects.filter(pk=conversation_id).values_list("contact_email", flat=True).first()
        if current is None:
            raise NotFound(str(conversation_id))
        if current == email:
            return False
        Conversation.objects.filter(pk=conversation_id).update(contact_email=email, updated_at=timezone.now())
    return True
