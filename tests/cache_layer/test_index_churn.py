"""The answer cache's index in a steady state: expiries, evictions, deletions and other workers'
changes are applied incrementally (the scope is never reloaded on a lookup), deleted entries are
never served, and a reload that is needed runs off the lookup path."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta

import numpy as np
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext, override_settings
from django.utils import timezone

from cache_layer import services, vector_index
from cache_layer.embeddings import get_embedder
from cache_layer.models import CacheChange, CachedAnswer
from tests.cache_layer.entries import store_answer

pytestmark = pytest.mark.django_db

SCOPE = services.scope_key(store="lantern", locale="en", tier="simple", faq_version="1", prompt_version="v1")
CANADA = "Do you ship to Canada?"
RETURNS = "What is your return policy?"
CANCEL = "How do I cancel my order?"


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The index's monotonic clock, moved by hand (the refresh interval is 5 s by default)."""
    now = [1000.0]
    monkeypatch.setattr(vector_index.time, "monotonic", lambda: now[0])
    return now


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Callable[[], None]]]:
    """Background work is held here instead of starting a thread (run it to finish it)."""
    jobs: list[Callable[[], None]] = []
    monkeypatch.setattr(vector_index, "_start_background", lambda target, name: jobs.append(target))
    yield jobs


def put(question: str, answer: str) -> None:
    assert store_answer(question, answer, scope=SCOPE)


def ask(question: str) -> services.CacheHit | None:
    return services.lookup(question=question, scope=SCOPE, embedding=None)


def other_worker_stores(question: str, answer: str) -> int:
    """What ``services.store`` in another process writes: the row and its change-log row."""
    key = services.exact_key_text(question)
    row = CachedAnswer.objects.create(
        scope=SCOPE,
        key_hash=services._key_hash(key),
        key_text=key,
        question=question,
        answer=answer,
        embedding=get_embedder().embed([question])[0].astype(np.float32).tobytes(),
        route="llm.simple",
        expires_at=timezone.now() + timedelta(hours=1),
    )
    CacheChange.objects.create(scope=SCOPE, entry_id=row.id, kind=CacheChange.Kind.ADD)
    return row.id


def other_worker_deletes(entry_id: int) -> None:
    CachedAnswer.objects.filter(id=entry_id).delete()
    CacheChange.objects.create(scope=SCOPE, entry_id=entry_id, kind=CacheChange.Kind.DELETE)


def entry_id(question: str) -> int:
    return CachedAnswer.objects.get(question=question).id


def full_scope_reads(queries: list[dict[str, str]]) -> list[str]:
    """Queries that read the scope's vectors wholesale (a reload), not by id."""
    return [q["sql"] for q in queries if '"embedding"' in q["sql"] and '"scope" =' in q["sql"]]


def test_own_deletions_keep_the_index_and_are_never_served(clock: list[float]) -> None:
    put(CANADA, "Yes.")
    put(RETURNS, "30 days.")
    put(CANCEL, "Open Orders and press Cancel.")
    assert ask("do you ship to canada please") is not None  # loads the scope once
    idx = vector_index.scope_index(SCOPE)
    loads = vector_index.stats()["full_loads"]

    assert services.evict_entry(entry_id(CANADA))  # marked wrong
    CachedAnswer.objects.filter(question=RETURNS).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert services.purge_expired() == 1  # expired
    clock[0] += 6  # past the refresh interval: this process's own changes come back from the log
    with CaptureQueriesContext(connection) as queries:
        assert ask("do you ship to canada please") is None
        assert ask("what's your return policy") is None
    assert full_scope_reads(queries.captured_queries) == []
    assert vector_index.scope_index(SCOPE) is idx and vector_index.stats()["full_loads"] == loads
    assert len(idx) == 1 and entry_id(CANCEL) in idx
    hit = ask("How can I cancel my order?")
    assert hit is not None and hit.answer == "Open Orders and press Cancel."


def test_the_size_bound_evicts_without_a_reload(clock: list[float]) -> None:
    put(CANADA, "Yes.")
    assert ask("do you ship to canada please") is not None
    idx = vector_index.scope_index(SCOPE)
    with override_settings(KEFU_CACHE_MAX_ENTRIES=2):
        put(RETURNS, "30 days.")
        CachedAnswer.objects.filter(question=CANADA).update(created_at=timezone.now() - timedelta(hours=1))
        put(CANCEL, "Open Orders and press Cancel.")  # the oldest (Canada) is evicted
    assert not CachedAnswer.objects.filter(question=CANADA).exists()
    clock[0] += 6
    with CaptureQueriesContext(connection) as queries:
        assert ask("do you ship to canada please") is None
        hit = ask("what's your return policy")
    assert hit is not None and hit.answer == "30 days."
    assert full_scope_reads(queries.captured_queries) == []
    assert vector_index.scope_index(SCOPE) is idx and len(idx) == 2
    assert vector_index.stats()["lookup_path_loads"] == 1


def test_another_workers_changes_are_applied_incrementally(clock: list[float]) -> None:
    put(CANADA, "Yes.")
    put(RETURNS, "30 days.")
    assert ask("do you ship to canada please") is not None
    idx = vector_index.scope_index(SCOPE)
    other_worker_deletes(entry_id(CANADA))
    cancel = other_worker_stores(CANCEL, "Open Orders and press Cancel.")
    assert ask("How can I cancel my order?") is None  # not yet: the index trusts itself for 5 s
    clock[0] += 6
    with CaptureQueriesContext(connection) as queries:
        hit = ask("How can I cancel my order?")  # this lookup reads the log: two small queries
    assert hit is not None and hit.entry_id == cancel
    assert full_scope_reads(queries.captured_queries) == []
    assert vector_index.scope_index(SCOPE) is idx and vector_index.stats()["full_loads"] == 1
    assert entry_id(RETURNS) in idx and cancel in idx and len(idx) == 2
    assert ask("do you ship to canada please") is None


def test_another_workers_purge_empties_the_index(clock: list[float]) -> None:
    put(CANADA, "Yes.")
    assert ask("do you ship to canada please") is not None
    idx = vector_index.scope_index(SCOPE)
    CachedAnswer.objects.filter(scope=SCOPE).delete()
    CacheChange.objects.create(scope=SCOPE, kind=CacheChange.Kind.PURGE)
    clock[0] += 6
    assert ask("do you ship to canada please") is None
    assert vector_index.scope_index(SCOPE) is idx and len(idx) == 0 and not idx.keys


def test_a_change_committed_late_is_not_lost(clock: list[float]) -> None:
    """A change whose id is below one already read (its transaction committed later) is a gap,
    asked for again at the next refresh."""
    put(CANADA, "Yes.")
    assert ask("do you ship to canada please") is not None
    late = other_worker_stores(CANCEL, "Open Orders and press Cancel.")
    change = CacheChange.objects.get(entry_id=late)
    CacheChange.objects.filter(id=change.id).update(id=change.id + 1)  # as if id + 0 were still open
    clock[0] += 6
    assert vector_index.refresh() == 1
    assert late in vector_index.scope_index(SCOPE) and change.id in vector_index._cursor.gaps
    early = other_worker_stores(RETURNS, "30 days.")
    CacheChange.objects.filter(entry_id=early).update(id=change.id)  # the open transaction commits
    clock[0] += 6
    assert vector_index.refresh() == 1
    assert early in vector_index.scope_index(SCOPE)


def test_an_index_behind_the_trimmed_log_reloads_off_the_lookup_path(
    clock: list[float], held: list[Callable[[], None]]
) -> None:
    put(CANADA, "Yes.")
    assert ask("do you ship to canada please") is not None
    old = vector_index.scope_index(SCOPE)
    returns = other_worker_stores(RETURNS, "30 days.")
    CacheChange.objects.all().delete()  # trimmed before this process read it
    clock[0] += vector_index.CHANGE_LOG_RETENTION_S
    with CaptureQueriesContext(connection) as queries:
        assert ask("do you ship to canada please") is not None  # the old index still answers
    assert full_scope_reads(queries.captured_queries) == [] and len(held) == 1
    assert vector_index.scope_index(SCOPE) is old
    gone = other_worker_stores(CANCEL, "Open Orders and press Cancel.")
    other_worker_deletes(gone)
    held.pop()()  # the background load finishes; changes meanwhile are replayed onto it
    new = vector_index.scope_index(SCOPE)
    assert new is not old and returns in new and gone not in new
    assert vector_index.stats()["background_loads"] == 1 and vector_index.stats()["lookup_path_loads"] == 1


def test_a_large_scope_loads_in_the_background(monkeypatch: pytest.MonkeyPatch, held: list[Callable[[], None]]) -> None:
    monkeypatch.setattr(vector_index, "SYNC_LOAD_MAX_ROWS", 1)
    put(CANADA, "Yes.")
    put(RETURNS, "30 days.")
    assert ask("do you ship to canada please") is None  # a miss while it loads, never a wait
    assert vector_index.scope_index(SCOPE).loading and len(held) == 1
    held.pop()()
    assert not vector_index.scope_index(SCOPE).loading
    assert ask("do you ship to canada please") is not None
    assert vector_index.stats()["lookup_path_loads"] == 0


def test_a_growing_scope_moves_to_the_inverted_file_in_the_background(
    monkeypatch: pytest.MonkeyPatch, held: list[Callable[[], None]]
) -> None:
    """Past EXACT_MAX_ROWS the exact tier keeps serving while the inverted file is built from
    memory; additions and deletions made meanwhile are replayed onto it."""
    monkeypatch.setattr(vector_index, "EXACT_MAX_ROWS", 64)
    rng = np.random.default_rng(3)
    vecs = rng.standard_normal((80, 384)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    idx = vector_index.build(SCOPE, [(i + 1, f"q{i}", vecs[i].tobytes(), f"k{i}") for i in range(60)])
    assert idx.kind == "exact"
    idx.add_rows([(i + 1, f"q{i}", vecs[i].tobytes(), f"k{i}") for i in range(60, 70)])
    assert idx.kind == "exact" and len(held) == 1  # the build waits; the exact tier serves
    idx.add_rows([(i + 1, f"q{i}", vecs[i].tobytes(), f"k{i}") for i in range(70, 80)])
    assert idx.remove([1, 2, 75]) == 3
    held.pop()()
    assert idx.kind == "ivf" and len(idx) == 77
    for i in (10, 65, 79):
        found = idx.search(vecs[i], 3)
        assert found.ids[0] == i + 1 and found.sims[0] == pytest.approx(1.0, abs=1e-5)
        assert found.questions[0] == f"q{i}" and np.allclose(found.vectors[0], vecs[i])
    assert 75 not in idx.search(vecs[74], 5).ids and 75 not in idx  # removed during the build
    assert idx.remove([11]) == 1 and 11 not in idx.search(vecs[10], 5).ids
