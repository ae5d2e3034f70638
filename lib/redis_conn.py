"""The connection options every kefu Redis client uses, so that each one recovers from dropped
connections (a Redis restart, a failover, ``CLIENT KILL``, an idle connection cut by a proxy).

redis-py's clients built on a connection pool (``Redis.from_url``, channels-redis, Django's
``RedisCache``, the ``limits`` storage) retry nothing by default: after Redis drops its clients,
the next command on each dead pooled connection fails once with ``ConnectionError``. With these
options a command that fails on a dead connection reconnects and is sent again (redis-py's own
``Retry`` with exponential backoff and jitter), a connection idle for longer than
``health_check_interval`` is pinged before use, and TCP keepalive notices a peer that vanished.

The socket timeout must exceed any blocking command's own timeout: channels-redis waits on
``BRPOP`` for ``brpop_timeout`` (5 s), and redis-py's default socket timeout is also 5 s, so an
idle socket's receive timed out and reconnected every 5 s (:data:`LAYER_SOCKET_TIMEOUT_S`).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, TypeVar

T = TypeVar("T")

#: Socket timeout of the channel layer's connections, seconds: above channels-redis'
#: ``brpop_timeout`` (5 s) so that an idle blocking receive returns empty before the socket times out.
LAYER_SOCKET_TIMEOUT_S = 10.0

#: Ping a pooled connection before use when it was idle this long, seconds.
HEALTH_CHECK_INTERVAL_S = 15


def redis_options(
    *,
    asyncio: bool,
    socket_timeout_s: float = 5.0,
    connect_timeout_s: float = 2.0,
    retries: int = 3,
    retry_timeouts: bool = True,
    purpose: str | None = None,
) -> dict[str, Any]:
    """Keyword arguments for a redis-py client or connection pool (``Redis.from_url(url, **opts)``,
    ``ConnectionPool.from_url``, a channels-redis host dict, Django ``RedisCache`` ``OPTIONS``).

    ``asyncio``: True for ``redis.asyncio`` clients (their ``Retry`` class differs);
    ``socket_timeout_s`` / ``connect_timeout_s``: per-command read and connect timeouts, seconds;
    ``retries``: attempts after the first, with exponential backoff from 50 ms capped at 1 s (plus
    jitter); ``retry_timeouts``: also retry a command that timed out (False where a timeout
    already means "fall back", e.g. the exact store on the shopper's path); ``purpose``: names
    the connections ``kefu-<purpose>`` on the server (:func:`client_name`).
    """
    from redis.backoff import ExponentialWithJitterBackoff
    from redis.exceptions import ConnectionError, TimeoutError

    retry: Any
    if asyncio:
        from redis.asyncio.retry import Retry as AsyncRetry

        retry = AsyncRetry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), retries)
    else:
        from redis.retry import Retry

        retry = Retry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), retries)
    errors: list[type[Exception]] = [ConnectionError]
    if retry_timeouts:
        errors.append(TimeoutError)
    options: dict[str, Any] = {
        "retry": retry,
        "retry_on_error": errors,
        "health_check_interval": HEALTH_CHECK_INTERVAL_S,
        "socket_keepalive": True,
        "socket_timeout": socket_timeout_s,
        "socket_connect_timeout": connect_timeout_s,
    }
    if purpose:
        options["client_name"] = client_name(purpose)
    return options


#: Every Redis connection kefu opens itself names itself ``kefu-<purpose>`` (``CLIENT SETNAME``), so
#: ``CLIENT LIST`` on the server shows which part of which process holds it.
CLIENT_NAME_PREFIX = "kefu-"

_pools: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()  # pool -> purpose
_pools_lock = threading.Lock()


def client_name(purpose: str) -> str:
    """The Redis client name of ``purpose``'s connections: ``kefu-<purpose>``."""
    return CLIENT_NAME_PREFIX + purpose


def tracked(client: T, purpose: str) -> T:
    """Count ``client``'s connections (a redis-py client, sync or asyncio) under ``purpose`` in
    :func:`open_connections`; returns ``client``. The pool is held weakly: a dropped client's
    connections stop counting when it is collected (they are closed then)."""
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        with _pools_lock:
            _pools[pool] = purpose
    return client


def open_connections() -> dict[str, int]:
    """This process's open Redis connections per purpose, from the pools of :func:`tracked`
    clients: connected sockets, idle in a pool or in use. Purposes with none are listed with 0."""
    with _pools_lock:
        pools = list(_pools.items())
    counts: dict[str, int] = {}
    for pool, purpose in pools:
        counts.setdefault(purpose, 0)
        for _ in range(3):  # the pool's sets may change under us (another thread); read again
            try:
                conns = [*pool._available_connections, *pool._in_use_connections]
                break
            except RuntimeError:
                continue
        else:
            conns = []
        counts[purpose] += sum(1 for c in conns if getattr(c, "is_connected", False) or getattr(c, "_sock", None))
    return counts
