"""Per-address limits of the shopper socket (docs/protocol.md, limits): sockets held at once and
messages per minute. Message rate uses the ``limits`` library's moving window (in memory, or in
Redis when ``REDIS_URL`` is set, so all workers share one budget); the socket count is per process.
"""

from __future__ import annotations

import logging
from collections import Counter

from django.conf import settings
from limits import parse
from redis.exceptions import RedisError

from lib.ratelimit import moving_window

log = logging.getLogger(__name__)

_sockets: Counter[str] = Counter()
_limiters = moving_window(key_prefix="kefu-limits")


def socket_open(address: str) -> bool:
    """Count a new socket of ``address``; False (and nothing counted) when it already holds the maximum."""
    if _sockets[address] >= settings.KEFU_MAX_SOCKETS_PER_IP:
        return False
    _sockets[address] += 1
    return True


def socket_close(address: str) -> None:
    _sockets[address] -= 1
    if _sockets[address] <= 0:
        del _sockets[address]


async def message_allowed(address: str) -> bool:
    """Take one message from ``address``'s budget of ``KEFU_MESSAGES_PER_MINUTE_PER_IP`` a minute.

    Fails open: when the limiter's Redis cannot be reached (even after its connection retries,
    lib/redis_conn.py) the message is allowed and the failure logged; refusing every shopper's
    message while Redis is down would lose more than an unmetered minute does."""
    item = parse(f"{settings.KEFU_MESSAGES_PER_MINUTE_PER_IP}/minute")
    try:
        return await _limiters.get().hit(item, "shopper-msg", address)
    except RedisError as e:
        log.warning("message rate limit unavailable (%r); message allowed", e)
        return True
