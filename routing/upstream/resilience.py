"""Keep a remote answer coming when an upstream fails before its first token, and log every call.

``stream_with_fallback(call)`` streams a :class:`~routing.upstream.call.Call` from its tier; on a transient failure
before any text was sent (429, 5xx, timeout, dropped connection) it retries the same tier with
exponential backoff and full jitter (honouring ``retry-after``), then falls back to the next
configured tier (simple -> medium -> complex). Nothing is retried once text has reached the
shopper: a stream cut after its first token is the caller's to end as ``cut``.

The first-token budget (``KEFU_LLM_FIRST_TOKEN_TIMEOUT_S``) is the message's, across retries and
tiers: each attempt gets an equal share of what is left among the tiers still to try. A
``retry-after`` longer than the retry cap or the time left is not waited for: the tier is skipped,
in every process, for that long (``routing.upstream.blocks``). A permanent error is never retried
and goes on only to a tier where it could turn out differently (other credentials, other model).

Before each attempt a tier must pass three gates, else it is skipped (the next tier is tried at
once; the last tier waits when its gate opens before the first-token deadline):

1. the upstream's own rate-limit headers (``routing.providers.ratelimits.book``): it said 0
   requests or tokens remain until its reset;
2. the circuit breaker of the upstream deployment (``routing.upstream.breaker``): open after
   ``KEFU_BREAKER_FAILURES`` consecutive failures, for ``KEFU_BREAKER_COOLDOWN_S``;
3. the tier's client-side limits (``routing.upstream.throttle``): concurrency, requests and tokens per minute;
4. the spend budgets (``routing.upstream.budgets``): the call's maximum cost is held on every budget that
   pays for it (the payer's, the tier's store-wide cap) or the tier is skipped (``budget``); the
   hold is settled with the attempt's ledger row.

Fallbacks go only to tiers the budgets left open to the answer (``Call.tiers_allowed``).

The call is never changed: the deployment that answered comes back as a value in the stream, an
``Answered`` item just before that attempt's first item (``routing.upstream.call``).

A tier whose canary candidate takes this call (``routing.upstream.canary``: a shopper's answer in a
conversation the canary's share gives it) is tried on its candidate first: one attempt, never
retried (the tier's own model is the sure thing the shopper should not wait behind), then the
tier's own model, then the next tier as usual. The candidate has its own breaker and rate-limit
book (another upstream key), its own throttle slots and its own prices on its ledger rows
(``variant`` ``candidate``).

Every attempt, skipped ones included, becomes a row of the cost ledger (``routing.upstream.ledger``,
``UpstreamCall``) with its outcome: ``ok``, ``retried``, ``fell_back`` or ``failed``.

The backoff is "full jitter" from the AWS Architecture Blog, "Exponential Backoff And Jitter"
(2015): sleep ``uniform(0, min(cap, base * 2**attempt))`` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncGenerator
from dataclasses import replace
from datetime import datetime
from typing import Any

from django.conf import settings
from django.utils import timezone

from routing.providers.base import ChatRequest, Provider, ProviderError, StreamDone, TextDelta
from routing.providers.ratelimits import UpstreamKey
from routing.types import CallContext
from routing.upstream import blocks as upstream_blocks
from routing.upstream import breaker as breakers
from routing.upstream import budgets, canary, ledger, throttle
from routing.upstream.breaker import BREAKER_FAILURES
from routing.upstream.call import Answered, Call, CallItem
from routing.upstream.ledger import Attempt
from routing.upstream.tiers import (
    CANDIDATE,
    CURRENT,
    TIER_ORDER,
    candidate_configured,
    check_tiers_async,
    deployment,
    provider_for,
    tier_configured,
    tier_model,
    tier_settings,
)

log = logging.getLogger(__name__)

RETRYABLE = {"rate_limited", "server", "connection", "timeout", "malformed"}


def backoff_s(attempt: int, *, base_s: float, cap_s: float, retry_after_s: float | None) -> float:
    """Seconds to wait before retry number ``attempt`` (0-based): the server's ``retry-after``
    when it gave one (capped at ``cap_s``), else full jitter ``uniform(0, min(cap, base * 2**n))``."""
    if retry_after_s is not None:
        return max(0.0, min(cap_s, retry_after_s))
    return random.uniform(0.0, min(cap_s, base_s * (2**attempt)))


def fallback_tiers(tier: str, allowed: tuple[str, ...] | None = None) -> list[str]:
    """``tier`` followed by the tiers above it, in ``TIER_ORDER``, that are configured on their
    own (``TierConfig.dedicated``: a tier that only inherits ``OPENAI_*`` would send the store's
    question to a model it never chose) and may be called (``tier_configured``); of those only
    the ``allowed`` ones when given (``tier`` itself is always first)."""
    order = list(TIER_ORDER)
    start = order.index(tier) if tier in order else 0
    return [tier] + [
        t
        for t in order[start + 1 :]
        if tier_configured(t) and tier_settings(t).dedicated and (allowed is None or t in allowed)
    ]


async def deployments(
    tiers: list[str], ctx: CallContext, *, answered_by: tuple[str, str] | None = None
) -> list[tuple[str, str]]:
    """The (tier, variant) pairs to try in order for ``tiers``: each tier's canary candidate
    first when the canary takes this call (``routing.upstream.canary.variant_async``), then its own model.
    A store tool's round (purpose ``tool``) goes on where the answer's last round was answered
    (``answered_by``, its tier and variant): a model that asked for a tool reads its result."""
    steps: list[tuple[str, str]] = []
    for tier in tiers:
        if answered_by is not None and ctx.purpose == "tool" and tier == answered_by[0]:
            candidate = answered_by[1] == CANDIDATE
        else:
            candidate = await canary.variant_async(tier, ctx) == CANDIDATE
        if candidate:
            steps.append((tier, CANDIDATE))
        steps.append((tier, CURRENT))
    return steps


def upstream_key(tier: str, provider: Provider, model: str, variant: str = CURRENT) -> UpstreamKey:
    """The (base URL, API key, model) a tier's calls go to: the provider's own key when it has
    one (``OpenAIProvider.upstream_key``, the one its rate-limit headers are filed under), else
    the settings of the tier's ``variant``."""
    own = getattr(provider, "upstream_key", None)
    if callable(own):
        key: UpstreamKey = own(model)
        return key
    cfg = deployment(tier, variant)
    return (cfg.base_url, cfg.api_key, model)


async def _gate(
    tier: str, key: UpstreamKey, request: ChatRequest, ctx: CallContext, variant: str = CURRENT
) -> tuple[str, float | None] | budgets.Hold | None:
    """Pass the four gates of the module docstring. A ``Hold`` or None: the caller may call, holds
    one ``throttle`` slot (release it), possibly the breaker's half-open trial (give a verdict or
    release it) and the budgets' hold (settle it with the ledger row; None: no budget applies).
    Otherwise (the skip reason, seconds until the gate may open or None)."""
    blocked_s = await upstream_blocks.blocked_for_s(key)
    if blocked_s > 0:
        return "upstream_limit", blocked_s
    breaker = breakers.breaker_for(key)
    if not breaker.allow():
        return "circuit_open", breaker.retry_in_s()
    refusal = await throttle.admit(
        tier, tokens=throttle.estimate_tokens(request.messages, request.max_tokens), variant=variant
    )
    if refusal is not None:
        breaker.release()
        return refusal.reason, refusal.retry_in_s
    try:
        return await budgets.reserve_async(ctx.payer, tier, ledger.max_cost_usd(tier, request, variant))
    except budgets.BudgetRefused as e:
        log.info("tier %s not called: %s", tier, e)
        throttle.release(tier, variant)
        breaker.release()
        return "budget", None
    except Exception:
        # The budgets' database is unreachable: the call goes ahead unheld (the ledger and the
        # next reservation still count it), as an answer matters more than a cap's last cent.
        log.warning("holding the spend budgets of a %s call failed; called unheld", tier, exc_info=True)
        return None


async def stream_with_fallback(call: Call) -> AsyncGenerator[CallItem, None]:
    """Stream ``call.request``; gates, retries and tier fallback as in the module docstring.

    Yields the provider's items (``TextDelta``, ``ToolCall``, one ``StreamDone``), each attempt
    that answers preceded by an :class:`~routing.upstream.call.Answered` naming its tier,
    deployment (``variant``), request (model set) and provider; ``call`` itself is never changed.
    ``call.context`` (conversation, shopper message, gateway key, purpose) is stored on the ledger
    rows. Raises the last ``ProviderError`` when every attempt failed or was skipped, or a
    ``ProviderError`` with ``after_first_token=True`` when a stream broke after sending text.
    """
    ctx = call.context
    retries = settings.KEFU_LLM_RETRIES
    deadline = time.monotonic() + settings.KEFU_LLM_FIRST_TOKEN_TIMEOUT_S
    last: ProviderError | None = None
    writing: asyncio.Task[None] | None = None  # the previous ledger row's write (None: none, or lost)
    opened = (call.tier, call.variant)  # what call.provider was made for
    await check_tiers_async()  # no deployment called before its GET /models answered
    steps = [
        (tier, variant)
        for tier, variant in await deployments(fallback_tiers(call.tier, call.tiers_allowed), ctx, answered_by=opened)
        # A tier (or candidate) whose model its endpoint does not list, or whose key it refused, is
        # never sent a request (routing.upstream.listing).
        if tier_configured(tier) and (variant == CURRENT or candidate_configured(tier))
    ]
    if not steps:
        raise ProviderError(f"the {call.tier} tier is off (see /healthz)", code="auth", permanent=True)
    # What a permanent failure ruled out for this message: (base URL, API key) after credentials
    # were refused, (base URL, API key, model) after the request itself was.
    refused: set[tuple[str, ...]] = set()
    stop = False  # a failure no other tier can mend, or no time left: try nothing more
    for index, (tier, variant) in enumerate(steps):
        if stop:
            break
        has_next = index < len(steps) - 1
        base_request = replace(call.request, model=tier_model(tier, variant))
        provider = (
            call.provider if (tier, variant) == opened and call.provider is not None else provider_for(tier, variant)
        )
        key = upstream_key(tier, provider, base_request.model, variant)
        # A candidate gets one attempt: its tier's own model follows at once.
        tries = retries + 1 if variant == CURRENT else 1
        for attempt in range(tries):
            # The message's first-token budget holds across retries and tiers: this attempt gets
            # an equal share of what is left among the deployments still to try (or the tier's own
            # first-token timeout when shorter), so an upstream that hangs leaves time to the next.
            left_s = deadline - time.monotonic()
            request = replace(base_request, first_token_within_s=left_s / (len(steps) - index))

            started_at = timezone.now()
            hold: budgets.Hold | None = None

            # Bound as defaults: each attempt's row names that attempt, whenever it is called.
            def row(
                outcome: str,
                *,
                _tier: str = tier,
                _variant: str = variant,
                _attempt: int = attempt,
                _started_at: datetime = started_at,
                _model: str = request.model,
                **fields: Any,
            ) -> None:
                """Record this attempt's ledger row (in the background, after the previous one),
                settling the attempt's budget hold with it."""
                nonlocal writing, hold
                fields.setdefault("model", _model)
                fields.setdefault("hold", hold)
                hold = None
                writing = ledger.record_attempt(
                    Attempt(
                        context=ctx,
                        tier=_tier,
                        variant=_variant,
                        attempt=_attempt + 1,
                        outcome=outcome,
                        started_at=_started_at,
                        **fields,
                    ),
                    after=writing,
                )

            if left_s <= 0:
                log.warning("tier %s not tried: the first-token budget is spent", tier)
                last = last or ProviderError("the first-token budget is spent", code="timeout", permanent=False)
                row("failed", error_code="budget_spent")
                stop = True
                break
            if key[:2] in refused or key in refused:
                # The same upstream already refused these credentials, or this model the request:
                # sending it again cannot turn out differently.
                row("fell_back" if has_next else "failed", error_code=last.code if last else "refused")
                break

            skip = await _gate(tier, key, request, ctx, variant)
            while (
                isinstance(skip, tuple)
                and not has_next
                and skip[1] is not None
                and time.monotonic() + skip[1] < deadline
            ):
                await asyncio.sleep(skip[1])  # the last tier: its gate opens before the deadline
                skip = await _gate(tier, key, request, ctx, variant)
            if isinstance(skip, tuple):
                reason = skip[0]
                log.warning("tier %s (%s) skipped: %s", tier, variant, reason)
                last = ProviderError(
                    f"tier {tier} skipped: {reason}",
                    permanent=False,
                    code="server" if reason == "circuit_open" else "budget" if reason == "budget" else "rate_limited",
                )
                row("fell_back" if has_next else "failed", error_code=reason)
                break

            hold = skip
            breaker = breakers.breaker_for(key)
            started = time.perf_counter()
            texts: list[str] = []
            ttft_ms: float | None = None
            done: StreamDone | None = None
            verdict = False
            answered = False
            try:
                async for item in provider.stream(request):
                    if isinstance(item, TextDelta) and item.text:
                        if ttft_ms is None:
                            ttft_ms = (time.perf_counter() - started) * 1000
                        texts.append(item.text)
                    elif isinstance(item, StreamDone):
                        done = item
                    if not answered:
                        # Said before the attempt's first item: a stream cut after it still names
                        # its deployment, and a store tool's next round starts there (the provider
                        # goes with it, that deployment's own upstream).
                        answered = True
                        yield Answered(tier=tier, variant=variant, request=request, provider=provider)
                    yield item
            except ProviderError as e:
                latency_ms = (time.perf_counter() - started) * 1000
                if e.code in BREAKER_FAILURES:
                    breaker.record_failure()
                    verdict = True
                # Without an HTTP status the request reached the upstream and broke (timeout,
                # dropped connection, bad chunk): it may be billed, so its tokens are counted.
                billed: dict[str, Any] = (
                    {"count_messages": request.messages, "received_text": "".join(texts)} if e.status is None else {}
                )
                if texts or e.after_first_token:
                    row(
                        "failed",
                        ttft_ms=ttft_ms,
                        latency_ms=latency_ms,
                        error_code=e.code,
                        http_status=e.status,
                        **billed,
                    )
                    raise
                last = e
                log.warning(
                    "tier %s (%s) failed before its first token (%s, attempt %d)", tier, variant, e.code, attempt + 1
                )
                wait: float | None = None
                if (
                    e.code == "rate_limited"
                    and e.retry_after_s is not None
                    and (
                        e.retry_after_s > settings.KEFU_LLM_RETRY_CAP_S
                        or time.monotonic() + e.retry_after_s >= deadline
                    )
                ):
                    # Longer than this message can wait: skip the tier, and keep it skipped for
                    # as long as the upstream asked, in every process (routing.upstream.blocks).
                    await upstream_blocks.block(key, e.retry_after_s)
                elif e.code == "timeout" and has_next:
                    pass  # a tier too slow to start: the next tier now beats a second wait here
                elif not e.permanent and e.code in RETRYABLE and attempt < tries - 1:
                    wait = backoff_s(
                        attempt,
                        base_s=settings.KEFU_LLM_RETRY_BASE_S,
                        cap_s=settings.KEFU_LLM_RETRY_CAP_S,
                        retry_after_s=e.retry_after_s,
                    )
                    if time.monotonic() + wait >= deadline:
                        wait = None  # waiting would cost more than trying the next tier now
                if e.permanent:
                    # Never retried; sent on only where it could turn out differently: refused
                    # credentials to another upstream or key, a refused request to another model.
                    refused.add(key[:2] if e.code == "auth" else key)
                outcome = "retried" if wait is not None else "fell_back" if has_next else "failed"
                row(outcome, latency_ms=latency_ms, error_code=e.code, http_status=e.status, **billed)
                if wait is None:
                    break
                await asyncio.sleep(wait)
                continue
            except BaseException as e:
                # The caller stopped reading (GeneratorExit, cancellation) or something broke
                # that is not the upstream's fault: the call still happened, and may be billed.
                latency_ms = (time.perf_counter() - started) * 1000
                if done is not None:  # stopped right after the end: a complete answer
                    breaker.record_success()
                    verdict = True
                    row(
                        "ok",
                        usage=done.usage,
                        model=done.model or request.model,
                        ttft_ms=done.ttft_ms,
                        latency_ms=done.latency_ms,
                    )
                else:
                    abandoned = isinstance(e, (GeneratorExit, asyncio.CancelledError))
                    row(
                        "failed",
                        ttft_ms=ttft_ms,
                        latency_ms=latency_ms,
                        error_code="abandoned" if abandoned else "internal",
                        count_messages=request.messages,
                        received_text="".join(texts),
                    )
                raise
            finally:
                throttle.release(tier, variant)
                if not verdict:
                    breaker.release()
            breaker.record_success()
            usage = done.usage if done is not None else None
            row(
                "ok",
                usage=usage,
                model=(done.model if done is not None else "") or request.model,
                ttft_ms=done.ttft_ms if done is not None else ttft_ms,
                latency_ms=done.latency_ms if done is not None else (time.perf_counter() - started) * 1000,
                count_messages=None if usage is not None else request.messages,
                received_text="".join(texts),
            )
            return
    assert last is not None
    raise last
