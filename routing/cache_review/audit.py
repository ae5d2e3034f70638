"""The router's half of the cache audit: re-answer a sampled semantic hit.

After a semantic hit, ``routing.tasks.maybe_audit`` draws with probability ``KEFU_CACHE_AUDIT_RATE``
(default 0.05); when drawn it opens a ``pending`` audit row (``cache_layer.audit.audit_open``) and
enqueues the Celery task ``routing.tasks.audit_cache_hit`` with the row's id once the surrounding
transaction commits. The task runs :func:`audit_hit`, which asks the tier that would have answered
(:data:`AUDIT_TIER`, with its usual retries and fallback) the served question with the router's own
grounded prompt and no history (a cache hit is only ever served for a standalone question), and
hands the fresh answer to ``cache_layer.audit.audit_record``, which judges it.
"""

from __future__ import annotations

import logging

import numpy as np
from django.conf import settings

from cache_layer import audit as cache_audit
from cache_layer.embeddings import get_embedder
from cache_layer.models import CacheAudit
from lib.text import detect_locale
from routing.decide import answers
from routing.decide.classify import grounding_for
from routing.faq.model import normalise_text
from routing.faq.registry import registry
from routing.models import FaqEntry
from routing.prompt.build import build_messages
from routing.providers.base import ProviderError
from routing.types import ROUTING_MAX_CHARS, CallContext
from routing.upstream.complete import complete_blocking
from routing.upstream.tiers import tier_configured

log = logging.getLogger(__name__)

AUDIT_TIER = "simple"  # the tier the router asks first (routing.decide.strategy.decide)


def question_vector(question: str) -> np.ndarray | None:
    """The question's vector exactly as the router embeds it for the cache (normalised text, first
    ``ROUTING_MAX_CHARS`` characters; see ``routing.decide.classify.classify``)."""
    norm = normalise_text(question[:ROUTING_MAX_CHARS])
    return np.asarray(get_embedder().embed([norm])[0], dtype=np.float32) if norm else None


def router_grounding(question: str, locale: str, grounded_on: list[int]) -> tuple[list[tuple[str, str]], list[int]]:
    """The router's grounding for ``question`` (``routing.decide.classify.grounding_for``: the 3
    closest FAQ entries as (question, answer) pairs, and their ids). A process without a FAQ model
    yet (a Celery worker) loads it first; if that fails, the entries ``grounded_on`` (ids: a
    cached answer's own grounding) are used instead."""
    try:
        registry.reload_if_changed()
    except Exception:  # the model is an optimisation here: fall back to the given grounding
        log.exception("FAQ model could not be loaded; using the entries given instead")
    if registry.model is not None:
        return grounding_for(question[:ROUTING_MAX_CHARS], locale)
    rows = FaqEntry.objects.filter(id__in=grounded_on).order_by("id")
    return [(r.question, answers.fill_placeholders(r.answer, r.locale)) for r in rows], [r.id for r in rows]


def audit_hit(*, audit_id: int) -> CacheAudit | None:
    """Re-answer pending audit ``audit_id``'s served question and record how the fresh answer
    compares (``cache_layer.audit.audit_record``); the row, or ``None`` when the audit is not
    pending or its entry no longer exists (evicted or purged before the audit ran).

    ``error`` rows (with ``detail``): no tier is configured, the call failed, or the answer was
    empty. Never raises: every failure is an ``error`` row. Blocking (the call runs on a private
    event loop, ``routing.upstream.complete.complete_blocking``)."""
    subject = cache_audit.audit_subject(audit_id)
    if subject is None:
        return None
    vector: np.ndarray | None = None
    try:
        vector = question_vector(subject.question)
        if not tier_configured(AUDIT_TIER):
            return cache_audit.audit_error(
                audit_id=audit_id, detail="no remote tier configured", question_vector=vector
            )
        locale = detect_locale(subject.question, subject.locale)
        grounding, _ids = router_grounding(subject.question, locale, subject.grounded_on)
        fresh = complete_blocking(
            messages=build_messages(grounding=grounding, history=[], text=subject.question, locale=locale),
            tier=AUDIT_TIER,
            context=CallContext(purpose="audit"),  # an audit answers no shopper: no conversation
            max_tokens=settings.KEFU_LLM_MAX_TOKENS,
        )
    except ProviderError as e:
        return cache_audit.audit_error(audit_id=audit_id, detail=f"upstream: {e.code}", question_vector=vector)
    except Exception as e:  # the task's edge: the audit is a measurement, its failure a row
        log.exception("cache audit %s failed", audit_id)
        return cache_audit.audit_error(audit_id=audit_id, detail=f"{type(e).__name__}: {e}", question_vector=vector)
    return cache_audit.audit_record(
        audit_id=audit_id, fresh=fresh.text, tier=fresh.tier, model=fresh.model, question_vector=vector
    )
