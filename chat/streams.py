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
import uuid
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from redis.exceptions import RedisError

from lib.loops import PerLoop
from lib.redis_conn import redis_options, tracked


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

    options = redis_options(asyncio=True, socket_timeout_s=2.0, purpose="stream-buffer")
    return tracked(aioredis.Redis.from_url(settings.REDIS_URL, **options), "stream-buffer")


# One async Redis client per event loop (a client's connections belong to the loop that made
# them), closed when that loop ends.
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


def _epoch_key(conversation_id: uuid.UUID) -> str:
    return f"kefu:epoch:{conversation_id.hex}"


# APPEND the delta unless the conversation's owner epoch in Redis is past the stream's: one atomic
# step, so every process agrees whether a delta came before or after a take-over.
_APPEND_IF_EPOCH = """
local current = tonumber(redis.call('GET', KEYS[2]) or '0')
if current > tonumber(ARGV[2]) then return 0 end
redis.call('APPEND', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], 3600)
return 1
"""

# Raise the conversation's owner epoch (never lower it: events of two owner changes may race).
_EPOCH_RAISE = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) > current then redis.call('SET', KEYS[1], ARGV[1], 'EX', 3600) end
return 1
"""


async def append(*, message_id: int, text: str, conversation_id: uuid.UUID, epoch: int) -> bool:
    """Add ``text`` (one delta) to the buffer of answer ``message_id``, which streams under owner
    ``epoch`` of its conversation. False when the conversation's owner changed since (an agent
    took it over in any process: :func:`epoch_raise`), and then nothing was added: the delta
    was generated after the take-over and must reach no socket and not the stored row. True on
    the in-memory defaults (one process: ``chat.fencing`` breaks the stream itself) and when Redis
    fails (logged; the database poll of ``chat.fencing`` still stops the stream)."""
    if not settings.REDIS_URL:
        s = _local.get(message_id)
        if s is not None:
            s.text += text
        return True
    try:
        added = await _client().eval(
            _APPEND_IF_EPOCH, 2, _key(message_id) + ":text", _epoch_key(conversation_id), text, epoch
        )
        return bool(added)
    except RedisError as e:
        _failed("append", message_id, e)
        return True


async def epoch_raise(conversation_id: uuid.UUID, epoch: int) -> None:
    """The conversation's owner is now ``epoch`` (after the change committed): from this moment no
    process adds a delta of an older epoch's stream (:func:`append`). Nothing on the in-memory
    defaults. A Redis failure is logged (the database poll of ``chat.fencing`` still stops it)."""
    if not settings.REDIS_URL:
        return
    try:
        await _client().eval(_EPOCH_RAISE, 1, _epoch_key(conversation_id), epoch)
    except RedisError as e:
        log.warning("raising the owner epoch of %s failed: %r", conversation_id, e)


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
