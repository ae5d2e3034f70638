"""Prices, costs and the cost ledger. Money is ``Decimal`` USD; prices are USD per million tokens,
per tier, from ``settings.KEFU_TIERS`` (defaults: the providers' list prices, see config/settings.py),
and per tier's canary candidate (``KEFU_<TIER>_CANARY_PRICE_*``, default the tier's;
``routing.upstream.tiers.deployment``).

The ledger (``routing.models.UpstreamCall``) gets one row per attempt to call a remote tier,
written by ``record_attempt`` from ``routing.upstream.resilience``. Writing never holds up an answer: the
row is written by a background task (token counting in a worker thread, the insert through
``database_sync_to_async``), so neither the event loop nor the next attempt's first token waits
for it. ``flush()`` waits for the rows still being written (tests, shutdown).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from django.conf import settings
from django.utils import timezone

from lib import sandbox
from lib.tokens import count_tokens
from routing.models import UpstreamCall
from routing.providers.base import ChatRequest, StreamDone, Usage
from routing.types import AnswerRecord, CallContext
from routing.upstream import budgets, canary
from routing.upstream.breaker import BREAKER_FAILURES
from routing.upstream.tiers import CANDIDATE, CURRENT, deployment, tier_model
from routing.upstream.tokens import PromptCounter, text_tokens

log = logging.getLogger(__name__)

MTOK = Decimal(1_000_000)
USD_PLACES = Decimal("0.000001")


def cost_usd(
    *, tier: str, prompt_tokens: int, completion_tokens: int, cached_prompt_tokens: int = 0, variant: str = CURRENT
) -> Decimal:
    """Cost of one call in USD (6 decimals): uncached input x input price + cached input x cached
    price + output x output price, each price per million tokens, at the prices of ``tier``'s
    ``variant`` (its own model's, or its candidate's). Raises ``KeyError`` for an unknown tier."""
    t = deployment(tier, variant)
    uncached = max(0, prompt_tokens - cached_prompt_tokens)
    total = (
        Decimal(uncached) * Decimal(str(t.price_input_per_mtok))
        + Decimal(cached_prompt_tokens) * Decimal(str(t.price_cached_input_per_mtok))
        + Decimal(completion_tokens) * Decimal(str(t.price_output_per_mtok))
    ) / MTOK
    return total.quantize(USD_PLACES, rounding=ROUND_HALF_UP)


def max_cost_usd(tier: str, request: ChatRequest, variant: str = CURRENT) -> Decimal:
    """The most a call of ``tier`` (its ``variant``) with ``request`` can cost, USD (what a spend budget holds
    before it starts, ``routing.upstream.budgets.reserve``): :func:`cost_usd` of its prompt, uncached
    (counted with the tier model's tokenizer, or estimated at ceil(UTF-8 bytes / 3) while it
    loads: ``routing.upstream.tokens.PromptCounter``), and of ``max_tokens`` completion tokens
    (``KEFU_LLM_MAX_TOKENS`` when the request sets none). Safe on the event loop.
    Raises ``KeyError`` for an unknown tier."""
    counter = PromptCounter(tier_model(tier, variant))
    prompt = counter.priming
    for m in request.messages:
        content = m.get("content")
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        prompt += counter.message(str(m.get("role", "")), str(content or ""))
    completion = request.max_tokens or settings.KEFU_LLM_MAX_TOKENS
    return cost_usd(tier=tier, prompt_tokens=prompt, completion_tokens=completion, variant=variant)


@dataclass(frozen=True)
class Attempt:
    """One attempt as ``routing.upstream.resilience`` saw it end; ``record_attempt`` makes it a row.

    ``usage`` is the API's (or the provider's estimate); when it is None and
    ``count_messages`` is set, the call may still be billed (it reached the upstream and broke),
    so the prompt (``count_messages``) and the text received (``received_text``) are counted
    with the tier model's tokenizer and the row is marked estimated. None and no messages: no
    tokens (the upstream refused with a status, or no request was sent). ``hold``: the
    reservation made on the spend budgets before the call (``routing.upstream.budgets``), replaced by the
    row's cost once it is written.
    ``ttft_ms`` / ``latency_ms``: from the attempt's start to its first text / its end.
    ``variant``: the tier's own model (``current``) or its canary candidate (``candidate``),
    whose prices the row is priced at.
    """

    context: CallContext
    tier: str
    model: str
    attempt: int
    outcome: str  # routing.models.Outcome value
    variant: str = CURRENT
    usage: Usage | None = None
    ttft_ms: float | None = None
    latency_ms: float = 0.0
    error_code: str = ""
    http_status: int | None = None
    count_messages: list[dict[str, Any]] | None = None
    received_text: str = ""
    started_at: datetime | None = None  # when the attempt began (aware); None: when recorded
    hold: budgets.Hold | None = None  # the spend budgets' reservation, settled with the row


_writing: set[asyncio.Task[None]] = set()


def record_attempt(attempt: Attempt, *, after: asyncio.Task[None] | None = None) -> asyncio.Task[None] | None:
    """Write ``attempt``'s ledger row in the background (returns at once).

    ``after``: the task writing the previous attempt of the same answer; this row is inserted
    after it, so that row ids follow the attempts even when an earlier row waits for a token count.
    A failure to write is logged, never raised: the ledger must not break an answer. Without a
    running loop (a stream finalised by the garbage collector after its loop ended) the row is
    lost, logged, and None is returned.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        log.error("ledger row of a %s call lost: no running event loop", attempt.tier)
        return None
    task = loop.create_task(_write(attempt, after))
    _writing.add(task)
    task.add_done_callback(_writing.discard)
    return task


async def flush() -> None:
    """Wait until every row recorded so far on this loop is written."""
    loop = asyncio.get_running_loop()
    while pending := [t for t in _writing if t.get_loop() is loop and not t.done()]:
        await asyncio.gather(*pending, return_exceptions=True)


def _usage_for(attempt: Attempt) -> Usage:
    """The attempt's tokens; counts them (blocking: the tokenizer's first load takes seconds)
    when the API gave none but the call may be billed."""
    if attempt.usage is not None:
        return attempt.usage
    if attempt.count_messages is None:
        return Usage(prompt_tokens=0, completion_tokens=0)
    return Usage(
        prompt_tokens=count_tokens(attempt.count_messages, attempt.model),
        completion_tokens=count_tokens(attempt.received_text, attempt.model) if attempt.received_text else 0,
        estimated=True,
    )


def _insert(attempt: Attempt, usage: Usage) -> Decimal:
    """Insert the row; returns its cost in USD."""
    ctx = attempt.context
    row = UpstreamCall.objects.create(
        conversation_id=ctx.conversation_id,
        message_id=ctx.message_id,
        api_key_id=ctx.api_key_id,
        # A bot test's call (lib.sandbox) is marked as such, whatever it was for.
        purpose=sandbox.LEDGER_PURPOSE if sandbox.active() else ctx.purpose,
        tier=attempt.tier,
        variant=attempt.variant,
        model=attempt.model[:100],
        attempt=attempt.attempt,
        prompt_tokens=usage.prompt_tokens,
        cached_prompt_tokens=usage.cached_prompt_tokens,
        completion_tokens=usage.completion_tokens,
        cost_usd=cost_usd(
            tier=attempt.tier,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            cached_prompt_tokens=usage.cached_prompt_tokens,
            variant=attempt.variant,
        ),
        ttft_ms=attempt.ttft_ms,
        latency_ms=attempt.latency_ms,
        outcome=attempt.outcome,
        error_code=attempt.error_code,
        http_status=attempt.http_status,
        estimated=usage.estimated,
        created_at=attempt.started_at or timezone.now(),
    )
    return Decimal(row.cost_usd)


async def _write(attempt: Attempt, after: asyncio.Task[None] | None) -> None:
    from channels.db import database_sync_to_async

    try:
        usage = attempt.usage
        if usage is None and attempt.count_messages is not None:
            usage = await asyncio.to_thread(_usage_for, attempt)
        if after is not None:
            await asyncio.wait([after])  # never raises: _write logs its own failures
        cost = await database_sync_to_async(_insert)(attempt, usage or _usage_for(attempt))
    except Exception:  # the background task's edge: a lost row is logged, the answer goes on
        log.exception("writing the ledger row of a %s call failed", attempt.tier)
        return
    if attempt.hold is not None:
        try:
            await database_sync_to_async(budgets.settle)(attempt.hold, cost)
        except Exception:  # its hold expires and counts at the call's maximum
            log.exception("settling the spend budgets of a %s call failed", attempt.tier)
    if attempt.variant == CANDIDATE and attempt.error_code in BREAKER_FAILURES:
        # A canary candidate failed: past its error threshold it is rolled back (routing.upstream.canary),
        # counted from the ledger, so every process's calls count.
        try:
            await database_sync_to_async(canary.check_errors)(attempt.tier)
        except Exception:  # the guard's edge: the next failure checks again
            log.exception("checking the %s canary's error rate failed", attempt.tier)


#: Tokens of a typical first-turn grounded prompt (system prompt, 3 FAQ entries, a one-line
#: question), what a remote tier would have been sent for an answer the FAQ model or the cache gave.
#: Measured with ``routing.prompt.build.build_messages`` and ``count_tokens`` (o200k_base) over the
#: demo FAQ's English entries, 3 consecutive entries at a time (25 windows), with a 12-word question:
#: median 376, range 324-417 (the system prompt alone with no grounding: 127).
TYPICAL_PROMPT_TOKENS = 376


def saved_usd(*, tier: str, answer_text: str, prompt_tokens: int | None = None) -> Decimal:
    """What ``tier`` would have cost to give ``answer_text`` (USD, 6 decimals): the cost of an
    answer the FAQ model, the cache or a shared stream (single flight) gave instead.

    ``cost_usd(tier, prompt_tokens=P, completion_tokens=C)`` with the tier's prices
    (``KEFU_TIERS``, USD per million tokens, no cached input), where
    ``P = prompt_tokens`` when the caller knows the prompt that would have been sent, else
    :data:`TYPICAL_PROMPT_TOKENS`; ``C`` = the answer's tokens counted with the tier model's
    tokenizer (``count_tokens``, tiktoken-compatible), or estimated at ceil(UTF-8 bytes / 3)
    while that tokenizer is still loading on the event loop (``routing.upstream.tokens.text_tokens``:
    safe to call on the event loop). Raises ``KeyError`` for an unknown tier.
    """
    model = tier_model(tier)
    completion, _estimated = text_tokens(answer_text, model) if answer_text else (0, False)
    prompt = TYPICAL_PROMPT_TOKENS if prompt_tokens is None else max(0, prompt_tokens)
    return cost_usd(tier=tier, prompt_tokens=prompt, completion_tokens=completion)


def lost_call_record(
    *,
    tier: str,
    conversation_id: Any,
    message_id: int | None,
    question: str,
    received_text: str,
    since: datetime | None = None,
    variant: str = CURRENT,
) -> Decimal:
    """Write the ledger row of a call whose process died while it streamed (kill -9, OOM): no
    attempt ever ended to record it, yet the upstream bills it. Tokens are estimated and the row
    says so (``estimated``, ``outcome`` ``failed``, ``error_code`` ``process_died``): prompt =
    :data:`TYPICAL_PROMPT_TOKENS` + the question's tokens, completion = the tokens of the text
    the shopper had (``received_text``), both counted with the tier model's tokenizer; the row
    names ``variant``'s model (``candidate``: the tier's canary candidate) at its prices. Blocking
    (tokenizer, database). Returns the estimated cost in USD (0 and no row when the call was
    recorded after all: a process that stopped gracefully records its abandoned calls itself; it
    looks for such a row of ``message_id`` from ``since`` on). Raises ``KeyError`` for an unknown tier."""
    if (
        since is not None
        and message_id is not None
        and UpstreamCall.objects.filter(
            message_id=message_id, error_code="abandoned", created_at__gte=since - timedelta(seconds=5)
        ).exists()
    ):
        return Decimal(0)
    model = tier_model(tier, variant)
    prompt = TYPICAL_PROMPT_TOKENS + (count_tokens(question, model) if question else 0)
    completion = count_tokens(received_text, model) if received_text else 0
    usd = cost_usd(tier=tier, prompt_tokens=prompt, completion_tokens=completion, variant=variant)
    UpstreamCall.objects.create(
        conversation_id=conversation_id,
        message_id=message_id,
        tier=tier,
        variant=variant,
        model=model[:100],
        prompt_tokens=prompt,
        completion_tokens=completion,
        cost_usd=usd,
        outcome="failed",
        error_code="process_died",
        estimated=True,
    )
    return usd


def answer_record(
    *,
    route: str,
    text: str,
    done: StreamDone | None,
    ttft_ms: float | None,
    latency_ms: float,
    cut: bool,
    tier: str | None,
    variant: str = CURRENT,
    messages: list[dict[str, Any]] | None = None,
    reason: str = "",
    faq_entry_id: int | None = None,
    cache_entry_id: int | None = None,
) -> AnswerRecord:
    """How an answer ended, with its cost (remote) or the cost it saved (fixed answers), in USD.

    ``route``: the route it ended on; ``tier``/``variant``: for a remote answer (``llm.*``) the
    deployment that answered, whose prices it is charged at; for a fixed answer the tier that
    would have answered (None: ``simple``), whose prices give ``saved_usd``. ``done``: the
    stream's end (its usage, tokens), None when it broke first: the prompt (``messages``, as
    last sent) and ``text`` are then counted with the tier model's tokenizer (blocking) and the
    record is marked estimated. ``ttft_ms``/``latency_ms``: as Chat measured them (ms).
    ``faq_entry_id``/``cache_entry_id``/``reason``: copied onto the record (the cache entry only
    for a ``cache.*`` route). Raises ``KeyError`` for an unknown tier."""
    if route.startswith("llm.") and tier:
        usage = done.usage if done is not None else None
        if usage is None:
            # The stream broke before its usage chunk: the call may still be billed, so count
            # what was sent and received (tiktoken-compatible encodings) and mark it estimated.
            model = tier_model(tier, variant)
            usage = Usage(
                prompt_tokens=count_tokens(messages or [], model),
                completion_tokens=count_tokens(text, model) if text else 0,
                estimated=True,
            )
        prompt_tokens, completion, cached = usage.prompt_tokens, usage.completion_tokens, usage.cached_prompt_tokens
        return AnswerRecord(
            text=text,
            route=route,
            model=(done.model if done else "") or tier_model(tier, variant),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion,
            cost_usd=cost_usd(
                tier=tier,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion,
                cached_prompt_tokens=cached,
                variant=variant,
            ),
            variant=variant,
            ttft_ms=ttft_ms,
            latency_ms=latency_ms,
            estimated=usage.estimated,
            cut=cut,
            reason=reason,
        )
    saved = Decimal(0)
    if route in ("faq", "action", "product") or route.startswith("cache."):
        # Priced at the tier that would have answered (the FAQ, action and product routes have none: the simple tier).
        saved = saved_usd(tier=tier or "simple", answer_text=text)
    return AnswerRecord(
        text=text,
        route=route,
        ttft_ms=ttft_ms,
        latency_ms=latency_ms,
        cut=cut,
        faq_entry_id=faq_entry_id,
        saved_usd=saved,
        cache_entry_id=cache_entry_id if route.startswith("cache.") else None,
        reason=reason,
    )
