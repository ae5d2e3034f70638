"""The answer cache's service API: scope keys, lookup (exact, then semantic + guard), store, eviction.

Entries live in the database (:class:`~cache_layer.models.CachedAnswer`), so they survive a
restart and every worker sees them. Each process keeps an in-memory index per scope
(:mod:`cache_layer.vector_index`) for the semantic search and the exact keys. An entry stored by
another worker is seen within ``KEFU_CACHE_INDEX_REFRESH_MS``; until then it is a miss (a model
call), never a wrong answer. A stale index never serves a deleted or expired entry: every
candidate it offers is confirmed against its row (``expires_at`` included) before it is served.

The exact lookup asks the exact store first (:mod:`cache_layer.exact_store`: Redis when
``REDIS_URL`` is set, else local memory), then the index's keys. It reads the database only when
the index knows the key, and refills the store then. Every deletion path deletes the store's keys
too. A miss costs no query at all.

Every insert and deletion of an entry writes a :class:`~cache_layer.models.CacheChange` row in
the same transaction, so other workers apply it to their indexes incrementally (no reload); this
process applies its own at commit. :func:`trim_change_log` drops old log rows (called from
:func:`enforce_size_bound` at most once a minute per process).

Settings: :class:`cache_layer.config.CacheConfig` (read and validated once; defaults in
config/settings.py).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
from django.db import IntegrityError, transaction
from django.db.models import Case, DateTimeField, F, IntegerField, Q, Value, When
from django.utils import timezone
from redis.exceptions import RedisError

from lib import sandbox
from lib.logredact import shopper_text
from lib.text import language_code

from . import vector_index
from .alignment import align
from .config import cache_config
from .embeddings import get_embedder
from .exact_store import ExactEntry, get_exact_store
from .hot import HotExact, current_hot_layer, get_hot_layer
from .intent_model import get_intent_model
from .models import CacheChange, CachedAnswer, CachedAnswerGround
from .normalise import exact_key_text
from .policy import may_cache_answer, may_cache_question
from .similarity import promotable, semantic_verdict

log = logging.getLogger(__name__)

ROUTE_EXACT = "cache.exact"
ROUTE_SEMANTIC = "cache.semantic"
# Answers from these routes are never stored: a person's words (agent, handoff) were written for
# one shopper, and a cache hit is already stored.
_UNCACHEABLE_ROUTE_PREFIXES = ("agent", "handoff", "cache.")


def ttl_s() -> int:
    """``KEFU_CACHE_TTL_S``: an entry's lifetime, seconds."""
    return cache_config().ttl_s


def cache_enabled() -> bool:
    """``KEFU_CACHE_ENABLED``."""
    return cache_config().enabled


@dataclass(frozen=True)
class CacheHit:
    """A cached answer to serve. ``similarity`` is the cosine (1.0 for an exact hit)."""

    answer: str
    route: str  # ROUTE_EXACT or ROUTE_SEMANTIC
    similarity: float
    entry_id: int
    model: str  # the model that wrote the answer originally
    question: str  # the cached question that matched
    rule: str = "exact"  # which rule allowed the hit: "exact", "same_intent", "same_slots", "lexical", "verified"


@dataclass(frozen=True)
class NearMiss:
    """A cached question close to a new one that no rule let answer it (:func:`near_miss`):
    ``entry_id`` and ``question`` of the cached entry, ``similarity`` the cosine."""

    entry_id: int
    question: str
    similarity: float


def scope_key(
    *,
    store: str,
    locale: str,
    tier: str,
    faq_version: str,
    prompt_version: str,
    model: str = "",
    max_tokens: int = 0,
) -> str:
    """The scope every entry and lookup is confined to: all that changes the right answer.

    ``model``: the model name the answers are asked of (``KEFU_<TIER>_MODEL``); ``max_tokens``:
    the output limit they are made within (tokens, ``KEFU_LLM_MAX_TOKENS``). Both are part of the
    scope (issue 29, item 6): a worker restarted with another model or another limit never serves
    the answers made with the old ones. ``""`` / ``0`` leave them out (callers that have none).

    Readable (``"store=...|locale=zh|tier=simple|faq=12|prompt=v3|model=gpt-4o-mini|max_tokens=600"``)
    so the admin shows it; the locale is reduced to its primary subtag (``"zh-CN"`` -> ``"zh"``)
    like the FAQ model does. Longer than 255 characters it is hashed.
    """
    loc = language_code(locale or "")
    key = f"store={store}|locale={loc}|tier={tier}|faq={faq_version}|prompt={prompt_version}"
    if model:
        key += f"|model={model}"
    if max_tokens:
        key += f"|max_tokens={max_tokens}"
    if len(key) > 255:
        key = "sha256=" + hashlib.sha256(key.encode()).hexdigest()
    return key


def _key_hash(key_text: str) -> str:
    return hashlib.sha256(key_text.encode()).hexdigest()


def _embed(text: str) -> np.ndarray:
    return np.asarray(get_embedder().embed([text])[0], dtype=np.float32)


def word_similarity(pairs: Sequence[tuple[str, str]]) -> list[float]:
    """The cosine of each ``(word_a, word_b)`` by the shared embedder run on the words alone (one
    call for every word of ``pairs``; the embedder's LRU keeps words seen before)."""
    words = list(dict.fromkeys(w for pair in pairs for w in pair))
    if not words:
        return []
    vecs = np.asarray(get_embedder().embed(words), dtype=np.float32)
    row = {w: vecs[i] for i, w in enumerate(words)}
    return [float(row[a] @ row[b]) for a, b in pairs]


def _aligner(word_threshold: float) -> Callable[[str, str], tuple[bool, str]]:
    def aligned(question: str, cached_question: str) -> tuple[bool, str]:
        result = align(question, cached_question, word_similarity=word_similarity, word_threshold=word_threshold)
        return result.ok, result.reason

    return aligned


# --- Lookup ------------------------------------------------------------------------------------------


def _record_hit(entry_id: int) -> None:
    if sandbox.active():
        return  # a bot test's lookup (lib.sandbox) reads the cache, never writes it
    CachedAnswer.objects.filter(id=entry_id).update(hits=F("hits") + 1, last_hit_at=timezone.now())


# --- Exact store (the fast path; the rows stay the source of truth) ----------------------------------
# Store failures (Redis down or slow) are logged and the database answers: the store only saves the
# exact lookup a query. A deletion that failed to reach the store cannot serve a stale answer: every
# store hit is checked against its row by the UPDATE that records the hit (see _record_exact_hit).


def _exact_get(scope: str, key_hash: str) -> ExactEntry | None:
    try:
        return get_exact_store().get(scope, key_hash)
    except (RedisError, ValueError) as e:  # ValueError: a value that is not our JSON
        log.warning("exact store read failed, using the database: %s", e)
        return None


def _exact_set(scope: str, key_hash: str, payload: ExactEntry, *, expires_at: datetime, now: datetime) -> None:
    """Put ``payload`` in the exact store until the row's ``expires_at`` (absolute, not now + TTL;
    kept in the payload too, for the hot layer)."""
    payload = {**payload, "expires_at": expires_at.isoformat()}
    try:
        get_exact_store().set(scope, key_hash, payload, (expires_at - now).total_seconds())
    except RedisError as e:
        log.warning("exact store write failed: %s", e)


def _exact_delete(keys: Sequence[tuple[str, str]]) -> None:
    """Delete ``(scope, key_hash)`` pairs from the exact store."""
    if not keys:
        return
    try:
        get_exact_store().delete(keys)
    except RedisError as e:
        log.warning("exact store delete of %d keys failed (each is refused at its next hit): %s", len(keys), e)


def _exact_purge(scope: str | None) -> None:
    try:
        get_exact_store().purge(scope)
    except RedisError as e:
        log.warning("exact store purge failed (its keys are refused at their next hit): %s", e)


def _record_exact_hit(entry: ExactEntry, now: datetime) -> bool:
    """Record a hit on the row ``entry`` was made from; ``False`` (nothing recorded) when that row
    was deleted, replaced by a newer one (same key, new ``id``/``created_at``) or has expired."""
    created_at = datetime.fromisoformat(entry["created_at"])
    if sandbox.active():  # a bot test's lookup: confirmed against its row, not counted
        return CachedAnswer.objects.filter(id=entry["id"], created_at=created_at, expires_at__gt=now).exists()
    n = CachedAnswer.objects.filter(id=entry["id"], created_at=created_at, expires_at__gt=now).update(
        hits=F("hits") + 1, last_hit_at=now
    )
    return n == 1


def _exact_hit(entry: ExactEntry) -> CacheHit:
    return CacheHit(
        answer=entry["answer"],
        route=ROUTE_EXACT,
        similarity=1.0,
        entry_id=entry["id"],
        model=entry["model"],
        question=entry["question"],
    )


def _hot_put(
    hot: HotExact | None, ticket: int | None, scope: str, key_hash: str, entry: ExactEntry, now: datetime
) -> None:
    """Keep a hit just confirmed against its row in the hot layer, for the row's remaining life."""
    if hot is not None and "expires_at" in entry:
        ttl_s = (datetime.fromisoformat(entry["expires_at"]) - now).total_seconds()
        hot.put(scope, key_hash, entry, ttl_s, ticket)


def _hot_hit(hot: HotExact, *, scope: str, key_hash: str, now: datetime) -> CacheHit | None:
    """Exact hit from this process's hot layer: no round trip; the hit is counted in memory and
    written with the others every ``hot.FLUSH_S`` seconds (:func:`flush_hot_hits`)."""
    vector_index.refresh_if_due()  # the change-log backstop for deletions whose announcement failed
    entry = hot.get(scope, key_hash)
    if entry is None:
        return None
    if not sandbox.active():  # a bot test's hit is not counted (lib.sandbox)
        hot.count_hit(int(entry["id"]), now)
        flush_hot_hits(hot)
    return _exact_hit(entry)


def flush_hot_hits(hot: HotExact | None = None, *, every_s: float | None = None) -> int:
    """Write the hits the hot layer counted (``hits`` + n, ``last_hit_at``) once ``every_s``
    seconds (``hot.FLUSH_S``) have passed since the last write: one UPDATE per 500 entries.
    Returns the number of entries written (0: nothing due). Synchronous (ORM)."""
    hot = hot or current_hot_layer()
    if hot is None:
        return 0
    due = hot.take_hits(every_s=every_s)
    items = list(due.items())
    for i in range(0, len(items), 500):
        chunk = items[i : i + 500]
        CachedAnswer.objects.filter(id__in=[entry_id for entry_id, _ in chunk]).update(
            hits=F("hits") + Case(*(When(id=e, then=Value(n)) for e, (n, _) in chunk), output_field=IntegerField()),
            last_hit_at=Case(*(When(id=e, then=Value(t)) for e, (_, t) in chunk), output_field=DateTimeField()),
        )
    return len(items)


def _exact_store_hit(
    *, scope: str, key_hash: str, now: datetime, hot: HotExact | None = None, ticket: int | None = None
) -> CacheHit | None:
    """Exact hit from the exact store, confirmed against its row (then kept in the hot layer
    when ``ticket``, taken before the read, is still current)."""
    entry = _exact_get(scope, key_hash)
    if entry is not None:
        if _record_exact_hit(entry, now):
            _hot_put(hot, ticket, scope, key_hash, entry, now)
            return _exact_hit(entry)
        _exact_delete([(scope, key_hash)])  # stale: deleted, replaced or expired since it was stored
    return None


def _exact_row_hit(*, scope: str, key_hash: str, now: datetime, idx: vector_index.ScopeIndex) -> CacheHit | None:
    """Exact hit from the database when the scope's index knows the key (the store missed it:
    evicted, another worker's local store, a restart); refills the store."""
    if key_hash not in idx.keys:
        return None  # no such row when the index was last checked: a miss costs no query
    row = (
        CachedAnswer.objects.filter(scope=scope, key_hash=key_hash, expires_at__gt=now)
        .values_list("id", "answer", "model", "question", "created_at", "expires_at")
        .first()
    )
    if row is None:
        return None
    _record_hit(row[0])
    payload: ExactEntry = {
        "id": row[0],
        "answer": row[1],
        "model": row[2],
        "question": row[3],
        "created_at": row[4].isoformat(),
    }
    _exact_set(scope, key_hash, payload, expires_at=row[5], now=now)
    return CacheHit(answer=row[1], route=ROUTE_EXACT, similarity=1.0, entry_id=row[0], model=row[2], question=row[3])


def lookup(*, question: str, scope: str, embedding: np.ndarray | None) -> CacheHit | None:
    """The cached answer for ``question`` in ``scope``, or ``None``.

    1. The question must pass :func:`~cache_layer.policy.may_cache_question` (no personal data,
       not a follow-up), else ``None`` without touching the store.
    2. Exact: same scope and same :func:`exact_key_text`, not expired: this process's hot layer
       first (``cache_layer.hot``: hits confirmed earlier, invalidated through Redis; counted in
       memory), then the exact store (checked against its row when the hit is recorded), then
       the database.
    3. Semantic: ``embedding`` (shape ``(dim,)``, unit norm, the same embedder and the same text
       normalisation as at :func:`store`; computed from ``question`` when ``None``) against the
       scope's vectors; the ``KEFU_CACHE_SEMANTIC_CANDIDATES`` nearest are judged by
       :func:`~cache_layer.similarity.semantic_verdict` (hard guard; same resolved intent above
       ``KEFU_CACHE_INTENT_COSINE``, the same answer-changing slots above
       ``KEFU_CACHE_SLOT_COSINE``, or the strict lexical rule above
       ``KEFU_CACHE_SEMANTIC_THRESHOLD``). The closest live one that passes is served, unless
       another passing one with a different answer is within ``KEFU_CACHE_AMBIGUITY_MARGIN`` of
       its cosine (then nothing is: which answer is right would be a guess).

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
    key_hash = _key_hash(key)
    hot, ticket = get_hot_layer(), None
    if hot is not None:
        exact = _hot_hit(hot, scope=scope, key_hash=key_hash, now=now)
        if exact is not None:
            return exact
        ticket = hot.ticket()
    exact = _exact_store_hit(scope=scope, key_hash=key_hash, now=now, hot=hot, ticket=ticket)
    if exact is not None:
        return exact
    idx = vector_index.scope_index(scope)
    exact = _exact_row_hit(scope=scope, key_hash=key_hash, now=now, idx=idx)
    if exact is not None:
        return exact
    if len(idx) == 0:
        return None
    vec = _embed(question) if embedding is None else np.asarray(embedding, dtype=np.float32).reshape(-1)
    if vec.shape[0] != idx.dim:
        log.warning("cache lookup: embedding dim %s does not match the scope's %s", vec.shape[0], idx.dim)
        return None
    cfg = cache_config()
    lexical_t, intent_t, slot_t = cfg.semantic_threshold, cfg.intent_cosine, cfg.slot_cosine
    found = idx.search(vec, cfg.semantic_candidates)  # nearest first, exact cosines
    floor = min(lexical_t, intent_t, slot_t, cfg.align_cosine, cfg.promote_min_cosine)
    candidates = [n for n, sim in enumerate(found.sims) if sim >= floor]
    if not candidates:
        return None
    model = get_intent_model() if cfg.intent_confidence <= 1.0 else None
    if model is not None and model.dim != vec.shape[0]:
        model = None
    resolved = model.resolve(np.vstack([vec[None, :], found.vectors[candidates]])) if model is not None else None
    aligned = _aligner(cfg.word_cosine) if cfg.align_cosine <= 1.0 else None
    passing: list[tuple[int, float, str]] = []  # (index row, cosine, rule)
    verifiable: list[tuple[int, float]] = []  # refused by the rules; a verified cosine may serve them
    for n, i in enumerate(candidates):
        sim = found.sims[i]
        verdict = semantic_verdict(
            question,
            found.questions[i],
            similarity=sim,
            resolved=(resolved[0], resolved[n + 1]) if resolved is not None else None,
            lexical_threshold=lexical_t,
            intent_threshold=intent_t,
            intent_confidence=cfg.intent_confidence,
            max_extra=cfg.guard_max_extra,
            slot_threshold=slot_t,
            aligned=aligned,
            align_threshold=cfg.align_cosine,
        )
        if verdict.ok:
            passing.append((i, sim, verdict.rule))
        elif sim >= cfg.promote_min_cosine and has_verified(scope) and promotable(question, found.questions[i]):
            verifiable.append((i, sim))
        else:
            log.debug(
                "cache: %s ~ entry %s (%.3f) refused: %s", shopper_text(question), found.ids[i], sim, verdict.rule
            )
    if not passing and not verifiable:
        return None
    rows = {
        r[0]: r
        for r in CachedAnswer.objects.filter(
            id__in=[found.ids[i] for i, _, _ in passing] + [found.ids[i] for i, _ in verifiable], expires_at__gt=now
        ).values_list("id", "answer", "model", "question", "verified_cosine")
    }
    # Verified promotion (cache_layer.promotion): an entry a judge confirmed for a question at
    # cosine c answers new questions at c or above that pass the hard guard and agree on every slot.
    for i, sim in verifiable:
        row = rows.get(found.ids[i])
        if row is not None and row[4] is not None and sim >= row[4]:
            passing.append((i, sim, "verified"))
    passing.sort(key=lambda p: -p[1])
    live = [(i, sim, rule) for i, sim, rule in passing if found.ids[i] in rows]
    if not live:
        return None
    best_i, best_sim, rule = live[0]
    best = rows[found.ids[best_i]]
    # Two cached questions both fit and their answers differ: unless the best is clearly closer,
    # which one is right is a guess, and a wrong guess is a false hit. A miss costs one model call.
    for i, sim, _ in live[1:]:
        if best_sim - sim < cfg.ambiguity_margin and rows[found.ids[i]][1] != best[1]:
            log.debug("cache: %s ambiguous between entries %s and %s", shopper_text(question), best[0], found.ids[i])
            return None
    _record_hit(best[0])
    return CacheHit(
        answer=best[1],
        route=ROUTE_SEMANTIC,
        similarity=best_sim,
        entry_id=best[0],
        model=best[2],
        question=best[3],
        rule=rule,
    )


# scope -> (monotonic time read, whether a live entry of it has a verified cosine)
_verified_scopes: dict[str, tuple[float, bool]] = {}


def has_verified(scope: str) -> bool:
    """Whether a live entry of ``scope`` has a verified cosine (``cache_layer.promotion``), read
    from the database at most every ``KEFU_CACHE_INDEX_REFRESH_MS`` per scope: most scopes have
    none, and then a lookup's near candidates cost no query. A promotion in this process is seen
    at once (:func:`forget_verified`), one in another within the refresh interval (a miss
    meanwhile, never a wrong answer)."""
    now = time.monotonic()
    known = _verified_scopes.get(scope)
    if known is not None and now - known[0] < cache_config().index_refresh_s:
        return known[1]
    found = CachedAnswer.objects.filter(
        scope=scope, verified_cosine__isnull=False, expires_at__gt=timezone.now()
    ).exists()
    _verified_scopes[scope] = (now, found)
    return found


def forget_verified(scope: str | None = None) -> None:
    """Read :func:`has_verified` of ``scope`` (every scope for ``None``) from the database again."""
    if scope is None:
        _verified_scopes.clear()
    else:
        _verified_scopes.pop(scope, None)


def near_miss(*, question: str, scope: str, embedding: np.ndarray | None) -> NearMiss | None:
    """The closest live entry of ``scope`` that may answer ``question`` but that no rule lets
    (for verified promotion, ``cache_layer.promotion``): cosine at least
    ``KEFU_CACHE_PROMOTE_MIN_COSINE``, :func:`~cache_layer.similarity.promotable` (hard guard and
    every slot), not the same question, and not already served by its verified cosine. ``None``
    when there is none, or ``question`` may not be cached at all. ``embedding`` as for
    :func:`lookup`. Synchronous (ORM)."""
    if not cache_enabled() or not may_cache_question(question)[0]:
        return None
    idx = vector_index.scope_index(scope)
    if len(idx) == 0:
        return None
    vec = _embed(question) if embedding is None else np.asarray(embedding, dtype=np.float32).reshape(-1)
    if vec.shape[0] != idx.dim:
        return None
    cfg = cache_config()
    key = exact_key_text(question)
    found = idx.search(vec, cfg.semantic_candidates)
    for i, sim in enumerate(found.sims):
        if sim < cfg.promote_min_cosine:
            break
        if exact_key_text(found.questions[i]) == key or not promotable(question, found.questions[i]):
            continue
        row = (
            CachedAnswer.objects.filter(pk=found.ids[i], expires_at__gt=timezone.now())
            .values_list("id", "verified_cosine")
            .first()
        )
        if row is None:
            continue
        verified = row[1]
        if verified is not None and sim >= verified:
            continue  # it is served already
        return NearMiss(entry_id=found.ids[i], question=found.questions[i], similarity=float(sim))
    return None


def has_live_entry(*, question: str, scope: str) -> bool:
    """Whether ``scope`` holds a live (unexpired) entry for ``question``'s exact key (one database
    query; no hit is recorded). False for a question that cannot be a key."""
    key = exact_key_text(question)
    if not key:
        return False
    return CachedAnswer.objects.filter(scope=scope, key_hash=_key_hash(key), expires_at__gt=timezone.now()).exists()


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
        log.debug("cache store refused (%s): %s", reason, shopper_text(question))
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
                replaced = existing.id
                existing.delete()
                CacheChange.objects.create(scope=scope, entry_id=replaced, kind=CacheChange.Kind.DELETE)
                transaction.on_commit(lambda: vector_index.discard(scope, [replaced]), robust=True)
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
            CacheChange.objects.create(scope=scope, entry_id=entry.id, kind=CacheChange.Kind.ADD)
    except IntegrityError:
        return False  # another worker stored the same key a moment ago
    payload: ExactEntry = {
        "id": entry.id,
        "answer": answer,
        "model": model,
        "question": question,
        "created_at": entry.created_at.isoformat(),
    }
    # On commit: inside a caller's transaction that rolls back, the store must not learn the row.
    transaction.on_commit(
        lambda: _exact_set(scope, kh, payload, expires_at=entry.expires_at, now=timezone.now()), robust=True
    )
    transaction.on_commit(lambda: vector_index.remember(scope, entry.id, question, vec, kh), robust=True)
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
    return _delete_rows(list(CachedAnswer.objects.filter(id__in=ids).values_list("id", "scope", "key_hash")))


def evict_naming(phrases: Sequence[str]) -> int:
    """Delete every cached answer whose question or answer names one of ``phrases`` (case-
    insensitive substrings, e.g. a changed product's titles and sku); returns how many. Blank
    phrases are skipped."""
    query = Q()
    for phrase in {p.strip() for p in phrases if p.strip()}:
        query |= Q(answer__icontains=phrase) | Q(question__icontains=phrase)
    if not query:
        return 0
    rows = list(CachedAnswer.objects.filter(query).values_list("id", "scope", "key_hash"))
    return _delete_rows(rows) if rows else 0


def evict_entry(entry_id: int) -> bool:
    """Delete one entry (an agent marked it wrong); ``True`` if it existed."""
    return bool(_delete_rows(list(CachedAnswer.objects.filter(id=entry_id).values_list("id", "scope", "key_hash"))))


def purge(scope: str | None = None) -> int:
    """Delete all entries (or one scope's); returns the number of answers deleted. The change log
    gets one ``purge`` row per scope, not one per entry."""
    qs = CachedAnswer.objects.all() if scope is None else CachedAnswer.objects.filter(scope=scope)
    with transaction.atomic():
        scopes = [scope] if scope is not None else sorted(set(qs.values_list("scope", flat=True)))
        n = qs.count()
        qs.delete()
        CacheChange.objects.bulk_create([CacheChange(scope=s, kind=CacheChange.Kind.PURGE) for s in scopes])
        transaction.on_commit(lambda: vector_index.clear(scopes), robust=True)
    _exact_purge(scope)
    return n


def purge_expired() -> int:
    """Delete expired entries; returns how many (lookups ignore them anyway)."""
    rows = list(CachedAnswer.objects.filter(expires_at__lte=timezone.now()).values_list("id", "scope", "key_hash"))
    return _delete_rows(rows) if rows else 0


def _delete_rows(rows: Sequence[tuple[int, str, str]]) -> int:
    """Delete ``(id, scope, key_hash)`` rows, 500 a transaction (SQLite limits query parameters),
    each with its ``delete`` change-log rows, then their exact-store keys; this process's indexes
    drop them at commit (O(dim) each, no reload). Returns the number of rows deleted (a row
    another worker deleted first is not counted; its log row is harmless)."""
    deleted = 0
    for i in range(0, len(rows), 500):
        chunk = rows[i : i + 500]
        with transaction.atomic():
            _, per_model = CachedAnswer.objects.filter(id__in=[r[0] for r in chunk]).delete()
            deleted += per_model.get(CachedAnswer._meta.label, 0)
            CacheChange.objects.bulk_create(
                [CacheChange(scope=r[1], entry_id=r[0], kind=CacheChange.Kind.DELETE) for r in chunk]
            )
            by_scope: dict[str, list[int]] = {}
            for r in chunk:
                by_scope.setdefault(r[1], []).append(r[0])
            transaction.on_commit(functools.partial(_discard, by_scope), robust=True)
        _exact_delete([(r[1], r[2]) for r in chunk])
    return deleted


def _discard(by_scope: dict[str, list[int]]) -> None:
    for scope, ids in by_scope.items():
        vector_index.discard(scope, ids)


_TRIM_EVERY_S = 60.0
_trimmed_at = [-_TRIM_EVERY_S]  # time.monotonic() of this process's last trim of the change log


def trim_change_log(*, older_than_s: float = vector_index.CHANGE_LOG_RETENTION_S) -> int:
    """Delete change-log rows older than ``older_than_s`` seconds (default
    ``vector_index.CHANGE_LOG_RETENTION_S``); returns how many. Any worker may run it (a Celery
    beat task too): an indexed range delete."""
    cutoff = timezone.now() - timedelta(seconds=older_than_s)
    n, _ = CacheChange.objects.filter(created_at__lt=cutoff).delete()
    return n


def enforce_size_bound() -> int:
    """Delete expired entries, then the oldest beyond ``KEFU_CACHE_MAX_ENTRIES``; returns how many."""
    removed = purge_expired()
    bound = cache_config().max_entries
    total = CachedAnswer.objects.count()
    if total > bound:
        cut = list(
            CachedAnswer.objects.order_by("created_at", "id").values_list("id", "scope", "key_hash")[: total - bound]
        )
        removed += _delete_rows(cut)
    now = time.monotonic()
    if now - _trimmed_at[0] >= _TRIM_EVERY_S:
        _trimmed_at[0] = now
        trim_change_log()
    return removed
