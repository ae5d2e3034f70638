"""Celery tasks of the router (found by ``app.autodiscover_tasks()`` in config/celery.py), and
how they are enqueued. Each task takes ids only and calls a function of the router; each is
enqueued when the surrounding transaction commits.

Embedded defaults run Celery eagerly: a task then runs inside the caller's thread, which is why
the answering loop enqueues through the ``*_async`` helpers (a worker thread it never waits for).
"""

from __future__ import annotations

import random

import numpy as np
from celery import shared_task
from django.db import transaction

from cache_layer import audit as cache_audit
from lib.background import Background
from routing.cache_review.audit import audit_hit


@shared_task(name="routing.tasks.audit_cache_hit", ignore_result=True)
def audit_cache_hit(audit_id: int) -> str | None:
    """Re-answer a served semantic hit and record the verdict (``routing.cache_review.audit.audit_hit``).

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
    """Wait until every audit, judgement and remake handed off by :func:`maybe_audit_async`,
    :func:`maybe_judge_async` and :func:`maybe_remake_async` on this loop has ended."""
    await _background.drain()
    await _judges.drain()
    await _remakes.drain()


@shared_task(name="routing.tasks.judge_near_miss", ignore_result=True)
def judge_near_miss(judgement_id: int) -> str | None:
    """Judge a near miss of the answer cache and promote it when it needs the same answer
    (``routing.cache_review.promotion.judge``). ``judgement_id``: the pending ``cache_layer.CacheJudgement``.
    Returns the verdict, or None when the judgement was not pending. Never raises."""
    from routing.cache_review import promotion

    row = promotion.judge(judgement_id=int(judgement_id))
    return row.verdict if row is not None else None


def maybe_judge(*, question: str, scope: str, embedding: np.ndarray | None) -> int | None:
    """After a remote answer to ``question`` (cache scope ``scope``, its vector ``embedding``):
    when near misses are judged (``routing.cache_review.promotion.enabled``) and the cache has one for it,
    open a pending judgement and enqueue :func:`judge_near_miss` on commit. Its id, or None.
    Synchronous; with eager Celery the judge's call runs in this thread: from async code use
    :func:`maybe_judge_async`."""
    from cache_layer import promotion as cache_promotion
    from cache_layer import services as cache
    from routing.cache_review import promotion

    if not promotion.enabled():
        return None
    near = cache.near_miss(question=question, scope=scope, embedding=embedding)
    if near is None:
        return None
    judgement_id = cache_promotion.judgement_open(
        scope=scope, entry_id=near.entry_id, question=question, similarity=near.similarity
    )
    if judgement_id is not None:
        transaction.on_commit(lambda: judge_near_miss.delay(judgement_id), robust=True)
    return judgement_id


_judges = Background("judging a near miss of the answer cache")


async def maybe_judge_async(*, question: str, scope: str, embedding: np.ndarray | None) -> bool:
    """:func:`maybe_judge` for the answering loop, in a worker thread it never waits for (the
    shopper's next message never waits for a judge). ``False`` when nothing is judged at all
    (no ``simple`` tier, promotion off). :func:`drain` waits for those threads."""
    from routing.cache_review import promotion

    if not promotion.enabled():
        return False
    _judges.start(lambda: maybe_judge(question=question, scope=scope, embedding=embedding))
    return True


@shared_task(name="routing.tasks.remake_clean_answer", ignore_result=True)
def remake_clean_answer(question: str, scope: str, tier: str, locale: str) -> bool:
    """Re-make a clean answer to ``question`` (a standalone question whose shopper's answer held
    their history and was not shared) at ``tier`` and cache it in ``scope``
    (``routing.cache_review.remake.remake``). Takes the question's text, not an id: the
    standalone rewrite of a follow-up is stored nowhere else, and the cache policy already found
    no personal data in it. Returns whether an entry was stored. Never raises for a failed call."""
    from routing.cache_review import remake

    return remake.remake(question=question, scope=scope, tier=tier, locale=locale)


def maybe_remake(*, question: str, scope: str, tier: str, locale: str) -> bool:
    """After an unshared remote answer to ``question`` (cache scope ``scope``, planned at
    ``tier``): when a clean remake is wanted (``routing.cache_review.remake.wanted``: remakes on,
    a question the cache may key on, no live entry yet), enqueue :func:`remake_clean_answer` when
    the current transaction commits. Returns whether it was enqueued. Synchronous; with eager
    Celery the remake's call runs in this thread: from async code use :func:`maybe_remake_async`."""
    from routing.cache_review import remake

    if not remake.wanted(question=question, scope=scope):
        return False
    transaction.on_commit(
        lambda: remake_clean_answer.delay(question=question, scope=scope, tier=tier, locale=locale), robust=True
    )
    return True


_remakes = Background("re-making a clean answer for the answer cache")


async def maybe_remake_async(*, question: str, scope: str, tier: str, locale: str) -> bool:
    """:func:`maybe_remake` for the answering loop, in a worker thread it never waits for.
    ``False`` when remakes are off (``KEFU_CACHE_REMAKE``, or the cache); :func:`drain` waits."""
    from routing.cache_review import remake

    if not remake.enabled():
        return False
    _remakes.start(lambda: maybe_remake(question=question, scope=scope, tier=tier, locale=locale))
    return True


@shared_task(name="routing.tasks.expire_budget_holds", ignore_result=True)
def expire_budget_holds() -> int:
    """Beat, every minute: spend-budget holds whose call's process died count as spent at their
    maximum (``routing.upstream.budgets.expire_holds``); counters of long-past periods are deleted.
    Returns how many holds expired."""
    from routing.upstream import budgets

    return budgets.expire_holds()
