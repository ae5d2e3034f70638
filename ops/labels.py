"""Labels on Ops (issue 32 item 3; docs/ops.md, "Labels"): per label, how many conversations
started in the window carry it, and their outcomes (``chat.outcomes``: resolved confirmed /
assumed, unresolved, still open), read from chat's stored rows like the rest of ``/ops/``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import datetime
from typing import Any

from django.utils import timezone

from chat.models import ConversationLabel, Label
from chat.outcomes import conversation_verdicts

#: Labelled conversations whose outcomes one page reads at most (newest first); more are
#: counted but their outcomes left out (``outcomes_capped``).
MAX_OUTCOMES = 20_000


def labels_summary(*, start: datetime, end: datetime, now: datetime | None = None) -> list[dict[str, Any]]:
    """Every label, in display order: ``{"id", "name", "color", "conversations": int (started in
    ``[start, end)`` and carrying it), "outcomes": {"resolved_confirmed", "resolved_assumed",
    "unresolved", "open"} (ints; a conversation without any bot answer has no outcome),
    "outcomes_capped": bool}``. Three queries plus the outcomes' reads."""
    now = now or timezone.now()
    links = (
        ConversationLabel.objects.filter(conversation__created_at__gte=start, conversation__created_at__lt=end)
        .order_by("-conversation__created_at")
        .values_list("label_id", "conversation_id")
    )
    by_label: dict[int, list[Any]] = defaultdict(list)
    wanted: list[Any] = []
    seen: set[Any] = set()
    for label_id, cid in links.iterator(chunk_size=2000):
        by_label[label_id].append(cid)
        if cid not in seen and len(wanted) < MAX_OUTCOMES:
            seen.add(cid)
            wanted.append(cid)
    states: dict[Any, str] = {}
    for o in conversation_verdicts(ids=wanted):
        states[o.conversation_id] = "open" if o.settles_at is not None and now < o.settles_at else o.state
    out = []
    for label in Label.objects.all():
        ids = by_label.get(label.pk, [])
        tally = Counter(states[c] for c in ids if c in states)
        out.append(
            {
                "id": label.pk,
                "name": label.name,
                "color": label.color,
                "conversations": len(ids),
                "outcomes": {
                    k: tally.get(k, 0) for k in ("resolved_confirmed", "resolved_assumed", "unresolved", "open")
                },
                "outcomes_capped": any(c not in seen for c in ids),
            }
        )
    return out
