"""Verified promotion over /ws/chat/ with the fake upstream as the judge: a near miss of the cache
is judged by the simple tier after its answer reached the shopper, a "same" verdict lets the
cached entry answer the next paraphrase, "different" does not, and with no simple tier nothing is
judged (fail closed)."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest
from channels.db import database_sync_to_async

from cache_layer.models import CachedAnswer, CacheJudgement
from routing.models import UpstreamCall
from tests.cache_layer.entries import store_answer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fake_openai import Behaviour

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture(autouse=True)
def promotion_on(settings):
    """Promotion is on by default, off in the test settings (it calls a test's upstream after the
    answer): these tests are about it."""
    settings.KEFU_CACHE_PROMOTION = True


# Cosines as the router embeds them (no rule serves any of the three pairs; the intent model does
# not unify them): NEAR is 0.872 from CACHED, LATER 0.912 from CACHED and 0.897 from NEAR.
CACHED = "How can I sign up for an account on your site?"
ANSWER = "Choose Sign up at the top of any page and confirm your e-mail."
NEAR = "create account"
LATER = "What do I need to do to register an account?"


async def ask(make_client, text: str) -> dict:
    shopper = await make_client()
    await shopper.hello()
    await shopper.say(text)
    return (await shopper.until("stream.end"))[-1]


async def judgements() -> list[CacheJudgement]:
    return await database_sync_to_async(lambda: list(CacheJudgement.objects.order_by("id")))()


async def judged(timeout_s: float = 20.0) -> CacheJudgement:
    """The first judgement once it has a verdict (the judge runs in a worker thread)."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = [r for r in await judgements() if r.verdict != "pending"]
        if rows:
            return rows[0]
        assert time.monotonic() < deadline, "no judgement was recorded"
        await asyncio.sleep(0.05)


async def judge_replies(make_client, remote, reply: str) -> CacheJudgement:
    """CACHED answered by the model and cached, then NEAR answered by the model (a miss), and the
    judge's ``reply`` about the two; the judgement once it has its verdict."""
    remote.push(Behaviour(text=ANSWER))
    assert (await ask(make_client, CACHED))["route"] == "llm.simple"
    remote.push(Behaviour(text="Use Sign up at the top of the page."), Behaviour(text=reply))
    near = await ask(make_client, NEAR)
    assert near["route"] == "llm.simple" and near["text"] == "Use Sign up at the top of the page."
    return await judged()


async def test_a_near_miss_judged_the_same_serves_the_next_paraphrase(make_client, faq, remote):
    row = await judge_replies(make_client, remote, "SAME")
    assert row.verdict == "same" and row.question == NEAR and row.cached_question == CACHED
    assert row.similarity == pytest.approx(0.872, abs=0.01)
    judge = remote.requests[-1]
    assert "SAME or DIFFERENT" in judge["messages"][0]["content"]
    assert NEAR in judge["messages"][1]["content"] and CACHED in judge["messages"][1]["content"]
    assert judge["max_tokens"] == 4
    purposes = await database_sync_to_async(lambda: list(UpstreamCall.objects.values_list("purpose", flat=True)))()
    assert sorted(purposes) == ["answer", "answer", "judge"]
    entry = await database_sync_to_async(CachedAnswer.objects.get)(question=CACHED)
    assert entry.verified_cosine == pytest.approx(row.similarity)

    later = await ask(make_client, LATER)
    assert later["route"] == "cache.semantic" and later["text"] == ANSWER
    assert len(remote.requests) == 3  # the paraphrase cost nothing


async def test_a_near_miss_judged_different_promotes_nothing(make_client, faq, remote):
    row = await judge_replies(make_client, remote, "Different.")
    assert row.verdict == "different" and row.alias_id is None
    remote.push(Behaviour(text="Only an e-mail address and a password."))
    later = await ask(make_client, LATER)
    assert later["route"] == "llm.simple" and later["text"] == "Only an e-mail address and a password."


async def test_an_unreadable_verdict_promotes_nothing(make_client, faq, remote):
    row = await judge_replies(make_client, remote, "Well, it depends.")
    assert row.verdict == "error" and "unreadable" in row.detail
    entry = await database_sync_to_async(CachedAnswer.objects.get)(question=CACHED)
    assert entry.verified_cosine is None


async def test_without_a_simple_tier_nothing_is_judged(faq):
    # No remote tier configured (the test settings' default): a near miss exists, nothing judges it.
    from cache_layer import promotion as cache_promotion
    from cache_layer import services as cache
    from routing import tasks
    from routing.cache_review import promotion

    def scenario() -> tuple[int | None, str]:
        scope = "test-scope"
        for question, answer in ((CACHED, ANSWER), (NEAR, "Use Sign up at the top of the page.")):
            assert store_answer(question, answer, scope=scope)
        assert cache.near_miss(question=NEAR, scope=scope, embedding=None) is not None
        opened = tasks.maybe_judge(question=NEAR, scope=scope, embedding=None)
        # A judgement left pending from a time with a judge fails closed too.
        entry = CachedAnswer.objects.get(question=CACHED)
        pending = cache_promotion.judgement_open(scope=scope, entry_id=entry.pk, question=NEAR, similarity=0.87)
        assert pending is not None
        row = promotion.judge(judgement_id=pending)
        assert row is not None
        return opened, f"{row.verdict}: {row.detail}"

    assert not promotion.enabled()
    opened, outcome = await database_sync_to_async(scenario)()
    assert opened is None
    assert outcome == "error: no simple tier configured"
    entry = await database_sync_to_async(CachedAnswer.objects.get)(question=CACHED)
    assert entry.verified_cosine is None
