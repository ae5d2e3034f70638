"""The router's half of verified promotion (``cache_layer.promotion`` has the rest): after a
remote answer to a question the cache missed, find its near miss and have the ``simple`` tier
judge, off the shopper's path, whether the two questions need the same answer.

``routing.tasks.maybe_judge_async`` is called by the answering path once the answer reached the
shopper; it looks for a near miss (``cache_layer.services.near_miss``), opens a pending
``CacheJudgement`` and enqueues ``routing.tasks.judge_near_miss``, which runs :func:`judge`.
No ``simple`` tier configured, or ``KEFU_CACHE_PROMOTION`` off: nothing is judged (fail closed).
"""

from __future__ import annotations

import logging

from django.conf import settings

from cache_layer import promotion as cache_promotion
from cache_layer.models import CacheJudgement
from routing.providers.base import ProviderError
from routing.types import CallContext
from routing.upstream.complete import complete_blocking
from routing.upstream.tiers import tier_configured

log = logging.getLogger(__name__)

JUDGE_TIER = "simple"
#: The judge's instructions. One word back, so a verdict costs a handful of completion tokens.
JUDGE_PROMPT = (
    "You compare two questions a shopper might send to an online store's customer service. "
    "Reply SAME if one answer, word for word, would answer both correctly and completely. "
    "Reply DIFFERENT if they ask about a different product, option, action, amount, time or "
    "anything else that could change the answer. Reply with the one word SAME or DIFFERENT."
)


def enabled() -> bool:
    """Whether near misses are judged: ``KEFU_CACHE_PROMOTION`` on and the judge's tier configured."""
    return bool(settings.KEFU_CACHE_PROMOTION) and tier_configured(JUDGE_TIER)


def parse_verdict(text: str) -> str | None:
    """``"same"`` / ``"different"`` from the judge's reply (its first word, any case, trailing
    punctuation ignored; ``是``/``相同`` and ``否``/``不同`` too), else ``None``."""
    words = text.strip().split()
    first = words[0].strip(".,!:;\"'*").upper() if words else ""
    if first == "SAME" or text.strip().startswith(("相同", "是")):
        return CacheJudgement.Verdict.SAME
    if first == "DIFFERENT" or text.strip().startswith(("不同", "否")):
        return CacheJudgement.Verdict.DIFFERENT
    return None


def judge(*, judgement_id: int) -> CacheJudgement | None:
    """Ask the judge about pending judgement ``judgement_id`` and record its verdict
    (``cache_layer.promotion.judgement_record``, which promotes on ``same``). The row, or ``None``
    when it is not pending or its entry is gone. Never raises: no tier, a failed call or a reply
    that is neither word is an ``error`` verdict with its ``detail`` (nothing promoted).
    Blocking (``routing.upstream.complete.complete_blocking``)."""
    subject = cache_promotion.judgement_subject(judgement_id)
    if subject is None:
        return None
    if not enabled():
        return cache_promotion.judgement_record(
            judgement_id=judgement_id, verdict=CacheJudgement.Verdict.ERROR, detail="no simple tier configured"
        )
    try:
        reply = complete_blocking(
            messages=[
                {"role": "system", "content": JUDGE_PROMPT},
                {"role": "user", "content": f"Question 1: {subject.question}\nQuestion 2: {subject.cached_question}"},
            ],
            tier=JUDGE_TIER,
            context=CallContext(purpose="judge"),  # judges no shopper's message: no conversation
            max_tokens=4,
            temperature=0.0,
        )
    except ProviderError as e:
        return cache_promotion.judgement_record(
            judgement_id=judgement_id, verdict=CacheJudgement.Verdict.ERROR, detail=f"upstream: {e.code}"
        )
    except Exception as e:  # the task's edge: a judgement is an optimisation, its failure a row
        log.exception("cache judgement %s failed", judgement_id)
        return cache_promotion.judgement_record(
            judgement_id=judgement_id, verdict=CacheJudgement.Verdict.ERROR, detail=f"{type(e).__name__}: {e}"
        )
    verdict = parse_verdict(reply.text)
    if verdict is None:
        return cache_promotion.judgement_record(
            judgement_id=judgement_id,
            verdict=CacheJudgement.Verdict.ERROR,
            judge_model=reply.model,
            detail=f"unreadable reply ({len(reply.text)} characters)",
        )
    return cache_promotion.judgement_record(judgement_id=judgement_id, verdict=verdict, judge_model=reply.model)
