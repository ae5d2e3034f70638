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
conversation is **open**, and counted in neither, until it **settles**: at the first whole hour
(UTC) at or after the end of its window. A bad sign needs no waiting: an unresolved
conversation is unresolved at once. (Whole hours let Ops keep the outcomes per hour,
``ops.rollup``, and read them back exactly, with no conversation re-read.)

All figures are computed from stored rows (messages, ratings, scores): nothing here is sampled.
:class:`OutcomeTally` counts them in a form that adds up (Ops stores one per hour).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any, Literal

from django.conf import settings
from django.utils import timezone

from .models import Conversation, Message, Role

__all__ = [
    "Outcome",
    "OutcomeState",
    "OutcomeTally",
    "conversation_outcomes",
    "conversation_verdicts",
    "csat_scores",
    "outcome_tallies",
    "outcomes_summary",
]

OutcomeState = Literal["resolved_confirmed", "resolved_assumed", "unresolved", "open"]
REASONS = ("handoff", "thumbs_down", "low_csat", "recontact")


@dataclass(frozen=True)
class Outcome:
    """One conversation's outcome: ``state`` and, for ``unresolved``, every ``reasons`` that
    made it so (of ``handoff``, ``thumbs_down``, ``low_csat``, ``recontact``). ``started_at``:
    the conversation's start; ``settles_at``: for a resolution, when it stops being open (the
    first whole hour at or after its window's end), ``None`` for ``unresolved``."""

    conversation_id: Any
    state: OutcomeState
    reasons: tuple[str, ...] = ()
    started_at: datetime | None = None
    settles_at: datetime | None = None


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


def settle_time(last_at: datetime, window: timedelta) -> datetime:
    """When a conversation whose last message was at ``last_at`` settles: the first whole hour
    (UTC) at or after ``last_at + window``."""
    end = last_at + window
    seconds = int(end.timestamp())
    top = seconds - seconds % 3600
    if top < end.timestamp():
        top += 3600
    return datetime.fromtimestamp(top, tz=UTC)


def conversation_outcomes(
    *, since: datetime, until: datetime, now: datetime | None = None, window_h: float | None = None
) -> list[Outcome]:
    """The outcome, at ``now`` (default: now), of every conversation that started in
    ``[since, until)`` and had at least one bot answer (see the module docstring). ``window_h``:
    the recontact window in hours (default ``KEFU_RESOLUTION_WINDOW_H``)."""
    now = now or timezone.now()
    return [
        Outcome(o.conversation_id, "open", (), o.started_at, o.settles_at)
        if o.settles_at is not None and now < o.settles_at
        else o
        for o in conversation_verdicts(since=since, until=until, window_h=window_h)
    ]


#: Conversations whose messages are read in one query (bounds the query's parameters: SQLite
#: allows 32,766 in older releases) and the rows held at once.
CHUNK = 2000


def conversation_verdicts(
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    ids: Collection[Any] | None = None,
    window_h: float | None = None,
) -> Iterator[Outcome]:
    """Like :func:`conversation_outcomes`, but never ``open``: a resolution is given with the
    time it settles (``settles_at``), which may be in the future. What the stored rows say so
    far; a later message, rating or score can change it. The conversations started in
    ``[since, until)``, or those of ``ids`` (one of the two). Yields the outcomes; reads the
    conversations :data:`CHUNK` at a time (two queries a chunk, four with verified customers).
    Raises ``ValueError`` with neither or both."""
    if (ids is None) == (since is None or until is None):
        raise ValueError("give since and until, or ids")
    window = timedelta(hours=settings.KEFU_RESOLUTION_WINDOW_H if window_h is None else window_h)
    idle = timedelta(seconds=settings.KEFU_SESSION_IDLE_S)
    fields = ("id", "customer_id", "csat_score", "created_at")
    if ids is not None:
        wanted = list(ids)
        for i in range(0, len(wanted), CHUNK):
            rows = Conversation.objects.filter(id__in=wanted[i : i + CHUNK], sandbox=False).order_by().values(*fields)
            yield from _verdicts([dict(c) for c in rows], window=window, idle=idle)
        return
    # A bot test's conversation (Conversation.sandbox) has no outcome.
    convs = (
        Conversation.objects.filter(created_at__gte=since, created_at__lt=until, sandbox=False)
        .order_by()
        .values(*fields)
    )
    chunk: list[dict[str, Any]] = []
    for c in convs.iterator(chunk_size=CHUNK):
        chunk.append(dict(c))
        if len(chunk) == CHUNK:
            yield from _verdicts(chunk, window=window, idle=idle)
            chunk = []
    if chunk:
        yield from _verdicts(chunk, window=window, idle=idle)


def _messages(ids: Collection[Any], into: dict[Any, list[dict[str, Any]]]) -> None:
    for m in (
        Message.objects.filter(conversation_id__in=ids, superseded=False)
        .order_by("conversation_id", "seq")
        .values("conversation_id", "role", "route", "rating", "faq_entry_id", "cache_entry_id", "created_at")
    ):
        into[m["conversation_id"]].append(dict(m))


def _verdicts(convs: list[dict[str, Any]], *, window: timedelta, idle: timedelta) -> Iterator[Outcome]:
    if not convs:
        return
    messages: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    _messages([c["id"] for c in convs], messages)
    # The same verified customers' conversations that started after one of these and no later
    # than its last message plus the window (their recontacts), with their messages.
    verified = [c for c in convs if c["customer_id"] and messages.get(c["id"])]
    later: dict[str, list[tuple[datetime, Any]]] = defaultdict(list)
    if verified:
        lo = min(c["created_at"] for c in verified)
        hi = max(messages[c["id"]][-1]["created_at"] for c in verified) + window
        for customer, started, other in Conversation.objects.filter(
            customer_id__in={c["customer_id"] for c in verified}, created_at__gt=lo, created_at__lte=hi
        ).values_list("customer_id", "created_at", "id"):
            later[customer].append((started, other))
        _messages({cid for lst in later.values() for _, cid in lst} - messages.keys(), messages)

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
        started = c["created_at"]
        if reasons:
            yield Outcome(c["id"], "unresolved", tuple(reasons), started)
            continue
        settles = settle_time(last_at, window)
        if (c["csat_score"] or 0) >= 4 or any(r["role"] == Role.BOT and r["rating"] == "up" for r in rows):
            yield Outcome(c["id"], "resolved_confirmed", (), started, settles)
        else:
            yield Outcome(c["id"], "resolved_assumed", (), started, settles)


#: A tally's key: ``(state, reasons, settles)``: ``state`` ``resolved_confirmed``,
#: ``resolved_assumed`` or ``unresolved``; ``reasons`` comma-joined (unresolved only, else "");
#: ``settles`` UTC epoch seconds when a resolution settles, 0 for unresolved (or, in Ops' hourly
#: rollups, a resolution already settled when the hour was rolled).
VerdictKey = tuple[str, str, int]


@dataclass
class OutcomeTally:
    """Outcomes counted so that tallies add up: ``verdicts`` counts conversations by
    :data:`VerdictKey`; ``csat`` counts satisfaction scores (1-5) of every conversation, answered
    or not. A tally read at a given time (:meth:`summary`) gives what
    :func:`outcomes_summary` gives for the same conversations."""

    verdicts: Counter[VerdictKey] = field(default_factory=Counter)
    csat: Counter[int] = field(default_factory=Counter)

    def add(self, outcome: Outcome) -> None:
        """Count ``outcome`` (from :func:`conversation_verdicts`), with its settle time."""
        settles = outcome.settles_at
        self.verdicts[
            (outcome.state, ",".join(outcome.reasons), 0 if settles is None else int(settles.timestamp()))
        ] += 1

    def merge(self, other: OutcomeTally) -> None:
        self.verdicts.update(other.verdicts)
        self.csat.update(other.csat)

    def summary(self, now: datetime) -> dict[str, Any]:
        """The figures at ``now``; the shape is :func:`outcomes_summary`'s."""
        count = dict.fromkeys(("resolved_confirmed", "resolved_assumed", "unresolved", "open"), 0)
        by_reason = dict.fromkeys(REASONS, 0)
        when = now.timestamp()
        for (state, reasons, settles), n in self.verdicts.items():
            if state == "unresolved":
                for reason in reasons.split(","):
                    by_reason[reason] += n
            elif settles > when:
                state = "open"
            count[state] += n
        total = sum(count.values())
        settled = total - count["open"]
        responses = sum(self.csat.values())
        resolved = count["resolved_confirmed"] + count["resolved_assumed"]
        return {
            "conversations": total,
            "open": count["open"],
            "settled": settled,
            "resolved_confirmed": count["resolved_confirmed"],
            "resolved_assumed": count["resolved_assumed"],
            "unresolved": count["unresolved"],
            "unresolved_by_reason": by_reason,
            "resolution_rate": resolved / settled if settled else None,
            "confirmed_resolution_rate": count["resolved_confirmed"] / settled if settled else None,
            "csat": {
                "responses": responses,
                "average": sum(s * n for s, n in self.csat.items()) / responses if responses else None,
                "distribution": {str(s): self.csat.get(s, 0) for s in range(1, 6)},
                "satisfied_share": (self.csat[4] + self.csat[5]) / responses if responses else None,
            },
        }


def outcome_tallies(*, since: datetime, until: datetime, bucket: Callable[[datetime], int]) -> dict[int, OutcomeTally]:
    """Tallies of the conversations started in ``[since, until)``, by the bucket ``bucket``
    names for a conversation's start (Ops: the hour's UTC epoch seconds). Only buckets with a
    conversation appear. Read as :func:`conversation_verdicts` reads, plus one query."""
    tallies: dict[int, OutcomeTally] = defaultdict(OutcomeTally)
    for o in conversation_verdicts(since=since, until=until):
        assert o.started_at is not None
        tallies[bucket(o.started_at)].add(o)
    for started, score in csat_scores(since=since, until=until):
        tallies[bucket(started)].csat[score] += 1
    return dict(tallies)


def csat_scores(*, since: datetime, until: datetime) -> Iterator[tuple[datetime, int]]:
    """``(started_at, score)`` of every conversation started in ``[since, until)`` with a
    satisfaction score (1-5), answered by the bot or not. One query."""
    rows = Conversation.objects.filter(
        created_at__gte=since, created_at__lt=until, csat_score__isnull=False, sandbox=False
    )
    for started, score in rows.order_by().values_list("created_at", "csat_score"):
        if score is not None:
            yield started, int(score)


def outcomes_summary(*, since: datetime, until: datetime, now: datetime | None = None) -> dict[str, Any]:
    """The outcomes of the conversations started in ``[since, until)``:

    ``{"conversations", "open", "settled", "resolved_confirmed", "resolved_assumed",
    "unresolved", "unresolved_by_reason": {reason: count}, "resolution_rate",
    "confirmed_resolution_rate", "csat": {"responses", "average", "distribution": {"1".."5"},
    "satisfied_share"}}``. Rates are shares of the settled conversations (0-1, None with none);
    a conversation with several reasons counts once in ``unresolved`` and under each reason;
    ``satisfied_share`` is the share of scores of 4 or 5 (the usual CSAT figure); the CSAT
    figures cover every conversation of the period with a score."""
    tally = outcome_tallies(since=since, until=until, bucket=lambda _: 0).get(0, OutcomeTally())
    return tally.summary(now or timezone.now())
