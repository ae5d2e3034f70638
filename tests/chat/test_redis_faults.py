"""Redis blips lose no shopper's answer (issue: faults). kefu runs as a real Daphne process on
PostgreSQL and a private ``redis-server`` of the test's own, whose client connections are killed
(as a failover does) or which is restarted with nothing persisted (every key and every group
membership gone). Every shopper, old and new, gets every answer; no socket is closed."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

import pytest
import websockets

from tests.sockets import frames_until

pytestmark = pytest.mark.asyncio

RETURNS = "You can return unused items within 30 days for a full refund."
PAYMENT = "We accept Visa, Mastercard, PayPal and Apple Pay."


async def ask(ws: Any, text: str) -> list[dict[str, Any]]:
    """Send ``text``; the frames up to its answer's ``stream.end``."""
    await ws.send(json.dumps({"type": "message", "client_id": str(uuid.uuid4()), "text": text}))
    return await frames_until(ws, "stream.end")


async def new_shopper_answered(kefu: Any, text: str, expected: str) -> None:
    async with websockets.connect(kefu.ws, origin=kefu.base) as ws:
        await ws.send(json.dumps({"type": "hello"}))
        assert json.loads(await ws.recv())["type"] == "conversation"
        frames = await ask(ws, text)
        assert [f["type"] for f in frames if f["type"] not in ("stream.delta",)][:2] == ["message", "stream.start"]
        assert frames[-1]["text"] == expected
        assert "".join(f["text"] for f in frames if f["type"] == "stream.delta") == expected


def healthz(kefu: Any) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(kefu.base + "/healthz", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def wait_healthy(kefu: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while (status := healthz(kefu))[0] != 200:
        assert time.monotonic() < deadline, f"/healthz stayed unhealthy: {status}"
        time.sleep(0.2)


@pytest.fixture
def kefu_on_private_redis(live_kefu: Any, private_redis: Any, pg_database: str) -> Any:
    return live_kefu(env={"DATABASE_URL": pg_database, "REDIS_URL": private_redis.url})


async def test_killed_connections_lose_no_answer(kefu_on_private_redis: Any, private_redis: Any) -> None:
    """Three rounds of CLIENT KILL: after each, a shopper already connected and four new ones are
    all answered in full, and the old socket is never closed."""
    kefu = kefu_on_private_redis
    async with websockets.connect(kefu.ws, origin=kefu.base) as old:
        await old.send(json.dumps({"type": "hello"}))
        assert json.loads(await old.recv())["type"] == "conversation"
        assert (await ask(old, "how many days do I have to return"))[-1]["text"] == RETURNS
        for _ in range(3):
            assert private_redis.kill_clients() >= 1  # the layer's blocking receive among them
            await asyncio.gather(*(new_shopper_answered(kefu, "is apple pay accepted", PAYMENT) for _ in range(4)))
            frames = await ask(old, "how many days do I have to return")
            assert frames[0]["type"] == "message" and frames[-1]["text"] == RETURNS
    assert healthz(kefu)[0] == 200


async def test_a_redis_restart_loses_no_answer_and_open_sockets_rejoin(
    kefu_on_private_redis: Any, private_redis: Any
) -> None:
    """A restart loses every group membership: once /healthz is back to 200 the socket that was
    open before the restart gets its acknowledgement and its whole answer again, and new
    shoppers are answered."""
    kefu = kefu_on_private_redis
    async with websockets.connect(kefu.ws, origin=kefu.base) as old:
        await old.send(json.dumps({"type": "hello"}))
        assert json.loads(await old.recv())["type"] == "conversation"
        assert (await ask(old, "how many days do I have to return"))[-1]["text"] == RETURNS
        private_redis.restart()
        await asyncio.to_thread(wait_healthy, kefu)
        frames = await ask(old, "is apple pay accepted")
        assert [f["type"] for f in frames if f["type"] != "stream.delta"] == ["message", "stream.start", "stream.end"]
        assert frames[-1]["text"] == PAYMENT
        assert "".join(f["text"] for f in frames if f["type"] == "stream.delta") == PAYMENT
        await new_shopper_answered(kefu, "how many days do I have to return", RETURNS)


async def test_while_redis_is_down_the_process_own_sockets_are_still_answered(
    kefu_on_private_redis: Any, private_redis: Any
) -> None:
    """Redis gone altogether: /healthz says so (503); a shopper already connected still gets the
    acknowledgement and the answer its own worker streams (delivered locally); a new socket gets
    an ``error`` frame ``unavailable`` and a 4503 close (the widget reconnects later), never 1011.
    Once Redis is back everything is answered again."""
    kefu = kefu_on_private_redis
    async with websockets.connect(kefu.ws, origin=kefu.base) as old:
        await old.send(json.dumps({"type": "hello"}))
        assert json.loads(await old.recv())["type"] == "conversation"
        private_redis.stop()
        status, body = healthz(kefu)
        assert status == 503 and body["channel_layer"].startswith("error")

        frames = await ask(old, "is apple pay accepted")
        assert frames[0]["type"] == "message" and frames[-1]["text"] == PAYMENT

        async with websockets.connect(kefu.ws, origin=kefu.base) as new:
            await new.send(json.dumps({"type": "hello"}))
            frame = json.loads(await asyncio.wait_for(new.recv(), 30))
            assert frame["type"] == "error" and frame["code"] == "unavailable"
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(new.recv(), 30)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 4503

        private_redis.start()
        await asyncio.to_thread(wait_healthy, kefu)
        assert (await ask(old, "how many days do I have to return"))[-1]["text"] == RETURNS
    await new_shopper_answered(kefu, "is apple pay accepted", PAYMENT)
