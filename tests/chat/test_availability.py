"""One truth about availability (chat.availability): agents online, the place in the queue and
the expected wait in the conversation, status and availability frames, and the e-mail address a
shopper leaves while no one is online (the ``contact`` frame), stored and shown to agents."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from chat import availability, sweeper
from chat.models import Conversation, ConversationStatus

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_console
from test_console import conversation, handed_off, stored

pytestmark = [pytest.mark.django_db(transaction=True)]

make_agent = test_console.make_agent  # the console tests' fixture: an agent console socket

NOBODY = {"agents_online": 0, "queue_position": None, "expected_wait_s": None, "contact_saved": False}


def test_the_wait_is_the_place_in_the_queue_over_the_last_hours_take_over_rate():
    # 6 taken in the hour: one every 600 s; the 2nd in line waits about 1,200 s.
    assert availability.expected_wait_s(position=2, taken_in_window=6, agents_online=1) == 1200
    # 7 taken: 514.3 s each, 2 in line: 1,028.6 s, rounded up to 30 s.
    assert availability.expected_wait_s(position=2, taken_in_window=7, agents_online=3) == 1050
    # Too few take-overs to tell a rate, or no one to take it: unknown.
    assert availability.expected_wait_s(position=1, taken_in_window=2, agents_online=1) is None
    assert availability.expected_wait_s(position=1, taken_in_window=50, agents_online=0) is None


@database_sync_to_async
def taken_from_queue(n: int, *, minutes_ago: float) -> None:
    """``n`` earlier conversations an agent took from the queue ``minutes_ago``."""
    when = timezone.now() - timedelta(minutes=minutes_ago)
    for _ in range(n):
        Conversation.objects.create(
            token_hash="x" * 64,
            status=ConversationStatus.CLOSED,
            queue_taken_at=when,
            queue_waited_from=when - timedelta(minutes=30),  # each had waited 30 min (the cap, issue 34)
        )


async def test_a_new_conversation_is_told_who_is_online(make_client, make_agent, faq):
    shopper = await make_client()
    frame = await shopper.hello()
    assert frame["availability"] == NOBODY
    await make_agent("alice", "Alice")
    again = await make_client()
    frame = await again.hello()
    assert frame["availability"] == {**NOBODY, "agents_online": 1}


async def test_nobody_online_the_shopper_leaves_an_email_that_agents_see(make_client, make_agent, faq):
    shopper = await make_client()
    await shopper.hello()
    status = (await handed_off(shopper, "I need a human"))[-1]
    assert status == {
        "type": "status",
        "status": "waiting_agent",
        "availability": {**NOBODY, "queue_position": 1},
    }
    notice = await shopper.recv()
    assert notice["role"] == "system" and "leave your e-mail address below" in notice["text"]
    before = await stored(shopper.conversation)

    await shopper.send({"type": "contact", "email": "not an address"})
    assert await shopper.recv() == {
        "type": "error",
        "code": "invalid",
        "message": "that is not a valid e-mail address",
    }
    await shopper.send({"type": "contact", "email": 42})
    assert (await shopper.recv())["code"] == "invalid"
    assert (await conversation(shopper.conversation)).contact_email == ""

    await shopper.send({"type": "contact", "email": "  ada@example.com "})
    assert await shopper.recv() == {"type": "contact.saved", "email": "ada@example.com"}
    assert await shopper.recv() == {
        "type": "availability",
        **NOBODY,
        "queue_position": 1,
        "contact_saved": True,
    }
    assert (await conversation(shopper.conversation)).contact_email == "ada@example.com"
    assert await stored(shopper.conversation) == before  # nothing stored was lost or added

    alice = await make_agent("alice", "Alice")
    row = next(r for r in alice.queue["conversations"] if r["id"] == shopper.conversation)
    assert row["status"] == "waiting_agent" and row["contact_email"] == "ada@example.com"
    await shopper.send({"type": "contact", "email": "ada.l@example.org"})
    assert (await shopper.recv())["type"] == "contact.saved"
    update = (await alice.until("conversation.update", shopper.conversation))[-1]
    assert update["contact_email"] == "ada.l@example.org"


async def test_the_queue_position_and_wait_follow_the_queue(make_client, make_agent, faq):
    await taken_from_queue(6, minutes_ago=20)  # one every 600 s over the last hour
    await taken_from_queue(5, minutes_ago=90)  # outside the hour: not counted
    alice = await make_agent("alice", "Alice")
    first, second = await make_client(), await make_client()
    await first.hello()
    await second.hello()
    status = (await handed_off(first, "can I talk to a human please"))[-1]
    assert status["availability"] == {
        "agents_online": 1,
        "queue_position": 1,
        "expected_wait_s": 600,
        "contact_saved": False,
    }
    status = (await handed_off(second, "can I talk to a human please"))[-1]
    assert status["availability"]["queue_position"] == 2 and status["availability"]["expected_wait_s"] == 1200
    # The sweep tells each waiting shopper once what they were last told by a sweep...
    assert await sweeper.announce_queue() == 2
    assert (await first.until("availability"))[-1]["queue_position"] == 1
    assert (await second.until("availability"))[-1]["queue_position"] == 2
    assert await sweeper.announce_queue() == 0  # nothing changed: nothing sent

    # ...and when the queue moves: Alice takes the first; the second is next, and the rate rose.
    await alice.send({"type": "take_over", "conversation": first.conversation})
    taken = (await first.until("status"))[-1]
    assert taken["status"] == "agent" and taken["availability"] == {
        "agents_online": 1,
        "queue_position": None,
        "expected_wait_s": None,
        "contact_saved": False,
    }
    assert (await conversation(first.conversation)).queue_taken_at is not None
    assert await sweeper.announce_queue() == 1
    moved = (await second.until("availability"))[-1]
    assert moved == {
        "type": "availability",
        "agents_online": 1,
        "queue_position": 1,
        "expected_wait_s": 540,  # 7 taken in the hour: 514 s, rounded up to 30 s
        "contact_saved": False,
    }
    assert await first.comm.receive_nothing(timeout=0.3)  # not waiting: no queue frames


async def test_an_agent_who_comes_online_is_told_to_the_waiting(make_client, make_agent, faq):
    shopper = await make_client()
    await shopper.hello()
    await handed_off(shopper, "I need a human")
    await shopper.recv()  # the "no one is online" notice
    assert await sweeper.announce_queue() == 1
    assert (await shopper.until("availability"))[-1]["agents_online"] == 0
    await make_agent("bob", "Bob")
    assert await sweeper.announce_queue() == 1
    told: Any = (await shopper.until("availability"))[-1]
    assert told["agents_online"] == 1 and told["queue_position"] == 1 and told["expected_wait_s"] is None
