"""The customer's context beside an open conversation (issue 32 item 4; docs/console.md,
"Customer context"): the same customer's earlier conversations, and what fills a canned reply's
placeholders.

Whose conversations are "the same customer's" (:func:`earlier_conversations`):

* a verified customer (``customer_id``, chat.identity): their other conversations, on any device;
* an e-mail (the address a shopper left, ``contact_email``, or a verified customer's
  ``customer_email``): other conversations that left or were verified with the same address, in
  any case;
* never a conversation verified as **another** customer, even with the same address; a name is
  never a key (two shoppers called "Li Wei" are two customers).
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db.models import OuterRef, Q, Subquery
from django.db.models.functions import Lower

from routing import services as router

from .models import Conversation, Message

#: Earlier conversations listed at most, newest first.
EARLIER_LIMIT = 20
#: Newest messages read for the last order number named.
ORDER_SCAN = 50


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def earlier_conversations(*, conversation_id: uuid.UUID, limit: int = EARLIER_LIMIT) -> list[dict[str, Any]] | None:
    """The same customer's other conversations (see the module docstring), newest first, at most
    ``limit``: ``[{"id", "status", "created_at", "updated_at" (ISO 8601), "match": "customer" |
    "email", "first_text" (the shopper's first words, ≤200 code points), "transcript" (its page's
    path)}]``; ``[]`` for an anonymous shopper who left no address; None for an unknown
    conversation. Two queries."""
    conv = (
        Conversation.objects.filter(pk=conversation_id).values("customer_id", "contact_email", "customer_email").first()
    )
    if conv is None:
        return None
    customer = conv["customer_id"]
    emails = {e.strip().lower() for e in (conv["contact_email"], conv["customer_email"]) if e and e.strip()}
    if not customer and not emails:
        return []
    same = Q(customer_id=customer) if customer else Q(pk__in=[])
    if emails:
        by_mail = Q(contact_email_l__in=emails) | Q(customer_email_l__in=emails)
        # An address never reaches across verified customers: another verified id is another person.
        same |= by_mail & (Q(customer_id="") | Q(customer_id=customer)) if customer else by_mail
    first = Message.objects.filter(conversation=OuterRef("pk"), role="shopper").order_by("seq")
    rows = (
        Conversation.objects.alias(contact_email_l=Lower("contact_email"), customer_email_l=Lower("customer_email"))
        .filter(same)
        .exclude(pk=conversation_id)
        .filter(last_seq__gt=0)
        .annotate(first_text=Subquery(first.values("text")[:1]))
        .order_by("-created_at", "-id")
        .values("id", "status", "created_at", "updated_at", "customer_id", "first_text")[:limit]
    )
    return [
        {
            "id": str(r["id"]),
            "status": r["status"],
            "created_at": _iso(r["created_at"]),
            "updated_at": _iso(r["updated_at"]),
            "match": "customer" if customer and r["customer_id"] == customer else "email",
            "first_text": (r["first_text"] or "")[:200],
            "transcript": f"/console/conversations/{r['id']}/",
        }
        for r in rows
    ]


def placeholder_values(*, conversation_id: uuid.UUID) -> dict[str, str]:
    """What fills a canned reply's placeholders in this conversation: ``{"name": the verified
    customer's name ("" for an anonymous shopper), "order_number": the last order number named in
    its newest messages, by anyone ("" when none)}`` (``routing.services.order_number_in``).
    Unknown conversation: both "". Two queries."""
    name = Conversation.objects.filter(pk=conversation_id).values_list("customer_name", flat=True).first() or ""
    number = ""
    texts = Message.objects.filter(conversation_id=conversation_id).order_by("-seq").values_list("text", flat=True)
    for text in texts[:ORDER_SCAN]:
        found = router.order_number_in(text or "")
        if found:
            number = found
            break
    return {"name": name.strip(), "order_number": number}


def conversation_locale(*, conversation_id: uuid.UUID) -> str | None:
    """The conversation's language (``Conversation.locale``), or None when it does not exist."""
    return Conversation.objects.filter(pk=conversation_id).values_list("locale", flat=True).first()
