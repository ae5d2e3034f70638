"""Ops' rollups: the raw rows of each hour summed into Ops' own tables (``ops.models``), so a
30-day window is read from a few thousand rows instead of millions (docs/ops.md, bench/ops_rollup.py).

* **Idempotent**: rolling an hour again replaces all of its rows in one transaction.
* **Late rows**: a ledger row is written after its call ended (and dated when it began), a shopper
  rates an answer later, an agent replies to a handoff, an audit gets its verdict: each run re-rolls
  the last N whole hours (``KEFU_OPS_ROLLUP_HOURS``, every 5 minutes on the beat schedule), and a
  daily run the last ``KEFU_OPS_ROLLUP_LATE_HOURS`` (8 days). Later changes reach the rollups with
  ``manage.py rollup --hours N``.
* **Only whole hours that ended**: the current hour is always read from the raw rows.
* Two runs rolling the same hour at once (PostgreSQL: an advisory lock per hour; SQLite: one
  writer at a time) leave the newer reading: an hour is written only if no run that read the rows
  later has written it meanwhile (``RolledHour.rolled_at`` is when the rows were read).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from django.db import connection, transaction
from django.utils import timezone

from cache_layer.models import CacheAudit

from .cells import HOUR, Cell, agent_queue_now, aligned, epoch, floor_to, raw_cells
from .models import AnswerRollup, CallRollup, FaqRollup, QueueSample, RolledHour, TierRollup

log = logging.getLogger(__name__)

#: Hours read from the raw rows per pass when rolling many (bounds memory and staleness).
CHUNK_HOURS = 24
_LOCK_NAMESPACE = 0x6F70  # "op": pg_advisory_xact_lock(namespace, hour number)


def hour_write(cell: Cell, *, read_at: datetime) -> bool:
    """Replace the rollup rows of the hour ``cell`` starts (epoch seconds; an hour's bucket of
    :func:`ops.cells.raw_cells`, read from the raw rows at ``read_at`` or later) with its figures. Returns False, and
    writes nothing, when a run that read the rows after ``read_at`` wrote the hour meanwhile."""
    hour = cell.start
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [_LOCK_NAMESPACE, hour // HOUR])
        newer = RolledHour.objects.filter(hour=hour, rolled_at__gt=read_at).exists()
        if newer:
            return False
        for model in (AnswerRollup, CallRollup, TierRollup, FaqRollup):
            model.objects.filter(hour=hour).delete()
        RolledHour.objects.filter(hour=hour).delete()
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
        for hour in range(chunk, chunk_end, HOUR):
            written += hour_write(cells.get(hour) or Cell(hour), read_at=read_at)
    log.info("ops rollup: %d hours from %s written", written, datetime.fromtimestamp(first, tz=UTC).isoformat())
    return written


def recent_roll(*, hours: int, now: datetime | None = None) -> int:
    """Roll up the last ``hours`` whole hours before the current one (``now``'s)."""
    if hours < 1:
        raise ValueError(f"hours must be at least 1, got {hours}")
    end = floor_to(now or timezone.now(), HOUR)
    return hours_roll(end - timedelta(hours=hours), end)


def queue_sample(*, now: datetime | None = None) -> QueueSample:
    """Store how many conversations wait for an agent and how many one holds, now."""
    waiting, with_agent = agent_queue_now()
    return QueueSample.objects.create(at=now or timezone.now(), waiting=waiting, with_agent=with_agent)
