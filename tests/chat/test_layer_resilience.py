"""A shopper socket survives its channel layer failing under it (a Redis restart or failover):
the consumer's channel-layer receive is retried instead of ending the consumer (which Daphne
reports to the browser as a 1011 close). Real Redis: the layer's connections are killed with
CLIENT KILL, as a restart does."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from channels.layers import channel_layers

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def redis_layer(settings: Any, redis_url: str) -> Iterator[None]:
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [redis_url], "prefix": "kefu-test-resilience"},
        }
    }
    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


def kill_other_redis_clients(redis_url: str) -> int:
    """Close every normal client connection to Redis but this one (what a restart does to kefu)."""
    r = redis.Redis.from_url(redis_url)
    try:
        return int(r.client_kill_filter(_type="normal", skipme=True))
    finally:
        r.close()


async def test_socket_stays_open_and_answers_after_the_layers_connections_are_killed(
    make_client: Any, faq: Any, redis_layer: None, redis_url: str
) -> None:
    shopper = await make_client()
    await shopper.hello()
    await shopper.say("how many days do I have to send an item back?")
    first = await shopper.until("stream.end")
    assert first[-1]["text"] == "You can return unused items within 30 days for a full refund."

    assert kill_other_redis_clients(redis_url) >= 1  # the layer's blocking receive among them

    await shopper.say("how many days do I have to send an item back?")
    again = await shopper.until("stream.end", timeout=30)
    assert [f["type"] for f in again][0] == "message"
    assert again[-1]["text"] == "You can return unused items within 30 days for a full refund."
