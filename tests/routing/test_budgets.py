"""Upstreams that misbehave cost a message no more than its budget (issue: faults): the
first-token budget holds across retries and tiers, a ``retry-after`` too long to wait skips the
tier for that long in every process, and errors inside a stream keep their type (a permanent one
is never retried, nor sent where it cannot turn out differently). The real ``openai`` client
against the project's test server (tests/fake_openai.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from routing.providers import ratelimits
from routing.upstream import blocks as upstream_blocks
from routing.upstream.resilience import upstream_key
from routing.upstream.tiers import provider_for
from tests.fake_openai import Behaviour
from tests.routing.test_ledger import call, outcomes, rows, run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture(autouse=True)
def _fresh_guards(routing_guards: None) -> None:
    """Clean breakers, rate-limit books and tier limiters around each test."""


def models_asked(remote: Any) -> list[str]:
    return [r["model"] for r in remote.requests]


async def test_an_upstream_that_never_sends_headers_costs_one_budget_not_one_per_tier(remote, settings):
    """Every tier hangs before its headers: the message gives up after its first-token budget
    (1.5 s), each tier having had a share of it, instead of 1.5 s per tier."""
    settings.KEFU_LLM_FIRST_TOKEN_TIMEOUT_S = 1.5
    remote.default = Behaviour(hang_before_headers_ms=20_000)
    started = time.monotonic()
    text, done, error = await run(call())
    elapsed = time.monotonic() - started
    assert text == "" and done is None and error is not None and error.code == "timeout"
    assert models_asked(remote) == ["fake-simple", "fake-medium", "fake-complex"]
    assert outcomes(await rows()) == [
        ("simple", "fell_back", "timeout"),
        ("medium", "fell_back", "timeout"),
        ("complex", "failed", "timeout"),
    ]
    assert elapsed < 3.0  # the old behaviour took 3 x 1.5 s


async def test_a_long_retry_after_skips_the_tier_and_keeps_it_skipped(remote, settings):
    settings.KEFU_LLM_RETRY_CAP_S = 2.0
    remote.push(Behaviour(status=429, retry_after=47), Behaviour(text="From medium."), Behaviour(text="Again medium."))
    text, _done, error = await run(call())
    assert error is None and text == "From medium."
    # not waited for (capped to 2 s and retried before): the next tier answered at once
    assert models_asked(remote) == ["fake-simple", "fake-medium"]
    key = upstream_key("simple", provider_for("simple"), "fake-simple")
    assert 40 < await upstream_blocks.blocked_for_s(key) <= 47

    text, _done, error = await run(call())
    assert error is None and text == "Again medium."
    assert models_asked(remote) == ["fake-simple", "fake-medium", "fake-medium"]  # simple not asked again
    assert outcomes(await rows())[-2:] == [("simple", "fell_back", "upstream_limit"), ("medium", "ok", "")]


async def test_a_retry_after_block_is_shared_with_other_processes(remote, settings, private_redis):
    """Written to Redis: a process that never saw the 429 (its own book empty) skips the tier too."""
    settings.REDIS_URL = private_redis.url
    upstream_blocks.forget()
    remote.push(Behaviour(status=429, retry_after=47), Behaviour(text="From medium."))
    await run(call())
    key = upstream_key("simple", provider_for("simple"), "fake-simple")
    ratelimits.book.clear()  # as another process: nothing local...
    upstream_blocks.forget()
    assert 40 < await upstream_blocks.blocked_for_s(key) <= 47  # ...but the shared block
    with private_redis.client() as r:
        assert r.hlen("kefu:upstream-blocks") == 1


async def test_a_short_retry_after_is_still_waited_for_on_the_same_tier(remote, settings):
    settings.KEFU_LLM_RETRY_CAP_S = 2.0
    remote.push(Behaviour(status=429, retry_after=0.1), Behaviour(text="Simple again."))
    text, _done, error = await run(call())
    assert error is None and text == "Simple again."
    assert models_asked(remote) == ["fake-simple", "fake-simple"]
    key = upstream_key("simple", provider_for("simple"), "fake-simple")
    assert await upstream_blocks.blocked_for_s(key) == 0.0


async def test_an_invalid_key_inside_the_stream_is_permanent_and_not_sent_to_the_same_upstream(remote):
    """Every tier uses the same upstream and key here: one request, not three tiers' worth."""
    remote.push(
        Behaviour(
            error_event_after_chunks=0,
            error_event={
                "message": "Incorrect API key provided.",
                "type": "invalid_request_error",
                "code": "invalid_api_key",
            },
        )
    )
    text, _done, error = await run(call())
    assert text == "" and error is not None and error.code == "auth" and error.permanent
    assert models_asked(remote) == ["fake-simple"]
    assert outcomes(await rows()) == [
        ("simple", "fell_back", "auth"),
        ("medium", "fell_back", "auth"),
        ("complex", "failed", "auth"),
    ]


async def test_context_length_exceeded_inside_the_stream_is_not_retried_on_that_model(remote):
    """A request refused by one model is never retried there; another tier's model may take it."""
    remote.push(
        Behaviour(
            error_event_after_chunks=0,
            error_event={
                "message": "This model's maximum context length is 128000 tokens.",
                "type": "invalid_request_error",
                "code": "context_length_exceeded",
            },
        ),
        Behaviour(text="A longer context answered."),
    )
    text, _done, error = await run(call())
    assert error is None and text == "A longer context answered."
    assert models_asked(remote) == ["fake-simple", "fake-medium"]
    assert outcomes(await rows()) == [("simple", "fell_back", "bad_request"), ("medium", "ok", "")]
