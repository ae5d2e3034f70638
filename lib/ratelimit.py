"""A moving-window rate limiter (the ``limits`` library) per event loop, in Redis when
``REDIS_URL`` is set (every process shares one budget), in memory otherwise. Each loop's Redis
client is closed when that loop ends (``lib.loops.PerLoop``)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from limits.aio.storage import MemoryStorage, RedisStorage, Storage
from limits.aio.strategies import MovingWindowRateLimiter

from .loops import PerLoop
from .redis_conn import redis_options, tracked


def _redis_client(limiter: MovingWindowRateLimiter) -> Any:
    """The ``redis.asyncio.Redis`` client under a Redis-backed limiter (the ``redispy`` bridge's),
    or None for another storage."""
    bridge = getattr(limiter.storage, "bridge", None)
    return getattr(bridge, "storage", None)


async def _close(limiter: MovingWindowRateLimiter) -> None:
    client = _redis_client(limiter)
    if client is not None:
        await client.aclose()


def moving_window(*, key_prefix: str) -> PerLoop[MovingWindowRateLimiter]:
    """One ``MovingWindowRateLimiter`` per running event loop (an async Redis storage's
    connections belong to the loop that made them), its Redis keys under ``key_prefix``, its
    connections named ``kefu-ratelimit-<key_prefix without kefu->`` and closed when the loop ends."""
    purpose = "ratelimit-" + key_prefix.removeprefix("kefu-")

    def make() -> MovingWindowRateLimiter:
        storage: Storage
        if settings.REDIS_URL:
            storage = RedisStorage(
                "async+" + settings.REDIS_URL,
                implementation="redispy",
                key_prefix=key_prefix,
                **redis_options(asyncio=True, socket_timeout_s=1.0, retries=2, purpose=purpose),
            )
        else:
            storage = MemoryStorage()
        limiter = MovingWindowRateLimiter(storage)
        client = _redis_client(limiter)
        if client is not None:
            tracked(client, purpose)
        return limiter

    return PerLoop(make, close=_close)
