"""Text of bot answers that are streaming right now, so that a socket that (re)joins mid-answer
gets ``stream.start`` + the text so far as one ``stream.delta`` (docs/protocol.md).

In-process dict by default; a Redis hash per answer when ``REDIS_URL`` is set, so a socket served
by another worker sees it too. Entries expire after an hour in Redis (a crashed worker's stream
does not linger) and are removed when the answer ends.

The buffer only helps a socket that joins mid-answer: a Redis failure in it is logged and never
stops an answer (``begin``/``append``/``end`` swallow it; ``get`` returns None, and the joining
socket gets the whole answer from its ``stream.end``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from redis.exceptions import RedisError

from lib.loops import PerLoop
from lib.redis_conn import redis_options


@dataclass
class LiveStream:
    message_id: int
    seq: int
    route: str
    text: str


log = logging.getLogger(__name__)

_local: dict[int, LiveStream] = {}


def _make_client() -> Any:
    import redis.asyncio as aioredis

    return aioredis.Redis.from_url(settings.REDIS_URL, **redis_options(asyncio=True, socket_timeout_s=2.0))


# One async Redis client per event loop: a client's connections belong to the loop that made them.
_clients: PerLoop[Any] = PerLoop(_make_client)


def _client() -> Any:
    return _clients.get()


def _key(message_id: int) -> str:
    return f"kefu:stream:{message_id}"


def _failed(op: str, message_id: int, e: Exception) -> None:
    log.warning("stream buffer %s of answer %s failed: %r", op, message_id, e)


async def begin(*, message_id: int, seq: int, route: str) -> None:
    """Start the buffer of answer ``message_id`` (its ``seq`` and ``route``)."""
    try:
        await _begin(message_id=message_id, seq=seq, route=route)
    except RedisError as e:
        _failed("begin", message_id, e)


async def _begin(*, message_id: int, seq: int, route: str) -> None:
    if settings.REDIS_URL:
        async with _client().pipeline(transaction=False) as pipe:
            pipe.hset(_key(message_id), mapping={"seq": seq, "route": route})
            pipe.expire(_key(message_id), 3600)
            await pipe.execute()
    else:
        _local[message_id] = LiveStream(message_id, seq, route, "")


async def append(*, message_id: int, text: str) -> None:
    """Add ``text`` (one delta) to the buffer of answer ``message_id``."""
    try:
        await _append(message_id=message_id, text=text)
    except RedisError as e:
        _failed("append", message_id, e)


async def _append(*, message_id: int, text: str) -> None:
    if settings.REDIS_URL:
        # The text lives in its own string key so APPEND can grow it; APPEND and EXPIRE go in one
        # round trip (this runs for every delta).
        async with _client().pipeline(transaction=False) as pipe:
            pipe.append(_key(message_id) + ":text", text)
            pipe.expire(_key(message_id) + ":text", 3600)
            await pipe.execute()
    else:
        s = _local.get(message_id)
        if s is not None:
            s.text += text


async def get(message_id: int) -> LiveStream | None:
    """The buffer of answer ``message_id``; None when there is none (ended, never begun, or Redis
    failing)."""
    try:
        return await _get(message_id)
    except RedisError as e:
        _failed("read", message_id, e)
        return None


async def _get(message_id: int) -> LiveStream | None:
    if settings.REDIS_URL:
        h = await _client().hgetall(_key(message_id))
        if not h:
            return None
        text = await _client().get(_key(message_id) + ":text")
        return LiveStream(message_id, int(h[b"seq"]), h[b"route"].decode(), (text or b"").decode())
    return _local.get(message_id)


async def end(message_id: int) -> None:
    """Drop the buffer of answer ``message_id`` (it expires within the hour anyway)."""
    if settings.REDIS_URL:
        try:
            await _client().delete(_key(message_id), _key(message_id) + ":text")
        except RedisError as e:
            _failed("end", message_id, e)
    else:
        _local.pop(message_id, None)
