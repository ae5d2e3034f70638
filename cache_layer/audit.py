"""The measured false-hit rate of the answer cache (issue 3, point 5).

A semantic hit serves an answer written for another question. Whether that was right is measured
two ways, both recorded as :class:`~cache_layer.models.CacheAudit` rows:

- **Sampling.** After a semantic hit, :func:`maybe_audit` draws with probability
  ``KEFU_CACHE_AUDIT_RATE`` (default 0.05) and, when drawn, enqueues the Celery task
  ``cache_layer.tasks.audit_semantic_hit`` once the surrounding transaction commits. The task
  (:func:`audit_hit`) asks the tier that would have answered (``simple``, with its usual retries
  and fallback) the served question with the router's own grounded prompt, and compares the fresh
  answer with the cached one: verdict ``same`` or ``different`` (see :func:`audit_hit` for the
  proxy used), or ``error`` when no fresh answer could be had. A ``different`` verdict evicts
  nothing: one model's two answers to one question may differ and both be right. It is counted.
- **Agents.** :func:`mark_wrong` evicts an entry an agent saw was wrong and records
  ``agent_wrong``, which counts as a false hit.

:func:`false_hit_rates` turns the rows into a rate per intent with a Wilson score 95% interval.

Settings read (``django.conf.settings``): ``KEFU_CACHE_AUDIT_RATE`` (0..1, default 0.05),
``KEFU_CACHE_AUDIT_SAME_COSINE`` (default 0.85), ``KEFU_TIERS``, ``KEFU_LLM_MAX_TOKENS``.
Embedded defaults run Celery eagerly: the audit then runs inside the caller's thread (use
:func:`maybe_audit_async` from the event loop).
"""
from __future__ import annotations

import asyncio
import logging
import math
import random
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from dataclasses import dataclass

import numpy as np
from django.conf import settings
from django.db import close_old_connections, transaction

from .intent_model import OTHER, get_intent_model
from .models import CacheAudit, CachedAnswer

log = logging.getLogger(__name__)

AUDIT_TIER = "simple"  # the tier the router asks first (routing.strategy.decide)
#: z for a two-sided 95% interval: the 0.975 quantile of the standard normal distribution.
Z_95 = 1.959963984540054
#: Verdicts that count in the rates, and those of them that are false hits.
COUNTED = (CacheAudit.Verdict.SAME, CacheAudit.Verdict.DIFFERENT, CacheAudit.Verdict.AGENT_WRONG)
FALSE_HITS = (CacheAudit.Verdict.DIFFERENT, CacheAudit.Verdict.AGENT_WRONG)


def audit_rate() -> float:
    """``KEFU_CACHE_AUDIT_RATE``: the share of semantic hits audited, clamped to 0..1."""
    return min(1.0, max(0.0, float(getattr(settings, "KEFU_CACHE_AUDIT_RATE", 0.05))))


def same_cosine() -> float:
    """``KEFU_CACHE_AUDIT_SAME_COSINE``: answer-embedding cosine at or above which two answers are ``same``."""
    return float(getattr(settings, "KEFU_CACHE_AUDIT_SAME_COSINE", 0.85))


# --- Sampling ----------------------------------------------------------------------------------------


def maybe_audit(*, entry_id: int, question: str, message_id: int | None, rng: random.Random | None = None) -> bool:
    """After a semantic hit on entry ``entry_id`` served for ``question`` (shopper message
    ``message_id``): with probability ``KEFU_CACHE_AUDIT_RATE``, enqueue
    ``audit_semantic_hit(entry_id, question, message_id)`` when the current transaction commits
    (at once outside one). Returns whether it was drawn. ``rng``: the random source (tests).

    Synchronous, and with eager Celery (no ``REDIS_URL``) the audit itself runs in this thread,
    remote call included: from async code use :func:`maybe_audit_async`. Never raises: a broker
    that refuses the task is logged (``robust`` on-commit callback) and costs one sample.
    """
    rate = audit_rate()
    if rate <= 0.0 or (rng or random).random() >= rate:
        return False
    from .tasks import audit_semantic_hit

    transaction.on_commit(
        lambda: audit_semantic_hit.delay(entry_id, question, message_id), robust=True
    )
    return True


_pending: set["asyncio.Future[bool]"] = set()


async def maybe_audit_async(*, entry_id: int, question: str, message_id: int | None) -> bool:
    """:func:`maybe_audit` for the answering loop: draws here, and when drawn hands the enqueue
    (and with eager Celery the whole audit) to a worker thread without waiting for it, so the
    shopper's next message never waits for an audit. Returns whether it was drawn.
    :func:`drain` waits for those threads (tests, shutdown)."""
    rate = audit_rate()
    if rate <= 0.0 or random.random() >= rate:
        return False

    def run() -> bool:
        close_old_connections()
        try:
            return maybe_audit(entry_id=entry_id, question=question, message_id=message_id, rng=_ALWAYS)
        finally:
            close_old_connections()

    future = asyncio.get_running_loop().run_in_executor(None, run)
    _pending.add(future)
    future.add_done_callback(_pending.discard)
    return True


async def drain() -> None:
    """Wait until every audit handed off by :func:`maybe_audit_async` on this loop has ended."""
    loop = asyncio.get_running_loop()
    while pending := [f for f in _pending if f.get_loop() is loop and not f.done()]:
        await asyncio.gather(*pending, return_exceptions=True)


class _Always(random.Random):
    """A random source that always draws (the draw was already made by the caller)."""

    def random(self) -> float:
        return 0.0


_ALWAYS = _Always()


# --- The audit itself (the Celery task's body) --------------------------------------------------------


def resolve_intent(vector: np.ndarray | None) -> str:
    """The cache intent model's intent for ``vector`` (``(dim,)`` unit float32), or ``"other"``
    when there is no vector, no model, or the dimensions disagree."""
    model = get_intent_model()
    if vector is None or model is None:
        return OTHER
    vec = np.asarray(vector, dtype=np.float32).reshape(-1)
    if vec.shape[0] != model.dim:
        return OTHER
    return model.resolve(vec[None, :])[0].intent


def _question_vector(question: str) -> np.ndarray | None:
    """The question's vector exactly as the router embeds it for the cache (normalised text, first
    ``ROUTING_MAX_CHARS`` characters; see ``routing.strategy._classify``)."""
    from routing.faq_model import normalise_text
    from routing.strategy import ROUTING_MAX_CHARS

    from .embeddings import get_embedder

    norm = normalise_text(question[:ROUTING_MAX_CHARS])
    return np.asarray(get_embedder().embed([norm])[0], dtype=np.float32) if norm else None


def _grounding(question: str, locale: str, grounded_on: Sequence[int]) -> list[tuple[str, str]]:
    """The router's grounding for ``question`` (``routing.strategy._grounding``: the 3 closest FAQ
    entries). A process without a FAQ model yet (a Celery worker) loads it first; if that fails,
    the entries the cached answer was grounded on (``grounded_on``) are used instead."""
    from routing import answers
    from routing.models import FaqEntry
    from routing.services import registry
    from routing.strategy import ROUTING_MAX_CHARS
    from routing.strategy import _grounding as router_grounding

    try:
        registry.reload_if_changed()
    except Exception:
        log.exception("cache audit: FAQ model could not be loaded; using the entry's own grounding")
    if registry.model is not None:
        return router_grounding(question[:ROUTING_MAX_CHARS], locale)[0]
    rows = FaqEntry.objects.filter(id__in=list(grounded_on)).order_by("id")
    return [(r.question, answers.fill_placeholders(r.answer)) for r in rows]


async def _reanswer(messages: list[dict[str, str]], locale: str) -> tuple[str, str, str]:
    """Stream the grounded prompt ``messages`` from :data:`AUDIT_TIER` (retries and fallback as
    in ``routing.resilience``) to its end: ``(text, tier that answered, model)``. The ledger rows
    carry no conversation or message (an audit answers no shopper). Raises ``ProviderError``."""
    from routing import ledger
    from routing.providers.base import ChatRequest, StreamDone, TextDelta
    from routing.providers.openai_remote import close_clients
    from routing.resilience import stream_with_fallback
    from routing.strategy import Decision, _provider

    request = ChatRequest(messages=messages, model=settings.KEFU_TIERS[AUDIT_TIER]["model"],
                          max_tokens=settings.KEFU_LLM_MAX_TOKENS)
    decision = Decision(route=f"llm.{AUDIT_TIER}", locale=locale, tier=AUDIT_TIER, provider=_provider(AUDIT_TIER),
                        request=request, reason="cache audit")
    texts: list[str] = []
    done: StreamDone | None = None
    try:
        async with aclosing(stream_with_fallback(decision, context=ledger.CallContext(purpose="audit"))) as stream:
            async for item in stream:
                if isinstance(item, TextDelta):
                    texts.append(item.text)
                elif isinstance(item, StreamDone):
                    done = item
    finally:
        await ledger.flush()  # this loop ends with the task: its ledger rows must be written first
        await close_clients()
    tier = decision.tier or AUDIT_TIER
    model = (done.model if done is not None else "") or decision.request.model  # type: ignore[union-attr]
    return "".join(texts), tier, model


def _on_private_loop(messages: list[dict[str, str]], locale: str) -> tuple[str, str, str]:
    """Run :func:`_reanswer` to its end on a fresh event loop, from a fresh thread (blocking).

    ``async_to_sync`` called right here would misbehave when the task runs eagerly inside
    ``database_sync_to_async`` (the thread-sensitive thread of the server): it would run the
    stream on the server's own loop and then close that loop's shared upstream clients, and the
    ledger's own ``database_sync_to_async`` writes would queue behind this very call (deadlock).
    A new thread starts with an empty context and no loop, so ``async_to_sync`` there makes a
    private loop, and the ledger's writes run in that new thread."""
    from asgiref.sync import async_to_sync
    from django.db import connections

    def run() -> tuple[str, str, str]:
        try:
            return async_to_sync(_reanswer)(messages, locale)
        finally:
            connections.close_all()  # this thread's connection (the ledger rows) ends with it

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="cache-audit") as pool:
        return pool.submit(run).result()


def answers_cosine(a: str, b: str) -> float:
    """Cosine (-1..1) of the embeddings of two answers (``get_embedder()``, unit rows)."""
    from .embeddings import get_embedder

    vecs = get_embedder().embed([a, b])
    return float(np.dot(vecs[0], vecs[1]))


def audit_hit(*, entry_id: int, question: str, message_id: int | None) -> CacheAudit | None:
    """Re-answer the served ``question`` and record how the fresh answer compares; the row, or
    ``None`` when entry ``entry_id`` no longer exists (evicted or purged before the audit ran:
    there is no cached answer left to judge).

    The fresh answer comes from the ``simple`` tier (then its fallbacks, like any answer), asked
    with the router's own prompt (``routing.context.build_messages`` with the grounding of
    ``routing.strategy._grounding``) and no conversation history: a cache hit is only ever served
    for a standalone question. The verdict is ``same`` when the cosine of the two answers'
    embeddings (multilingual-e5-small, the cache's own embedder) is at least
    ``KEFU_CACHE_AUDIT_SAME_COSINE``, else ``different``; ``error`` (with ``detail``) when no
    tier is configured, the call failed or the answer was empty.

    The cosine is a proxy, not a judgement of correctness: it measures whether two texts talk
    about the same thing in similar words, and it is cheap (no second model call). Two right
    answers worded differently can score below the threshold (counted as a false hit: the estimate
    leans high), and a contradiction scores above it (missed: the estimate leans low). Measured with
    this embedder against "Yes, we ship the walnut desk to Norway; delivery takes 5-7 business
    days.": a paraphrase 0.973, "Sorry, we do not ship the walnut desk to Norway." 0.893, the same
    sentence with "2-3 business days" 0.986, an unrelated answer (gift cards) 0.800. So the sampled
    rate mostly catches answers about something else; wrong numbers and negations are left to the
    agents' marks (:func:`mark_wrong`). Answers beyond the embedder's 512 tokens are compared on
    their beginning only. An LLM judge or a person would be better and costlier. Never raises:
    every failure is an ``error`` row.
    """
    from routing.context import build_messages
    from routing.providers.base import ProviderError
    from routing.strategy import detect_locale, tier_configured

    entry = CachedAnswer.objects.filter(id=entry_id).values("id", "question", "answer", "locale", "grounded_on").first()
    if entry is None:
        log.info("cache audit skipped: entry %s no longer exists", entry_id)
        return None
    row = CacheAudit(
        entry_id=entry_id, message_id=message_id, question=question,
        cached_question=entry["question"], cached_answer=entry["answer"], intent=OTHER,
    )
    try:
        row.intent = resolve_intent(_question_vector(question))
        if not tier_configured(AUDIT_TIER):
            return _save_error(row, "no remote tier configured")
        locale = detect_locale(question, entry["locale"] or "en")
        grounding = _grounding(question, locale, entry["grounded_on"] or [])
        messages = build_messages(grounding=grounding, history=[], text=question, locale=locale)
        fresh, row.tier, row.model = _on_private_loop(messages, locale)
    except ProviderError as e:
        return _save_error(row, f"upstream: {e.code}")
    except Exception as e:
        log.exception("cache audit of entry %s failed", entry_id)
        return _save_error(row, f"{type(e).__name__}: {e}")
    row.fresh_answer = fresh
    if not fresh.strip():
        return _save_error(row, "empty answer")
    row.similarity = answers_cosine(entry["answer"], fresh)
    row.verdict = CacheAudit.Verdict.SAME if row.similarity >= same_cosine() else CacheAudit.Verdict.DIFFERENT
    _save(row)
    return row


def _save(row: CacheAudit) -> None:
    """Insert ``row``; an entry deleted meanwhile leaves it without one (the FK is SET_NULL)."""
    if row.entry_id is not None and not CachedAnswer.objects.filter(id=row.entry_id).exists():
        row.entry_id = None
    row.save()


def _save_error(row: CacheAudit, detail: str) -> CacheAudit:
    row.verdict = CacheAudit.Verdict.ERROR
    row.detail = detail[:200]
    _save(row)
    return row


# --- Agents -------------------------------------------------------------------------------------------


def mark_wrong(*, entry_id: int, by: str, message_id: int | None = None) -> bool:
    """An agent (``by``: a username) says cached entry ``entry_id`` was a wrong answer: record an
    ``agent_wrong`` row (a false hit in :func:`false_hit_rates`) and evict the entry
    (``cache_layer.services.evict_entry``: database, exact store and semantic indexes). ``True``
    when the entry existed; ``False`` (nothing recorded) when it was already gone.

    The row's intent is the cached question's (its stored vector): an agent sees the entry, not
    necessarily the question it was served for (``message_id`` when known).
    """
    from . import services

    entry = CachedAnswer.objects.filter(id=entry_id).first()
    if entry is None:
        return False
    with transaction.atomic():
        CacheAudit.objects.create(
            entry=entry, message_id=message_id, intent=resolve_intent(entry.vector()), question=entry.question,
            cached_question=entry.question, cached_answer=entry.answer, verdict=CacheAudit.Verdict.AGENT_WRONG,
            marked_by=by[:150],
        )
        evicted = services.evict_entry(entry_id)
    return evicted


# --- Rates --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IntentRate:
    """The false-hit rate of one intent.

    ``n``: counted rows (``same`` + ``different`` + ``agent_wrong``); ``different`` and
    ``agent_wrong``: the false hits among them; ``errors``: audits that got no fresh answer (not
    in ``n``); ``rate``: ``(different + agent_wrong) / n`` (0..1); ``low`` / ``high``: its Wilson
    score 95% interval.
    """

    intent: str
    n: int
    different: int
    agent_wrong: int
    errors: int
    rate: float
    low: float
    high: float


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (E. B. Wilson, "Probable inference, the
    law of succession, and statistical inference", JASA 22 (1927) 209-212):

        centre = (p + z²/2n) / (1 + z²/n)
        half   = z / (1 + z²/n) · sqrt(p(1-p)/n + z²/4n²)        with p = successes / n

    ``(centre - half, centre + half)``, clamped to 0..1; ``(0.0, 1.0)`` when ``n`` is 0. Unlike
    the normal ("Wald") interval it stays inside 0..1 and is not empty at 0 or n successes, which
    matters here: false hits are rare and samples small. Raises ``ValueError`` for counts outside
    ``0 <= successes <= n``.
    """
    if n < 0 or successes < 0 or successes > n:
        raise ValueError(f"bad counts: {successes} of {n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = (z / denom) * math.sqrt(p * (1.0 - p) / n + z2 / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def false_hit_rates() -> list[IntentRate]:
    """Per intent, from every :class:`CacheAudit` row: counts, rate and Wilson 95% interval
    (:class:`IntentRate`), the intent with the most counted rows first (then by name).

    Caveat: ``agent_wrong`` rows are not a random sample (agents see some conversations, not a
    draw), so adding them to the sampled rows makes the rate lean high: an upper-leaning estimate,
    which is the safe side for deciding whether the cache may keep serving an intent.
    One aggregate query.
    """
    from django.db.models import Count

    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in CacheAudit.objects.values("intent", "verdict").annotate(k=Count("id")).order_by():
        counts[r["intent"]][r["verdict"]] += int(r["k"])
    out = []
    for intent, by_verdict in counts.items():
        n = sum(by_verdict[v] for v in COUNTED)
        false = sum(by_verdict[v] for v in FALSE_HITS)
        low, high = wilson_interval(false, n)
        out.append(IntentRate(
            intent=intent, n=n, different=by_verdict[CacheAudit.Verdict.DIFFERENT],
            agent_wrong=by_verdict[CacheAudit.Verdict.AGENT_WRONG], errors=by_verdict[CacheAudit.Verdict.ERROR],
            rate=false / n if n else 0.0, low=low, high=high,
        ))
    out.sort(key=lambda r: (-r.n, r.intent))
    return out
