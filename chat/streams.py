"""Text of bot answers that are streaming right now, so that a socket that (re)joins mid-answer
gets ``stream.start`` + the text so far as one ``stream.delta`` (docs/protocol.md).

In-process dict by default; a Redis hash per answer when ``REDIS_URL`` is set, so a socket served
by another worker sees it too. Entries expire after an hour in Redis (a crashed worker's stream
does not linger) and are removed when the answer ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings

from lib.loops import PerLoop


@dataclass
class LiveStream:
    message_id: int
    seq: int
    route: str
    text: str


_local: dict[int, LiveStream] = {}


def _make_client() -> Any:
    import redis.asyncio as aioredis

    return aioredis.Redis.from_url(settings.REDIS_URL)


# One async Redis client per event loop: a client's connections belong to the loop that made them.
_clients: PerLoop[Any] = PerLoop(_make_client)


def _client() -> Any:
    return _clients.get()


def _key(message_id: int) -> str:
    return f"kefu:stream:{message_id}"


async def begin(*, message_id: int, seq: int, route: str) -> None:
    if settings.REDIS_URL:
        async with _client().pipeline(transaction=False) as pipe:
            pipe.hset(_key(message_id), mapping={"seq": seq, "route": route})
            pipe.expire(_key(message_id), 3600)
            await pipe.execute()
    else:
        _local[message_id] = LiveStream(message_id, seq, route, "")


async def append(*, message_id: int, text: str) -> None:
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
    if settings.REDIS_URL:
        h = await _client().hgetall(_key(message_id))
        if not h:
            return None
        text = await _client().get(_key(message_id) + ":text")
        return LiveStream(message_id, int(h[b"seq"]), h[b"route"].decode(), (text or b"").decode())
    return _local.get(message_id)


async def end(message_id: int) -> None:
    if settings.REDIS_URL:
        await _client().delete(_key(message_id), _key(message_id) + ":text")
    else:
        _local.pop(message_id, None)
