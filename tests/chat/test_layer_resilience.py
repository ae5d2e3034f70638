"""A shopper socket survives its channel layer failing under it (a Redis restart or failover):
the consumer's channel-layer receive is retried instead of ending the consumer (which Daphne
reports to the browser as a 1011 close). Real Redis: the layer's connections are killed with
CLIENT KILL, as a restart does, on a private ``redis-server`` of the test's own."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from channels.layers import channel_layers

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def redis_layer(settings: Any, private_redis: Any) -> Iterator[None]:
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [private_redis.url], "prefix": "kefu-test-resilience"},
        }
    }
    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


async def test_socket_stays_open_and_answers_after_the_layers_connections_are_killed(
    make_client: Any, faq: Any, redis_layer: None, private_redis: Any
) -> None:
    shopper = await make_client()
    await shopper.hello()
    await shopper.say("how many days do I have to send an item back?")
    first = await shopper.until("stream.end")
    assert first[-1]["text"] == "You can return unused items within 30 days for a full refund."

    assert private_redis.kill_clients() >= 1  # the layer's blocking receive among them

    await shopper.say("how many days do I have to send an item back?")
    again = await shopper.until("stream.end", timeout=30)
    assert [f["type"] for f in again][0] == "message"
    assert again[-1]["text"] == "You can return unused items within 30 days for a full refund."
