"""The answer cache's service API: scope keys, lookup (exact, then semantic + guard), store, eviction.

Storage (first version): entries live in the database (:class:`~cache_layer.models.CachedAnswer`),
so they survive a restart and every worker sees them. Each process keeps an in-memory index per
scope (the scope's ids, questions and a ``(n, dim)`` float32 matrix) for the semantic search: an
exact dot-product search with numpy, refreshed when the scope's entries change. Change detection is
one indexed aggregate per lookup (count and max id of the scope), so an entry stored by another
worker is seen at that worker's next lookup. Redis for the exact cache and a vector library (usearch
/ faiss) are not used yet.

Settings read (``getattr(settings, name, default)``):
- ``KEFU_CACHE_ENABLED`` (True)
- ``KEFU_CACHE_TTL_S`` (604800 = 7 days): absolute lifetime of an entry;
- ``KEFU_CACHE_MAX_ENTRIES`` (100000): size bound over all scopes, oldest evicted first;
- ``KEFU_CACHE_SEMANTIC_THRESHOLD`` (0.93): cosine needed for a semantic hit (measured, see
  ``bench/cache_guard_eval.py``);
- ``KEFU_CACHE_GUARD_MAX_EXTRA`` (1): content words one question may add (see ``similarity.guard``);
- ``KEFU_CACHE_SEMANTIC_CANDIDATES`` (5): above-threshold neighbours tried against the guard.
"""
from __future__ import annotations

import hashlib
import logging
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Sequence

import numpy as np
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Count, F, Max
from django.utils import timezone

from .models import CachedAnswer, CachedAnswerGround
from .normalise import exact_key_text
from .policy import may_cache_answer, may_cache_question
from .similarity import guard

log = logging.getLogger(__name__)

ROUTE_EXACT = "cache.exact"
ROUTE_SEMANTIC = "cache.semantic"
# Answers from these routes are never stored: a person's words (agent, handoff) were written for
# one shopper, and a cache hit is already stored.
_UNCACHEABLE_ROUTE_PREFIXES = ("agent", "handoff", "cache.")


def _setting(name: str, default: object) -> object:
    return getattr(settings, name, default)


def ttl_s() -> int:
    return int(_setting("KEFU_CACHE_TTL_S", 7 * 24 * 3600))  # type: ignore[call-overload]


def max_entries() -> int:
    return int(_setting("KEFU_CACHE_MAX_ENTRIES", 100_000))  # type: ignore[call-overload]


def semantic_threshold() -> float:
    return float(_setting("KEFU_CACHE_SEMANTIC_THRESHOLD", 0.93))  # type: ignore[arg-type]


def guard_max_extra() -> int:
    return int(_setting("KEFU_CACHE_GUARD_MAX_EXTRA", 1))  # type: ignore[call-overload]


def semantic_candidates() -> int:
    return int(_setting("KEFU_CACHE_SEMANTIC_CANDIDATES", 5))  # type: ignore[call-overload]


def cache_enabled() -> bool:
    return bool(_setting("KEFU_CACHE_ENABLED", True))


@dataclass(frozen=True)
class CacheHit:
    """A cached answer to serve. ``similarity`` is the cosine (1.0 for an exact hit)."""

    answer: str
    route: str  # ROUTE_EXACT or ROUTE_SEMANTIC
    similarity: float
    entry_id: int
    model: str  # the model that wrote the answer originally
    question: str  # the cached question that matched


def scope_key(*, store: str, locale: str, tier: str, faq_version: str, prompt_version: str) -> str:
    """The scope every entry and lookup is confined to: all that changes the right answer.

    Readable (``"store=...|locale=zh|tier=simple|faq=12|prompt=v3"``) so the admin shows it; the
    locale is reduced to its primary subtag (``"zh-CN"`` -> ``"zh"``) like the FAQ model does.
    Longer than 255 characters it is hashed.
    """
    loc = (locale or "").strip().lower().replace("_", "-").split("-", 1)[0]
    key = f"store={store}|locale={loc}|tier={tier}|faq={faq_version}|prompt={prompt_version}"
    if len(key) > 255:
        key = "sha256=" + hashlib.sha256(key.encode()).hexdigest()
    return key


def _key_hash(key_text: str) -> str:
    return hashlib.sha256(key_text.encode()).hexdigest()


# --- In-process semantic index ---------------------------------------------------------------------


@dataclass
class _ScopeIndex:
    """One scope's vectors. ``vecs``: ``(n, dim)`` float32 unit rows; ``ids``/``questions``: length n."""

    stamp: tuple[int, int]  # (count, max id) of the scope when loaded
    ids: np.ndarray
    questions: list[str]
    vecs: np.ndarray


_indexes: dict[str, _ScopeIndex] = {}
_indexes_lock = threading.Lock()


def _scope_stamp(scope: str) -> tuple[int, int]:
    agg = CachedAnswer.objects.filter(scope=scope).aggregate(n=Count("id"), m=Max("id"))
    return int(agg["n"] or 0), int(agg["m"] or 0)


def _rows_to_index(rows: list[tuple[int, str, bytes]], stamp: tuple[int, int]) -> _ScopeIndex:
    vec_list = [np.frombuffer(bytes(r[2]), dtype=np.float32) for r in rows]
    dim = vec_list[0].shape[0] if vec_list else 0
    keep = [i for i, v in enumerate(vec_list) if v.shape[0] == dim]  # a model swap leaves odd rows
    return _ScopeIndex(
        stamp=stamp,
        ids=np.array([rows[i][0] for i in keep], dtype=np.int64),
        questions=[rows[i][1] for i in keep],
        vecs=np.vstack([vec_list[i] for i in keep]) if keep else np.zeros((0, 0), dtype=np.float32),
    )


def _scope_index(scope: str) -> _ScopeIndex:
    """The scope's index, brought up to date with the database: entries added since it was loaded
    are appended (one query for the new rows only, so a store does not cost the next lookup a
    reload of the whole scope); after a deletion the scope is reloaded."""
    stamp = _scope_stamp(scope)
    idx = _indexes.get(scope)
    if idx is not None and idx.stamp == stamp:
        return idx
    if idx is not None and stamp[1] > idx.stamp[1]:
        new_rows = list(
            CachedAnswer.objects.filter(scope=scope, id__gt=idx.stamp[1], embedding__isnull=False)
            .order_by("id").values_list("id", "question", "embedding")
        )
        if idx.stamp[0] + len(new_rows) == stamp[0]:  # only additions since the last load
            added = _rows_to_index(new_rows, stamp)
            if len(idx.ids) == 0 or (added.vecs.size and added.vecs.shape[1] == idx.vecs.shape[1]):
                merged = _ScopeIndex(
                    stamp=stamp,
                    ids=np.concatenate([idx.ids, added.ids]),
                    questions=idx.questions + added.questions,
                    vecs=np.vstack([idx.vecs, added.vecs]) if len(idx.ids) else added.vecs,
                )
                with _indexes_lock:
                    _indexes[scope] = merged
                return merged
    rows = list(
        CachedAnswer.objects.filter(scope=scope, embedding__isnull=False)
        .order_by("id").values_list("id", "question", "embedding")
    )
    idx = _rows_to_index(rows, stamp)
    with _indexes_lock:
        _indexes[scope] = idx
    return idx


def _forget(scopes: Sequence[str] | None = None) -> None:
    """Drop in-process indexes (all, or the given scopes); they reload at the next lookup."""
    with _indexes_lock:
        if scopes is None:
            _indexes.clear()
        else:
            for s in scopes:
                _indexes.pop(s, None)


def _embed(text: str) -> np.ndarray:
    from .embeddings import get_embedder

    return np.asarray(get_embedder().embed([text])[0], dtype=np.float32)


# --- Lookup ------------------------------------------------------------------------------------------


def _record_hit(entry_id: int) -> None:
    CachedAnswer.objects.filter(id=entry_id).update(hits=F("hits") + 1, last_hit_at=timezone.now())


def lookup(*, question: str, scope: str, embedding: np.ndarray | None) -> CacheHit | None:
    """The cached answer for ``question`` in ``scope``, or ``None``.

    1. The question must pass :func:`~cache_layer.policy.may_cache_question` (no personal data,
       not a follow-up), else ``None`` without touching the store.
    2. Exact: same scope and same :func:`exact_key_text`, not expired.
    3. Semantic: ``embedding`` (shape ``(dim,)``, unit norm, the same embedder and the same text
       normalisation as at :func:`store`; computed from ``question`` when ``None``) against the
       scope's vectors; the best candidates with cosine >= ``KEFU_CACHE_SEMANTIC_THRESHOLD`` are
       tried in order and the first that passes :func:`~cache_layer.similarity.guard` and has not
       expired is served.

    A hit increments the entry's ``hits`` and sets ``last_hit_at``; ``expires_at`` is unchanged.
    Synchronous (ORM): call it through ``database_sync_to_async`` from async code.
    """
    if not cache_enabled():
        return None
    ok, _reason = may_cache_question(question)
    key = exact_key_text(question)
    if not ok or not key:
        return None
    now = timezone.now()
    row = (
        CachedAnswer.objects.filter(scope=scope, key_hash=_key_hash(key), expires_at__gt=now)
        .values_list("id", "answer", "model", "question")
        .first()
    )
    if row is not None:
        _record_hit(row[0])
        return CacheHit(answer=row[1], route=ROUTE_EXACT, similarity=1.0, entry_id=row[0], model=row[2], question=row[3])

    idx = _scope_index(scope)
    if len(idx.ids) == 0:
        return None
    vec = _embed(question) if embedding is None else np.asarray(embedding, dtype=np.float32).reshape(-1)
    if vec.shape[0] != idx.vecs.shape[1]:
        log.warning("cache lookup: embedding dim %s does not match the scope's %s", vec.shape[0], idx.vecs.shape[1])
        return None
    sims = idx.vecs @ vec  # (n,) cosines: rows and query are unit vectors
    threshold = semantic_threshold()
    k = min(semantic_candidates(), len(sims))
    top = np.argpartition(-sims, k - 1)[:k] if k < len(sims) else np.arange(len(sims))
    top = top[np.argsort(-sims[top])]
    max_extra = guard_max_extra()
    for i in top:
        sim = float(sims[i])
        if sim < threshold:
            break
        passed, reason = guard(idx.questions[i], question, max_extra=max_extra)
        if not passed:
            log.debug("cache guard blocked %r ~ %r (%.3f): %s", question, idx.questions[i], sim, reason)
            continue
        hit = (
            CachedAnswer.objects.filter(id=int(idx.ids[i]), expires_at__gt=now)
            .values_list("id", "answer", "model", "question")
            .first()
        )
        if hit is None:
            continue  # expired (or deleted since the index loaded)
        _record_hit(hit[0])
        return CacheHit(answer=hit[1], route=ROUTE_SEMANTIC, similarity=sim, entry_id=hit[0], model=hit[2], question=hit[3])
    return None


# --- Store -------------------------------------------------------------------------------------------


def store(
    *,
    question: str,
    answer: str,
    scope: str,
    embedding: np.ndarray | None,
    route: str,
    model: str,
    grounded_on: Sequence[int],
    prompt_version: str,
    cut: bool,
    locale: str = "",
) -> bool:
    """Store ``answer`` for ``question`` in ``scope`` when it is safe to share; ``True`` if stored.

    Refused (``False``, logged at debug with the reason): a cut or failed stream (``cut=True``), a
    route a person answered on or a cache hit, a question or answer with personal data, a
    follow-up, an empty question or answer. ``embedding``: shape ``(dim,)`` float32 unit vector of
    the question (computed when ``None``). An existing live entry for the same exact key is kept
    (first answer wins); an expired one is replaced. ``grounded_on``: FAQ entry ids, for
    :func:`evict_for_faq_entry`. After a store the oldest entries beyond ``KEFU_CACHE_MAX_ENTRIES``
    are deleted.
    """
    reason = _refusal(question=question, answer=answer, route=route, cut=cut)
    if reason:
        log.debug("cache store refused (%s): %r", reason, question[:80])
        return False
    key = exact_key_text(question)
    vec = _embed(question) if embedding is None else np.asarray(embedding, dtype=np.float32).reshape(-1)
    now = timezone.now()
    kh = _key_hash(key)
    try:
        with transaction.atomic():
            existing = CachedAnswer.objects.select_for_update().filter(scope=scope, key_hash=kh).first()
            if existing is not None:
                if existing.expires_at > now:
                    return False
                existing.delete()
            entry = CachedAnswer.objects.create(
                scope=scope,
                key_hash=kh,
                key_text=key,
                question=question,
                answer=answer,
                embedding=vec.astype(np.float32).tobytes(),
                route=route,
                model=model,
                locale=locale,
                grounded_on=[int(g) for g in grounded_on],
                system_prompt_version=prompt_version,
                expires_at=now + timedelta(seconds=ttl_s()),
            )
            CachedAnswerGround.objects.bulk_create(
                [CachedAnswerGround(answer=entry, faq_entry_id=int(g)) for g in dict.fromkeys(grounded_on)]
            )
    except IntegrityError:
        return False  # another worker stored the same key a moment ago
    _forget([scope])
    enforce_size_bound()
    return True


def _refusal(*, question: str, answer: str, route: str, cut: bool) -> str:
    """Why an answer may not be stored, or ``""``."""
    if not cache_enabled():
        return "disabled"
    if cut:
        return "cut"
    if route.startswith(_UNCACHEABLE_ROUTE_PREFIXES):
        return f"route:{route}"
    ok, reason = may_cache_question(question)
    if not ok:
        return f"question:{reason}"
    if not exact_key_text(question):
        return "question:empty_key"
    ok, reason = may_cache_answer(answer)
    if not ok:
        return f"answer:{reason}"
    return ""


# --- Eviction ----------------------------------------------------------------------------------------


def evict_for_faq_entry(entry_id: int) -> int:
    """Delete every cached answer grounded on FAQ entry ``entry_id``; returns how many."""
    ids = list(CachedAnswerGround.objects.filter(faq_entry_id=entry_id).values_list("answer_id", flat=True))
    if not ids:
        return 0
    scopes = list(CachedAnswer.objects.filter(id__in=ids).values_list("scope", flat=True).distinct())
    n, _ = CachedAnswer.objects.filter(id__in=ids).delete()
    _forget(scopes)
    return len(ids) if n else 0


def evict_entry(entry_id: int) -> bool:
    """Delete one entry (an agent marked it wrong); ``True`` if it existed."""
    n, _ = CachedAnswer.objects.filter(id=entry_id).delete()
    _forget()
    return bool(n)


def purge(scope: str | None = None) -> int:
    """Delete all entries (or one scope's); returns the number of answers deleted."""
    qs = CachedAnswer.objects.all() if scope is None else CachedAnswer.objects.filter(scope=scope)
    n = qs.count()
    qs.delete()
    _forget(None if scope is None else [scope])
    return n


def purge_expired() -> int:
    """Delete expired entries; returns how many (lookups ignore them anyway)."""
    qs = CachedAnswer.objects.filter(expires_at__lte=timezone.now())
    n = qs.count()
    if n:
        qs.delete()
        _forget()
    return n


def enforce_size_bound() -> int:
    """Delete expired entries, then the oldest beyond ``KEFU_CACHE_MAX_ENTRIES``; returns how many."""
    removed = purge_expired()
    bound = max_entries()
    total = CachedAnswer.objects.count()
    if total > bound:
        cut_ids = list(CachedAnswer.objects.order_by("created_at", "id").values_list("id", flat=True)[: total - bound])
        CachedAnswer.objects.filter(id__in=cut_ids).delete()
        _forget()
        removed += len(cut_ids)
    return removed
