"""The exact store: both backends on their own, then as the answer cache's fast path.

Redis tests use the real server at ``REDIS_URL`` over a real connection, each under its own key
prefix, deleted afterwards.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from cache_layer import exact_store, services, vector_index
from cache_layer.exact_store import ExactEntry, LocalExactStore, RedisExactStore, get_exact_store, set_exact_store
from cache_layer.models import CachedAnswer
from tests.cache_layer.entries import store_answer

SCOPE = services.scope_key(store="lantern", locale="en", tier="simple", faq_version="1", prompt_version="v1")
OTHER_SCOPE = services.scope_key(store="lantern", locale="zh", tier="simple", faq_version="1", prompt_version="v1")


def entry(i: int = 1, answer: str = "Yes, we ship to Canada.") -> ExactEntry:
    return {
        "id": i,
        "answer": answer,
        "model": "gpt-test",
        "question": "Do you ship to Canada?",
        "created_at": timezone.now().isoformat(),
    }


def put(question: str, answer: str, *, scope: str = SCOPE, grounded_on: list[int] | None = None) -> bool:
    return store_answer(question, answer, scope=scope, grounded_on=grounded_on)


def ask(question: str, *, scope: str = SCOPE) -> services.CacheHit | None:
    return services.lookup(question=question, scope=scope, embedding=None)


def kh(question: str) -> str:
    return services._key_hash(services.exact_key_text(question))


def new_redis_store(redis_url: str, prefix: str) -> RedisExactStore:
    return RedisExactStore(redis_url, prefix=prefix)


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of this test's own; every key under it is deleted afterwards."""
    p = f"kefu-test:{uuid.uuid4().hex[:12]}"
    yield p
    cleaner = RedisExactStore(redis_url, prefix=p)
    cleaner.purge()
    cleaner.close()


@pytest.fixture
def worker_a(redis_url: str, prefix: str) -> Iterator[RedisExactStore]:
    """This process's exact store, in Redis."""
    store = new_redis_store(redis_url, prefix)
    set_exact_store(store)
    vector_index.forget()
    yield store
    set_exact_store(None)
    store.close()


@pytest.fixture
def worker_b(redis_url: str, prefix: str) -> Iterator[RedisExactStore]:
    """Another worker's store: its own connection pool, the same Redis and namespace."""
    store = new_redis_store(redis_url, prefix)
    yield store
    store.close()


@pytest.fixture
def local_store() -> Iterator[LocalExactStore]:
    store = LocalExactStore(max_entries=100)
    set_exact_store(store)
    vector_index.forget()
    yield store
    set_exact_store(None)


# --- Local backend -----------------------------------------------------------------------------------


def test_local_set_get_delete_purge() -> None:
    store = LocalExactStore(max_entries=10)
    first = entry(1)
    store.set(SCOPE, "a" * 64, first, ttl_s=60)
    store.set(OTHER_SCOPE, "a" * 64, entry(2), ttl_s=60)
    assert store.get(SCOPE, "a" * 64) == first
    assert store.get(SCOPE, "b" * 64) is None
    assert store.delete([(SCOPE, "a" * 64), (SCOPE, "b" * 64)]) == 1
    assert store.get(SCOPE, "a" * 64) is None and store.get(OTHER_SCOPE, "a" * 64) is not None
    store.set(SCOPE, "c" * 64, entry(3), ttl_s=60)
    assert store.purge(OTHER_SCOPE) == 1
    assert store.get(SCOPE, "c" * 64) is not None
    assert store.purge() == 1 and len(store) == 0


def test_local_expiry_is_absolute_and_a_hit_does_not_extend_it(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(exact_store.time, "monotonic", lambda: clock[0])
    store = LocalExactStore()
    store.set(SCOPE, "a" * 64, entry(), ttl_s=10)
    for _ in range(9):  # a hit every second: each would push a sliding expiry forward
        clock[0] += 1
        assert store.get(SCOPE, "a" * 64) is not None
    clock[0] += 1  # 10 s after the set
    assert store.get(SCOPE, "a" * 64) is None
    assert len(store) == 0
    store.set(SCOPE, "b" * 64, entry(), ttl_s=0)  # no lifetime left: not stored
    assert store.get(SCOPE, "b" * 64) is None


def test_local_bound_drops_the_least_recently_used() -> None:
    store = LocalExactStore(max_entries=3)
    for h in "abc":
        store.set(SCOPE, h * 64, entry(), ttl_s=60)
    assert store.get(SCOPE, "a" * 64) is not None  # "a" used again: "b" is now the oldest
    store.set(SCOPE, "d" * 64, entry(), ttl_s=60)
    assert len(store) == 3
    assert store.get(SCOPE, "b" * 64) is None
    assert all(store.get(SCOPE, h * 64) is not None for h in "acd")
    with pytest.raises(ValueError, match="max_entries"):
        LocalExactStore(max_entries=0)


def test_local_store_is_safe_from_many_threads() -> None:
    store = LocalExactStore(max_entries=500)
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(300):
                key = f"{t}-{i}".ljust(64, "x")
                store.set(SCOPE, key, entry(i), ttl_s=60)
                got = store.get(SCOPE, key)
                assert got is None or got["id"] == i  # None only if the bound already dropped it
                if i % 7 == 0:
                    store.delete([(SCOPE, key)])
        except BaseException as e:  # collected and re-raised in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert len(store) <= 500


# --- Redis backend -----------------------------------------------------------------------------------


def test_redis_keys_are_namespaced_by_scope_hash_and_hold_json(redis_url: str, prefix: str) -> None:
    import redis

    store = new_redis_store(redis_url, prefix)
    store.set(SCOPE, "a" * 64, entry(7, "Oui, 是的."), ttl_s=60)
    key = f"{prefix}:{exact_store.scope_hash(SCOPE)}:{'a' * 64}"
    assert store.key(SCOPE, "a" * 64) == key
    raw = redis.Redis.from_url(redis_url).get(key)
    assert raw is not None and b'"id": 7' in raw
    got = store.get(SCOPE, "a" * 64)
    assert got is not None and got["answer"] == "Oui, 是的." and got["id"] == 7
    assert store.get(OTHER_SCOPE, "a" * 64) is None
    assert exact_store.DEFAULT_PREFIX == "kefu:cache:exact"
    store.close()


def test_redis_expiry_is_absolute_and_a_hit_does_not_extend_it(redis_url: str, prefix: str) -> None:
    store = new_redis_store(redis_url, prefix)
    store.set(SCOPE, "a" * 64, entry(), ttl_s=60)
    first = store.ttl_ms(SCOPE, "a" * 64)
    assert 0 < first <= 60_000
    time.sleep(0.05)
    for _ in range(5):
        assert store.get(SCOPE, "a" * 64) is not None
    assert 0 < store.ttl_ms(SCOPE, "a" * 64) < first  # still counting down, not reset by the hits
    store.set(SCOPE, "b" * 64, entry(), ttl_s=0.3)
    time.sleep(0.8)  # well past the 0.3 s lifetime
    assert store.get(SCOPE, "b" * 64) is None
    store.set(SCOPE, "a" * 64, entry(), ttl_s=-1)  # no lifetime left: the key goes
    assert store.get(SCOPE, "a" * 64) is None
    store.close()


def test_redis_delete_and_purge_by_scope(redis_url: str, prefix: str) -> None:
    store = new_redis_store(redis_url, prefix)
    for i in range(1200):  # more than one SCAN page and one delete chunk
        store.set(SCOPE, f"{i:064d}", entry(i), ttl_s=60)
    store.set(OTHER_SCOPE, "a" * 64, entry(), ttl_s=60)
    assert store.delete([(SCOPE, f"{0:064d}"), (SCOPE, "z" * 64)]) == 1
    assert store.purge(SCOPE) == 1199
    assert store.get(SCOPE, f"{5:064d}") is None
    assert store.get(OTHER_SCOPE, "a" * 64) is not None
    assert store.purge() == 1
    store.close()


def test_two_workers_see_each_others_entries(redis_url: str, prefix: str) -> None:
    alice_worker = new_redis_store(redis_url, prefix)
    bob_worker = new_redis_store(redis_url, prefix)
    alice_worker.set(SCOPE, "a" * 64, entry(3, "30 days."), ttl_s=60)
    got = bob_worker.get(SCOPE, "a" * 64)
    assert got is not None and got["answer"] == "30 days."
    bob_worker.delete([(SCOPE, "a" * 64)])
    assert alice_worker.get(SCOPE, "a" * 64) is None
    alice_worker.close()
    bob_worker.close()


def test_backend_follows_redis_url(settings: Any, redis_url: str) -> None:
    settings.REDIS_URL = redis_url
    store = get_exact_store()
    assert isinstance(store, RedisExactStore) and store.prefix == "kefu:cache:exact"
    settings.REDIS_URL = ""
    assert isinstance(get_exact_store(), LocalExactStore)


# --- As the answer cache's fast path -----------------------------------------------------------------
# These tests commit (transaction=True): services.store writes the exact store on commit only.


@pytest.mark.django_db(transaction=True)
def test_stored_answer_is_served_from_redis_with_one_query(
    worker_a: RedisExactStore, django_assert_num_queries: Any, settings: Any
) -> None:
    # The Redis layer alone (the hot layer in front of it, and its change-log cursor read once a
    # process, are tests/cache_layer/test_hot_layer.py's).
    settings.KEFU_CACHE_HOT_MAX_ENTRIES = 0
    assert put("Do you ship to Canada?", "Yes, in 5-7 days.")
    row = CachedAnswer.objects.get()
    got = worker_a.get(SCOPE, kh("Do you ship to Canada?"))
    assert got is not None and got["id"] == row.id and got["answer"] == "Yes, in 5-7 days."
    with django_assert_num_queries(1):  # the UPDATE that records the hit; no SELECT
        hit = ask("do you ship to CANADA ?")
    assert hit is not None and hit.route == "cache.exact" and hit.answer == "Yes, in 5-7 days."
    row.refresh_from_db()
    assert row.hits == 1 and row.last_hit_at is not None


@pytest.mark.django_db(transaction=True)
def test_key_lives_until_the_rows_expiry_and_hits_do_not_extend_it(worker_a: RedisExactStore) -> None:
    assert put("Do you ship to Canada?", "Yes.")
    key = kh("Do you ship to Canada?")
    assert 0 < worker_a.ttl_ms(SCOPE, key) <= services.ttl_s() * 1000
    # A row with 100 s left, its key missing (a cold store): the database hit refills the store
    # with the row's remaining lifetime, not a fresh TTL.
    CachedAnswer.objects.update(expires_at=timezone.now() + timedelta(seconds=100))
    worker_a.purge()
    assert ask("Do you ship to Canada?") is not None
    assert 0 < worker_a.ttl_ms(SCOPE, key) <= 100_000
    before = worker_a.ttl_ms(SCOPE, key)
    assert ask("Do you ship to Canada?") is not None  # a hit from the store
    assert worker_a.ttl_ms(SCOPE, key) <= before
    assert CachedAnswer.objects.get().expires_at < timezone.now() + timedelta(seconds=101)


@pytest.mark.django_db(transaction=True)
def test_another_worker_serves_an_entry_stored_by_this_one(
    worker_a: RedisExactStore, worker_b: RedisExactStore, django_assert_num_queries: Any, settings: Any
) -> None:
    settings.KEFU_CACHE_HOT_MAX_ENTRIES = 0  # the Redis layer alone, as above
    assert put("What is your return policy?", "30 days.")
    set_exact_store(worker_b)
    with django_assert_num_queries(1):
        hit = ask("what is your return policy")
    assert hit is not None and hit.answer == "30 days." and hit.route == "cache.exact"


@pytest.mark.django_db(transaction=True)
def test_every_deletion_path_removes_the_keys(worker_a: RedisExactStore, settings: Any) -> None:
    def present(q: str, scope: str = SCOPE) -> bool:
        return worker_a.get(scope, kh(q)) is not None

    assert put("What is your return policy?", "30 days.", grounded_on=[7])
    assert put("Do you ship to Canada?", "Yes.", grounded_on=[8])
    assert put("Which payment methods do you accept?", "Visa.", grounded_on=[9])
    assert put("Do you ship to Canada?", "是的。", scope=OTHER_SCOPE)
    assert all(
        present(q)
        for q in ("What is your return policy?", "Do you ship to Canada?", "Which payment methods do you accept?")
    )

    assert services.evict_for_faq_entry(7) == 1
    assert not present("What is your return policy?") and present("Do you ship to Canada?")

    canada = CachedAnswer.objects.get(scope=SCOPE, question="Do you ship to Canada?")
    assert services.evict_entry(canada.id)
    assert not present("Do you ship to Canada?") and present("Do you ship to Canada?", OTHER_SCOPE)

    assert services.purge(scope=OTHER_SCOPE) == 1
    assert not present("Do you ship to Canada?", OTHER_SCOPE) and present("Which payment methods do you accept?")

    CachedAnswer.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    assert present("Which payment methods do you accept?")  # the row's expiry moved, the key's did not
    assert services.purge_expired() == 1
    assert not present("Which payment methods do you accept?")

    settings.KEFU_CACHE_MAX_ENTRIES = 1
    assert put("What is your return policy?", "30 days.")
    CachedAnswer.objects.update(created_at=timezone.now() - timedelta(hours=1))
    assert put("Do you ship to Canada?", "Yes.")
    assert not present("What is your return policy?") and present("Do you ship to Canada?")

    assert services.purge() == 1
    assert not present("Do you ship to Canada?")


@pytest.mark.django_db(transaction=True)
def test_a_key_whose_row_is_gone_is_never_served(worker_a: RedisExactStore) -> None:
    """A deletion that missed the store (another worker's memory, Redis briefly down) is caught."""
    assert put("Do you ship to Canada?", "Yes.")
    CachedAnswer.objects.all().delete()  # straight to the database: the key stays
    assert worker_a.get(SCOPE, kh("Do you ship to Canada?")) is not None
    assert ask("Do you ship to Canada?") is None
    assert worker_a.get(SCOPE, kh("Do you ship to Canada?")) is None  # dropped on the way
    # Replaced by a newer row with the same key: the newer answer is served, never the old one.
    assert put("Do you ship to Canada?", "No longer.")
    stale: ExactEntry = {
        "id": 10_000,
        "answer": "Yes.",
        "model": "gpt-test",
        "question": "Do you ship to Canada?",
        "created_at": timezone.now().isoformat(),
    }
    worker_a.set(SCOPE, kh("Do you ship to Canada?"), stale, ttl_s=60)
    hit = ask("Do you ship to Canada?")
    assert hit is not None and hit.answer == "No longer."


@pytest.mark.django_db(transaction=True)
def test_redis_down_falls_back_to_the_database() -> None:
    set_exact_store(RedisExactStore("redis://127.0.0.1:1/0", timeout_ms=200))  # nothing listens on port 1
    try:
        assert put("Do you ship to Canada?", "Yes.")
        hit = ask("Do you ship to Canada?")
        assert hit is not None and hit.answer == "Yes." and hit.route == "cache.exact"
        assert services.purge() == 1
    finally:
        set_exact_store(None)


@pytest.mark.django_db(transaction=True)
def test_local_backend_fast_path(local_store: LocalExactStore, django_assert_num_queries: Any) -> None:
    assert put("Do you ship to Canada?", "Yes.")
    assert local_store.get(SCOPE, kh("Do you ship to Canada?")) is not None
    with django_assert_num_queries(1):
        assert ask("Do you ship to Canada?") is not None
    assert services.purge() == 1
    assert len(local_store) == 0
    assert ask("Do you ship to Canada?") is None


@pytest.mark.django_db(transaction=True)
def test_store_inside_a_rolled_back_transaction_leaves_no_key(local_store: LocalExactStore) -> None:
    from django.db import transaction

    with pytest.raises(RuntimeError), transaction.atomic():
        assert put("Do you ship to Canada?", "Yes.")
        raise RuntimeError("the caller's transaction fails")
    assert local_store.get(SCOPE, kh("Do you ship to Canada?")) is None
    assert CachedAnswer.objects.count() == 0
