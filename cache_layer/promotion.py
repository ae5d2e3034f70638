"""Verified promotion: near misses judged off the shopper's path, promoted when they need the
same answer (after Apple's Krites: a judge model confirms a near miss before the cache serves it,
and vCache's per-entry thresholds: what was verified moves that entry's own bar).

The flow, with the router's half in ``routing.cache_review.promotion`` and ``routing.tasks``:

1. A remote answer was made for a question the cache missed. :func:`cache_layer.services.near_miss`
   finds the closest live entry that no rule let answer it: cosine at least
   ``KEFU_CACHE_PROMOTE_MIN_COSINE`` (0.80), and the hard guard and every slot agree
   (``similarity.promotable``: a judge never overrules numbers, negation or slots).
2. :func:`judgement_open` records the pair (``CacheJudgement``, ``pending``; one judgement per
   entry and question, ever) and the router's task asks the ``simple`` tier whether the two
   questions need the same answer.
3. :func:`judgement_record` stores the verdict. ``same`` promotes (:func:`promote`): the entry's
   ``verified_cosine`` falls to the pair's cosine, so new questions at or above it that pass the
   hard guard and agree on every slot are served the entry (hit rule ``verified``), and the
   judged question gets an alias entry with the entry's answer and expiry (unless one is live).
   A ``different`` verdict at or above a verified cosine withdraws it (conflicting evidence:
   trust neither).
4. :func:`judgement_revert` (the admin's action) undoes a promotion: the alias is evicted and the
   entry's verified cosine recomputed from the judgements left.

No ``simple`` tier configured: nothing is judged, nothing promoted (the router checks).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

import numpy as np
from django.db import transaction
from django.utils import timezone

from . import services
from .models import CachedAnswer, CacheJudgement
from .normalise import exact_key_text

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JudgementSubject:
    """What the judge is shown: the new ``question`` and the ``cached_question``, and the entry's
    ``locale`` (the language the questions are in)."""

    question: str
    cached_question: str
    locale: str


def _key_hash(question: str) -> str:
    return hashlib.sha256(exact_key_text(question).encode()).hexdigest()


def judgement_open(*, scope: str, entry_id: int, question: str, similarity: float) -> int | None:
    """Record a pending judgement of ``question`` against entry ``entry_id`` (cosine
    ``similarity``); its id, or ``None`` when the entry is gone or this pair was judged before
    (each pair is judged once: a judge's verdict does not change by asking again)."""
    entry = CachedAnswer.objects.filter(pk=entry_id).values_list("question", "answer").first()
    if entry is None:
        return None
    row, created = CacheJudgement.objects.get_or_create(
        entry_id=entry_id,
        key_hash=_key_hash(question),
        defaults={
            "scope": scope,
            "question": question,
            "cached_question": entry[0],
            "cached_answer": entry[1],
            "similarity": float(similarity),
        },
    )
    return row.pk if created else None


def judgement_subject(judgement_id: int) -> JudgementSubject | None:
    """The pending judgement's questions, or ``None`` when it is not pending (judged already) or
    its entry is gone."""
    row = (
        CacheJudgement.objects.filter(pk=judgement_id, verdict=CacheJudgement.Verdict.PENDING, entry__isnull=False)
        .select_related("entry")
        .first()
    )
    if row is None or row.entry is None:
        return None
    return JudgementSubject(question=row.question, cached_question=row.cached_question, locale=row.entry.locale)


def judgement_record(
    *, judgement_id: int, verdict: str, judge_model: str = "", detail: str = "", embedding: np.ndarray | None = None
) -> CacheJudgement | None:
    """Store the judge's ``verdict`` (``same``, ``different`` or ``error`` with ``detail``) on a
    pending judgement and act on it (see the module docstring). ``embedding``: the judged
    question's vector, for its alias (computed when ``None``). Returns the row, or ``None`` when
    it does not exist; a judgement that is no longer pending is returned unchanged. Raises
    ``ValueError`` for another verdict."""
    if verdict not in (CacheJudgement.Verdict.SAME, CacheJudgement.Verdict.DIFFERENT, CacheJudgement.Verdict.ERROR):
        raise ValueError(f"not a judge's verdict: {verdict!r}")
    with transaction.atomic():
        row = CacheJudgement.objects.select_for_update().filter(pk=judgement_id).first()
        if row is None or row.verdict != CacheJudgement.Verdict.PENDING:
            return row
        row.verdict, row.judge_model, row.detail = verdict, judge_model[:128], detail[:200]
        row.judged_at = timezone.now()
        row.save(update_fields=["verdict", "judge_model", "detail", "judged_at"])
    if verdict == CacheJudgement.Verdict.SAME and row.entry_id is not None:
        alias = promote(entry_id=row.entry_id, question=row.question, similarity=row.similarity, embedding=embedding)
        if alias is not None:
            CacheJudgement.objects.filter(pk=row.pk).update(alias_id=alias)
            row.alias_id = alias
    elif verdict == CacheJudgement.Verdict.DIFFERENT and row.entry_id is not None:
        _recompute_verified(row.entry_id, scope=row.scope)
    return row


def promote(*, entry_id: int, question: str, similarity: float, embedding: np.ndarray | None = None) -> int | None:
    """Let entry ``entry_id`` answer ``question`` (judged the same at cosine ``similarity``): lower
    its ``verified_cosine`` to ``similarity`` and store an alias entry for ``question`` with the
    entry's answer, route, model, grounding and expiry. Returns the alias's id, or ``None`` when
    none was made (the entry is gone or expired, a live entry for ``question`` exists, or the
    policy refused the question)."""
    entry = CachedAnswer.objects.filter(pk=entry_id, expires_at__gt=timezone.now()).first()
    if entry is None:
        return None
    _recompute_verified(entry_id, scope=entry.scope, extra_same=similarity)
    stored = services.store(
        question=question,
        answer=entry.answer,
        scope=entry.scope,
        embedding=embedding,
        route=entry.route,
        model=entry.model,
        grounded_on=list(entry.grounded_on or []),
        prompt_version=entry.system_prompt_version,
        cut=False,
        locale=entry.locale,
    )
    if not stored:
        return None
    alias = CachedAnswer.objects.filter(scope=entry.scope, key_hash=_key_hash(question)).first()  # indexed
    if alias is None:
        return None
    CachedAnswer.objects.filter(pk=alias.pk).update(expires_at=entry.expires_at)  # it lives as long as the entry
    return alias.pk


def _recompute_verified(entry_id: int, *, scope: str, extra_same: float | None = None) -> None:
    """The entry's verified cosine from its judgements: the lowest cosine of a ``same`` verdict
    not reverted (and ``extra_same``, a promotion not yet recorded as a judgement) that lies above
    every ``different`` verdict's cosine; ``None`` when there is none."""
    rows = CacheJudgement.objects.filter(entry_id=entry_id, reverted_at__isnull=True).values_list(
        "verdict", "similarity"
    )
    same = [s for v, s in rows if v == CacheJudgement.Verdict.SAME]
    if extra_same is not None:
        same.append(extra_same)
    refuted = max((s for v, s in rows if v == CacheJudgement.Verdict.DIFFERENT), default=-2.0)
    above = [s for s in same if s > refuted]
    CachedAnswer.objects.filter(pk=entry_id).update(verified_cosine=min(above) if above else None)
    transaction.on_commit(lambda: services.forget_verified(scope), robust=True)  # ``scope``: the entry's


def judgement_revert(*, judgement_id: int, by: str) -> bool:
    """Undo a promotion (a person's decision, from the admin): evict its alias, mark the judgement
    reverted by ``by`` and recompute the entry's verified cosine. ``False`` when the judgement is
    not a ``same`` verdict or was reverted already."""
    row = CacheJudgement.objects.filter(pk=judgement_id).first()
    if row is None or row.verdict != CacheJudgement.Verdict.SAME or row.reverted_at is not None:
        return False
    if row.alias_id is not None:
        services.evict_entry(row.alias_id)
    CacheJudgement.objects.filter(pk=row.pk).update(reverted_at=timezone.now(), reverted_by=by[:150])
    if row.entry_id is not None:
        _recompute_verified(row.entry_id, scope=row.scope)
    log.info("cache promotion %s reverted", judgement_id)
    return True
