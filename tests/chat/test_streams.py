"""Live stream buffers (chat.streams), in process and in Redis: what a socket that joins
mid-answer gets as "the text so far"."""

from __future__ import annotations

import pytest

from chat import streams

pytestmark = pytest.mark.asyncio


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_text_so_far_grows_and_is_gone_after_the_end(backend, settings, request):
    if backend == "redis":
        settings.REDIS_URL = request.getfixturevalue("redis_url")
    streams._clients.clear()
    message_id = 987654321
    await streams.end(message_id)
    assert await streams.get(message_id) is None
    await streams.begin(message_id=message_id, seq=7, route="llm.simple")
    await streams.append(message_id=message_id, text="Hello, ")
    await streams.append(message_id=message_id, text="退货 ok")
    live = await streams.get(message_id)
    assert live == streams.LiveStream(message_id, 7, "llm.simple", "Hello, 退货 ok")
    await streams.end(message_id)
    assert await streams.get(message_id) is None
    streams._clients.clear()
