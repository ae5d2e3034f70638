"""Ops' rollups: the raw rows of each hour summed into Ops' own tables (``ops.models``), so a
30-day window is read from a few thousand rows instead of millions (docs/ops.md, bench/ops_rollup.py).

* **Idempotent**: rolling an hour again replaces all of its rows in one transaction.
* **Late rows**: a ledger row is written after its call ended (and dated when it began), a shopper
  rates an answer later, an agent replies to a handoff, an audit gets its verdict: each run re-rolls
  the last N whole hours (``KEFU_OPS_ROLLUP_HOURS``, every 5 minutes on the beat schedule), and a
  daily run the last ``KEFU_OPS_ROLLUP_LATE_HOURS`` (8 days). Later changes reach the rollups with
  ``manage.py rollup --hours N``.
* **Outcomes** (``chat.outcomes``) are kept by the hour a conversation *started*, per
  conversation (``ConversationOutcome``) and summed per hour (``OutcomeRollup``); a message,
  rating or satisfaction score days later changes them. Each run also scores again the
  conversations that had any of these since the run's first hour, and the earlier conversations
  of a verified customer who started a new one (a recontact), and re-groups their hours from the
  per-conversation rows (:func:`conversations_rescore`); and it re-rolls the whole hour of an
  answer rated late. An open resolution is stored with the time it settles, so time passing
  needs no re-roll.
* **Only whole hours that ended**: the current hour is always read from the raw rows.
* Two runs rolling the same hour at once (PostgreSQL: an advisory lock per hour; SQLite: one
  writer at a time) leave the newer reading: an hour is written only if no run that read the rows
  later has written it meanwhile (``RolledHour.rolled_at`` is when the rows were read).
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count
from django.utils import timezone

from cache_layer.models import CacheAudit
from chat.models import Conversation, Message, Role
from chat.outcomes import Outcome, OutcomeTally, conversation_verdicts, csat_scores

from .cells import HOUR, Cell, agent_queue_now, aligned, at, epoch, floor_to, raw_cells
from .models import (
    AnswerRollup,
    CallRollup,
    ConversationOutcome,
    FaqRollup,
    OutcomeRollup,
    QueueSample,
    RolledHour,
    TierRollup,
)

log = logging.getLogger(__name__)

#: Hours read from the raw rows per pass when rolling many (bounds memory and staleness).
CHUNK_HOURS = 24
#: Conversation ids per query (bounds a query's parameters).
CONVERSATION_CHUNK = 2000
_LOCK_NAMESPACE = 0x6F70  # "op": pg_advisory_xact_lock(namespace, hour number)


def _lock(hour: int) -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [_LOCK_NAMESPACE, hour // HOUR])


@dataclass
class HourOutcomes:
    """The conversations started in one hour as read from the rows: each one's verdict
    (``chat.outcomes.conversation_verdicts``) and the satisfaction scores (1-5) given."""

    verdicts: list[Outcome] = field(default_factory=list)
    csat: Counter[int] = field(default_factory=Counter)


def _settles(outcome: Outcome) -> int:
    return 0 if outcome.settles_at is None else int(outcome.settles_at.timestamp())


def _conversation_rows(hour: int, outcomes: Iterable[Outcome]) -> None:
    """Store ``outcomes`` (conversations started in ``hour``) as ``ConversationOutcome`` rows."""
    ConversationOutcome.objects.bulk_create(
        ConversationOutcome(
            conversation_id=o.conversation_id,
            hour=hour,
            state=o.state,
            reasons=",".join(o.reasons),
            settles=_settles(o),
        )
        for o in outcomes
    )


def _outcome_rows(hour: int, keys: Iterable[tuple[str, str, int, int]], csat: Counter[int], read_at: datetime) -> None:
    """Replace the hour's ``OutcomeRollup`` rows with ``keys`` (state, reasons, settles, count),
    settle times at or before ``read_at`` written as 0 (settled), and its CSAT counts."""
    tally = OutcomeTally()
    settled = read_at.timestamp()
    for state, reasons, settles, n in keys:
        tally.verdicts[(state, reasons, 0 if settles <= settled else settles)] += n
    OutcomeRollup.objects.filter(hour=hour).delete()
    OutcomeRollup.objects.bulk_create(
        OutcomeRollup(hour=hour, state=state, reasons=reasons, settles=settles, conversations=n)
        for (state, reasons, settles), n in tally.verdicts.items()
    )
    RolledHour.objects.filter(hour=hour).update(
        outcomes_at=read_at, **{f"csat_{score}": csat.get(score, 0) for score in range(1, 6)}
    )


def hour_write(cell: Cell, *, read_at: datetime, outcomes: HourOutcomes | None = None) -> bool:
    """Replace the rollup rows of the hour ``cell`` starts (epoch seconds; an hour's bucket of
    :func:`ops.cells.raw_cells`, read from the raw rows at ``read_at`` or later) with its
    figures, and the outcomes of the conversations started in it with ``outcomes`` (read at
    ``read_at`` or later; none: no conversation). Returns False, and writes nothing, when a run
    that read the rows after ``read_at`` wrote the hour meanwhile."""
    hour = cell.start
    outcomes = outcomes or HourOutcomes()
    with transaction.atomic():
        _lock(hour)
        newer = RolledHour.objects.filter(hour=hour, rolled_at__gt=read_at).exists()
        if newer:
            return False
        for model in (AnswerRollup, CallRollup, TierRollup, FaqRollup):
            model.objects.filter(hour=hour).delete()
        RolledHour.objects.filter(hour=hour).delete()
        ConversationOutcome.objects.filter(hour=hour).delete()
        _conversation_rows(hour, outcomes.verdicts)
        audits = cell.audits
        RolledHour.objects.create(
            hour=hour,
            rolled_at=read_at,
            shopper_messages=cell.shopper_messages,
            handoffs_replied=cell.wait.n,
            wait_hist=cell.wait.to_bytes(),
            wait_min=cell.wait.lo,
            wait_max=cell.wait.hi,
            audit_same=audits.get(CacheAudit.Verdict.SAME, 0),
            audit_different=audits.get(CacheAudit.Verdict.DIFFERENT, 0),
            audit_agent_wrong=audits.get(CacheAudit.Verdict.AGENT_WRONG, 0),
            audit_error=audits.get(CacheAudit.Verdict.ERROR, 0),
            queue_samples=cell.queue_samples,
            queue_waiting_max=cell.queue_waiting_max,
            queue_with_agent_max=cell.queue_with_agent_max,
        )
        _outcome_rows(
            hour,
            ((o.state, ",".join(o.reasons), _settles(o), 1) for o in outcomes.verdicts),
            outcomes.csat,
            read_at,
        )
        AnswerRollup.objects.bulk_create(
            AnswerRollup(
                hour=hour,
                route=route,
                answers=a.answers,
                cut=a.cut,
                cost_micro_usd=a.cost_micro,
                saved_micro_usd=a.saved_micro,
                prompt_tokens=a.prompt_tokens,
                completion_tokens=a.completion_tokens,
                rated_up=a.rated_up,
                rated_down=a.rated_down,
                ttft_count=a.ttft.n,
                ttft_hist=a.ttft.to_bytes(),
                ttft_min=a.ttft.lo,
                ttft_max=a.ttft.hi,
            )
            for route, a in cell.answers.items()
        )
        CallRollup.objects.bulk_create(
            CallRollup(
                hour=hour,
                tier=tier,
                purpose=purpose,
                outcome=outcome,
                stop=stop,
                calls=c.calls,
                prompt_tokens=c.prompt_tokens,
                cached_prompt_tokens=c.cached_prompt_tokens,
                completion_tokens=c.completion_tokens,
                cost_micro_usd=c.cost_micro,
            )
            for (tier, purpose, outcome, stop), c in cell.calls.items()
        )
        TierRollup.objects.bulk_create(
            TierRollup(hour=hour, tier=tier, ttft_count=h.n, ttft_hist=h.to_bytes(), ttft_min=h.lo, ttft_max=h.hi)
            for tier, h in cell.tier_ttft.items()
        )
        FaqRollup.objects.bulk_create(
            FaqRollup(hour=hour, faq_entry_id=entry, answers=f.answers, rated_up=f.rated_up, rated_down=f.rated_down)
            for entry, f in cell.faq.items()
        )
    return True


def hours_roll(start: datetime, end: datetime) -> int:
    """Roll up every whole hour from the one holding ``start`` up to, not including, the one
    holding ``end`` (pass ``timezone.now()`` to stop before the current hour). Returns how many
    hours were written. Each hour is its own transaction: a run stopped half-way leaves every
    hour either as it was or rolled."""
    first, stop = epoch(floor_to(start, HOUR)), epoch(floor_to(end, HOUR))
    written = 0
    for chunk in range(first, stop, CHUNK_HOURS * HOUR):
        chunk_end = min(stop, chunk + CHUNK_HOURS * HOUR)
        read_at = timezone.now()
        cells = raw_cells(
            datetime.fromtimestamp(chunk, tz=UTC), datetime.fromtimestamp(chunk_end, tz=UTC), key=aligned(HOUR)
        )
        outcomes = _hour_outcomes(chunk, chunk_end)
        for hour in range(chunk, chunk_end, HOUR):
            written += hour_write(cells.get(hour) or Cell(hour), read_at=read_at, outcomes=outcomes.get(hour))
    log.info("ops rollup: %d hours from %s written", written, datetime.fromtimestamp(first, tz=UTC).isoformat())
    return written


def _hour_outcomes(first: int, end: int) -> dict[int, HourOutcomes]:
    """The conversations started in ``[first, end)`` (epoch seconds), by hour."""
    since, until = at(first), at(end)
    out: dict[int, HourOutcomes] = defaultdict(HourOutcomes)
    for o in conversation_verdicts(since=since, until=until):
        assert o.started_at is not None
        out[epoch(floor_to(o.started_at, HOUR))].verdicts.append(o)
    for started, score in csat_scores(since=since, until=until):
        out[epoch(floor_to(started, HOUR))].csat[score] += 1
    return out


def conversations_rescore(ids: Collection[Any], *, read_at: datetime | None = None) -> int:
    """Score the conversations ``ids`` again (``chat.outcomes.conversation_verdicts``), replace
    their ``ConversationOutcome`` rows and re-group each rolled-up hour they started in from
    those rows (``OutcomeRollup`` and the hour's CSAT counts; read at ``read_at`` or later,
    default now). Hours not rolled up, or whose outcomes a later reading wrote, are left.
    Returns how many hours were re-grouped. Costs the changed conversations and one grouped
    query per hour, not the hours' other conversations."""
    read_at = read_at or timezone.now()
    verdicts = {o.conversation_id: o for o in conversation_verdicts(ids=ids)}
    by_hour: dict[int, list[Any]] = defaultdict(list)
    wanted = list(ids)
    for i in range(0, len(wanted), CONVERSATION_CHUNK):
        rows = Conversation.objects.filter(id__in=wanted[i : i + CONVERSATION_CHUNK]).values_list("id", "created_at")
        for cid, started in rows:
            by_hour[epoch(floor_to(started, HOUR))].append(cid)
    rolled = set(
        RolledHour.objects.filter(hour__in=list(by_hour), outcomes_at__isnull=False).values_list("hour", flat=True)
    )
    written = 0
    for hour in sorted(rolled):
        convs = by_hour[hour]
        with transaction.atomic():
            _lock(hour)
            if RolledHour.objects.filter(hour=hour, outcomes_at__gt=read_at).exists():
                continue
            ConversationOutcome.objects.filter(conversation_id__in=convs).delete()
            _conversation_rows(hour, [o for cid in convs if (o := verdicts.get(cid)) is not None])
            keys = (
                ConversationOutcome.objects.filter(hour=hour)
                .values_list("state", "reasons", "settles")
                .annotate(n=Count("conversation_id"))
                .order_by()
            )
            scores = Counter(score for _, score in csat_scores(since=at(hour), until=at(hour + HOUR)))
            _outcome_rows(hour, keys, scores, read_at)
        written += 1
    return written


def late_changes(since: datetime, *, before: datetime) -> tuple[set[Any], set[int]]:
    """What changed since ``since`` in hours that started before ``before``:
    ``(conversation_ids, answer_hours)``. ``conversation_ids``: the conversations started before
    ``before`` with a message, a rating or a satisfaction score since ``since``, and the earlier
    conversations, still in their recontact window, of verified customers who started one since
    ``since``. ``answer_hours``: hours (epoch seconds) of the bot answers rated since ``since``.
    Four queries, each on an indexed column."""
    window = timedelta(hours=settings.KEFU_RESOLUTION_WINDOW_H)
    # Every role named, so that the (role, created_at) index serves the range.
    touched = Message.objects.filter(role__in=Role.values, created_at__gte=since).order_by().values("conversation_id")
    rated = Message.objects.filter(rated_at__gte=since).order_by()
    customers = (
        Conversation.objects.filter(created_at__gte=since).exclude(customer_id="").order_by().values("customer_id")
    )
    older = Conversation.objects.filter(created_at__lt=before).order_by()
    ids = set(older.filter(id__in=touched.union(rated.values("conversation_id"))).values_list("id", flat=True))
    ids.update(older.filter(csat_at__gte=since).values_list("id", flat=True))
    ids.update(older.filter(customer_id__in=customers, updated_at__gte=since - window).values_list("id", flat=True))
    cut = epoch(before)
    answer_hours = {
        h for h in (epoch(floor_to(t, HOUR)) for t in rated.values_list("created_at", flat=True)) if h < cut
    }
    return ids, answer_hours


def recent_roll(*, hours: int, now: datetime | None = None) -> int:
    """Roll up the last ``hours`` whole hours before the current one (``now``'s), then what
    changed since the first of them in earlier hours (:func:`late_changes`): the whole hour of
    an answer rated late, and the conversations that changed, scored again
    (:func:`conversations_rescore`). Returns how many hours were written, whole or outcomes
    only."""
    if hours < 1:
        raise ValueError(f"hours must be at least 1, got {hours}")
    end = floor_to(now or timezone.now(), HOUR)
    first = end - timedelta(hours=hours)
    # Taken before anything is read: the re-score below leaves the hours a whole re-roll of this
    # run (the late-rated answers' hours) wrote since, having read every conversation of them.
    read_at = timezone.now()
    ids, answer_hours = late_changes(first, before=first)
    written = hours_roll(first, end)
    rolled = set(RolledHour.objects.filter(hour__in=answer_hours).values_list("hour", flat=True))
    for hour in sorted(rolled):
        written += hours_roll(at(hour), at(hour + HOUR))
    if ids:
        written += conversations_rescore(ids, read_at=read_at)
    return written


def queue_sample(*, now: datetime | None = None) -> QueueSample:
    """Store how many conversations wait for an agent and how many one holds, now."""
    waiting, with_agent = agent_queue_now()
    return QueueSample.objects.create(at=now or timezone.now(), waiting=waiting, with_agent=with_agent)
