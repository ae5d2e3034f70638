"""The console's inbox views (issue 31 item 2; docs/console.md#the-inbox): Waiting, Mine, All open
and Closed, each with its count. Mine is per agent (the conversations they hold), Closed comes
newest first and paged, its first page only when its tab asks; the counts follow live, Mine's
per console; a conversation that appears live carries its face (``info``), not a bare "Visitor".

WebsocketCommunicator on the real ASGI application (SQLite, in-memory channel layer), as
tests/chat/test_console.py. Personas: ``alice`` and ``bob`` (agents), a shopper in Shanghai.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from chat.models import Conversation, Message

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_console import make_agent, make_user  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.django_db(transaction=True)]


@database_sync_to_async
def conversations(status: str, n: int, *, holder: str = "", minutes_ago: int = 0) -> list[str]:
    """``n`` conversations of ``status`` (held by agent ``holder``), one shopper message each, the
    first the most recently active; ``minutes_ago`` shifts them all into the past."""
    user = make_user(holder, first_name=holder.title()) if holder else None
    now = timezone.now() - timedelta(minutes=minutes_ago)
    ids = []
    for i in range(n):
        c = Conversation.objects.create(
            token_hash="x" * 64,
            status=status,
            last_seq=1,
            agent=user,
            agent_name=user.first_name if user else "",
            waiting_since=now if status == "waiting_agent" else None,
        )
        Message.objects.create(conversation=c, seq=1, role="shopper", text=f"{status} {holder} {i}")
        Conversation.objects.filter(pk=c.pk).update(updated_at=now - timedelta(seconds=i))
        ids.append(str(c.pk))
    return ids


async def test_mine_and_closed_views_their_counts_and_pages(make_agent: Any, settings: Any) -> None:  # noqa: F811
    settings.KEFU_CONSOLE_PAGE = 2
    alices = await conversations("agent", 3, holder="alice")
    [bobs] = await conversations("agent", 1, holder="bob", minutes_ago=10)
    await conversations("waiting_agent", 2)
    closed = await conversations("closed", 3)

    alice = await make_agent("alice", "Alice")
    queue = alice.queue
    assert queue["counts"] == {"waiting_agent": 2, "agent": 4, "bot": 0, "open": 6, "mine": 3, "closed": 3}
    listed = [r["id"] for r in queue["conversations"]]
    assert len(listed) == len(set(listed))  # Alice's held rows are both "agent" and "mine": sent once
    assert alices[:2] == [r for r in listed if r in alices]
    assert not set(closed) & set(listed)  # Closed: its count only, its rows when its tab asks
    assert queue["next"]["closed"] is not None and queue["next"]["mine"] is not None

    # Mine's next page: Alice's third, not Bob's.
    await alice.send({"type": "queue.more", "status": "mine", "after": queue["next"]["mine"]})
    page = await alice.recv()
    assert page["type"] == "queue.page" and [r["id"] for r in page["conversations"]] == [alices[2]]
    assert page["next"] == {"mine": None} and page["counts"]["mine"] == 3
    assert bobs not in [r["id"] for r in page["conversations"]]

    # Closed, newest first, in pages.
    await alice.send({"type": "queue.more", "status": "closed", "after": queue["next"]["closed"]})
    first = await alice.recv()
    assert [r["id"] for r in first["conversations"]] == closed[:2]
    assert {r["status"] for r in first["conversations"]} == {"closed"}
    await alice.send({"type": "queue.more", "status": "closed", "after": first["next"]["closed"]})
    second = await alice.recv()
    assert [r["id"] for r in second["conversations"]] == closed[2:] and second["next"] == {"closed": None}

    # Bob's console counts his own.
    bob = await make_agent("bob", "Bob")
    assert bob.queue["counts"]["mine"] == 1
    assert [r["id"] for r in bob.queue["conversations"] if r["agent"] == "Bob"] == [bobs]

    # A section this server does not list is refused.
    await alice.send({"type": "queue.more", "status": "everything", "after": "x"})
    err = await alice.recv()
    while err["type"] == "team":  # Bob coming online reaches Alice's console too (issue 32)
        err = await alice.recv()
    assert err["type"] == "error" and err["code"] == "invalid"


async def test_counts_follow_live_and_mine_is_each_agents_own(make_agent: Any) -> None:  # noqa: F811
    [first, second] = await conversations("waiting_agent", 2)
    alice = await make_agent("alice", "Alice")
    bob = await make_agent("bob", "Bob")
    base = {"waiting_agent": 2, "agent": 0, "bot": 0, "open": 2, "mine": 0, "closed": 0}
    assert alice.queue["counts"] == bob.queue["counts"] == base

    # Bob takes the first over: his Mine counts it, Alice's does not.
    await bob.send({"type": "take_over", "conversation": first})
    [*_, to_bob] = await bob.until("conversation.update", first, status="agent")
    [*_, to_alice] = await alice.until("conversation.update", first, status="agent")
    assert to_bob["counts"] == {**base, "waiting_agent": 1, "agent": 1, "mine": 1}
    assert to_alice["counts"] == {**base, "waiting_agent": 1, "agent": 1, "mine": 0}

    # Alice opens Closed (empty), then Bob closes his: a row for her (the top of Closed), his
    # Mine goes back to 0, Closed counts it.
    await alice.send({"type": "queue.more", "status": "closed", "after": alice.queue["next"]["closed"]})
    assert (await alice.until("queue.page"))[-1]["conversations"] == []
    await bob.send({"type": "close", "conversation": first})
    [*_, to_bob] = await bob.until("conversation.update", first, status="closed")
    [*_, to_alice] = await alice.until("conversation.update", first, status="closed")
    assert to_bob["counts"] == {**base, "waiting_agent": 1, "mine": 0, "open": 1, "closed": 1}
    assert to_alice["counts"] == to_bob["counts"]
    assert to_alice["info"]["status"] == "closed" and to_alice["info"]["last_shopper"]["text"].startswith(
        "waiting_agent"
    )

    # Alice takes the second: her Mine, not Bob's.
    await alice.send({"type": "take_over", "conversation": second})
    [*_, to_alice] = await alice.until("conversation.update", second, status="agent")
    [*_, to_bob] = await bob.until("conversation.update", second, status="agent")
    assert (to_alice["counts"]["mine"], to_bob["counts"]["mine"]) == (1, 0)


async def test_a_bot_conversation_that_appears_live_comes_with_its_face(
    make_client: Any,
    make_agent: Any,  # noqa: F811
    faq: Any,
) -> None:
    """Before, its row was built from the update alone and showed "Visitor" until a reload."""
    alice = await make_agent("alice", "Alice")
    shopper = await make_client()
    assert (await shopper.hello(locale="zh", time_zone="Asia/Shanghai"))["type"] == "conversation"
    await shopper.say("可以退货吗？")
    [*_, update] = await alice.until("conversation.update", shopper.conversation)
    assert update["last_message"]["seq"] == 1
    info = update["info"]
    assert (info["id"], info["time_zone"], info["locale"]) == (shopper.conversation, "Asia/Shanghai", "zh")
    assert info["last_shopper"]["text"] == "可以退货吗？"
