"""Outcomes: whether a conversation's problem was solved, defined strictly.

A conversation is **resolved** only when, once its recontact window (``KEFU_RESOLUTION_WINDOW_H``
hours after its last message) has passed, none of these happened (after Zendesk's "verified
resolutions": a resolution is claimed only when nothing says otherwise, and said apart when the
shopper confirmed it):

* **handoff** — a bot answer on route ``handoff``, or an agent wrote in it;
* **thumbs_down** — the shopper rated a bot answer "down";
* **low_csat** — the shopper's satisfaction score was 1 or 2;
* **recontact** — the same shopper came back on the same topic within the window: a shopper
  message starting a new session of the conversation (after ``KEFU_SESSION_IDLE_S`` of silence,
  or to a closed conversation), or, for a verified customer, a new conversation of theirs;
  "the same topic" means both sides were answered from a common FAQ entry or cached answer, or
  either side has no such answer to compare (a remote answer, a handoff): a recontact is never
  excused for want of a label.

A resolved conversation is **confirmed** when the shopper said so (a thumbs-up on a bot answer,
or a satisfaction score of 4 or 5), **assumed** otherwise; the two are reported apart. A
conversation whose window has not passed is **open** and counted in neither.

All figures are computed from stored rows (messages, ratings, scores): nothing here is sampled.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any, Literal

from django.conf import settings
from django.utils import timezone

from .models import Conversation, Message, Role

__all__ = ["Outcome", "OutcomeState", "conversation_outcomes", "outcomes_summary"]

OutcomeState = Literal["resolved_confirmed", "resolved_assumed", "unresolved", "open"]
REASONS = ("handoff", "thumbs_down", "low_csat", "recontact")


@dataclass(frozen=True)
class Outcome:
    """One conversation's outcome: ``state`` and, for ``unresolved``, every ``reasons`` that
    made it so (of ``handoff``, ``thumbs_down``, ``low_csat``, ``recontact``)."""

    conversation_id: Any
    state: OutcomeState
    reasons: tuple[str, ...] = ()


@dataclass
class _Session:
    start: datetime
    end: datetime
    topics: set[tuple[str, int]] = field(default_factory=set)
    answered: bool = False


def _sessions(rows: list[dict[str, Any]], idle: timedelta) -> list[_Session]:
    """A conversation's messages (oldest first) cut into sessions: a shopper message after
    ``idle`` without any message starts a new one."""
    out: list[_Session] = []
    last: datetime | None = None
    for r in rows:
        at = r["created_at"]
        if r["role"] == Role.SHOPPER and (last is None or at - last >= idle or not out):
            out.append(_Session(start=at, end=at))
        if out:
            s = out[-1]
            s.end = at
            if r["role"] == Role.BOT:
                s.answered = True
                if r["faq_entry_id"] is not None:
                    s.topics.add(("faq", r["faq_entry_id"]))
                if r["cache_entry_id"] is not None:
                    s.topics.add(("cache", r["cache_entry_id"]))
        last = at
    return out


def _same_topic(a: _Session, b: _Session) -> bool:
    return not a.topics or not b.topics or bool(a.topics & b.topics)


def conversation_outcomes(
    *, since: datetime, until: datetime, now: datetime | None = None, window_h: float | None = None
) -> list[Outcome]:
    """The outcome of every conversation that started in ``[since, until)`` and had at least one
    bot answer (see the module docstring). ``window_h``: the recontact window in hours (default
    ``KEFU_RESOLUTION_WINDOW_H``). Three queries, whatever the number of conversations."""
    now = now or timezone.now()
    window = timedelta(hours=settings.KEFU_RESOLUTION_WINDOW_H if window_h is None else window_h)
    idle = timedelta(seconds=settings.KEFU_SESSION_IDLE_S)
    convs = list(
        Conversation.objects.filter(created_at__gte=since, created_at__lt=until).values(
            "id", "customer_id", "csat_score", "created_at"
        )
    )
    if not convs:
        return []
    ids = [c["id"] for c in convs]
    customers = {c["customer_id"] for c in convs if c["customer_id"]}
    # Later conversations of the same verified customers (their recontacts), up to a window on.
    later: dict[str, list[tuple[datetime, Any]]] = defaultdict(list)
    if customers:
        for c in Conversation.objects.filter(
            customer_id__in=customers, created_at__gte=since, created_at__lt=until + window
        ).values("id", "customer_id", "created_at"):
            later[c["customer_id"]].append((c["created_at"], c["id"]))
    wanted = set(ids) | {cid for lst in later.values() for _, cid in lst}
    messages: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for m in (
        Message.objects.filter(conversation_id__in=wanted, superseded=False)
        .order_by("conversation_id", "seq")
        .values("conversation_id", "role", "route", "rating", "faq_entry_id", "cache_entry_id", "created_at")
    ):
        messages[m["conversation_id"]].append(dict(m))

    out = []
    for c in convs:
        rows = messages.get(c["id"], [])
        if not any(r["role"] == Role.BOT for r in rows):
            continue
        last_at = rows[-1]["created_at"]
        sessions = _sessions(rows, idle)
        reasons: list[str] = []
        if any(r["route"] == "handoff" or r["role"] == Role.AGENT for r in rows):
            reasons.append("handoff")
        if any(r["role"] == Role.BOT and r["rating"] == "down" for r in rows):
            reasons.append("thumbs_down")
        if c["csat_score"] is not None and c["csat_score"] <= 2:
            reasons.append("low_csat")
        recontact = any(b.start - a.end <= window and _same_topic(a, b) for a, b in pairwise(sessions) if a.answered)
        if not recontact and c["customer_id"] and sessions:
            for started, other in later.get(c["customer_id"], []):
                if other == c["id"] or not (c["created_at"] < started <= last_at + window):
                    continue
                theirs = _sessions(messages.get(other, []), idle)
                if theirs and _same_topic(sessions[-1], theirs[0]):
                    recontact = True
                    break
        if recontact:
            reasons.append("recontact")
        if reasons:
            out.append(Outcome(c["id"], "unresolved", tuple(reasons)))
        elif now - last_at < window:
            out.append(Outcome(c["id"], "open"))
        elif (c["csat_score"] or 0) >= 4 or any(r["role"] == Role.BOT and r["rating"] == "up" for r in rows):
            out.append(Outcome(c["id"], "resolved_confirmed"))
        else:
            out.append(Outcome(c["id"], "resolved_assumed"))
    return out


def outcomes_summary(*, since: datetime, until: datetime, now: datetime | None = None) -> dict[str, Any]:
    """The outcomes of the conversations started in ``[since, until)``:

    ``{"conversations", "open", "settled", "resolved_confirmed", "resolved_assumed",
    "unresolved", "unresolved_by_reason": {reason: count}, "resolution_rate",
    "confirmed_resolution_rate", "csat": {"responses", "average", "distribution": {"1".."5"},
    "satisfied_share"}}``. Rates are shares of the settled conversations (0-1, None with none);
    a conversation with several reasons counts once in ``unresolved`` and under each reason;
    ``satisfied_share`` is the share of scores of 4 or 5 (the usual CSAT figure); the CSAT
    figures cover every conversation of the period with a score."""
    outcomes = conversation_outcomes(since=since, until=until, now=now)
    count = {
        s: sum(1 for o in outcomes if o.state == s)
        for s in ("resolved_confirmed", "resolved_assumed", "unresolved", "open")
    }
    settled = len(outcomes) - count["open"]
    by_reason = {r: sum(1 for o in outcomes if r in o.reasons) for r in REASONS}
    scores = [
        int(score)
        for score in Conversation.objects.filter(
            created_at__gte=since, created_at__lt=until, csat_score__isnull=False
        ).values_list("csat_score", flat=True)
        if score is not None
    ]
    resolved = count["resolved_confirmed"] + count["resolved_assumed"]
    return {
        "conversations": len(outcomes),
        "open": count["open"],
        "settled": settled,
        "resolved_confirmed": count["resolved_confirmed"],
        "resolved_assumed": count["resolved_assumed"],
        "unresolved": count["unresolved"],
        "unresolved_by_reason": by_reason,
        "resolution_rate": resolved / settled if settled else None,
        "confirmed_resolution_rate": count["resolved_confirmed"] / settled if settled else None,
        "csat": {
            "responses": len(scores),
            "average": sum(scores) / len(scores) if scores else None,
            "distribution": {str(n): scores.count(n) for n in range(1, 6)},
            "satisfied_share": sum(1 for s in scores if s >= 4) / len(scores) if scores else None,
        },
    }
