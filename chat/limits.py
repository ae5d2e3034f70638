"""Per-address limits of the shopper socket (docs/protocol.md, limits): sockets held at once,
messages per minute, and the messages replays may send (per socket and per address). Message rate
and the address's replay budget use the ``limits`` library's moving window (in memory, or in Redis
when ``REDIS_URL`` is set, so all workers share one budget); the socket count and each socket's
replay budget are per process.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter

from django.conf import settings
from limits import RateLimitItemPerSecond, parse
from limits.aio.storage import MemoryStorage
from limits.aio.strategies import MovingWindowRateLimiter
from redis.exceptions import RedisError

from lib.loops import PerLoop
from lib.ratelimit import moving_window

log = logging.getLogger(__name__)

_sockets: Counter[str] = Counter()
_limiters = moving_window(key_prefix="kefu-limits")
# Each socket's replay budget: in this process's memory (a socket lives in one process).
_socket_limiters: PerLoop[MovingWindowRateLimiter] = PerLoop(lambda: MovingWindowRateLimiter(MemoryStorage()))


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


async def _retry_after_s(limiter: MovingWindowRateLimiter, item: RateLimitItemPerSecond, *ids: str) -> int:
    """Whole seconds until the oldest entry of the moving window leaves it (1 at least, the window at most)."""
    stats = await limiter.get_window_stats(item, *ids)
    return max(1, min(item.get_expiry(), math.ceil(stats.reset_time - time.time())))


def _replay_items() -> tuple[RateLimitItemPerSecond, RateLimitItemPerSecond]:
    window = settings.KEFU_REPLAY_WINDOW_S
    return (
        RateLimitItemPerSecond(settings.KEFU_REPLAY_MESSAGES_PER_SOCKET, window),
        RateLimitItemPerSecond(settings.KEFU_REPLAY_MESSAGES_PER_IP, window),
    )


async def replay_wait(address: str, socket_key: str) -> int | None:
    """Before reading a replay's page: None when both replay budgets (see :func:`replay_allowed`)
    have room for one message at least, else the seconds to wait. Nothing is charged; it spares
    the database the read of a page that would be refused anyway. Fails open on Redis errors."""
    per_socket, per_address = _replay_items()
    mine = _socket_limiters.get()
    if not await mine.test(per_socket, "replay-socket", socket_key):
        return await _retry_after_s(mine, per_socket, "replay-socket", socket_key)
    shared = _limiters.get()
    try:
        if not await shared.test(per_address, "replay-ip", address):
            return await _retry_after_s(shared, per_address, "replay-ip", address)
    except RedisError as e:
        log.warning("replay budget of the address unavailable (%r); replay allowed", e)
    return None


async def replay_allowed(address: str, socket_key: str, cost: int) -> int | None:
    """Take ``cost`` messages (what a replay or an ``older`` page is about to send; 1 at least)
    from the replay budgets: ``KEFU_REPLAY_MESSAGES_PER_SOCKET`` of socket ``socket_key`` and
    ``KEFU_REPLAY_MESSAGES_PER_IP`` of ``address``, each per ``KEFU_REPLAY_WINDOW_S`` seconds
    (moving windows; issue 29, item 4). A cost over a budget is taken as the whole budget, so a
    configured page larger than a budget is still served once per window.

    Returns None when both budgets had room (both are charged), else the seconds to wait before
    asking again (nothing charged). The address's budget fails open like :func:`message_allowed`
    (Redis unreachable: logged, allowed); the socket's budget is in memory and always holds."""
    per_socket, per_address = _replay_items()
    socket_cost = max(1, min(cost, per_socket.amount))
    address_cost = max(1, min(cost, per_address.amount))
    mine = _socket_limiters.get()
    if not await mine.test(per_socket, "replay-socket", socket_key, cost=socket_cost):
        return await _retry_after_s(mine, per_socket, "replay-socket", socket_key)
    shared = _limiters.get()
    try:
        if not await shared.hit(per_address, "replay-ip", address, cost=address_cost):
            return await _retry_after_s(shared, per_address, "replay-ip", address)
    except RedisError as e:
        log.warning("replay budget of the address unavailable (%r); replay allowed", e)
    await mine.hit(per_socket, "replay-socket", socket_key, cost=socket_cost)
    return None


async def upload_allowed(address: str) -> bool:
    """Take one upload from ``address``'s budgets (issue 33): ``KEFU_ATTACHMENTS_PER_MINUTE_PER_IP``
    a minute, of which ``KEFU_ATTACHMENT_BURST`` at most within 10 s (a few photos at once pass,
    a steady stream is slowed to the minute's rate). False when either is spent (the burst is
    tested first, so a refused upload is charged to neither). Fails open on Redis errors, like
    :func:`message_allowed`."""
    burst = RateLimitItemPerSecond(settings.KEFU_ATTACHMENT_BURST, 10)
    minute = parse(f"{settings.KEFU_ATTACHMENTS_PER_MINUTE_PER_IP}/minute")
    limiter = _limiters.get()
    try:
        if not await limiter.test(burst, "upload-burst", address):
            return False
        if not await limiter.hit(minute, "upload-min", address):
            return False
        return await limiter.hit(burst, "upload-burst", address)
    except RedisError as e:
        log.warning("upload rate limit unavailable (%r); upload allowed", e)
        return True
