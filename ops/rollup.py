"""Ops' rollups: the raw rows of each hour summed into Ops' own tables (``ops.models``), so a
30-day window is read from a few thousand rows instead of millions (docs/ops.md, bench/ops_rollup.py).

* **Idempotent**: rolling an hour again replaces all of its rows in one transaction.
* **Late rows**: a ledger row is written after its call ended (and dated when it began), a shopper
  rates an answer later, an agent replies to a handoff, an audit gets its verdict: each run re-rolls
  the last N whole hours (``KEFU_OPS_ROLLUP_HOURS``, every 5 minutes on the beat schedule), and a
  daily run the last ``KEFU_OPS_ROLLUP_LATE_HOURS`` (8 days). Later changes reach the rollups with
  ``manage.py rollup --hours N``.
* **Outcomes** (``chat.outcomes``) are kept by the hour a conversation *started*, and a message,
  rating or satisfaction score days later changes them: each run also re-rolls the outcomes of
  the hours whose conversations had any of these since the run's first hour, and of the earlier
  conversations of a verified customer who started a new one (a recontact), and re-rolls the
  whole hour of an answer rated late. An open resolution is stored with the time it settles, so
  time passing needs no re-roll.
* **Only whole hours that ended**: the current hour is always read from the raw rows.
* Two runs rolling the same hour at once (PostgreSQL: an advisory lock per hour; SQLite: one
  writer at a time) leave the newer reading: an hour is written only if no run that read the rows
  later has written it meanwhile (``RolledHour.rolled_at`` is when the rows were read).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from cache_layer.models import CacheAudit
from chat.models import Conversation, Message, Role
from chat.outcomes import OutcomeTally, outcome_tallies

from .cells import HOUR, Cell, agent_queue_now, aligned, at, epoch, floor_to, raw_cells
from .models import AnswerRollup, CallRollup, FaqRollup, OutcomeRollup, QueueSample, RolledHour, TierRollup

log = logging.getLogger(__name__)

#: Hours read from the raw rows per pass when rolling many (bounds memory and staleness).
CHUNK_HOURS = 24
_LOCK_NAMESPACE = 0x6F70  # "op": pg_advisory_xact_lock(namespace, hour number)


def _lock(hour: int) -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [_LOCK_NAMESPACE, hour // HOUR])


def _outcome_rows(hour: int, tally: OutcomeTally) -> None:
    OutcomeRollup.objects.filter(hour=hour).delete()
    OutcomeRollup.objects.bulk_create(
        OutcomeRollup(hour=hour, state=state, reasons=reasons, settles=settles, conversations=n)
        for (state, reasons, settles), n in tally.verdicts.items()
    )


def _csat_fields(tally: OutcomeTally) -> dict[str, int]:
    return {f"csat_{score}": tally.csat.get(score, 0) for score in range(1, 6)}


def hour_write(cell: Cell, *, read_at: datetime, outcomes: OutcomeTally | None = None) -> bool:
    """Replace the rollup rows of the hour ``cell`` starts (epoch seconds; an hour's bucket of
    :func:`ops.cells.raw_cells`, read from the raw rows at ``read_at`` or later) with its
    figures, and the outcomes of the conversations started in it with ``outcomes`` (read at
    ``read_at`` or later; none: no conversation). Returns False, and writes nothing, when a run
    that read the rows after ``read_at`` wrote the hour meanwhile."""
    hour = cell.start
    outcomes = outcomes or OutcomeTally()
    with transaction.atomic():
        _lock(hour)
        newer = RolledHour.objects.filter(hour=hour, rolled_at__gt=read_at).exists()
        if newer:
            return False
        for model in (AnswerRollup, CallRollup, TierRollup, FaqRollup):
            model.objects.filter(hour=hour).delete()
        RolledHour.objects.filter(hour=hour).delete()
        _outcome_rows(hour, outcomes)
        audits = cell.audits
        RolledHour.objects.create(
            hour=hour,
            rolled_at=read_at,
            outcomes_at=read_at,
            **_csat_fields(outcomes),
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
        tallies = _tallies(chunk, chunk_end, read_at)
        for hour in range(chunk, chunk_end, HOUR):
            written += hour_write(cells.get(hour) or Cell(hour), read_at=read_at, outcomes=tallies.get(hour))
    log.info("ops rollup: %d hours from %s written", written, datetime.fromtimestamp(first, tz=UTC).isoformat())
    return written


def _tallies(first: int, end: int, read_at: datetime) -> dict[int, OutcomeTally]:
    """Outcome tallies of the conversations started in ``[first, end)`` (epoch seconds), by hour."""
    return outcome_tallies(
        since=datetime.fromtimestamp(first, tz=UTC),
        until=datetime.fromtimestamp(end, tz=UTC),
        bucket=lambda t: epoch(floor_to(t, HOUR)),
        settled_by=read_at,
    )


def outcomes_write(hour: int, tally: OutcomeTally, *, read_at: datetime) -> bool:
    """Replace the outcomes of the rolled-up ``hour`` (epoch seconds) with ``tally`` (read at
    ``read_at`` or later), leaving its other figures. Returns False, and writes nothing, when the
    hour is not rolled up or a run that read the rows after ``read_at`` wrote its outcomes."""
    with transaction.atomic():
        _lock(hour)
        rolled = RolledHour.objects.filter(hour=hour).exclude(outcomes_at__gt=read_at)
        if not rolled.update(outcomes_at=read_at, **_csat_fields(tally)):
            return False
        _outcome_rows(hour, tally)
    return True


def late_hours(since: datetime, *, before: datetime) -> tuple[set[int], set[int]]:
    """What changed since ``since`` in hours that started before ``before`` (epoch seconds):
    ``(outcome_hours, answer_hours)``. ``outcome_hours``: start hours of the conversations with a
    message, a rating or a satisfaction score since ``since``, and of the earlier conversations,
    still in their recontact window, of verified customers who started a conversation since
    ``since``. ``answer_hours``: hours of the bot answers rated since ``since``. Four queries,
    each on an indexed column."""
    window = timedelta(hours=settings.KEFU_RESOLUTION_WINDOW_H)
    # Every role named, so that the (role, created_at) index serves the range.
    touched = Message.objects.filter(role__in=Role.values, created_at__gte=since).order_by().values("conversation_id")
    rated = Message.objects.filter(rated_at__gte=since).order_by()
    starts = set(
        Conversation.objects.filter(id__in=touched.union(rated.values("conversation_id")))
        .order_by()
        .values_list("created_at", flat=True)
    )
    starts.update(Conversation.objects.filter(csat_at__gte=since).order_by().values_list("created_at", flat=True))
    customers = (
        Conversation.objects.filter(created_at__gte=since).exclude(customer_id="").order_by().values("customer_id")
    )
    starts.update(
        Conversation.objects.filter(customer_id__in=customers, created_at__lt=since, updated_at__gte=since - window)
        .order_by()
        .values_list("created_at", flat=True)
    )
    cut = epoch(before)
    outcome_hours = {h for h in (epoch(floor_to(t, HOUR)) for t in starts) if h < cut}
    answer_hours = {
        h for h in (epoch(floor_to(t, HOUR)) for t in rated.values_list("created_at", flat=True)) if h < cut
    }
    return outcome_hours, answer_hours


def recent_roll(*, hours: int, now: datetime | None = None) -> int:
    """Roll up the last ``hours`` whole hours before the current one (``now``'s), then what
    changed since the first of them in earlier hours (:func:`late_hours`): the whole hour of an
    answer rated late, the outcomes of an hour whose conversations changed. Returns how many
    hours were written, whole or outcomes only."""
    if hours < 1:
        raise ValueError(f"hours must be at least 1, got {hours}")
    end = floor_to(now or timezone.now(), HOUR)
    first = end - timedelta(hours=hours)
    read_at = timezone.now()
    outcome_hours, answer_hours = late_hours(first, before=first)
    written = hours_roll(first, end)
    rolled = set(RolledHour.objects.filter(hour__in=outcome_hours | answer_hours).values_list("hour", flat=True))
    for hour in sorted(answer_hours & rolled):
        written += hours_roll(at(hour), at(hour + HOUR))
    for hour in sorted((outcome_hours - answer_hours) & rolled):
        tally = _tallies(hour, hour + HOUR, read_at).get(hour) or OutcomeTally()
        written += outcomes_write(hour, tally, read_at=read_at)
    return written


def queue_sample(*, now: datetime | None = None) -> QueueSample:
    """Store how many conversations wait for an agent and how many one holds, now."""
    waiting, with_agent = agent_queue_now()
    return QueueSample.objects.create(at=now or timezone.now(), waiting=waiting, with_agent=with_agent)
