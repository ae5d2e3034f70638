"""The whole chat flow over real sockets against Daphne subprocesses: once on the embedded
defaults (SQLite, in-memory layer), once on Redis + PostgreSQL with two workers sharing a
conversation (a socket on each)."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
import websockets

from tests.sockets import frames_until as recv_until

pytestmark = pytest.mark.asyncio


async def ask(ws, text: str) -> list[dict]:
    await ws.send(json.dumps({"type": "message", "client_id": str(uuid.uuid4()), "text": text}))
    return await recv_until(ws, "stream.end")


async def test_embedded_defaults_flow(live_kefu):
    kefu = live_kefu()
    assert kefu.health == {
        "status": "ok",
        "database": "ok",
        "channel_layer": "ok",
        "cache": "ok",
        "faq_model": "ok",
        "router": "ok",
        # The remote tiers' standing, a detail that never makes /healthz 503 (issue 28): no key here.
        "tiers": {
            tier: f"not configured: no API key (KEFU_{tier.upper()}_API_KEY or OPENAI_API_KEY)"
            for tier in ("simple", "medium", "complex")
        },
    }
    async with websockets.connect(kefu.ws, origin=kefu.base) as ws:
        await ws.send(json.dumps({"type": "hello"}))
        conv = json.loads(await ws.recv())
        frames = await ask(ws, "is apple pay accepted at checkout?")
        assert (
            frames[-1]["route"] == "faq" and frames[-1]["text"] == "We accept Visa, Mastercard, PayPal and Apple Pay."
        )
    # reconnect and resume: the stored conversation comes back, in order, nothing duplicated
    async with websockets.connect(kefu.ws, origin=kefu.base) as ws:
        await ws.send(json.dumps({"type": "hello", "conversation": conv["id"], "token": conv["token"]}))
        assert json.loads(await ws.recv())["id"] == conv["id"]
        replay = [json.loads(await ws.recv()) for _ in range(2)]
        assert [(f["seq"], f["role"]) for f in replay] == [(1, "shopper"), (2, "bot")]


async def test_redis_and_postgres_two_workers_share_a_conversation(live_kefu, redis_url, pg_database):
    env = {"DATABASE_URL": pg_database, "REDIS_URL": redis_url}
    first = live_kefu(env=env)
    second = live_kefu(env=env, faq_path=None)
    async with websockets.connect(first.ws, origin=first.base) as a:
        await a.send(json.dumps({"type": "hello"}))
        conv = json.loads(await a.recv())
        async with websockets.connect(second.ws, origin=second.base) as b:
            await b.send(json.dumps({"type": "hello", "conversation": conv["id"], "token": conv["token"]}))
            assert json.loads(await b.recv())["type"] == "conversation"
            # The resume's replay runs after the conversation frame: wait until it is over (a
            # socket handles frames in order, so the reply to a bad frame comes after it), or an
            # answer that finished meanwhile is replayed as a message instead of streamed.
            await b.send(json.dumps({"type": "feedback", "message_id": 0, "rating": "up"}))
            assert json.loads(await b.recv())["code"] == "invalid"
            frames_a = await ask(a, "how many days is shipping?")
            frames_b = await recv_until(b, "stream.end")
    assert frames_a[-1]["route"] == "faq"
    # the socket on the other worker saw the same acknowledgement and the same streamed answer
    assert [f for f in frames_b if f["type"] != "stream.delta"] == [f for f in frames_a if f["type"] != "stream.delta"]
    assert "".join(f["text"] for f in frames_b if f["type"] == "stream.delta") == frames_a[-1]["text"]
    assert frames_a[-1]["text"].startswith("Orders ship within 1 business day")


async def test_sockets_closed_mid_answer_give_their_slot_back(live_kefu):
    """A shopper who closes the tab while an answer streams must not use up the per-address
    socket budget (3 here): after 24 such closes a new socket is still served, and every answer was
    stored whole."""
    kefu = live_kefu(env={"KEFU_MAX_SOCKETS_PER_IP": "3"})
    conversations = []

    async def one() -> None:
        ws = await websockets.connect(kefu.ws, origin=kefu.base)
        await ws.send(json.dumps({"type": "hello"}))
        conversations.append(json.loads(await ws.recv()))
        await ws.send(
            json.dumps({"type": "message", "client_id": str(uuid.uuid4()), "text": "how long does delivery take?"})
        )
        await recv_until(ws, "stream.delta")
        ws.transport.abort()  # the tab is gone: no closing handshake, frames still on their way

    for _ in range(12):
        await asyncio.gather(*(one() for _ in range(2)))
    async with websockets.connect(kefu.ws, origin=kefu.base) as ws:
        await ws.send(
            json.dumps({"type": "hello", "conversation": conversations[-1]["id"], "token": conversations[-1]["token"]})
        )
        assert json.loads(await ws.recv())["type"] == "conversation"
        replay = [json.loads(await ws.recv()) for _ in range(2)]
        assert replay[1]["role"] == "bot" and replay[1]["text"].startswith("Orders ship within 1 business day")


async def test_burst_of_messages_over_a_real_socket_loses_nothing(live_kefu):
    """40 messages sent back to back: every acknowledgement and every answer reaches the socket
    (more frames than the channel layer's default queue capacity of 100)."""
    from pathlib import Path

    demo = Path(__file__).resolve().parents[2] / "routing" / "demo" / "faq_demo.jsonl"
    kefu = live_kefu(faq_path=demo)  # long answers: many frames each
    async with websockets.connect(kefu.ws, origin=kefu.base) as ws:
        await ws.send(json.dumps({"type": "hello"}))
        json.loads(await ws.recv())
        questions = ["how long does delivery take?", "my lamp arrived broken"] * 20
        for q in questions:
            await ws.send(json.dumps({"type": "message", "client_id": str(uuid.uuid4()), "text": q}))
        acks = ends = 0
        async with asyncio.timeout(60):
            while ends < len(questions):
                f = json.loads(await ws.recv())
                acks += f["type"] == "message"
                ends += f["type"] == "stream.end"
        assert acks == len(questions) and ends == len(questions)


async def test_a_frame_over_the_size_limit_is_closed_with_1009(live_kefu):
    """Over Daphne's 1 MiB message limit: a close frame 1009 (message too big), not a dropped
    connection (1006), and the server goes on serving."""
    kefu = live_kefu()
    async with websockets.connect(kefu.ws, origin=kefu.base, max_size=None) as ws:
        await ws.send(json.dumps({"type": "hello"}))
        json.loads(await ws.recv())
        await ws.send(json.dumps({"type": "message", "client_id": "big", "text": "x" * (1024 * 1024 + 10)}))
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    async with websockets.connect(kefu.ws, origin=kefu.base) as ws:
        await ws.send(json.dumps({"type": "hello"}))
        assert json.loads(await ws.recv())["type"] == "conversation"
