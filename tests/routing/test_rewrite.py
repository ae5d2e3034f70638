"""Follow-ups rewritten into standalone questions (routing/prompt/rewrite.py), against the fake upstream.

The real ``openai`` client talks HTTP to tests/fake_openai.py, scripted per test; the rewrite goes
through ``stream_with_fallback`` like every remote call, so it is also a row of the cost ledger.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from channels.db import database_sync_to_async

from chat.models import Conversation, Message
from routing.models import UpstreamCall
from routing.prompt.rewrite import REWRITE_MAX_CHARS, REWRITE_MAX_TOKENS, clean_rewrite, standalone_question
from routing.providers.openai_remote import close_clients
from routing.upstream import ledger
from routing.upstream.ledger import CallContext
from tests.fake_openai import Behaviour

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

HISTORY = [
    ("shopper", "Do you sell the merino wool scarf in other colours?"),
    ("bot", "Yes: the merino wool scarf (180 cm) comes in red and blue, 39 EUR each."),
]
FOLLOW_UP = "and the blue one, is it in stock?"


@pytest.fixture(autouse=True)
def _fresh_guards(routing_guards: None) -> None:
    """Clean breakers, rate-limit book and tier limiters around each test (tests/conftest.py)."""


@pytest.fixture(autouse=True)
async def _close_clients() -> AsyncIterator[None]:
    yield
    await ledger.flush()
    await close_clients()


async def rewrite(**kw: Any) -> str | None:
    kw.setdefault("history", list(HISTORY))
    kw.setdefault("text", FOLLOW_UP)
    kw.setdefault("locale", "en")
    out = await standalone_question(**kw)
    await ledger.flush()
    return out


async def test_request_carries_history_and_text_and_the_reply_comes_back_cleaned(remote):
    remote.push(Behaviour(text='Standalone question: "Is the blue merino wool scarf (180 cm) in stock?"\n'))

    def make_message() -> tuple[Conversation, Message]:
        conversation = Conversation.objects.create(token_hash="r" * 64)
        return conversation, Message.objects.create(conversation=conversation, seq=3, role="shopper", text=FOLLOW_UP)

    conversation, message = await database_sync_to_async(make_message)()

    out = await rewrite(context=CallContext(conversation_id=conversation.id, message_id=message.pk))

    assert out == "Is the blue merino wool scarf (180 cm) in stock?"
    [request] = remote.requests
    assert request["model"] == "fake-simple"
    assert request["max_tokens"] == REWRITE_MAX_TOKENS and request["temperature"] == 0
    system, user = request["messages"]
    assert system["role"] == "system" and "standalone question" in system["content"]
    assert "English" in system["content"]
    # Every earlier turn and the follow-up itself are in the prompt.
    for _, body in HISTORY:
        assert body in user["content"]
    assert user["content"].rstrip().endswith(FOLLOW_UP)
    # The rewrite is a remote call like any other: one ledger row, with its message.
    calls = await database_sync_to_async(
        lambda: list(UpstreamCall.objects.values("tier", "outcome", "message_id", "purpose"))
    )()
    assert calls == [{"tier": "simple", "outcome": "ok", "message_id": message.pk, "purpose": "rewrite"}]


async def test_chinese_follow_up_asks_for_chinese_and_strips_the_label(remote):
    remote.push(Behaviour(text="问题：蓝色的美利奴羊毛围巾有货吗？"))

    out = await rewrite(
        history=[("shopper", "羊毛围巾有几种颜色？"), ("bot", "有红色和蓝色两种。")], text="那蓝色的呢？", locale="zh"
    )

    assert out == "蓝色的美利奴羊毛围巾有货吗？"
    system, user = remote.requests[0]["messages"]
    assert "Chinese" in system["content"] and "那蓝色的呢？" in user["content"]
    assert "羊毛围巾有几种颜色？" in user["content"]


async def test_every_attempt_failing_with_500_gives_none(remote, settings):
    settings.KEFU_LLM_RETRIES = 0
    remote.default = Behaviour(status=500)

    assert await rewrite() is None
    # simple, then the configured tiers above it: a failing rewrite never raises.
    assert [r["model"] for r in remote.requests] == ["fake-simple", "fake-medium", "fake-complex"]


async def test_a_slow_upstream_gives_none_within_the_rewrite_budget(remote, settings):
    settings.KEFU_REWRITE_TIMEOUT_S = 0.3
    remote.default = Behaviour(text="Is the blue merino wool scarf in stock?", ttft_ms=5000)

    assert await rewrite() is None
    assert len(remote.requests) == 1  # the budget ran out during the first attempt


async def test_an_empty_reply_gives_none(remote):
    remote.push(Behaviour(text=""))

    assert await rewrite() is None


@pytest.mark.parametrize(
    "behaviour",
    [
        Behaviour(text="Is the blue merino wool scarf in stock?", finish_reason="length"),  # cut by max_tokens
        Behaviour(text="Is the blue merino wool scarf in stock?\nYes, it is in stock."),  # rewrote and answered
        Behaviour(text="Is the blue scarf " + "really " * 60 + "in stock?"),  # overlong
    ],
    ids=["cut", "two-lines", "overlong"],
)
async def test_a_reply_that_is_not_one_question_gives_none(remote, behaviour):
    remote.push(behaviour)

    assert await rewrite() is None


async def test_nothing_is_asked_without_a_configured_tier_or_without_history(remote, settings):
    assert await rewrite(history=[]) is None
    assert await rewrite(history=[("bot", "  ")]) is None
    settings.KEFU_TIERS = {**settings.KEFU_TIERS, "simple": settings.KEFU_TIERS["simple"].with_current(api_key="")}
    assert await rewrite() is None
    assert remote.requests == []


async def test_clean_rewrite() -> None:
    assert clean_rewrite("  “Do you ship the oak desk to Norway?”  ") == "Do you ship the oak desk to Norway?"
    assert clean_rewrite("Question:   Is the   blue scarf in stock?") == "Is the blue scarf in stock?"
    assert clean_rewrite("\n\nIs the blue scarf in stock?\n") == "Is the blue scarf in stock?"
    assert clean_rewrite("") is None and clean_rewrite(' "" ') is None
    assert clean_rewrite("a" * REWRITE_MAX_CHARS) == "a" * REWRITE_MAX_CHARS
    assert clean_rewrite("a" * (REWRITE_MAX_CHARS + 1)) is None
