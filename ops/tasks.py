"""Celery tasks of Ops (found by ``app.autodiscover_tasks()``), on the beat schedule
(``CELERY_BEAT_SCHEDULE`` in config/settings.py): the rollups and the queue samples. Each is
idempotent, so a missed or doubled run is harmless."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from .rollup import queue_sample, recent_roll


@shared_task(name="ops.tasks.rollup", ignore_result=True)
def rollup(late: bool = False) -> int:
    """Re-roll the last ``KEFU_OPS_ROLLUP_HOURS`` whole hours (every 5 minutes), or with
    ``late`` the last ``KEFU_OPS_ROLLUP_LATE_HOURS`` (daily); returns how many were written."""
    hours = settings.KEFU_OPS_ROLLUP_LATE_HOURS if late else settings.KEFU_OPS_ROLLUP_HOURS
    return recent_roll(hours=hours)


@shared_task(name="ops.tasks.sample_queue", ignore_result=True)
def sample_queue() -> int:
    """Store the agent queue's length now (``ops.QueueSample``); returns how many wait."""
    return queue_sample().waiting
