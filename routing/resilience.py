"""Keep a remote answer coming when an upstream fails before its first token.

``stream_with_fallback(decision)`` streams from the decision's tier; on a transient failure
before any text was sent (429, 5xx, timeout, dropped connection) it retries the same tier with
exponential backoff and full jitter (honouring ``retry-after``), then falls back to the next
configured tier (simple -> medium -> complex). Nothing is retried once text has reached the
shopper: a stream cut after its first token is the caller's to end as ``cut``.

The backoff is "full jitter" from the AWS Architecture Blog, "Exponential Backoff And Jitter"
(2015): sleep ``uniform(0, min(cap, base * 2**attempt))`` seconds.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import TYPE_CHECKING

from django.conf import settings

from .providers.base import ProviderError, StreamDone, TextDelta

if TYPE_CHECKING:
    from .strategy import Decision

log = logging.getLogger(__name__)

TIER_ORDER = ("simple", "medium", "complex")
RETRYABLE = {"rate_limited", "server", "connection", "timeout", "malformed"}


def backoff_s(attempt: int, *, base_s: float, cap_s: float, retry_after_s: float | None) -> float:
    """Seconds to wait before retry number ``attempt`` (0-based): the server's ``retry-after``
    when it gave one (capped at ``cap_s``), else full jitter ``uniform(0, min(cap, base * 2**n))``."""
    if retry_after_s is not None:
        return max(0.0, min(cap_s, retry_after_s))
    return random.uniform(0.0, min(cap_s, base_s * (2**attempt)))


def fallback_tiers(tier: str) -> list[str]:
    """``tier`` followed by the configured tiers above it, in ``TIER_ORDER``."""
    from .strategy import tier_configured

    order = list(TIER_ORDER)
    start = order.index(tier) if tier in order else 0
    return [tier] + [t for t in order[start + 1:] if tier_configured(t)]


async def stream_with_fallback(decision: Decision) -> AsyncIterator[TextDelta | StreamDone]:
    """Stream ``decision.request``; retries and tier fallback as in the module docstring.

    Updates ``decision.tier``, ``decision.route`` and ``decision.request.model`` to the tier that
    answered.
    Raises the last ``ProviderError`` when every attempt failed, or a ``ProviderError`` with
    ``after_first_token=True`` when a stream broke after sending text.
    """
    from .strategy import _provider

    assert decision.request is not None and decision.tier is not None
    retries = settings.KEFU_LLM_RETRIES
    deadline = time.monotonic() + settings.KEFU_LLM_FIRST_TOKEN_TIMEOUT_S
    last: ProviderError | None = None
    for tier in fallback_tiers(decision.tier):
        request = replace(decision.request, model=settings.KEFU_TIERS[tier]["model"])
        provider = decision.provider if tier == decision.tier and decision.provider is not None else _provider(tier)
        for attempt in range(retries + 1):
            decision.tier, decision.route, decision.request = tier, f"llm.{tier}", request
            sent_text = False
            try:
                async for item in provider.stream(request):
                    if isinstance(item, TextDelta) and item.text:
                        sent_text = True
                    yield item
                return
            except ProviderError as e:
                if sent_text or e.after_first_token:
                    raise
                last = e
                log.warning("tier %s failed before its first token (%s, attempt %d)", tier, e.code, attempt + 1)
                if e.permanent or e.code not in RETRYABLE or attempt == retries:
                    break
                wait = backoff_s(attempt, base_s=settings.KEFU_LLM_RETRY_BASE_S, cap_s=settings.KEFU_LLM_RETRY_CAP_S,
                                 retry_after_s=e.retry_after_s)
                if time.monotonic() + wait >= deadline:
                    break  # waiting would cost more than trying the next tier now
                await asyncio.sleep(wait)
    assert last is not None
    raise last
