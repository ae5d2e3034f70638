"""The measured false-hit rate of the answer cache: audit rows, verdicts and rates.

A semantic hit serves an answer written for another question. Whether that was right is measured
two ways, both recorded as :class:`~cache_layer.models.CacheAudit` rows:

- **Sampling.** The router samples semantic hits (``routing.cache_review.audit``: ``KEFU_CACHE_AUDIT_RATE``),
  opens a ``pending`` row here (:func:`audit_open`, which copies the served question and the
  cached question and answer), enqueues a task with the row's id, re-answers the question with
  the tier that would have answered and hands the fresh answer back (:func:`audit_record`):
  verdict ``same`` or ``different`` (see :func:`audit_record` for the proxy used), or ``error``
  (:func:`audit_error`) when no fresh answer could be had. A ``different`` verdict evicts
  nothing: one model's two answers to one question may differ and both be right. It is counted.
- **Agents.** :func:`mark_wrong` evicts an entry an agent saw was wrong and records
  ``agent_wrong``, which counts as a false hit.

:func:`false_hit_rates` turns the rows into a rate per intent with a Wilson score 95% interval.

Settings read (``django.conf.settings``): ``KEFU_CACHE_AUDIT_RATE`` (0..1, default 0.05),
``KEFU_CACHE_AUDIT_SAME_COSINE`` (default 0.85).
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

import numpy as np
from django.db import transaction
from django.db.models import Count

from . import services
from .config import cache_config
from .embeddings import get_embedder
from .intent_model import OTHER, get_intent_model
from .models import CacheAudit, CachedAnswer

log = logging.getLogger(__name__)

#: z for a two-sided 95% interval: the 0.975 quantile of the standard normal distribution.
Z_95 = 1.959963984540054
#: Verdicts that count in the rates, and those of them that are false hits.
COUNTED = (CacheAudit.Verdict.SAME, CacheAudit.Verdict.DIFFERENT, CacheAudit.Verdict.AGENT_WRONG)
FALSE_HITS = (CacheAudit.Verdict.DIFFERENT, CacheAudit.Verdict.AGENT_WRONG)


def audit_rate() -> float:
    """``KEFU_CACHE_AUDIT_RATE``: the share of semantic hits audited (0..1)."""
    return cache_config().audit_rate


def same_cosine() -> float:
    """``KEFU_CACHE_AUDIT_SAME_COSINE``: answer-embedding cosine at or above which two answers are ``same``."""
    return cache_config().audit_same_cosine


# --- Sampled audits ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditSubject:
    """What a pending audit re-asks: the audit row's id, the served ``question``, the cached
    entry's ``locale`` and the FAQ entries its answer was grounded on (``grounded_on``)."""

    audit_id: int
    question: str
    locale: str
    grounded_on: list[int]


def audit_open(*, entry_id: int, question: str, message_id: int | None) -> int | None:
    """Open a ``pending`` audit of cached entry ``entry_id`` served for ``question`` (shopper
    message ``message_id``): the row's id, or ``None`` (nothing written) when the entry is gone."""
    entry = CachedAnswer.objects.filter(id=entry_id).values("id", "question", "answer").first()
    if entry is None:
        return None
    row = CacheAudit.objects.create(
        entry_id=entry_id,
        message_id=message_id,
        question=question,
        cached_question=entry["question"],
        cached_answer=entry["answer"],
        intent=OTHER,
        verdict=CacheAudit.Verdict.PENDING,
    )
    return int(row.pk)


def audit_subject(audit_id: int) -> AuditSubject | None:
    """The pending audit ``audit_id`` to re-answer; ``None`` when it is not pending any more, or
    when its entry was evicted or purged meanwhile (there is no cached answer left to judge: the
    pending row is deleted)."""
    row = (
        CacheAudit.objects.filter(id=audit_id, verdict=CacheAudit.Verdict.PENDING)
        .values("question", "entry_id", "entry__locale", "entry__grounded_on")
        .first()
    )
    if row is None:
        return None
    if row["entry_id"] is None:
        log.info("cache audit %s skipped: its entry no longer exists", audit_id)
        CacheAudit.objects.filter(id=audit_id, verdict=CacheAudit.Verdict.PENDING).delete()
        return None
    return AuditSubject(
        audit_id=audit_id,
        question=row["question"],
        locale=row["entry__locale"] or "en",
        grounded_on=list(row["entry__grounded_on"] or []),
    )


def audit_record(
    *, audit_id: int, fresh: str, tier: str, model: str, question_vector: np.ndarray | None
) -> CacheAudit | None:
    """Judge the fresh answer ``fresh`` (from ``tier`` / ``model``) against the cached one and
    store the verdict on pending audit ``audit_id``; the row, or ``None`` when it is not pending.

    ``question_vector``: the served question's vector as the router embeds it (``(dim,)`` unit
    float32), for the row's intent (:func:`resolve_intent`). The verdict is ``same`` when the
    cosine of the two answers' embeddings (multilingual-e5-small, the cache's own embedder) is at
    least ``KEFU_CACHE_AUDIT_SAME_COSINE``, else ``different``; an empty ``fresh`` is an ``error``.

    The cosine is a proxy, not a judgement of correctness: it measures whether two texts talk
    about the same thing in similar words, and it is cheap (no second model call). Two right
    answers worded differently can score below the threshold (counted as a false hit: the estimate
    leans high), and a contradiction scores above it (missed: the estimate leans low). Measured with
    this embedder against "Yes, we ship the walnut desk to Norway; delivery takes 5-7 business
    days.": a paraphrase 0.973, "Sorry, we do not ship the walnut desk to Norway." 0.893, the same
    sentence with "2-3 business days" 0.986, an unrelated answer (gift cards) 0.800. So the sampled
    rate mostly catches answers about something else; wrong numbers and negations are left to the
    agents' marks (:func:`mark_wrong`). Answers beyond the embedder's 512 tokens are compared on
    their beginning only. An LLM judge or a person would be better and costlier.
    """
    row = CacheAudit.objects.filter(id=audit_id, verdict=CacheAudit.Verdict.PENDING).first()
    if row is None:
        return None
    row.intent = resolve_intent(question_vector)
    row.tier, row.model, row.fresh_answer = tier, model, fresh
    if not fresh.strip():
        return _save_error(row, "empty answer")
    row.similarity = answers_cosine(row.cached_answer, fresh)
    row.verdict = CacheAudit.Verdict.SAME if row.similarity >= same_cosine() else CacheAudit.Verdict.DIFFERENT
    _save(row)
    return row


def audit_error(*, audit_id: int, detail: str, question_vector: np.ndarray | None = None) -> CacheAudit | None:
    """Close pending audit ``audit_id`` as ``error`` (no fresh answer could be had: ``detail`` says
    why, at most 200 characters); the row, or ``None`` when it is not pending."""
    row = CacheAudit.objects.filter(id=audit_id, verdict=CacheAudit.Verdict.PENDING).first()
    if row is None:
        return None
    row.intent = resolve_intent(question_vector)
    return _save_error(row, detail)


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


def answers_cosine(a: str, b: str) -> float:
    """Cosine (-1..1) of the embeddings of two answers (``get_embedder()``, unit rows)."""
    vecs = get_embedder().embed([a, b])
    return float(np.dot(vecs[0], vecs[1]))


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
    entry = CachedAnswer.objects.filter(id=entry_id).first()
    if entry is None:
        return False
    with transaction.atomic():
        CacheAudit.objects.create(
            entry=entry,
            message_id=message_id,
            intent=resolve_intent(entry.vector()),
            question=entry.question,
            cached_question=entry.question,
            cached_answer=entry.answer,
            verdict=CacheAudit.Verdict.AGENT_WRONG,
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


def false_hit_rates(*, start: datetime | None = None, end: datetime | None = None) -> list[IntentRate]:
    """Per intent, from every :class:`CacheAudit` row (or those opened in ``[start, end)``):
    counts, rate and Wilson 95% interval (:class:`IntentRate`), the intent with the most counted
    rows first (then by name).

    Caveat: ``agent_wrong`` rows are not a random sample (agents see some conversations, not a
    draw), so adding them to the sampled rows makes the rate lean high: an upper-leaning estimate,
    which is the safe side for deciding whether the cache may keep serving an intent.
    One aggregate query.
    """
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    rows = CacheAudit.objects.all()
    if start is not None:
        rows = rows.filter(created_at__gte=start)
    if end is not None:
        rows = rows.filter(created_at__lt=end)
    for r in rows.values("intent", "verdict").annotate(k=Count("id")).order_by():
        counts[r["intent"]][r["verdict"]] += int(r["k"])
    out = []
    for intent, by_verdict in counts.items():
        n = sum(by_verdict[v] for v in COUNTED)
        false = sum(by_verdict[v] for v in FALSE_HITS)
        low, high = wilson_interval(false, n)
        out.append(
            IntentRate(
                intent=intent,
                n=n,
                different=by_verdict[CacheAudit.Verdict.DIFFERENT],
                agent_wrong=by_verdict[CacheAudit.Verdict.AGENT_WRONG],
                errors=by_verdict[CacheAudit.Verdict.ERROR],
                rate=false / n if n else 0.0,
                low=low,
                high=high,
            )
        )
    out.sort(key=lambda r: (-r.n, r.intent))
    return out


def forget_questions(*, message_ids: list[int]) -> int:
    """Blank the shopper's question on the audits of ``message_ids`` and unlink them (a purge or
    an erasure of those messages); the verdicts stay, so the false-hit rates do not change.
    Returns how many rows. One statement, none for an empty list."""
    if not message_ids:
        return 0
    return CacheAudit.objects.filter(message_id__in=message_ids).update(question="", message_id=None)


def agent_marks(*, message_ids: list[int]) -> dict[int, str]:
    """Of the shopper messages ``message_ids``, those whose cached answer an agent marked wrong:
    ``{shopper message id: username of the agent}`` (the last mark wins). One query."""
    if not message_ids:
        return {}
    rows = CacheAudit.objects.filter(verdict=CacheAudit.Verdict.AGENT_WRONG, message_id__in=message_ids).order_by("id")
    return {int(r.message_id): r.marked_by for r in rows.only("message_id", "marked_by") if r.message_id is not None}
