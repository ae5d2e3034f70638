"""The answer cache's in-process semantic index: per scope, the entries' ids, questions and a
``(n, dim)`` float32 matrix of unit vectors for an exact dot-product search with numpy, plus the
exact keys of its rows (so an exact miss costs no query).

Change detection is one indexed aggregate (count and max id of the scope), run at most every
``KEFU_CACHE_INDEX_REFRESH_MS`` per scope; this process's own stores are appended at commit
(:func:`remember`) and its deletions drop the index (:func:`forget`), so they need no check. An
index that is stale about other workers' entries can only miss: ``cache_layer.services`` confirms
every candidate against its row before serving it. A vector library (usearch / faiss) is not used yet.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np
from django.db.models import Count, Max

from .config import cache_config
from .models import CachedAnswer


class ScopeIndex:
    """One scope's vectors: ``vecs`` ``(n, dim)`` float32 unit rows, ``ids`` ``(n,)`` entry ids,
    ``questions`` (n); ``keys``: exact key hash -> entry id of every row loaded (also rows whose
    vector was dropped for a wrong dimension); ``stamp``: (count, max id) of the scope as far as
    this index knows; ``checked_at``: ``time.monotonic()`` of the last stamp check.

    Appends grow preallocated buffers in place (capacity doubles), so storing an answer costs
    O(dim), not a copy of the scope. Readers in other threads hold the views ``vecs``/``ids`` of
    the first ``n`` rows, which appends never touch (they write past ``n`` and publish a new
    ``n`` only after the row is complete)."""

    def __init__(self, *, stamp: tuple[int, int], checked_at: float) -> None:
        self.stamp = stamp
        self.checked_at = checked_at
        self.dim = 0  # set by the first row added
        self._vecs = np.zeros((0, 0), dtype=np.float32)
        self._ids = np.zeros(0, dtype=np.int64)
        self.questions: list[str] = []
        self.keys: dict[str, int] = {}
        self.n = 0
        self._lock = threading.Lock()

    @property
    def vecs(self) -> np.ndarray:
        return self._vecs[: self.n]

    @property
    def ids(self) -> np.ndarray:
        return self._ids[: self.n]

    def add_rows(self, rows: Sequence[tuple[int, str, bytes, str]]) -> bool:
        """Append rows ``(id, question, embedding bytes, key_hash)`` ordered by id. Rows whose
        vector has another dimension than the index's (a model swap leaves some) are kept out of
        the vectors but their keys are kept. ``False`` (nothing changed) when a row's id is not
        above every id already held: the caller reloads the scope."""
        with self._lock:
            if rows and self.n and rows[0][0] <= int(self._ids[self.n - 1]):
                return False
            for entry_id, question, blob, key_hash in rows:
                vec = np.frombuffer(bytes(blob), dtype=np.float32)
                self.keys[key_hash] = int(entry_id)
                if self.dim == 0:
                    self.dim = vec.shape[0]
                    self._vecs = np.zeros((max(16, len(rows)), self.dim), dtype=np.float32)
                    self._ids = np.zeros(self._vecs.shape[0], dtype=np.int64)
                if vec.shape[0] != self.dim:
                    continue
                if self.n == self._vecs.shape[0]:
                    grown = max(16, 2 * self.n)
                    vecs = np.zeros((grown, self.dim), dtype=np.float32)
                    vecs[: self.n] = self._vecs[: self.n]
                    ids = np.zeros(grown, dtype=np.int64)
                    ids[: self.n] = self._ids[: self.n]
                    self._vecs, self._ids = vecs, ids
                self._vecs[self.n] = vec
                self._ids[self.n] = entry_id
                self.questions.append(question)
                self.n += 1  # published last: readers never see a half-written row
            return True


_indexes: dict[str, ScopeIndex] = {}
_indexes_lock = threading.Lock()


def _scope_stamp(scope: str) -> tuple[int, int]:
    agg = CachedAnswer.objects.filter(scope=scope).aggregate(n=Count("id"), m=Max("id"))
    return int(agg["n"] or 0), int(agg["m"] or 0)


_INDEX_COLUMNS = ("id", "question", "embedding", "key_hash")


def scope_index(scope: str) -> ScopeIndex:
    """The scope's index, brought up to date with the database when it was last checked more than
    ``KEFU_CACHE_INDEX_REFRESH_MS`` ago (a deletion by this process dropped it: it is loaded): entries
    added since it was loaded are appended (one query for the new rows only, so a store does not
    cost the next lookup a reload of the whole scope); after a deletion the scope is reloaded."""
    now = time.monotonic()
    idx = _indexes.get(scope)
    if idx is not None and now - idx.checked_at < cache_config().index_refresh_s:
        return idx
    stamp = _scope_stamp(scope)
    if idx is not None and idx.stamp == stamp:
        idx.checked_at = now
        return idx
    if idx is not None and stamp[1] > idx.stamp[1]:
        new_rows = list(
            CachedAnswer.objects.filter(scope=scope, id__gt=idx.stamp[1], embedding__isnull=False)
            .order_by("id")
            .values_list(*_INDEX_COLUMNS)
        )
        if idx.stamp[0] + len(new_rows) == stamp[0] and idx.add_rows(new_rows):  # only additions since
            idx.stamp, idx.checked_at = stamp, now
            return idx
    rows = list(
        CachedAnswer.objects.filter(scope=scope, embedding__isnull=False).order_by("id").values_list(*_INDEX_COLUMNS)
    )
    idx = ScopeIndex(stamp=stamp, checked_at=now)
    idx.add_rows(rows)
    with _indexes_lock:
        _indexes[scope] = idx
    return idx


def remember(scope: str, entry_id: int, question: str, vec: np.ndarray, key_hash: str) -> None:
    """This process stored an entry (committed): add it to the scope's index now, without a query.
    The stamp grows by one row; if another worker added rows meanwhile, the next stamp check sees
    the count differ and reloads."""
    idx = _indexes.get(scope)
    if idx is None:
        return
    if idx.add_rows([(entry_id, question, vec.astype(np.float32).tobytes(), key_hash)]):
        idx.stamp = (idx.stamp[0] + 1, max(idx.stamp[1], entry_id))
    else:
        forget([scope])


def forget(scopes: Sequence[str] | None = None) -> None:
    """Drop in-process indexes (all, or the given scopes); they reload at the next lookup."""
    with _indexes_lock:
        if scopes is None:
            _indexes.clear()
        else:
            for s in scopes:
                _indexes.pop(s, None)
