"""Live stream buffers (chat.streams), in process and in Redis: what a socket that joins
mid-answer gets as "the text so far"."""

from __future__ import annotations

import uuid

import pytest

from chat import streams

pytestmark = pytest.mark.asyncio

CONV = uuid.UUID(int=987654321)


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_text_so_far_grows_and_is_gone_after_the_end(backend, settings, request):
    if backend == "redis":
        settings.REDIS_URL = request.getfixturevalue("redis_url")
    streams._clients.clear()
    message_id = 987654321
    await streams.end(message_id)
    assert await streams.get(message_id) is None
    await streams.begin(message_id=message_id, seq=7, route="llm.simple")
    await streams.append(message_id=message_id, text="Hello, ", conversation_id=CONV, epoch=0)
    await streams.append(message_id=message_id, text="退货 ok", conversation_id=CONV, epoch=0)
    live = await streams.get(message_id)
    assert live == streams.LiveStream(message_id, 7, "llm.simple", "Hello, 退货 ok")
    await streams.end(message_id)
    assert await streams.get(message_id) is None
    streams._clients.clear()


async def test_a_delta_of_an_older_epoch_is_refused_after_the_owner_changed(settings, private_redis):
    """Redis decides, atomically, whether a delta came before or after a take-over: once the
    conversation's epoch is raised, a stream of the old epoch adds nothing."""
    settings.REDIS_URL = private_redis.url
    streams._clients.clear()
    conv = uuid.uuid4()
    await streams.begin(message_id=1, seq=2, route="llm.simple")
    assert await streams.append(message_id=1, text="before ", conversation_id=conv, epoch=0) is True
    await streams.epoch_raise(conv, 1)
    assert await streams.append(message_id=1, text="after", conversation_id=conv, epoch=0) is False
    assert (await streams.get(1)).text == "before "
    await streams.epoch_raise(conv, 0)  # never lowered: an older owner change arriving late
    assert await streams.append(message_id=1, text="after", conversation_id=conv, epoch=0) is False
    assert await streams.append(message_id=1, text="new owner", conversation_id=conv, epoch=1) is True
    streams._clients.clear()
