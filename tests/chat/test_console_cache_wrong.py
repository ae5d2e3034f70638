"""An agent who marks a cached answer wrong evicts it (issue 3, part 5), end to end: shoppers on
/ws/chat/ with the fake upstream, agents on /ws/agent/ (WebsocketCommunicator on the real ASGI
application, SQLite, in-memory channel layer), then the transcript page.

Personas: ``shopper`` (asks first: the upstream answers), ``second_shopper`` (asks again: served
from the cache), ``third_shopper`` (asks after the mark: the upstream again), ``alice`` (the agent
holding the second shopper's conversation) and ``bob`` (another agent, who marks the answer).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from cache_layer.models import CacheAudit, CachedAnswer
from chat.models import Message

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fake_openai import Behaviour

pytestmark = [pytest.mark.django_db(transaction=True)]  # async tests run under asyncio_mode = "auto"

LAMP_Q = "Does the walnut floor lamp come with a dimmer switch?"
CACHED = "Yes, it has an inline dimmer."
FRESH = "No: it has a foot switch, no dimmer."


def make_agent_user(username: str, first_name: str) -> Any:
    """A staff user with the agents' permission (fresh from the database: no stale permission cache)."""
    from django.contrib.auth.models import Permission, User

    user = User.objects.create_user(username, password="pw-" + username, is_staff=True, first_name=first_name)
    user.user_permissions.add(Permission.objects.get(codename="handle_conversations"))
    return User.objects.get(pk=user.pk)


def session_cookie(user: Any) -> bytes:
    from django.test import Client

    c = Client()
    c.force_login(user)
    return f"sessionid={c.cookies['sessionid'].value}".encode()


class AgentSocket:
    """An agent console socket, signed in as ``user``."""

    def __init__(self, user: Any, cookie: bytes) -> None:
        from config.asgi import application

        self.user = user
        headers = [(b"host", b"127.0.0.1:8000"), (b"origin", b"http://127.0.0.1:8000"), (b"cookie", cookie)]
        self.comm = WebsocketCommunicator(application, "/ws/agent/", headers=headers)

    async def send(self, frame: dict[str, Any]) -> None:
        await self.comm.send_json_to(frame)

    async def next(self, *kinds: str) -> dict[str, Any]:
        """The next frame of one of ``kinds`` (list updates and other frames in between are skipped)."""
        while True:
            frame = await self.comm.receive_json_from(timeout=20)
            if frame["type"] in kinds:
                return frame

    async def mark_wrong(self, conversation: str, message: Any) -> dict[str, Any]:
        """Send ``cache.wrong``; its reply (``cache.wrong.done`` or ``error``)."""
        await self.send({"type": "cache.wrong", "conversation": conversation, "message": message})
        return await self.next("cache.wrong.done", "error")


@pytest.fixture
async def make_agent() -> Any:
    """Factory: ``await make_agent("alice", "Alice")`` -> a connected agent socket past ``ready``
    and ``queue``. All are closed afterwards."""
    sockets: list[AgentSocket] = []

    async def make(username: str, name: str) -> AgentSocket:
        user = await database_sync_to_async(make_agent_user)(username, name)
        sock = AgentSocket(user, await database_sync_to_async(session_cookie)(user))
        connected, _ = await sock.comm.connect()
        assert connected
        sockets.append(sock)
        assert (await sock.comm.receive_json_from(timeout=20))["type"] == "ready"
        assert (await sock.comm.receive_json_from(timeout=20))["type"] == "queue"
        return sock

    yield make
    for s in sockets:
        try:
            await s.comm.disconnect()
        except Exception:
            pass


async def ask(make_client: Any, text: str) -> tuple[Any, dict[str, Any]]:
    """A new shopper asks ``text``: the shopper and the answer's ``stream.end`` frame."""
    shopper = await make_client()
    await shopper.hello()
    await shopper.say(text)
    return shopper, (await shopper.until("stream.end"))[-1]


@database_sync_to_async
def message(pk: int) -> Message:
    return Message.objects.get(pk=pk)


@database_sync_to_async
def entry_exists(pk: int) -> bool:
    return CachedAnswer.objects.filter(pk=pk).exists()


@database_sync_to_async
def agent_marks() -> list[dict[str, Any]]:
    return list(
        CacheAudit.objects.filter(verdict=CacheAudit.Verdict.AGENT_WRONG).values(
            "entry_id", "message_id", "marked_by", "cached_answer", "question"
        )
    )


async def test_marking_a_cached_answer_wrong_evicts_it(make_client, make_agent, faq, remote, client):
    remote.push(Behaviour(text=CACHED))
    shopper, first = await ask(make_client, LAMP_Q)
    assert first["route"] == "llm.simple" and first["text"] == CACHED
    assert (await message(first["id"])).cache_entry_id is None  # the upstream answered: no entry served

    second_shopper, hit = await ask(make_client, LAMP_Q)
    assert hit["route"] == "cache.exact" and hit["text"] == CACHED
    served = await message(hit["id"])
    entry_id = served.cache_entry_id
    assert entry_id is not None and await entry_exists(entry_id)
    assert (await database_sync_to_async(CachedAnswer.objects.get)(pk=entry_id)).answer == CACHED
    question = await database_sync_to_async(Message.objects.get)(
        conversation_id=second_shopper.conversation, seq=served.reply_to_seq
    )

    # alice holds the conversation; bob (not the holder) may still mark its cached answer wrong
    alice = await make_agent("alice", "Alice")
    await alice.send({"type": "take_over", "conversation": second_shopper.conversation})
    assert (await alice.next("status", "conversation.update"))["agent"] == "Alice"
    bob = await make_agent("bob", "Bob")
    await bob.send({"type": "open", "conversation": second_shopper.conversation})
    history = await bob.next("history")
    bot_item = next(m for m in history["messages"] if m["id"] == hit["id"])
    assert bot_item["route"] == "cache.exact" and bot_item["cached"] is True and "marked_wrong" not in bot_item

    done = await bob.mark_wrong(second_shopper.conversation, hit["id"])
    assert done == {
        "type": "cache.wrong.done",
        "conversation": second_shopper.conversation,
        "message": hit["id"],
        "evicted": True,
    }
    assert not await entry_exists(entry_id)
    marks = await agent_marks()
    assert len(marks) == 1
    assert marks[0]["marked_by"] == "bob" and marks[0]["cached_answer"] == CACHED
    assert marks[0]["message_id"] == question.pk  # the shopper message the answer was served for
    assert marks[0]["entry_id"] is None  # the entry is gone; the audit row stays readable

    # the next shopper asking the same question gets a fresh answer from the upstream
    remote.push(Behaviour(text=FRESH))
    _third_shopper, again = await ask(make_client, LAMP_Q)
    assert again["route"].startswith("llm.") and again["text"] == FRESH
    assert len(remote.requests) == 2

    # marking it again: nothing left to evict, nothing recorded twice
    repeat = await bob.mark_wrong(second_shopper.conversation, hit["id"])
    assert repeat["type"] == "cache.wrong.done" and repeat["evicted"] is False
    assert len(await agent_marks()) == 1

    # the console's history and the transcript show the mark
    await bob.send({"type": "open", "conversation": second_shopper.conversation})
    history = await bob.next("history")
    bot_item = next(m for m in history["messages"] if m["id"] == hit["id"])
    assert bot_item["marked_wrong"] is True and bot_item["marked_wrong_by"] == "bob"
    await database_sync_to_async(client.force_login)(bob.user)
    page = await database_sync_to_async(client.get)(f"/console/conversations/{second_shopper.conversation}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "<code>cache.exact</code>" in html and "marked wrong by bob" in html
    first_page = await database_sync_to_async(client.get)(f"/console/conversations/{shopper.conversation}/")
    assert (
        "<code>llm.simple</code>" in first_page.content.decode() and "marked wrong" not in first_page.content.decode()
    )


async def test_only_cached_messages_of_that_conversation_can_be_marked(make_client, make_agent, faq, remote):
    remote.push(Behaviour(text=CACHED))
    shopper, first = await ask(make_client, LAMP_Q)
    second_shopper, hit = await ask(make_client, LAMP_Q)
    assert hit["route"] == "cache.exact"
    entry_id = (await message(hit["id"])).cache_entry_id
    faq_shopper, faq_answer = await ask(make_client, "which payment methods do you accept?")
    assert faq_answer["route"] == "faq"
    own_question = await database_sync_to_async(Message.objects.get)(conversation_id=second_shopper.conversation, seq=1)
    bob = await make_agent("bob", "Bob")

    for conversation, msg in [
        (shopper.conversation, first["id"]),  # answered by the upstream, not the cache
        (faq_shopper.conversation, faq_answer["id"]),  # answered by the FAQ model
        (second_shopper.conversation, own_question.pk),  # the shopper's own message
    ]:
        err = await bob.mark_wrong(conversation, msg)
        assert err["type"] == "error" and err["code"] == "not_cached" and err["conversation"] == conversation

    # the cached answer, named with another conversation's id
    err = await bob.mark_wrong(shopper.conversation, hit["id"])
    assert err["code"] == "not_found" and err["conversation"] == shopper.conversation
    err = await bob.mark_wrong("00000000-0000-0000-0000-000000000000", hit["id"])
    assert err["code"] == "not_found"
    for bad in ["12", True, None, 0, -3, 1.5]:
        err = await bob.mark_wrong(second_shopper.conversation, bad)
        assert err["code"] == "invalid", bad
    await bob.send({"type": "cache.wrong", "message": hit["id"]})
    assert (await bob.next("error"))["code"] == "invalid"

    # nothing was evicted or recorded by any of those
    assert await entry_exists(entry_id)
    assert await agent_marks() == []


async def test_an_agent_whose_permission_was_taken_away_cannot_mark(make_client, make_agent, faq, remote):
    remote.push(Behaviour(text=CACHED))
    await ask(make_client, LAMP_Q)
    second_shopper, hit = await ask(make_client, LAMP_Q)
    entry_id = (await message(hit["id"])).cache_entry_id
    bob = await make_agent("bob", "Bob")
    await database_sync_to_async(bob.user.user_permissions.clear)()
    err = await bob.mark_wrong(second_shopper.conversation, hit["id"])
    assert err["code"] == "forbidden"
    assert await entry_exists(entry_id) and await agent_marks() == []
