"""The hot layer (cache_layer.hot): confirmed exact hits served from this process's memory, and
dropped at once when any worker changes them, over a real Redis and its pub/sub."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from cache_layer import hot as hot_module
from cache_layer import services, vector_index
from cache_layer.exact_store import ExactEntry, RedisExactStore, set_exact_store
from cache_layer.hot import HotExact, get_hot_layer, reset_hot_layer
from cache_layer.models import CacheChange, CachedAnswer
from tests.cache_layer.entries import store_answer

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = services.scope_key(store="lantern", locale="en", tier="simple", faq_version="1", prompt_version="v1")
QUESTION = "Do you ship to Canada?"
ANSWER = "Yes, we ship to Canada in 5-8 business days."


def wait_until(condition: Callable[[], object], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


def put(question: str = QUESTION, answer: str = ANSWER) -> None:
    assert store_answer(question, answer, scope=SCOPE)


def ask(question: str = QUESTION) -> services.CacheHit | None:
    return services.lookup(question=question, scope=SCOPE, embedding=None)


def key_hash(question: str = QUESTION) -> str:
    return services._key_hash(services.exact_key_text(question))


def made_hot(hot: HotExact, question: str = QUESTION) -> None:
    """Ask until the hit is held in memory (a put races the announcement of the store's own
    write, which may arrive after the ticket was taken: the next ask puts it then)."""
    wait_until(lambda: ask(question) is not None and hot.get(SCOPE, key_hash(question)) is not None, "it is hot")


@pytest.fixture
def layer(redis_url: str) -> Iterator[tuple[HotExact, RedisExactStore]]:
    """This process's exact store in Redis under a prefix of its own, and its hot layer, live."""
    prefix = f"kefu-test:{uuid.uuid4().hex[:12]}"
    store = RedisExactStore(redis_url, prefix=prefix)
    set_exact_store(store)
    vector_index.forget()
    hot = get_hot_layer()
    assert hot is not None
    wait_until(hot.live, "the listener has subscribed")
    yield hot, store
    reset_hot_layer()
    set_exact_store(None)
    store.purge()
    store.close()


def test_a_confirmed_hit_is_next_served_from_memory_without_a_query_or_a_redis_read(layer, monkeypatch):
    hot, store = layer
    put()
    made_hot(hot)
    reads: list[object] = []
    monkeypatch.setattr(store, "get", lambda *a: reads.append(a))
    with CaptureQueriesContext(connection) as queries:
        hit = ask()
    assert hit is not None and hit.answer == ANSWER and hit.route == "cache.exact"
    assert len(queries) == 0 and reads == []


def test_another_workers_eviction_is_dropped_at_once(layer, redis_url):
    hot, store = layer
    put()
    made_hot(hot)
    entry_id = CachedAnswer.objects.get(scope=SCOPE).id
    other = RedisExactStore(redis_url, prefix=store.prefix)  # another worker: its own connections
    try:
        other.delete([(SCOPE, key_hash())])
    finally:
        other.close()
    wait_until(lambda: hot.get(SCOPE, key_hash()) is None, "the announcement dropped it")
    assert services.evict_entry(entry_id)  # the row too, as an eviction does
    assert ask() is None


def test_an_entry_marked_wrong_is_not_served_again(layer):
    hot, _store = layer
    put()
    made_hot(hot)
    assert services.evict_entry(CachedAnswer.objects.get(scope=SCOPE).id)  # what mark_wrong does
    wait_until(lambda: hot.get(SCOPE, key_hash()) is None, "the eviction's announcement arrived")
    assert ask() is None


def test_a_put_racing_an_invalidation_is_refused():
    hot = HotExact(10)
    hot.set_live(True)
    entry: ExactEntry = {"id": 1, "answer": ANSWER, "model": "m", "question": QUESTION, "created_at": "x"}
    ticket = hot.ticket()
    hot.drop_keys([(SCOPE, "k" * 64)])  # an announcement arrives between the read and the put
    assert not hot.put(SCOPE, "a" * 64, entry, 60, ticket)
    assert hot.put(SCOPE, "a" * 64, entry, 60, hot.ticket())
    assert hot.get(SCOPE, "a" * 64) == entry
    hot.set_live(False)
    assert hot.get(SCOPE, "a" * 64) is None and len(hot) == 0
    assert not hot.put(SCOPE, "a" * 64, entry, 60, hot.ticket())


def test_a_deletion_whose_announcement_was_lost_is_dropped_from_the_change_log(layer, settings):
    """Another worker deleted the row but its Redis failed: no announcement, the Redis key stays.
    The change log, read at most every KEFU_CACHE_INDEX_REFRESH_MS, drops it here too."""
    hot, store = layer
    settings.KEFU_CACHE_INDEX_REFRESH_MS = 0
    put()
    made_hot(hot)
    row = CachedAnswer.objects.get(scope=SCOPE)
    CacheChange.objects.create(scope=SCOPE, entry_id=row.id, kind=CacheChange.Kind.DELETE)
    row.delete()
    assert store.get(SCOPE, key_hash()) is not None  # still in Redis
    assert ask() is None
    assert hot.get(SCOPE, key_hash()) is None


def test_losing_redis_drops_everything_until_the_listener_is_back(private_redis):
    store = RedisExactStore(private_redis.url, prefix=f"kefu-test:{uuid.uuid4().hex[:12]}")
    set_exact_store(store)
    vector_index.forget()
    try:
        hot = get_hot_layer()
        assert hot is not None
        wait_until(hot.live, "the listener has subscribed")
        put()
        made_hot(hot)
        private_redis.restart()  # messages sent while it is away would be missed
        wait_until(lambda: hot.stats["outages"] >= 1, "the listener saw its connection go")
        assert hot.get(SCOPE, key_hash()) is None
        wait_until(hot.live, "the listener has subscribed again")
        assert len(hot) == 0
        assert ask() is not None  # from the row (the restarted Redis lost its keys)
    finally:
        reset_hot_layer()
        set_exact_store(None)
        store.close()


def test_hits_served_from_memory_are_written_to_the_row(layer, monkeypatch):
    hot, _store = layer
    monkeypatch.setattr(hot_module, "FLUSH_S", 3600.0)  # only the explicit flush below writes
    put()
    made_hot(hot)
    before = CachedAnswer.objects.get(scope=SCOPE).hits
    for _ in range(5):
        assert ask() is not None
    hot_module_flushed = services.flush_hot_hits(hot, every_s=0)
    assert hot_module_flushed == 1
    row = CachedAnswer.objects.get(scope=SCOPE)
    assert row.hits == before + 5 and row.last_hit_at is not None
    assert services.flush_hot_hits(hot, every_s=0) == 0  # nothing counted since
