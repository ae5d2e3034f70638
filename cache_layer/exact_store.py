"""The exact answer cache's fast path: ``(scope, key_hash) -> entry`` with an absolute expiry.

The database row (:class:`~cache_layer.models.CachedAnswer`) stays the source of truth (admin,
eviction by FAQ entry, the semantic index); this store only saves the exact lookup its SQL query.
:mod:`cache_layer.services` writes an entry here after the row is committed, deletes it on every
deletion path, and checks every hit against the row when it records the hit (so a key that a
deletion missed, e.g. in another worker's local memory, is never served; see
``services._exact_store_hit``).

Two backends behind one small protocol, chosen by ``settings.REDIS_URL``:

- :class:`RedisExactStore` (``REDIS_URL`` set): shared by every worker. Keys
  ``kefu:cache:exact:<scope-hash>:<key_hash>`` (``<scope-hash>``: the first 16 hex digits of the
  SHA-256 of the scope, so a scope can be purged with one ``SCAN MATCH``); the value is the entry
  as JSON; the key's ``PX`` is the entry's *remaining* lifetime, so the expiry is absolute and a
  hit (a ``GET``) never extends it.
- :class:`LocalExactStore` (no ``REDIS_URL``): a bounded, thread-safe dict in this process with
  the same absolute expiry; the least recently used entry goes first when it is full
  (``KEFU_CACHE_LOCAL_MAX_ENTRIES``).

The Redis backend announces every key it sets, replaces or deletes, and every purge, on the
pub/sub channel :data:`CHANNEL` in the same pipeline: each process's hot layer
(:mod:`cache_layer.hot`, confirmed hits in memory in front of this store) drops them at once.

Errors: the Redis backend raises ``redis.exceptions.RedisError`` (connection refused, timeout
after ``KEFU_CACHE_REDIS_TIMEOUT_MS``); callers in ``services`` log it and fall back to the database.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, NotRequired, Protocol, TypedDict

from django.conf import settings

from lib.redis_conn import redis_options, tracked

from .config import cache_config

DEFAULT_PREFIX = "kefu:cache:exact"
#: The pub/sub channel on which the Redis store announces every key it sets, replaces or deletes
#: and every purge (``cache_layer.hot``): ``{"keys": [[scope, key_hash], ...]}`` or
#: ``{"purge": scope}`` (``null``: every scope), JSON.
CHANNEL = "kefu:cache:exact:changes"


class ExactEntry(TypedDict):
    """What the exact store keeps per key: enough to serve a hit without the database.

    ``created_at``: the row's ``created_at`` as ISO 8601 (with its offset); together with ``id`` it
    identifies the row version, so a hit on a deleted or replaced row is detected.
    """

    id: int
    answer: str
    model: str
    question: str
    created_at: str
    # The row's expires_at as ISO 8601 (entries written before it existed lack it).
    expires_at: NotRequired[str]


class ExactStore(Protocol):
    """``(scope, key_hash) -> ExactEntry`` with an absolute lifetime per entry. Thread-safe."""

    name: str

    def get(self, scope: str, key_hash: str) -> ExactEntry | None:
        """The live entry, or ``None`` (missing or expired). Never extends the lifetime."""
        ...

    def set(self, scope: str, key_hash: str, payload: ExactEntry, ttl_s: float) -> None:
        """Store ``payload`` for ``ttl_s`` seconds from now (replacing any entry); ``ttl_s <= 0``
        deletes the key instead."""
        ...

    def delete(self, keys: Iterable[tuple[str, str]]) -> int:
        """Delete the given ``(scope, key_hash)`` pairs; returns how many existed."""
        ...

    def purge(self, scope: str | None = None) -> int:
        """Delete every entry (or one scope's); returns how many were deleted."""
        ...


def scope_hash(scope: str) -> str:
    """16 hex digits naming ``scope`` in Redis keys (scopes can be 255 characters of anything)."""
    return hashlib.sha256(scope.encode()).hexdigest()[:16]


class LocalExactStore:
    """In-process backend: a bounded dict with absolute expiry (monotonic clock), LRU when full.

    ``max_entries``: at most this many keys (>= 1); the least recently read or written goes first.
    Lookups are O(1); :meth:`purge` of one scope is O(entries).
    """

    name = "local"

    def __init__(self, max_entries: int = 20_000) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self._max = max_entries
        self._lock = threading.Lock()
        # (scope, key_hash) -> (deadline on time.monotonic(), payload)
        self._data: OrderedDict[tuple[str, str], tuple[float, ExactEntry]] = OrderedDict()

    def get(self, scope: str, key_hash: str) -> ExactEntry | None:
        k = (scope, key_hash)
        with self._lock:
            item = self._data.get(k)
            if item is None:
                return None
            if item[0] <= time.monotonic():
                del self._data[k]
                return None
            self._data.move_to_end(k)
            return item[1]

    def set(self, scope: str, key_hash: str, payload: ExactEntry, ttl_s: float) -> None:
        k = (scope, key_hash)
        with self._lock:
            if ttl_s <= 0:
                self._data.pop(k, None)
                return
            self._data[k] = (time.monotonic() + ttl_s, payload)
            self._data.move_to_end(k)
            while len(self._data) > self._max:
                self._data.popitem(last=False)

    def delete(self, keys: Iterable[tuple[str, str]]) -> int:
        n = 0
        with self._lock:
            for k in keys:
                if self._data.pop(k, None) is not None:
                    n += 1
        return n

    def purge(self, scope: str | None = None) -> int:
        with self._lock:
            if scope is None:
                n = len(self._data)
                self._data.clear()
                return n
            doomed = [k for k in self._data if k[0] == scope]
            for k in doomed:
                del self._data[k]
            return len(doomed)

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)


class RedisExactStore:
    """Redis backend (redis-py, one connection pool per store; redis-py's client is thread-safe).

    ``url``: a ``redis://`` URL; ``prefix``: the key namespace (tests use their own);
    ``timeout_ms``: connect and socket timeout of every command, so a stalled Redis costs a lookup
    at most that long before ``services`` falls back to the database.
    """

    name = "redis"
    _DELETE_CHUNK = 500

    def __init__(self, url: str, *, prefix: str = DEFAULT_PREFIX, timeout_ms: float = 250.0) -> None:
        import redis

        self.prefix = prefix.rstrip(":")
        self.url = url
        # Stores under another prefix (tests) announce on their own channel.
        self.channel = CHANNEL if self.prefix == DEFAULT_PREFIX else f"{CHANNEL}:{self.prefix}"
        # A dead pooled connection is replaced and the command sent once more; a timeout is not
        # retried (the database answers instead, within the lookup's budget).
        self._redis = redis.Redis.from_url(
            url,
            **redis_options(
                asyncio=False,
                socket_timeout_s=timeout_ms / 1000,
                connect_timeout_s=timeout_ms / 1000,
                retries=1,
                retry_timeouts=False,
                purpose="exact-store",
            ),
        )
        tracked(self._redis, "exact-store")

    def key(self, scope: str, key_hash: str) -> str:
        """The Redis key of one entry: ``<prefix>:<scope-hash>:<key_hash>``."""
        return f"{self.prefix}:{scope_hash(scope)}:{key_hash}"

    def get(self, scope: str, key_hash: str) -> ExactEntry | None:
        raw = self._redis.get(self.key(scope, key_hash))
        if raw is None:
            return None
        entry: ExactEntry = json.loads(raw)
        return entry

    def _announce(self, pipe: Any, message: dict[str, Any]) -> None:
        pipe.publish(self.channel, json.dumps(message, ensure_ascii=False))

    def set(self, scope: str, key_hash: str, payload: ExactEntry, ttl_s: float) -> None:
        """Set (or, ``ttl_s <= 0``, delete) the key and announce it on :data:`CHANNEL`, in one
        pipeline: other processes' hot layers drop what they held for it."""
        ttl_ms = int(ttl_s * 1000)
        pipe = self._redis.pipeline(transaction=False)
        if ttl_ms <= 0:
            pipe.delete(self.key(scope, key_hash))
        else:
            pipe.set(self.key(scope, key_hash), json.dumps(payload, ensure_ascii=False), px=ttl_ms)
        self._announce(pipe, {"keys": [[scope, key_hash]]})
        pipe.execute()

    def delete(self, keys: Iterable[tuple[str, str]]) -> int:
        """Delete the keys and announce them on :data:`CHANNEL` (500 a pipeline)."""
        pairs = list(keys)
        n = 0
        for i in range(0, len(pairs), self._DELETE_CHUNK):
            chunk = pairs[i : i + self._DELETE_CHUNK]
            pipe = self._redis.pipeline(transaction=False)
            pipe.delete(*(self.key(s, h) for s, h in chunk))
            self._announce(pipe, {"keys": [list(p) for p in chunk]})
            n += int(pipe.execute()[0])
        return n

    def purge(self, scope: str | None = None) -> int:
        pattern = f"{self.prefix}:*" if scope is None else f"{self.prefix}:{scope_hash(scope)}:*"
        n = 0
        batch: list[bytes] = []
        for name in self._redis.scan_iter(match=pattern, count=1000):
            batch.append(name)
            if len(batch) >= self._DELETE_CHUNK:
                n += int(self._redis.unlink(*batch))
                batch.clear()
        if batch:
            n += int(self._redis.unlink(*batch))
        self._redis.publish(self.channel, json.dumps({"purge": scope}, ensure_ascii=False))
        return n

    def ttl_ms(self, scope: str, key_hash: str) -> int:
        """Remaining lifetime of a key in ms (Redis ``PTTL``: -2 missing, -1 no expiry)."""
        return int(self._redis.pttl(self.key(scope, key_hash)))

    def close(self) -> None:
        self._redis.close()


_store: ExactStore | None = None
_store_source: str | None = None  # the REDIS_URL the store was built for; "" = local
_override: ExactStore | None = None
_store_lock = threading.Lock()


def get_exact_store() -> ExactStore:
    """The process-wide exact store: Redis when ``settings.REDIS_URL`` is set, else local memory.

    Built once per ``REDIS_URL`` value (a change of the setting, as in tests, builds a new one).
    Settings read: ``REDIS_URL``, ``KEFU_CACHE_LOCAL_MAX_ENTRIES`` (20,000),
    ``KEFU_CACHE_REDIS_TIMEOUT_MS`` (250).
    """
    global _store, _store_source
    if _override is not None:
        return _override
    url = str(settings.REDIS_URL or "")
    store = _store
    if store is not None and _store_source == url:
        return store
    with _store_lock:
        if _store is None or _store_source != url:
            if url:
                _store = RedisExactStore(url, timeout_ms=cache_config().redis_timeout_ms)
            else:
                _store = LocalExactStore(cache_config().local_max_entries)
            _store_source = url
        return _store


def set_exact_store(store: ExactStore | None) -> None:
    """Use ``store`` as the process-wide exact store (tests, benchmarks); ``None`` goes back to the
    one chosen by the settings."""
    global _override
    _override = store
