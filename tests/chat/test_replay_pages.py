"""Replay within bounds (issue 29, item 4): a replay (``hello``/``resync`` with ``after``) sends at
most ``KEFU_REPLAY_PAGE`` messages, the newest, after a ``replay.more`` when older ones exist; the
client asks for older pages with ``older`` (each ended by ``older.end``); and what replays cost is
budgeted in messages per socket and per address (shared by the workers through Redis), over which
the socket gets ``error`` ``replay_limited`` with ``retry_after`` and nothing stored is lost
(docs/protocol.md, replay pages)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
import websockets
from channels.db import database_sync_to_async

from chat.models import Conversation, Message
from tests.queries import all_threads_queries

pytestmark = pytest.mark.asyncio

N = 12  # messages stored in the conversation (seq 1..12)


@database_sync_to_async
def store_messages(conversation_id: str, n: int = N) -> None:
    """``n`` finished messages, shopper and bot in turn, every shopper message answered."""
    conv = Conversation.objects.get(pk=conversation_id)
    Message.objects.bulk_create(
        Message(
            conversation=conv,
            seq=seq,
            role="shopper" if seq % 2 else "bot",
            text=f"message {seq}",
            client_id=f"c-{seq}" if seq % 2 else None,
            route="" if seq % 2 else "faq",
            reply_to_seq=None if seq % 2 else seq - 1,
        )
        for seq in range(1, n + 1)
    )
    Conversation.objects.filter(pk=conv.pk).update(last_seq=n, answered_seq=n - 1)


async def resumed(make_client: Any, first: Any, after: int = 0) -> tuple[Any, list[dict[str, Any]]]:
    """A new socket resuming ``first``'s conversation with ``after``: it and the frames of its replay."""
    other = await make_client()
    hello = await other.hello(conversation=first.conversation, token=first.token, after=after)
    assert hello["type"] == "conversation"
    return other, await drain(other)


async def drain(client: Any) -> list[dict[str, Any]]:
    """Every frame the socket gets until it has been quiet for 0.5 s."""
    frames = []
    while not await client.comm.receive_nothing(timeout=0.5):
        frames.append(await client.recv())
    return frames


def seqs(frames: list[dict[str, Any]]) -> list[int]:
    return [f["seq"] for f in frames if f["type"] == "message"]


@pytest.fixture
def pages(settings: Any) -> Any:
    settings.KEFU_REPLAY_PAGE = 5
    settings.KEFU_REPLAY_MESSAGES_PER_SOCKET = 100
    settings.KEFU_REPLAY_MESSAGES_PER_IP = 1000
    settings.KEFU_REPLAY_WINDOW_S = 10
    return settings


@pytest.mark.django_db(transaction=True)
async def test_a_resume_sends_the_newest_page_and_older_pages_on_request(make_client: Any, pages: Any) -> None:
    first = await make_client()
    await first.hello()
    await store_messages(first.conversation)

    shopper, frames = await resumed(make_client, first)
    assert frames[0] == {"type": "replay.more", "before": 8}
    assert [f["type"] for f in frames[1:]] == ["message"] * 5
    assert seqs(frames) == [8, 9, 10, 11, 12]
    assert frames[-1]["text"] == "message 12"

    await shopper.send({"type": "older", "before": 8})
    frames = await drain(shopper)
    assert seqs(frames) == [3, 4, 5, 6, 7]
    assert frames[-1] == {"type": "older.end", "before": 8, "more": True}
    await shopper.send({"type": "older", "before": 3})
    frames = await drain(shopper)
    assert seqs(frames) == [1, 2]
    assert frames[-1] == {"type": "older.end", "before": 3, "more": False}
    assert frames[0]["role"] == "shopper" and frames[0]["client_id"] == "c-1"

    for bad in (0, -1, "8", True, None):
        await shopper.send({"type": "older", "before": bad})
        error = await shopper.recv()
        assert error["type"] == "error" and error["code"] == "invalid"

    # Within a page: everything after `after`, no replay.more (as before).
    _, frames = await resumed(make_client, first, after=9)
    assert [f["type"] for f in frames] == ["message"] * 3 and seqs(frames) == [10, 11, 12]


@pytest.mark.django_db(transaction=True)
async def test_a_resync_sends_a_page_too(make_client: Any, pages: Any) -> None:
    first = await make_client()
    await first.hello()
    await store_messages(first.conversation)
    await first.send({"type": "resync", "after": 1})
    frames = await drain(first)
    assert frames[0] == {"type": "replay.more", "before": 8}
    assert seqs(frames) == [8, 9, 10, 11, 12]


@pytest.mark.django_db(transaction=True)
async def test_a_socket_over_its_replay_budget_is_told_to_wait_and_loses_nothing(make_client: Any, pages: Any) -> None:
    pages.KEFU_REPLAY_MESSAGES_PER_SOCKET = 10
    pages.KEFU_REPLAY_WINDOW_S = 2
    first = await make_client()
    await first.hello()
    await store_messages(first.conversation)

    shopper, frames = await resumed(make_client, first)  # 5 of 10
    assert seqs(frames) == [8, 9, 10, 11, 12]
    await shopper.send({"type": "older", "before": 8})  # 10 of 10
    assert seqs(await drain(shopper)) == [3, 4, 5, 6, 7]
    await shopper.send({"type": "older", "before": 3})  # 2 more: over
    frames = await drain(shopper)
    assert len(frames) == 1 and frames[0]["type"] == "error" and frames[0]["code"] == "replay_limited"
    assert frames[0]["retry_after"] in (1, 2)

    # Another socket of the same address has its own budget (the address's is far from spent).
    _, frames = await resumed(make_client, first)
    assert seqs(frames) == [8, 9, 10, 11, 12]

    # Once the window moved on, the same request is served: nothing was lost.
    deadline = time.monotonic() + 10
    while True:
        await shopper.send({"type": "older", "before": 3})
        frames = await drain(shopper)
        if (frames and frames[-1]["type"] == "older.end") or time.monotonic() > deadline:
            break
        assert frames[0]["code"] == "replay_limited"
    assert seqs(frames) == [1, 2] and frames[-1] == {"type": "older.end", "before": 3, "more": False}


@pytest.mark.django_db(transaction=True)
async def test_the_sockets_of_one_address_share_a_replay_budget(make_client: Any, pages: Any) -> None:
    pages.KEFU_REPLAY_MESSAGES_PER_IP = 8
    first = await make_client()
    await first.hello()
    await store_messages(first.conversation)
    _, frames = await resumed(make_client, first)  # 5 of the address's 8
    assert seqs(frames) == [8, 9, 10, 11, 12]
    _, frames = await resumed(make_client, first)  # 5 more: over
    assert len(frames) == 1 and frames[0]["type"] == "error" and frames[0]["code"] == "replay_limited"
    assert 1 <= frames[0]["retry_after"] <= 10


@pytest.mark.django_db(transaction=True)
async def test_a_replay_reads_one_page_in_one_query_whatever_the_conversation_holds(
    make_client: Any, pages: Any
) -> None:
    """The hot path of the trial: a resync of a long conversation reads the page's rows only (one
    statement, LIMIT page + 1), and one refused for its budget reads none."""
    pages.KEFU_REPLAY_MESSAGES_PER_SOCKET = 5
    first = await make_client()
    await first.hello()
    await store_messages(first.conversation, n=400)
    with all_threads_queries() as captured:
        await first.send({"type": "resync", "after": 0})
        frames = await drain(first)
    assert seqs(frames) == list(range(396, 401))
    reads = [q for q in captured.snapshot() if "chat_message" in q.sql]
    assert len(reads) == 1 and "LIMIT 6" in reads[0].sql, captured.report()

    # Over the socket's budget: refused before anything is read.
    deadline = time.monotonic() + 10
    while True:
        with all_threads_queries() as captured:
            await first.send({"type": "resync", "after": 0})
            frames = await drain(first)
        if (frames and frames[0].get("code") == "replay_limited") or time.monotonic() > deadline:
            break  # (a resync sooner than a second after the last gets rate_limited first)
    assert [f["code"] for f in frames] == ["replay_limited"]
    assert [q for q in captured.snapshot() if "chat_message" in q.sql] == [], captured.report()


async def recv(ws: Any, timeout: float = 30) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


async def replay_of(ws: Any) -> list[dict[str, Any]]:
    """The frames after ``conversation`` until the socket has been quiet for 0.5 s."""
    frames = []
    while True:
        try:
            frames.append(json.loads(await asyncio.wait_for(ws.recv(), 0.5)))
        except TimeoutError:
            return frames


@pytest.mark.timeout(360)  # two servers migrated and started: minutes on a busy machine
async def test_two_workers_share_one_address_replay_budget(
    live_kefu: Any, private_redis: Any, pg_database: str
) -> None:
    """Two Daphne processes on one database and one Redis: an address's replay budget spent on
    one worker is spent on the other too."""
    env = {
        "DATABASE_URL": pg_database,
        "REDIS_URL": private_redis.url,
        "KEFU_REPLAY_PAGE": "5",
        "KEFU_REPLAY_MESSAGES_PER_SOCKET": "100",
        "KEFU_REPLAY_MESSAGES_PER_IP": "8",
    }
    one, two = live_kefu(env=env), live_kefu(env=env, faq_path=None)
    async with websockets.connect(one.ws, origin=one.base) as ws:
        await ws.send(json.dumps({"type": "hello"}))
        conv = await recv(ws)
        for i in range(4):  # 8 messages: 4 FAQ questions and their answers
            await ws.send(
                json.dumps({"type": "message", "client_id": f"q-{i}", "text": "how long does delivery take?"})
            )
            while (await recv(ws))["type"] != "stream.end":
                pass
    resume = {"type": "hello", "conversation": conv["id"], "token": conv["token"], "after": 0}
    async with websockets.connect(one.ws, origin=one.base) as a:
        await a.send(json.dumps(resume))
        assert (await recv(a))["type"] == "conversation"
        frames = await replay_of(a)
        assert frames[0] == {"type": "replay.more", "before": 4}
        assert seqs(frames) == [4, 5, 6, 7, 8]
    async with websockets.connect(two.ws, origin=two.base) as b:
        await b.send(json.dumps(resume))
        assert (await recv(b))["type"] == "conversation"
        frames = await replay_of(b)
        assert [(f["type"], f.get("code")) for f in frames] == [("error", "replay_limited")]
