"""A moving-window rate limiter (the ``limits`` library) per event loop, in Redis when
``REDIS_URL`` is set (every process shares one budget), in memory otherwise."""

from __future__ import annotations

from django.conf import settings
from limits.aio.storage import MemoryStorage, RedisStorage, Storage
from limits.aio.strategies import MovingWindowRateLimiter

from .loops import PerLoop
from .redis_conn import redis_options


def moving_window(*, key_prefix: str) -> PerLoop[MovingWindowRateLimiter]:
    """One ``MovingWindowRateLimiter`` per running event loop (an async Redis storage's
    connections belong to the loop that made them), its Redis keys under ``key_prefix``."""

    def make() -> MovingWindowRateLimiter:
        storage: Storage
        if settings.REDIS_URL:
            storage = RedisStorage(
                "async+" + settings.REDIS_URL,
                implementation="redispy",
                key_prefix=key_prefix,
                **redis_options(asyncio=True, socket_timeout_s=1.0, retries=2),
            )
        else:
            storage = MemoryStorage()
        return MovingWindowRateLimiter(storage)

    return PerLoop(make)
