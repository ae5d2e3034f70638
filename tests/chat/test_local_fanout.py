"""Group events reach this process's own sockets without Redis, and other processes' sockets
through it (issue 13: a channel-layer group send per token, even for the sockets in the same
process). Two layers on one private Redis stand for two worker processes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from chat.layer import ShieldedRedisChannelLayer

pytestmark = pytest.mark.asyncio


def worker_layer(url: str) -> ShieldedRedisChannelLayer:
    return ShieldedRedisChannelLayer(hosts=[url], prefix="kefu-fanout-test", capacity=100)


async def test_a_group_event_goes_in_process_to_local_members_and_through_redis_to_the_others(
    private_redis: Any,
) -> None:
    a, b = worker_layer(private_redis.url), worker_layer(private_redis.url)
    a_socket, a_other = await a.new_channel(), await a.new_channel()
    b_socket = await b.new_channel()
    inbox, other_inbox = a.local_inbox(a_socket), a.local_inbox(a_other)
    await a.group_add("conv.x", a_socket)
    await a.group_add("conv.x", a_other)

    await a.group_send("conv.x", {"type": "chat.frame", "n": 1})
    assert inbox.get_nowait() == {"type": "chat.frame", "n": 1}
    assert other_inbox.get_nowait() == {"type": "chat.frame", "n": 1}
    assert (a.local_deliveries, a.remote_pushes) == (2, 0)  # all members local: nothing pushed

    await b.group_add("conv.x", b_socket)  # a socket of the conversation in another worker
    await a.group_send("conv.x", {"type": "chat.frame", "n": 2})
    assert (await asyncio.wait_for(b.receive(b_socket), 5)) == {"type": "chat.frame", "n": 2}
    assert inbox.get_nowait()["n"] == 2
    assert (a.local_deliveries, a.remote_pushes) == (4, 1)

    # From the other worker, a's sockets get it through Redis (a's receive), not its inbox.
    await b.group_send("conv.x", {"type": "chat.frame", "n": 3})
    assert (await asyncio.wait_for(a.receive(a_socket), 5))["n"] == 3
    assert inbox.empty()
    await a.flush()


async def test_a_channel_without_an_inbox_and_a_closed_one_still_get_events_through_redis(private_redis: Any) -> None:
    """Only channels whose consumer reads an inbox are served in process; one whose inbox was
    closed (its socket ended) gets nothing more in process."""
    a = worker_layer(private_redis.url)
    plain, closing = await a.new_channel(), await a.new_channel()
    inbox = a.local_inbox(closing)
    await a.group_add("conv.y", plain)
    await a.group_add("conv.y", closing)
    a.local_close(closing)
    await a.group_send("conv.y", {"type": "chat.frame", "n": 1})
    assert (await asyncio.wait_for(a.receive(plain), 5)) == {"type": "chat.frame", "n": 1}
    assert inbox.empty() and a.local_deliveries == 0 and a.remote_pushes == 1
    await a.send(plain, {"type": "chat.frame", "n": 2})
    assert (await asyncio.wait_for(a.receive(plain), 5))["n"] == 2
    await a.flush()


async def test_group_expiry_and_capacity_hold_for_local_members(private_redis: Any) -> None:
    a = ShieldedRedisChannelLayer(hosts=[private_redis.url], prefix="kefu-fanout-test", capacity=2, group_expiry=60)
    socket = await a.new_channel()
    inbox = a.local_inbox(socket)
    await a.group_add("conv.z", socket)
    for n in range(3):
        await a.group_send("conv.z", {"type": "chat.frame", "n": n})
    assert [inbox.get_nowait()["n"] for _ in range(inbox.qsize())] == [0, 1]  # the third was over capacity
    await a.flush()


@pytest.mark.django_db(transaction=True)
async def test_a_shoppers_answer_reaches_its_socket_in_process(
    settings: Any, private_redis: Any, make_client: Any, faq: Any
) -> None:
    """The whole path on kefu's layer: the acknowledgement and the answer's frames published by
    this process reach the shopper's socket through its inbox, none through a Redis push."""
    from channels.layers import channel_layers, get_channel_layer

    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "chat.layer.ShieldedRedisChannelLayer",
            "CONFIG": {"hosts": [private_redis.url], "prefix": "kefu-fanout-test"},
        }
    }
    channel_layers.backends.clear()
    try:
        shopper = await make_client()
        await shopper.hello()
        await shopper.say("how many days do I have to send an item back?")
        frames = await shopper.until("stream.end")
        assert [f["type"] for f in frames][:3] == ["message", "stream.start", "stream.delta"]
        assert frames[-1]["text"] == "You can return unused items within 30 days for a full refund."
        layer = get_channel_layer()
        assert layer.local_deliveries >= 2 and layer.remote_pushes == 0
    finally:
        channel_layers.backends.clear()
