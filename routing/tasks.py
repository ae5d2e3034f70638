"""Celery tasks of the router (found by ``app.autodiscover_tasks()`` in config/celery.py), and
how they are enqueued. Each task takes ids only and calls a function of the router; each is
enqueued when the surrounding transaction commits.

Embedded defaults run Celery eagerly: a task then runs inside the caller's thread, which is why
the answering loop enqueues through the ``*_async`` helpers (a worker thread it never waits for).
"""

from __future__ import annotations

import random

from celery import shared_task
from django.db import transaction

from cache_layer import audit as cache_audit
from lib.background import Background

from .audit import audit_hit


@shared_task(name="routing.tasks.audit_cache_hit", ignore_result=True)
def audit_cache_hit(audit_id: int) -> str | None:
    """Re-answer a served semantic hit and record the verdict (``routing.audit.audit_hit``).

    ``audit_id``: the pending ``cache_layer.CacheAudit`` row (opened by :func:`maybe_audit`),
    which holds the question. Returns the verdict (``same``/``different``/``error``), or None when
    the audit or its entry was gone. Never raises.
    """
    row = audit_hit(audit_id=int(audit_id))
    return row.verdict if row is not None else None


def maybe_audit(*, entry_id: int, question: str, message_id: int | None, rng: random.Random | None = None) -> bool:
    """After a semantic hit on entry ``entry_id`` served for ``question`` (shopper message
    ``message_id``): with probability ``KEFU_CACHE_AUDIT_RATE``, open a pending audit row and
    enqueue ``audit_cache_hit(audit_id)`` when the current transaction commits (at once outside
    one). Returns whether it was drawn. ``rng``: the random source (tests).

    Synchronous, and with eager Celery (no ``REDIS_URL``) the audit itself runs in this thread,
    remote call included: from async code use :func:`maybe_audit_async`. A broker that refuses
    the task is logged (``robust`` on-commit callback) and costs one sample (its row stays
    ``pending``, which counts nowhere).
    """
    rate = cache_audit.audit_rate()
    if rate <= 0.0 or (rng or random).random() >= rate:
        return False
    audit_id = cache_audit.audit_open(entry_id=entry_id, question=question, message_id=message_id)
    if audit_id is None:
        return True  # drawn, but the entry is gone: nothing left to judge
    transaction.on_commit(lambda: audit_cache_hit.delay(audit_id), robust=True)
    return True


_background = Background("sampling a cache hit for audit")


class _Always(random.Random):
    """A random source that always draws (the draw was already made by the caller)."""

    def random(self) -> float:
        return 0.0


_ALWAYS = _Always()


async def maybe_audit_async(*, entry_id: int, question: str, message_id: int | None) -> bool:
    """:func:`maybe_audit` for the answering loop: draws here, and when drawn hands the row, the
    enqueue (and with eager Celery the whole audit) to a worker thread without waiting for it, so
    the shopper's next message never waits for an audit. Returns whether it was drawn.
    :func:`drain` waits for those threads (tests, shutdown)."""
    rate = cache_audit.audit_rate()
    if rate <= 0.0 or random.random() >= rate:
        return False
    _background.start(lambda: maybe_audit(entry_id=entry_id, question=question, message_id=message_id, rng=_ALWAYS))
    return True


async def drain() -> None:
    """Wait until every audit handed off by :func:`maybe_audit_async` on this loop has ended."""
    await _background.drain()


@shared_task(name="routing.tasks.expire_budget_holds", ignore_result=True)
def expire_budget_holds() -> int:
    """Beat, every minute: spend-budget holds whose call's process died count as spent at their
    maximum (``routing.budgets.expire_holds``); counters of long-past periods are deleted.
    Returns how many holds expired."""
    from . import budgets

    return budgets.expire_holds()
