"""How many agent console sockets are open (all processes sharing the cache: Redis when
``REDIS_URL`` is set, else this process). Used to tell a shopper who asks for a person that
nobody is online.

A counter in Django's cache (atomic ``incr``/``decr``). Known gap: a process killed without
closing its sockets leaves the count too high until the key expires (a day after the last change).
"""

from __future__ import annotations

from django.core.cache import cache

KEY = "kefu:agents-online"
TTL_S = 24 * 3600


def agent_connected() -> None:
    cache.add(KEY, 0, TTL_S)
    try:
        cache.incr(KEY)
    except ValueError:  # expired between add and incr
        cache.set(KEY, 1, TTL_S)
    cache.touch(KEY, TTL_S)


def agent_disconnected() -> None:
    try:
        if cache.decr(KEY) < 0:
            cache.set(KEY, 0, TTL_S)
    except ValueError:
        pass


def agents_online() -> int:
    """Agent sockets open now (0 or more)."""
    return max(0, int(cache.get(KEY) or 0))
