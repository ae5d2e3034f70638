"""Upstreams that asked to be left alone (``retry-after`` longer than a message can wait), shared by
every process.

A 429 whose ``retry-after`` is beyond the retry cap (``KEFU_LLM_RETRY_CAP_S``) or beyond what is
left of the message's first-token budget is not waited for: the tier is skipped and stays
skipped for as long as the upstream asked, in this process (``ratelimits.book``) and in every
other one. With ``REDIS_URL`` the block is written to one Redis hash (field: a hash of the
upstream's base URL, key and model; value: the end of the block, Unix seconds), which each
process reads at most every :data:`REFRESH_S` seconds, so the check on the answering path is a
dictionary lookup, not a round trip. Without Redis the process's own book is all there is.

Redis failures are logged and ignored: a block is an optimisation (the upstream would answer 429
again), never a reason to fail an answer.
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Any

from django.conf import settings
from redis.exceptions import RedisError

from lib.loops import PerLoop
from lib.redis_conn import redis_options, tracked
from routing.providers import ratelimits
from routing.providers.ratelimits import UpstreamKey

log = logging.getLogger(__name__)

#: How stale this process's copy of the shared blocks may be, seconds.
REFRESH_S = 1.0
_HASH = "kefu:upstream-blocks"

_shared: dict[str, float] = {}  # key hash -> end of the block (Unix seconds)
_loaded_at = {"t": float("-inf")}


def _make_client() -> Any:
    import redis.asyncio as aioredis

    options = redis_options(asyncio=True, socket_timeout_s=0.5, retries=1, purpose="upstream-blocks")
    return tracked(aioredis.Redis.from_url(settings.REDIS_URL, **options), "upstream-blocks")


# One client per event loop, closed when its loop ends (a Celery task's loop ends with the task).
_clients: PerLoop[Any] = PerLoop(_make_client)


def key_hash(key: UpstreamKey) -> str:
    """16 hex digits naming an upstream (base URL, API key, model) without storing its key."""
    return hashlib.sha256("\x00".join(key).encode()).hexdigest()[:16]


async def block(key: UpstreamKey, seconds: float) -> None:
    """Skip ``key`` for ``seconds`` in every process (this one at once)."""
    ratelimits.book.block(key, seconds)
    until = time.time() + seconds
    _shared[key_hash(key)] = max(until, _shared.get(key_hash(key), 0.0))
    if not settings.REDIS_URL:
        return
    try:
        client = _clients.get()
        async with client.pipeline(transaction=False) as pipe:
            pipe.hset(_HASH, key_hash(key), repr(until))
            pipe.expire(_HASH, max(1, int(seconds) + 60))
            await pipe.execute()
    except RedisError as e:
        log.warning("sharing the block of an upstream failed: %r", e)


async def blocked_for_s(key: UpstreamKey) -> float:
    """Seconds until ``key`` may be called again (0.0: now): this process's book, and the blocks
    other processes shared (re-read at most every :data:`REFRESH_S`)."""
    local = ratelimits.book.blocked_for_s(key)
    if settings.REDIS_URL and time.monotonic() - _loaded_at["t"] >= REFRESH_S:
        _loaded_at["t"] = time.monotonic()
        try:
            raw = await _clients.get().hgetall(_HASH)
            now = time.time()
            _shared.clear()
            _shared.update({k.decode(): float(v) for k, v in raw.items() if float(v) > now})
        except (RedisError, ValueError) as e:
            log.warning("reading the shared upstream blocks failed: %r", e)
    shared = _shared.get(key_hash(key), 0.0) - time.time()
    return max(local, shared, 0.0)


def forget() -> None:
    """Drop this process's copy of the shared blocks (tests)."""
    _shared.clear()
    _loaded_at["t"] = float("-inf")
    _clients.clear()
