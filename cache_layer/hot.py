"""The exact cache's in-process layer: confirmed exact hits kept in this process's memory, in front
of the Redis exact store, in front of the database (the layered cache of the design kefu started
from). A repeated question answered from here costs no round trip at all.

What may be served from here, and for how long:

- An entry gets in only after a hit that the database confirmed (``services._exact_store_hit``
  or ``_exact_row_hit``), with the row's own absolute expiry, and only while this process listens
  to the invalidations (below). Bounded: ``KEFU_CACHE_HOT_MAX_ENTRIES`` (least recently used out).
- Every change to the exact store (a key set, replaced or deleted, a scope purged), by any
  worker, is published on the Redis channel :data:`CHANNEL` in the same pipeline as the change
  (``exact_store.RedisExactStore``). A listener thread per process drops what it names here at
  once: an entry evicted, expired by the sweep, replaced or marked wrong on another worker is
  not served again after its message arrives.
- A put races a deletion when the deletion's message arrives between the store read and the put:
  :meth:`HotExact.ticket` is taken before the read, and a put whose ticket is older than the
  latest invalidation is refused.
- The listener's connection lost: everything here is dropped and nothing is used until it has
  subscribed again (messages sent meanwhile were missed). Redis health checks every
  :data:`HEALTH_CHECK_S` find a silent connection.
- Backstop for a deletion whose publish failed (the deleting worker lost Redis): the change log
  in the database (``CacheChange``), read by ``vector_index.refresh`` at most every
  ``KEFU_CACHE_INDEX_REFRESH_MS``, drops the deleted ids here too (``drop_ids``,
  ``drop_scope``), so such an entry is served at most that long after its deletion.

Hits served from here are counted in memory and written to the rows (``hits``, ``last_hit_at``)
by :func:`~cache_layer.services.flush_hot_hits` at most every :data:`FLUSH_S` seconds, in one
statement; a killed process loses at most that many seconds of hit counts (statistics only).

Without ``REDIS_URL`` there is no layer: the exact store is this process's memory already.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from .config import cache_config
from .exact_store import CHANNEL, ExactEntry, RedisExactStore, get_exact_store

log = logging.getLogger(__name__)

__all__ = ["CHANNEL", "HotExact", "Listener", "current_hot_layer", "get_hot_layer", "reset_hot_layer"]
#: Seconds between the listener's health checks (a PING on a silent connection).
HEALTH_CHECK_S = 5.0
#: Seconds between two writes of the hits counted here.
FLUSH_S = 2.0

Key = tuple[str, str]  # (scope, key_hash)


class HotExact:
    """A bounded LRU of confirmed exact hits with an invalidation epoch. Thread-safe.

    ``max_entries`` (>= 1): at most this many keys. Nothing is served or stored while not
    :meth:`live` (the listener is not subscribed). Counters in :attr:`stats`: ``hits``, ``puts``,
    ``refused`` (puts refused: stale ticket or not live), ``dropped`` (entries invalidated),
    ``outages`` (times the listener lost its connection while live).
    """

    def __init__(self, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self._max = max_entries
        self._lock = threading.Lock()
        self._data: OrderedDict[Key, tuple[float, ExactEntry]] = OrderedDict()  # key -> (monotonic deadline, entry)
        self._by_id: dict[int, Key] = {}
        self._live = False
        self._epoch = 0  # moves on every invalidation and every change of liveness
        self._hits: Counter[int] = Counter()
        self._last_hit: dict[int, datetime] = {}
        self._flushed_at = time.monotonic()
        self.stats = {"hits": 0, "puts": 0, "refused": 0, "dropped": 0, "outages": 0}

    def live(self) -> bool:
        with self._lock:
            return self._live

    def set_live(self, live: bool) -> None:
        """The listener subscribed (True) or lost its connection (False: everything is dropped)."""
        with self._lock:
            self._epoch += 1
            if self._live and not live:
                self.stats["outages"] += 1
            self._live = live
            if not live:
                self.stats["dropped"] += len(self._data)
                self._data.clear()
                self._by_id.clear()

    def ticket(self) -> int | None:
        """Take before reading the store: :meth:`put` refuses the entry read if an invalidation
        came in between. None while not live (nothing would be stored)."""
        with self._lock:
            return self._epoch if self._live else None

    def get(self, scope: str, key_hash: str) -> ExactEntry | None:
        """The entry, or None (absent, expired, or not live)."""
        key = (scope, key_hash)
        with self._lock:
            if not self._live:
                return None
            item = self._data.get(key)
            if item is None:
                return None
            if item[0] <= time.monotonic():
                self._remove(key)
                return None
            self._data.move_to_end(key)
            self.stats["hits"] += 1
            return item[1]

    def put(self, scope: str, key_hash: str, entry: ExactEntry, ttl_s: float, ticket: int | None) -> bool:
        """Keep a confirmed ``entry`` for ``ttl_s`` seconds (the row's remaining lifetime); refused
        (False) when not live, when ``ticket`` is None or older than the latest invalidation,
        or when ``ttl_s <= 0``."""
        key = (scope, key_hash)
        with self._lock:
            if not self._live or ticket is None or ticket != self._epoch or ttl_s <= 0:
                self.stats["refused"] += 1
                return False
            self._remove(key)
            self._data[key] = (time.monotonic() + ttl_s, entry)
            self._by_id[int(entry["id"])] = key
            while len(self._data) > self._max:
                _, (_, e) = self._data.popitem(last=False)
                self._by_id.pop(int(e["id"]), None)
            self.stats["puts"] += 1
            return True

    def _remove(self, key: Key) -> None:
        item = self._data.pop(key, None)
        if item is not None:
            self._by_id.pop(int(item[1]["id"]), None)
            self.stats["dropped"] += 1

    def drop_keys(self, keys: Iterable[Key]) -> None:
        with self._lock:
            self._epoch += 1
            for key in keys:
                self._remove(key)

    def drop_ids(self, entry_ids: Iterable[int]) -> None:
        with self._lock:
            self._epoch += 1
            for entry_id in entry_ids:
                key = self._by_id.get(int(entry_id))
                if key is not None:
                    self._remove(key)

    def drop_scope(self, scope: str | None) -> None:
        with self._lock:
            self._epoch += 1
            for key in [k for k in self._data if scope is None or k[0] == scope]:
                self._remove(key)

    def apply(self, message: dict[str, Any]) -> None:
        """Apply one :data:`CHANNEL` message (its JSON, parsed)."""
        if "purge" in message:
            self.drop_scope(message["purge"])
        else:
            self.drop_keys((str(s), str(h)) for s, h in message.get("keys", []))

    def count_hit(self, entry_id: int, now: datetime) -> None:
        with self._lock:
            self._hits[entry_id] += 1
            self._last_hit[entry_id] = now

    def take_hits(self, *, every_s: float | None = None) -> dict[int, tuple[int, datetime]]:
        """The hits counted since the last take, ``{entry id: (hits, last hit)}``, once ``every_s``
        seconds (:data:`FLUSH_S`) have passed since then (else ``{}``); they are forgotten here."""
        every_s = FLUSH_S if every_s is None else every_s
        with self._lock:
            now = time.monotonic()
            if not self._hits or now - self._flushed_at < every_s:
                return {}
            hits, last = self._hits, self._last_hit
            self._hits, self._last_hit, self._flushed_at = Counter(), {}, now
        return {i: (n, last[i]) for i, n in hits.items()}

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)


class Listener:
    """The thread that applies a store's change messages (``channel``, :data:`CHANNEL` by default)
    to a :class:`HotExact` (daemon; one per layer). ``url``: the Redis URL. Reconnects after a
    failure, 0.1 s then doubling to 5 s."""

    def __init__(self, hot: HotExact, url: str, channel: str = CHANNEL) -> None:
        self.hot, self.url, self.channel = hot, url, channel
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kefu-cache-hot-listener", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        import redis

        from lib.redis_conn import redis_options

        backoff = 0.1
        while not self._stop.is_set():
            client = None
            try:
                options = redis_options(
                    asyncio=False,
                    socket_timeout_s=HEALTH_CHECK_S * 2,
                    connect_timeout_s=2.0,
                    retries=0,
                    purpose="cache-hot-listener",
                )
                options["health_check_interval"] = HEALTH_CHECK_S
                client = redis.Redis.from_url(self.url, **options)
                pubsub = client.pubsub()
                pubsub.subscribe(self.channel)
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=1.0)
                    if message is None:
                        continue
                    if message["type"] == "subscribe":
                        self.hot.set_live(True)
                        backoff = 0.1
                    elif message["type"] == "message":
                        try:
                            self.hot.apply(json.loads(message["data"]))
                        except (ValueError, TypeError, KeyError):
                            log.warning("cache hot layer: unreadable change message, dropping everything")
                            self.hot.drop_scope(None)
            except Exception as e:  # connection refused, reset, timed out: drop all, then reconnect
                if self.hot.live():
                    log.warning("cache hot layer: listener lost Redis (%s); serving from Redis until it is back", e)
                self.hot.set_live(False)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                if client is not None:
                    try:
                        client.close()
                    except Exception:
                        pass
        self.hot.set_live(False)


_layer: tuple[HotExact, Listener, tuple[str, str]] | None = None
_layer_lock = threading.Lock()


def get_hot_layer() -> HotExact | None:
    """The process's hot layer in front of the Redis exact store, its listener started at first
    use; None when the exact store is not Redis or ``KEFU_CACHE_HOT_MAX_ENTRIES`` is 0. Rebuilt
    when the store changes (tests)."""
    global _layer
    store = get_exact_store()
    if not isinstance(store, RedisExactStore) or cache_config().hot_max_entries <= 0:
        return None
    key = (store.url, store.channel)
    layer = _layer
    if layer is not None and layer[2] == key:
        return layer[0]
    with _layer_lock:
        if _layer is None or _layer[2] != key:
            if _layer is not None:
                _layer[1].stop(timeout=0)
            hot = HotExact(cache_config().hot_max_entries)
            listener = Listener(hot, store.url, store.channel)
            listener.start()
            _layer = (hot, listener, key)
        return _layer[0]


def current_hot_layer() -> HotExact | None:
    """The hot layer if one was built (the change-log backstop applies deletions to it), else None."""
    layer = _layer
    return layer[0] if layer is not None else None


def reset_hot_layer() -> None:
    """Stop the listener and forget the layer (tests)."""
    global _layer
    with _layer_lock:
        if _layer is not None:
            _layer[1].stop()
            _layer = None
