"""Celery tasks of Ops (found by ``app.autodiscover_tasks()``), on the beat schedule
(``CELERY_BEAT_SCHEDULE`` in config/settings.py): the rollups and the queue samples. Each is
idempotent, so a missed or doubled run is harmless."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from .cells import HOUR, at, epoch, floor_to
from .rollup import hours_roll, queue_sample, recent_roll

#: Hours rolled by one task of the daily run: each task stays well inside the task time limit
#: (``KEFU_CELERY_TASK_TIME_LIMIT_S``) however long the late window and however busy the store
#: (bench/ops_rollup.py: a day of a million-rows-a-month store rolls in about 10 s).
SPAN_HOURS = 24


@shared_task(name="ops.tasks.rollup", ignore_result=True)
def rollup(late: bool = False) -> int:
    """Every 5 minutes: re-roll the last ``KEFU_OPS_ROLLUP_HOURS`` whole hours and what changed
    in older ones (``ops.rollup.recent_roll``); returns how many hours were written. With
    ``late`` (daily): queue the last ``KEFU_OPS_ROLLUP_LATE_HOURS`` as tasks of
    :data:`SPAN_HOURS` each (:func:`rollup_span`), newest first; returns how many were queued."""
    if not late:
        return recent_roll(hours=settings.KEFU_OPS_ROLLUP_HOURS)
    end = epoch(floor_to(timezone.now(), HOUR))
    first = end - settings.KEFU_OPS_ROLLUP_LATE_HOURS * HOUR
    queued = 0
    for stop in range(end, first, -SPAN_HOURS * HOUR):
        rollup_span.delay(max(first, stop - SPAN_HOURS * HOUR), stop)
        queued += 1
    return queued


@shared_task(name="ops.tasks.rollup_span", ignore_result=True)
def rollup_span(first: int, end: int) -> int:
    """Re-roll the whole hours in ``[first, end)`` (UTC epoch seconds); returns how many."""
    return hours_roll(at(first), at(end))


@shared_task(name="ops.tasks.sample_queue", ignore_result=True)
def sample_queue() -> int:
    """Store the agent queue's length now (``ops.QueueSample``); returns how many wait."""
    return queue_sample().waiting
