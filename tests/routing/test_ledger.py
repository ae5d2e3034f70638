"""The cost ledger: one ``UpstreamCall`` row per attempt, for every failure mode of the upstream.

The real ``openai`` client (``OpenAIProvider``) talks HTTP to the project's OpenAI-compatible test
server (tests/fake_openai.py), scripted per test; ``stream_with_fallback`` is called the way the
answering loop and the gateway call it. Prices are the tiers' default list prices (USD per
million tokens): simple 0.28 in / 0.028 cached / 0.42 out, medium 0.30 / 0.03 / 2.50.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import pytest
from channels.db import database_sync_to_async

from chat.models import Conversation, Message
from lib.tokens import count_tokens
from routing.models import UpstreamCall
from routing.providers.base import ChatRequest, ProviderError, StreamDone, TextDelta
from routing.providers.openai_remote import close_clients
from routing.upstream import ledger
from routing.upstream.call import Answered, Call
from routing.upstream.ledger import CallContext
from routing.upstream.resilience import stream_with_fallback
from routing.upstream.tiers import provider_for
from tests.fake_openai import Behaviour

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

QUESTION = "Does the walnut floor lamp come with a dimmer switch?"
MESSAGES = [
    {"role": "system", "content": "You are the store's helpful assistant."},
    {"role": "user", "content": QUESTION},
]


@pytest.fixture(autouse=True)
def _fresh_guards(routing_guards: None) -> None:
    """Clean breakers, rate-limit book and tier limiters around each test (tests/conftest.py)."""


@pytest.fixture(autouse=True)
async def _close_clients() -> AsyncIterator[None]:
    yield
    await close_clients()


def call(tier: str = "simple", context: CallContext | None = None) -> Call:
    return Call(
        tier=tier,
        provider=provider_for(tier),
        request=ChatRequest(messages=list(MESSAGES), model=f"fake-{tier}", max_tokens=200),
        context=context or CallContext(),
    )


async def run(c: Call, answered: list[Answered] | None = None) -> tuple[str, StreamDone | None, ProviderError | None]:
    """Stream ``c`` to its end: (text, the StreamDone or None, the error or None); then wait for
    the ledger rows to be written. The stream's ``Answered`` items are appended to ``answered``."""
    texts: list[str] = []
    done: StreamDone | None = None
    error: ProviderError | None = None
    try:
        async for item in stream_with_fallback(c):
            if isinstance(item, TextDelta):
                texts.append(item.text)
            elif isinstance(item, Answered):
                if answered is not None:
                    answered.append(item)
            elif isinstance(item, StreamDone):
                done = item
    except ProviderError as e:
        error = e
    await ledger.flush()
    return "".join(texts), done, error


async def rows() -> list[dict[str, Any]]:
    fields = (
        "tier",
        "model",
        "attempt",
        "outcome",
        "error_code",
        "http_status",
        "prompt_tokens",
        "cached_prompt_tokens",
        "completion_tokens",
        "cost_usd",
        "estimated",
        "ttft_ms",
        "conversation_id",
        "message_id",
        "api_key_id",
    )
    return await database_sync_to_async(lambda: list(UpstreamCall.objects.order_by("id").values(*fields)))()


def outcomes(found: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(r["tier"], r["outcome"], r["error_code"]) for r in found]


async def test_answer_with_usage_is_one_ok_row_with_its_cost_and_context(remote):
    remote.push(
        Behaviour(
            text="Yes, it has an inline dimmer.", prompt_tokens=1000, completion_tokens=200, cached_prompt_tokens=400
        )
    )

    def make_conversation() -> tuple[Conversation, Message]:
        conversation = Conversation.objects.create(token_hash="t" * 64)
        return conversation, Message.objects.create(conversation=conversation, seq=1, role="shopper", text=QUESTION)

    conversation, message = await database_sync_to_async(make_conversation)()

    text, done, error = await run(call(context=CallContext(conversation_id=conversation.id, message_id=message.pk)))

    assert error is None and text == "Yes, it has an inline dimmer." and done is not None
    [row] = await rows()
    assert outcomes([row]) == [("simple", "ok", "")]
    assert row["model"] == "fake-simple" and row["attempt"] == 1 and row["http_status"] is None
    assert (row["prompt_tokens"], row["cached_prompt_tokens"], row["completion_tokens"]) == (1000, 400, 200)
    # 600 uncached x $0.28/M + 400 cached x $0.028/M + 200 x $0.42/M = $0.0002632
    assert row["cost_usd"] == Decimal("0.000263")
    assert row["estimated"] is False and row["ttft_ms"] is not None
    assert row["conversation_id"] == conversation.id and row["message_id"] == message.pk
    assert row["api_key_id"] is None


async def test_429_with_retry_after_then_ok_is_a_retried_row_and_an_ok_row(remote):
    remote.push(
        Behaviour(status=429, retry_after=0.2), Behaviour(text="Yes, it dims.", prompt_tokens=50, completion_tokens=5)
    )

    text, _, error = await run(call())

    assert error is None and text == "Yes, it dims."
    found = await rows()
    assert outcomes(found) == [("simple", "retried", "rate_limited"), ("simple", "ok", "")]
    refused, answered = found
    # A 429 is not billed: no tokens, no cost, nothing estimated.
    assert refused["http_status"] == 429 and refused["attempt"] == 1
    assert (refused["prompt_tokens"], refused["completion_tokens"], refused["cost_usd"]) == (0, 0, Decimal("0"))
    assert refused["estimated"] is False and refused["ttft_ms"] is None
    assert answered["attempt"] == 2 and answered["prompt_tokens"] == 50
    assert answered["cost_usd"] == Decimal("0.000016")  # 50 x 0.28/M + 5 x 0.42/M = 0.0000161
    assert [r["model"] for r in remote.requests] == ["fake-simple", "fake-simple"]


async def test_500_on_simple_then_medium_answers(remote):
    remote.push(
        Behaviour(status=500),
        Behaviour(status=500),
        Behaviour(text="It has a dimmer.", prompt_tokens=1000, completion_tokens=200),
    )
    c = call()
    answered: list[Answered] = []

    text, done, error = await run(c, answered)

    assert error is None and text == "It has a dimmer." and answered[-1].route == "llm.medium"
    assert c.route == "llm.simple"  # the plan is never changed: the route comes back as a value
    found = await rows()
    assert outcomes(found) == [("simple", "retried", "server"), ("simple", "fell_back", "server"), ("medium", "ok", "")]
    assert [r["http_status"] for r in found] == [500, 500, None]
    assert [r["cost_usd"] for r in found] == [Decimal("0"), Decimal("0"), Decimal("0.000800")]
    assert found[2]["model"] == "fake-medium"


async def test_slow_first_token_times_out_and_falls_back_with_estimated_prompt(remote, settings):
    # Each of the three tiers gets a third of the budget: 0.5 s, still far below the 5 s first token
    # (at 0.3 s in all, a loaded machine let the medium tier time out too).
    settings.KEFU_LLM_FIRST_TOKEN_TIMEOUT_S = 1.5
    remote.push(
        Behaviour(text="too late", ttft_ms=5000), Behaviour(text="On time.", prompt_tokens=40, completion_tokens=3)
    )

    text, _, error = await run(call())

    assert error is None and text == "On time."
    found = await rows()
    # The deadline for a first token has passed: a retry would only be later than the next tier.
    assert outcomes(found) == [("simple", "fell_back", "timeout"), ("medium", "ok", "")]
    timed_out = found[0]
    # The request reached the upstream, which may bill the prompt: counted and marked estimated.
    prompt = count_tokens(MESSAGES, "fake-simple")
    assert timed_out["estimated"] is True and timed_out["prompt_tokens"] == prompt > 0
    assert timed_out["completion_tokens"] == 0 and timed_out["http_status"] is None
    assert timed_out["cost_usd"] == ledger.cost_usd(tier="simple", prompt_tokens=prompt, completion_tokens=0)


async def test_connection_dropped_before_first_token_is_retried(remote):
    remote.push(
        Behaviour(drop_before_first_token=True), Behaviour(text="Second try.", prompt_tokens=10, completion_tokens=2)
    )

    text, _, error = await run(call())

    assert error is None and text == "Second try."
    found = await rows()
    assert outcomes(found) == [("simple", "retried", "connection"), ("simple", "ok", "")]
    assert found[0]["estimated"] is True and found[0]["completion_tokens"] == 0


async def test_connection_dropped_after_first_token_is_a_failed_row_with_the_text_counted(remote):
    answer = "The lamp has a dimmer and a fabric shade in three colours"
    remote.push(Behaviour(text=answer, drop_after_chunks=3))

    text, done, error = await run(call())

    assert text == "The lamp has " and done is None
    assert error is not None and error.after_first_token and error.code == "connection"
    [row] = await rows()
    assert outcomes([row]) == [("simple", "failed", "connection")]
    assert row["estimated"] is True and row["ttft_ms"] is not None
    assert row["prompt_tokens"] == count_tokens(MESSAGES, "fake-simple")
    assert row["completion_tokens"] == count_tokens("The lamp has ", "fake-simple") > 0
    assert row["cost_usd"] == ledger.cost_usd(
        tier="simple", prompt_tokens=row["prompt_tokens"], completion_tokens=row["completion_tokens"]
    )
    assert len(remote.requests) == 1  # never retried once text was sent


async def test_malformed_chunk_before_first_token_is_retried(remote):
    remote.push(
        Behaviour(text="broken", malformed_after_chunks=0),
        Behaviour(text="Fine now.", prompt_tokens=8, completion_tokens=2),
    )

    text, _, error = await run(call())

    assert error is None and text == "Fine now."
    assert outcomes(await rows()) == [("simple", "retried", "malformed"), ("simple", "ok", "")]


async def test_malformed_chunk_after_first_token_is_a_failed_row(remote):
    remote.push(Behaviour(text="one two three four", malformed_after_chunks=2))

    text, _, error = await run(call())

    assert text == "one two " and error is not None and error.after_first_token
    [row] = await rows()
    assert outcomes([row]) == [("simple", "failed", "malformed")] and row["estimated"] is True


async def test_stream_without_usage_is_an_ok_row_with_counted_tokens(remote):
    remote.push(Behaviour(text="Yes, it dims.", include_usage=False))

    text, done, _ = await run(call())

    assert done is not None and done.usage.estimated
    [row] = await rows()
    assert outcomes([row]) == [("simple", "ok", "")] and row["estimated"] is True
    assert row["prompt_tokens"] == count_tokens(MESSAGES, "fake-simple")
    assert row["completion_tokens"] == count_tokens("Yes, it dims.", "fake-simple")


async def test_permanent_error_falls_back_without_retry(remote):
    remote.push(Behaviour(status=400), Behaviour(text="From the medium tier."))

    text, _, error = await run(call())

    assert error is None and text == "From the medium tier."
    assert outcomes(await rows()) == [("simple", "fell_back", "bad_request"), ("medium", "ok", "")]


async def test_every_tier_failing_ends_with_a_failed_row(remote):
    remote.push(*[Behaviour(status=503)] * 6)

    text, done, error = await run(call())

    assert text == "" and done is None and error is not None and error.status == 503
    assert outcomes(await rows()) == [
        ("simple", "retried", "server"),
        ("simple", "fell_back", "server"),
        ("medium", "retried", "server"),
        ("medium", "fell_back", "server"),
        ("complex", "retried", "server"),
        ("complex", "failed", "server"),
    ]


async def test_a_reader_that_stops_mid_stream_leaves_an_abandoned_row(remote):
    remote.push(Behaviour(text="one two three four five six", token_ms=50))
    stream = stream_with_fallback(call())
    answered = await anext(stream)
    assert isinstance(answered, Answered) and answered.route == "llm.simple"
    first = await anext(stream)
    assert isinstance(first, TextDelta)
    await stream.aclose()  # e.g. the gateway's client disconnected
    await ledger.flush()
    [row] = await rows()
    assert outcomes([row]) == [("simple", "failed", "abandoned")] and row["estimated"] is True
    assert row["completion_tokens"] == count_tokens(first.text, "fake-simple")


async def test_shopper_sees_a_cut_answer_and_the_ledger_a_failed_call(make_client, faq, remote):
    """Over /ws/chat/: the shopper gets the text so far (stored as cut) and an error frame; the
    ledger has the one call, failed after its first token, with its tokens counted."""
    remote.push(Behaviour(text="The lamp has a dimmer and a fabric shade in three colours", drop_after_chunks=3))
    shopper = await make_client()
    await shopper.hello()
    await shopper.say(QUESTION)
    frames = await shopper.until("error")
    end = next(f for f in frames if f["type"] == "stream.end")
    assert end["cut"] is True and end["text"] == "The lamp has " and frames[-1]["code"] == "unavailable"
    stored = await database_sync_to_async(Message.objects.get)(pk=end["id"])
    assert stored.cut and stored.text == "The lamp has "
    await ledger.flush()
    [row] = await rows()
    assert outcomes([row]) == [("simple", "failed", "connection")] and row["estimated"] is True
    assert row["completion_tokens"] == count_tokens("The lamp has ", "fake-simple")
