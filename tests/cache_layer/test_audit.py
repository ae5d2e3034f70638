"""The measured false-hit rate (cache_layer/audit.py, routing/cache_review/audit.py, routing/tasks.py): sampled
re-answers, agents' marks, Wilson intervals.

Re-answers go over real HTTP to the project's fake OpenAI server (tests/fake_openai.py) through
the Celery task, which runs eagerly on the embedded defaults and takes the audit row's id only.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from cache_layer import audit, services, vector_index
from cache_layer.audit import false_hit_rates, mark_wrong, wilson_interval
from cache_layer.embeddings import get_embedder
from cache_layer.intent_model import get_intent_model
from cache_layer.models import CacheAudit, CachedAnswer
from routing import tasks
from routing.cache_review import audit as reanswer
from routing.faq.model import normalise_text
from routing.models import UpstreamCall
from routing.providers import ratelimits
from routing.tasks import maybe_audit
from routing.upstream import breaker, throttle
from tests.cache_layer.entries import store_answer
from tests.fake_openai import Behaviour

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = services.scope_key(store="lantern", locale="en", tier="simple", faq_version="per-answer", prompt_version="v1")
CACHED_Q = "Do you ship the walnut desk to Norway?"
SERVED_Q = "Can you ship the walnut desk to Norway?"
CACHED_A = "Yes, we ship the walnut desk to Norway; delivery takes 5-7 business days."


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    vector_index.forget()
    breaker.reset_breakers()
    ratelimits.book.clear()
    throttle.reset()
    yield
    vector_index.forget()
    breaker.reset_breakers()
    ratelimits.book.clear()
    throttle.reset()


def put(question: str = CACHED_Q, answer: str = CACHED_A) -> int:
    assert store_answer(question, answer, scope=SCOPE, model="fake-simple")
    return CachedAnswer.objects.get(question=question).id


def expected_intent(question: str) -> str:
    """What the brief says the row holds: the cache intent model's intent of the router's vector."""
    model = get_intent_model()
    if model is None:
        return "other"
    vec = get_embedder().embed([normalise_text(question)])[0]
    return model.resolve(vec[None])[0].intent


def test_a_sampled_hit_answered_the_same_way_is_recorded_same(faq, remote, settings):
    settings.KEFU_CACHE_AUDIT_RATE = 1.0
    entry_id = put()
    remote.push(Behaviour(text=CACHED_A))

    assert maybe_audit(entry_id=entry_id, question=SERVED_Q, message_id=None) is True

    [row] = CacheAudit.objects.all()
    assert row.verdict == "same" and row.similarity is not None and row.similarity > 0.99
    assert row.entry_id == entry_id and row.message_id is None
    assert (row.question, row.cached_question, row.cached_answer, row.fresh_answer) == (
        SERVED_Q,
        CACHED_Q,
        CACHED_A,
        CACHED_A,
    )
    assert row.tier == "simple" and row.model == "fake-simple"
    assert row.intent == expected_intent(SERVED_Q)
    # Re-asked with the router's grounded prompt: system prompt with the FAQ, then the served question alone.
    [request] = remote.requests
    assert request["model"] == "fake-simple"
    system, user = request["messages"]
    assert system["role"] == "system" and "Store information:" in system["content"] and "- Q: " in system["content"]
    assert user == {"role": "user", "content": SERVED_Q}
    # A verdict of "same" leaves the entry alone.
    assert CachedAnswer.objects.filter(id=entry_id).exists()
    # The re-answer is in the cost ledger, attached to no conversation (it answered no shopper).
    assert list(UpstreamCall.objects.values_list("tier", "outcome", "conversation_id", "message_id", "purpose")) == [
        ("simple", "ok", None, None, "audit")
    ]


def test_a_sampled_hit_answered_otherwise_is_recorded_different_and_not_evicted(faq, remote, settings):
    settings.KEFU_CACHE_AUDIT_RATE = 1.0
    entry_id = put()
    remote.push(Behaviour(text="Our gift cards never expire and can be used on any product in the store."))

    assert maybe_audit(entry_id=entry_id, question=SERVED_Q, message_id=None)

    [row] = CacheAudit.objects.all()
    assert row.verdict == "different" and row.similarity < settings.KEFU_CACHE_AUDIT_SAME_COSINE
    assert CachedAnswer.objects.filter(id=entry_id).exists()  # counted, not evicted
    [rate] = false_hit_rates()
    assert (rate.intent, rate.n, rate.different, rate.rate) == (row.intent, 1, 1, 1.0)


def test_rate_zero_never_samples_and_the_draw_follows_the_rate(settings):
    entry_id = put()
    settings.KEFU_CACHE_AUDIT_RATE = 0.0
    assert maybe_audit(entry_id=entry_id, question=SERVED_Q, message_id=None) is False
    assert CacheAudit.objects.count() == 0

    settings.KEFU_CACHE_AUDIT_RATE = 0.3
    expected_draws = random.Random(7)
    draws = [expected_draws.random() for _ in range(6)]
    rng = random.Random(7)
    got = [maybe_audit(entry_id=entry_id, question=SERVED_Q, message_id=None, rng=rng) for _ in range(6)]
    assert got == [d < 0.3 for d in draws] and any(got) and not all(got)
    # Each draw ran the task (eager Celery); with no remote tier configured each is an error row.
    assert list(CacheAudit.objects.values_list("verdict", "detail")) == [("error", "no remote tier configured")] * sum(
        got
    )


def test_a_failing_upstream_is_an_error_row_not_counted(faq, remote, settings):
    settings.KEFU_CACHE_AUDIT_RATE = 1.0
    settings.KEFU_LLM_RETRIES = 0
    remote.default = Behaviour(status=500)
    entry_id = put()

    assert maybe_audit(entry_id=entry_id, question=SERVED_Q, message_id=None)

    [row] = CacheAudit.objects.all()
    assert row.verdict == "error" and row.detail == "upstream: server" and row.similarity is None
    [rate] = false_hit_rates()
    assert (rate.n, rate.errors) == (0, 1)
    assert CachedAnswer.objects.filter(id=entry_id).exists()


def test_an_entry_evicted_before_its_audit_records_nothing(remote, settings):
    entry_id = put()
    audit_id = audit.audit_open(entry_id=entry_id, question=SERVED_Q, message_id=None)
    assert audit_id is not None and CacheAudit.objects.get(id=audit_id).verdict == "pending"
    services.evict_entry(entry_id)

    assert reanswer.audit_hit(audit_id=audit_id) is None
    assert CacheAudit.objects.count() == 0 and remote.requests == []
    # Gone before the draw: the draw happens, no row is opened, nothing is asked.
    settings.KEFU_CACHE_AUDIT_RATE = 1.0
    assert maybe_audit(entry_id=entry_id, question=SERVED_Q, message_id=None) is True
    assert CacheAudit.objects.count() == 0 and remote.requests == []


def test_the_task_takes_the_audit_rows_id_only(faq, remote, settings, monkeypatch):
    """No shopper text goes through the broker: the task's one argument is the pending row's id."""
    settings.KEFU_CACHE_AUDIT_RATE = 1.0
    entry_id = put()
    sent: list[tuple[tuple, dict]] = []
    monkeypatch.setattr(tasks.audit_cache_hit, "delay", lambda *a, **k: sent.append((a, k)))

    assert maybe_audit(entry_id=entry_id, question=SERVED_Q, message_id=7) is True

    [row] = CacheAudit.objects.all()
    assert sent == [((row.id,), {})]
    assert (row.verdict, row.question, row.message_id, row.entry_id) == ("pending", SERVED_Q, 7, entry_id)
    [rate] = false_hit_rates()
    assert (rate.n, rate.errors) == (0, 0)  # a pending audit counts nowhere


async def test_the_async_entry_point_hands_the_audit_to_a_thread(faq, remote, settings):
    from channels.db import database_sync_to_async

    settings.KEFU_CACHE_AUDIT_RATE = 1.0
    entry_id = await database_sync_to_async(put)()
    remote.push(Behaviour(text=CACHED_A))

    assert await tasks.maybe_audit_async(entry_id=entry_id, question=SERVED_Q, message_id=None)
    await tasks.drain()

    verdicts = await database_sync_to_async(lambda: list(CacheAudit.objects.values_list("verdict", flat=True)))()
    assert verdicts == ["same"]


async def test_the_sync_entry_point_also_works_from_database_sync_to_async(faq, remote, settings):
    """The eager task then runs in the thread-sensitive thread; its re-answer must not touch the
    server's loop (nor close its upstream clients)."""
    from channels.db import database_sync_to_async

    settings.KEFU_CACHE_AUDIT_RATE = 1.0
    entry_id = await database_sync_to_async(put)()
    remote.push(Behaviour(text="Our gift cards never expire and can be used on any product in the store."))

    assert await database_sync_to_async(maybe_audit)(entry_id=entry_id, question=SERVED_Q, message_id=None)

    verdicts = await database_sync_to_async(lambda: list(CacheAudit.objects.values_list("verdict", flat=True)))()
    assert verdicts == ["different"]


def test_mark_wrong_evicts_the_entry_and_counts_as_a_false_hit(settings):
    entry_id = put()
    hit = services.lookup(question=CACHED_Q, scope=SCOPE, embedding=None)
    assert hit is not None and hit.entry_id == entry_id

    assert mark_wrong(entry_id=entry_id, by="alice") is True

    assert services.lookup(question=CACHED_Q, scope=SCOPE, embedding=None) is None
    assert services.lookup(question=SERVED_Q, scope=SCOPE, embedding=None) is None
    assert not CachedAnswer.objects.filter(id=entry_id).exists()
    [row] = CacheAudit.objects.all()
    assert row.verdict == "agent_wrong" and row.marked_by == "alice" and row.entry_id is None
    assert (row.cached_question, row.cached_answer) == (CACHED_Q, CACHED_A)
    assert row.intent == expected_intent(CACHED_Q)
    [rate] = false_hit_rates()
    assert (rate.n, rate.agent_wrong, rate.rate) == (1, 1, 1.0)
    # Already gone: nothing more is recorded.
    assert mark_wrong(entry_id=entry_id, by="alice") is False
    assert CacheAudit.objects.count() == 1


def test_rates_per_intent_count_different_and_agent_wrong_but_not_errors():
    def rows(intent: str, verdict: str, k: int) -> list[CacheAudit]:
        return [
            CacheAudit(intent=intent, verdict=verdict, question="q", cached_question="q", cached_answer="a")
            for _ in range(k)
        ]

    CacheAudit.objects.bulk_create(
        rows("shipping", "same", 95)
        + rows("shipping", "different", 3)
        + rows("shipping", "agent_wrong", 2)
        + rows("shipping", "error", 4)
        + rows("refund", "same", 10)
    )

    shipping, refund = false_hit_rates()
    assert (shipping.intent, shipping.n, shipping.different, shipping.agent_wrong, shipping.errors) == (
        "shipping",
        100,
        3,
        2,
        4,
    )
    assert shipping.rate == pytest.approx(0.05)
    assert (shipping.low, shipping.high) == pytest.approx(wilson_interval(5, 100))
    assert (refund.intent, refund.n, refund.rate, refund.low) == ("refund", 10, 0.0, 0.0)
    assert refund.high == pytest.approx(0.27753, abs=1e-5)


@pytest.mark.parametrize(
    "successes, n, low, high",
    [
        # By hand with z = 1.959964 (Wilson 1927): 0 of 10 -> centre = (z²/20)/(1+z²/10) = 0.138766,
        # half = (z/(1+z²/10))·sqrt(z²/400) = 0.138766: (0, 0.277533).
        (0, 10, 0.0, 0.277533),
        # 5 of 100: centre = (0.05 + z²/200)/(1+z²/100) = 0.066647,
        # half = (z/(1+z²/100))·sqrt(0.05·0.95/100 + z²/40000) = 0.045104: (0.021544, 0.111750).
        (5, 100, 0.021544, 0.111750),
        # 10 of 10 mirrors 0 of 10.
        (10, 10, 0.722467, 1.0),
    ],
)
def test_wilson_interval_known_values(successes, n, low, high):
    got = wilson_interval(successes, n)
    assert got == pytest.approx((low, high), abs=1e-6)


def test_wilson_interval_edges():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(3, 2)
    low, high = wilson_interval(50, 1000)
    assert low < 0.05 < high and high - low < wilson_interval(5, 100)[1] - wilson_interval(5, 100)[0]


def test_admin_changelist_shows_the_rates(admin_client):
    CacheAudit.objects.create(
        intent="shipping", verdict="different", question="q", cached_question="q", cached_answer="a", similarity=0.4
    )
    response = admin_client.get("/admin/cache_layer/cacheaudit/")
    assert response.status_code == 200
    [rate] = response.context["false_hit_rates"]
    assert (rate.intent, rate.n, rate.different) == ("shipping", 1, 1)
    assert b'id="false-hit-rates"' in response.content
    assert admin_client.get("/admin/cache_layer/cacheaudit/add/").status_code == 403
