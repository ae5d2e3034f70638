"""Guards in front of each tier: the circuit breaker, the upstream's rate-limit headers and the
tier's own limits (concurrency, requests and tokens per minute). A guarded tier is skipped: the
next tier answers at once, and the ledger says why.

Unit tests drive the breaker and the header book with a hand-moved clock; the rest run the real
``openai`` client against the project's OpenAI-compatible test server (tests/fake_openai.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import Any

import pytest
from channels.db import database_sync_to_async

from routing.models import UpstreamCall
from routing.providers.base import ChatRequest, ProviderError, StreamDone, TextDelta
from routing.providers.openai_remote import close_clients
from routing.providers.ratelimits import (
    UpstreamLimitBook,
    UpstreamRateLimits,
    parse_duration_s,
    parse_rate_limit_headers,
)
from routing.upstream import breaker, ledger, throttle
from routing.upstream.breaker import CircuitBreaker
from routing.upstream.call import Answered, Call
from routing.upstream.resilience import stream_with_fallback
from routing.upstream.tiers import provider_for
from tests.fake_openai import Behaviour, FakeOpenAI


class Clock:
    """A clock that moves only when told (seconds)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# ---------------------------------------------------------------------------- breaker, unit


def test_breaker_opens_after_consecutive_failures_and_a_success_resets_the_count():
    clock = Clock()
    b = CircuitBreaker(failure_threshold=3, cooldown_s=30, clock=clock)
    b.record_failure()
    b.record_failure()
    b.record_success()  # the count starts again
    b.record_failure()
    b.record_failure()
    assert b.state == "closed" and b.allow()
    b.record_failure()
    assert b.state == "open" and not b.allow()
    assert b.retry_in_s() == 30


def test_breaker_lets_one_trial_through_after_the_cooldown():
    clock = Clock()
    b = CircuitBreaker(failure_threshold=1, cooldown_s=30, clock=clock)
    b.record_failure()
    clock.now += 29.9
    assert not b.allow()
    clock.now += 0.2
    assert b.state == "half_open"
    assert b.allow()  # the trial
    assert not b.allow()  # only one at a time
    b.record_success()
    assert b.state == "closed" and b.allow() and b.allow()


def test_a_failed_trial_opens_the_breaker_for_another_cooldown():
    clock = Clock()
    b = CircuitBreaker(failure_threshold=2, cooldown_s=10, clock=clock)
    b.record_failure()
    b.record_failure()
    clock.now += 10
    assert b.allow()
    b.record_failure()  # one failure is enough in half-open state
    assert b.state == "open" and b.retry_in_s() == 10


def test_an_abandoned_trial_is_given_back():
    clock = Clock()
    b = CircuitBreaker(failure_threshold=1, cooldown_s=5, clock=clock)
    b.record_failure()
    clock.now += 5
    assert b.allow() and not b.allow()
    b.release()
    assert b.allow()


def test_breaker_refuses_a_threshold_below_one():
    with pytest.raises(ValueError):
        CircuitBreaker(failure_threshold=0, cooldown_s=1)


# ---------------------------------------------------------------------------- headers, unit


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("1s", 1.0),
        ("6m0s", 360.0),
        ("120ms", 0.12),
        ("1h2m3.5s", 3723.5),
        ("0.5", 0.5),
        ("17", 17.0),
        ("", None),
        ("soon", None),
        ("5x", None),
        (None, None),
    ],
)
def test_reset_durations_in_openai_and_plain_formats(value, seconds):
    result = parse_duration_s(value)
    assert result == pytest.approx(seconds) if seconds is not None else result is None


def test_rate_limit_headers_are_read():
    limits = parse_rate_limit_headers(
        {
            "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-remaining-tokens": "1520",
            "x-ratelimit-reset-requests": "120ms",
            "x-ratelimit-reset-tokens": "6m0s",
        }
    )
    assert limits == UpstreamRateLimits(
        remaining_requests=0, remaining_tokens=1520, reset_requests_s=0.12, reset_tokens_s=360.0
    )
    assert limits.exhausted_for_s() == pytest.approx(0.12)
    assert parse_rate_limit_headers({"content-type": "text/event-stream"}) is None


def test_book_blocks_an_exhausted_upstream_until_its_reset():
    clock = Clock()
    book = UpstreamLimitBook(clock=clock)
    key = ("http://upstream/v1", "k", "m")
    book.observe(key, UpstreamRateLimits(remaining_requests=5, remaining_tokens=0, reset_tokens_s=20))
    assert book.blocked_for_s(key) == 20
    assert book.blocked_for_s(("http://upstream/v1", "k", "other-model")) == 0
    clock.now += 20
    assert book.blocked_for_s(key) == 0
    book.observe(key, UpstreamRateLimits(remaining_requests=0))  # no reset header: 1 s
    assert book.blocked_for_s(key) == 1
    book.observe(key, UpstreamRateLimits(remaining_requests=3, remaining_tokens=900))  # budget again
    assert book.blocked_for_s(key) == 0


def test_token_estimate_is_characters_over_four_plus_max_tokens():
    messages = [
        {"role": "system", "content": "x" * 10},
        {"role": "user", "content": [{"type": "text", "text": "y" * 7}]},
    ]
    assert throttle.estimate_tokens(messages, 100) == 5 + 100
    assert throttle.estimate_tokens(messages, None) == 5


# ---------------------------------------------------------------------------- with the fake upstream

MESSAGES = [{"role": "user", "content": "Is the oak side table solid wood?"}]


class _HeaderRequest:
    """The server's request, adding headers to the response it prepares (aiohttp calls
    ``request._prepare_hook(response)`` just before writing the response headers)."""

    def __init__(self, request: Any, headers: dict[str, str]) -> None:
        self._request, self._headers = request, headers

    def __getattr__(self, name: str) -> Any:
        return getattr(self._request, name)

    async def _prepare_hook(self, response: Any) -> None:
        response.headers.update(self._headers)
        await self._request._prepare_hook(response)


class FakeOpenAIWithLimits(FakeOpenAI):
    """The test server, sending the next of ``upstream_headers`` with each chat response."""

    upstream_headers: list[dict[str, str]]

    async def _chat_completions(self, request: Any) -> Any:
        headers = self.upstream_headers.pop(0) if self.upstream_headers else {}
        response = await super()._chat_completions(_HeaderRequest(request, headers))
        if not response.prepared:  # a plain (error or JSON) response: not sent yet
            response.headers.update(headers)
        return response


@pytest.fixture
def limited_upstream(settings) -> Iterator[FakeOpenAIWithLimits]:
    server = FakeOpenAIWithLimits.start()
    server.upstream_headers = []
    # Each tier configured on its own (a KEFU_<TIER>_MODEL), so a failing tier falls back to the next.
    settings.KEFU_TIERS = {
        tier: replace(cfg, dedicated=True).with_current(
            base_url=server.base_url, api_key="test-key", model=f"fake-{tier}"
        )
        for tier, cfg in settings.KEFU_TIERS.items()
    }
    settings.KEFU_LLM_FIRST_TOKEN_TIMEOUT_S = 2.0
    settings.KEFU_LLM_TOTAL_TIMEOUT_S = 10.0
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _fresh_guards(routing_guards: None) -> None:
    """Clean breakers, rate-limit book and tier limiters around each test (tests/conftest.py)."""


@pytest.fixture(autouse=True)
async def _close_clients() -> AsyncIterator[None]:
    yield
    await close_clients()


def call() -> Call:
    return Call(
        tier="simple",
        provider=provider_for("simple"),
        request=ChatRequest(messages=list(MESSAGES), model="fake-simple", max_tokens=100),
    )


async def answer() -> tuple[str, Answered | None, ProviderError | None]:
    """Stream a simple-tier call to its end: (text, the last ``Answered`` of the stream, which
    names the route it ended on, or None, the error or None)."""
    c = call()
    texts: list[str] = []
    answered: Answered | None = None
    error: ProviderError | None = None
    try:
        async for item in stream_with_fallback(c):
            if isinstance(item, TextDelta):
                texts.append(item.text)
            elif isinstance(item, Answered):
                answered = item
    except ProviderError as e:
        error = e
    await ledger.flush()
    assert c.route == "llm.simple"  # the plan is never changed
    return "".join(texts), answered, error


async def ledger_rows() -> list[tuple[str, str, str]]:
    return await database_sync_to_async(
        lambda: list(UpstreamCall.objects.order_by("id").values_list("tier", "outcome", "error_code"))
    )()


@pytest.mark.django_db(transaction=True)
async def test_open_breaker_skips_the_tier_at_once(limited_upstream, settings):
    settings.KEFU_BREAKER_FAILURES = 2
    limited_upstream.push(
        Behaviour(status=500), Behaviour(status=500), Behaviour(text="medium one"), Behaviour(text="medium two")
    )

    first, d1, _ = await answer()
    second, d2, _ = await answer()

    assert (first, d1.route) == ("medium one", "llm.medium")
    assert (second, d2.route) == ("medium two", "llm.medium")
    # The second answer never asked the simple tier: its breaker was open.
    assert [r["model"] for r in limited_upstream.requests] == [
        "fake-simple",
        "fake-simple",
        "fake-medium",
        "fake-medium",
    ]
    assert await ledger_rows() == [
        ("simple", "retried", "server"),
        ("simple", "fell_back", "server"),
        ("medium", "ok", ""),
        ("simple", "fell_back", "circuit_open"),
        ("medium", "ok", ""),
    ]


@pytest.mark.django_db(transaction=True)
async def test_breaker_closes_again_after_a_successful_trial(limited_upstream, settings):
    settings.KEFU_BREAKER_FAILURES = 1
    settings.KEFU_LLM_RETRIES = 0
    limited_upstream.push(Behaviour(status=502), Behaviour(text="medium"))
    await answer()
    key = (limited_upstream.base_url, "test-key", "fake-simple")
    b = breaker.breaker_for(key)
    assert b.state == "open"
    clock = Clock()
    b._clock = clock  # type: ignore[attr-defined]  # move past the cooldown without sleeping
    b._opened_at = clock.now - settings.KEFU_BREAKER_COOLDOWN_S  # type: ignore[attr-defined]
    limited_upstream.push(Behaviour(text="simple again"))

    text, d, _ = await answer()

    assert (text, d.route) == ("simple again", "llm.simple") and b.state == "closed"


@pytest.mark.django_db(transaction=True)
async def test_rate_limits_are_not_breaker_failures(limited_upstream, settings):
    settings.KEFU_BREAKER_FAILURES = 1
    settings.KEFU_LLM_RETRIES = 0
    limited_upstream.push(Behaviour(status=429), Behaviour(text="medium"), Behaviour(text="simple"))
    await answer()
    text, d, _ = await answer()
    assert (text, d.route) == ("simple", "llm.simple")


@pytest.mark.django_db(transaction=True)
async def test_upstream_saying_none_left_is_not_called_until_its_reset(limited_upstream):
    limited_upstream.upstream_headers = [
        {
            "x-ratelimit-limit-requests": "3",
            "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-reset-requests": "1m0s",
            "x-ratelimit-remaining-tokens": "40000",
        }
    ]
    limited_upstream.push(Behaviour(text="last one for a minute"), Behaviour(text="from medium"))

    first, _, _ = await answer()
    second, d, _ = await answer()

    assert first == "last one for a minute"
    assert (second, d.route) == ("from medium", "llm.medium")
    assert [r["model"] for r in limited_upstream.requests] == ["fake-simple", "fake-medium"]
    assert await ledger_rows() == [
        ("simple", "ok", ""),
        ("simple", "fell_back", "upstream_limit"),
        ("medium", "ok", ""),
    ]


@pytest.mark.django_db(transaction=True)
async def test_429_headers_block_the_upstream_for_other_answers(limited_upstream, settings):
    settings.KEFU_LLM_RETRIES = 0
    limited_upstream.upstream_headers = [{"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "30s"}]
    limited_upstream.push(Behaviour(status=429), Behaviour(text="medium one"), Behaviour(text="medium two"))
    await answer()
    text, d, _ = await answer()
    assert (text, d.route) == ("medium two", "llm.medium")
    assert [r["model"] for r in limited_upstream.requests] == ["fake-simple", "fake-medium", "fake-medium"]


@pytest.mark.django_db(transaction=True)
async def test_requests_per_minute_limit_falls_back(limited_upstream, settings):
    settings.KEFU_TIERS = {**settings.KEFU_TIERS, "simple": replace(settings.KEFU_TIERS["simple"], rpm=1)}
    limited_upstream.push(Behaviour(text="simple"), Behaviour(text="medium"))
    await answer()
    text, d, _ = await answer()
    assert (text, d.route) == ("medium", "llm.medium")
    assert (await ledger_rows())[1] == ("simple", "fell_back", "local_rpm")


@pytest.mark.django_db(transaction=True)
async def test_tokens_per_minute_limit_falls_back(limited_upstream, settings):
    # Each request counts ceil(33 / 4) + 100 = 109 tokens; 150 a minute leaves room for one.
    settings.KEFU_TIERS = {**settings.KEFU_TIERS, "simple": replace(settings.KEFU_TIERS["simple"], tpm=150)}
    limited_upstream.push(Behaviour(text="simple"), Behaviour(text="medium"))
    await answer()
    text, d, _ = await answer()
    assert (text, d.route) == ("medium", "llm.medium")
    assert (await ledger_rows())[1] == ("simple", "fell_back", "local_tpm")


@pytest.mark.django_db(transaction=True)
async def test_concurrency_limit_sends_the_next_answer_to_the_next_tier(limited_upstream, settings):
    settings.KEFU_TIERS = {**settings.KEFU_TIERS, "simple": replace(settings.KEFU_TIERS["simple"], max_concurrency=1)}
    limited_upstream.push(Behaviour(text="slow simple answer", token_ms=200), Behaviour(text="medium"))
    slow = stream_with_fallback(call())
    assert isinstance(await anext(slow), Answered)
    first = await anext(slow)  # the simple tier's one slot is now taken
    assert isinstance(first, TextDelta) and throttle.in_flight("simple") == 1

    text, d, _ = await answer()
    assert (text, d.route) == ("medium", "llm.medium")

    rest = [item async for item in slow]
    assert isinstance(rest[-1], StreamDone) and throttle.in_flight("simple") == 0
    await ledger.flush()
    assert ("simple", "fell_back", "concurrency") in await ledger_rows()


@pytest.mark.django_db(transaction=True)
async def test_last_tier_waits_for_its_gate_when_it_opens_before_the_deadline(limited_upstream, settings):
    settings.KEFU_TIERS = {tier: cfg for tier, cfg in settings.KEFU_TIERS.items() if tier == "simple"}
    limited_upstream.upstream_headers = [{"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "300ms"}]
    limited_upstream.push(Behaviour(text="first"), Behaviour(text="second"))
    await answer()
    text, d, error = await answer()
    assert error is None and (text, d.route) == ("second", "llm.simple")
    assert await ledger_rows() == [("simple", "ok", ""), ("simple", "ok", "")]


@pytest.mark.django_db(transaction=True)
async def test_last_tier_blocked_past_the_deadline_fails_without_a_request(limited_upstream, settings):
    settings.KEFU_TIERS = {tier: cfg for tier, cfg in settings.KEFU_TIERS.items() if tier == "simple"}
    limited_upstream.upstream_headers = [{"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "5m"}]
    limited_upstream.push(Behaviour(text="first"))
    await answer()
    text, _, error = await answer()
    assert text == "" and error is not None and error.code == "rate_limited"
    assert len(limited_upstream.requests) == 1
    assert (await ledger_rows())[-1] == ("simple", "failed", "upstream_limit")
