"""Assignment, away and collision in the agent console (issue 32: chat/assignment.py): frames on
/ws/agent/ (WebsocketCommunicator on the real ASGI application, SQLite, in-memory channel layer)
and the round-robin rules called directly. Agents: ``alice``, ``bob``, ``carol``."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from chat import assignment, services
from chat.models import AgentLease, Conversation, InternalNote

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_console import make_agent, make_user  # noqa: F401 (make_agent: a fixture)

pytestmark = [pytest.mark.django_db(transaction=True)]


def waiting(n: int = 1, *, status: str = "waiting_agent") -> list[str]:
    """``n`` conversations waiting for an agent (oldest first), each with one shopper message."""
    from chat.models import Message

    out = []
    for i in range(n):
        c = Conversation.objects.create(
            token_hash="x" * 64,
            status=status,
            last_seq=1,
            waiting_since=timezone.now() + timedelta(seconds=i) if status == "waiting_agent" else None,
        )
        Message.objects.create(conversation=c, seq=1, role="shopper", text=f"question {i}")
        out.append(str(c.pk))
    return out


def online(*users: Any) -> None:
    for u in users:
        AgentLease.objects.create(
            channel_name=f"test.{u.pk}", agent=u, expires_at=timezone.now() + timedelta(seconds=30)
        )


def assignees(ids: list[str]) -> list[str]:
    rows = dict(Conversation.objects.filter(pk__in=ids).values_list("pk", "assignee_name"))
    return [rows[Conversation._meta.pk.to_python(i)] for i in ids]


async def test_assign_to_a_colleague_with_a_note_keeps_it_waiting_and_tells_every_console(make_agent: Any) -> None:  # noqa: F811
    [cid] = await database_sync_to_async(waiting)(1)
    alice = await make_agent("alice", "Alice")
    bob = await make_agent("bob", "Bob")
    await alice.send({"type": "open", "conversation": cid})
    await alice.until("history", cid)
    await alice.send({"type": "assign", "conversation": cid, "agent": bob.user.pk, "note": "wants a refund"})
    # The note row, to the agents following the conversation, then the assignment to every console.
    note = (await alice.until("note", cid))[-1]
    assert note["text"] == "Alice → Bob: wants a refund" and note["author"] == "Alice"
    got = (await bob.until("assignment", cid))[-1]
    assert got["assignee"] == {"id": bob.user.pk, "name": "Bob"}
    assert got["by"] == "Alice" and got["reason"] == "manual" and got["note"] == "Alice → Bob: wants a refund"
    assert got["info"]["status"] == "waiting_agent" and got["info"]["assignee"] == {"id": bob.user.pk, "name": "Bob"}
    conv = await database_sync_to_async(Conversation.objects.get)(pk=cid)
    assert (conv.status, conv.assignee_id, conv.agent_id) == ("waiting_agent", bob.user.pk, None)
    assert await database_sync_to_async(InternalNote.objects.filter(conversation_id=cid).count)() == 1
    # "Assign to me", and back to Unassigned.
    await alice.send({"type": "assign", "conversation": cid, "agent": "me"})
    got = (await bob.until("assignment", cid, previous=bob.user.pk))[-1]
    assert got["assignee"] == {"id": alice.user.pk, "name": "Alice"} and got["note"] == "Alice → Alice"
    mine = database_sync_to_async(lambda: Conversation.objects.filter(assignment.assigned_q(alice.user)).count())
    assert await mine() == 1  # the "Mine" selector
    await bob.send({"type": "assign", "conversation": cid, "agent": None})
    assert (await alice.until("assignment", cid, previous=alice.user.pk))[-1]["assignee"] is None
    assert await mine() == 0


async def test_a_held_conversation_transferred_goes_back_to_the_queue_for_the_colleague(make_agent: Any) -> None:  # noqa: F811
    [cid] = await database_sync_to_async(waiting)(1)
    alice = await make_agent("alice", "Alice")
    bob = await make_agent("bob", "Bob")
    await alice.send({"type": "take_over", "conversation": cid})
    update = (await bob.until("conversation.update", cid, status="agent"))[-1]
    assert update["agent"] == "Alice"
    assert (await bob.until("assignment", cid))[-1]["assignee"] == {"id": alice.user.pk, "name": "Alice"}
    await alice.send({"type": "assign", "conversation": cid, "agent": bob.user.pk, "note": "VIP"})
    frames = await bob.until("assignment", cid)
    assert [f["status"] for f in frames if f["type"] == "conversation.update" and "status" in f] == ["waiting_agent"]
    conv = await database_sync_to_async(Conversation.objects.get)(pk=cid)
    assert (conv.status, conv.agent_id, conv.assignee_id) == ("waiting_agent", None, bob.user.pk)
    assert conv.owner_epoch == 2


async def test_bad_assignments_are_refused_with_a_code(make_agent: Any) -> None:  # noqa: F811
    cid, closed = await database_sync_to_async(waiting)(2)
    await database_sync_to_async(Conversation.objects.filter(pk=closed).update)(status="closed")
    alice = await make_agent("alice", "Alice")
    bob = await make_agent("bob", "Bob")
    mallory = await database_sync_to_async(make_user)("mallory", agent=False)
    cases = [
        ({"agent": "bob"}, "invalid"),
        ({"agent": bob.user.pk, "note": "x" * 1001}, "invalid"),
        ({"agent": mallory.pk}, "not_agent"),
        ({"agent": 99999}, "not_agent"),
    ]
    for extra, code in cases:
        await alice.send({"type": "assign", "conversation": cid, **extra})
        assert (await alice.until("error"))[-1]["code"] == code, extra
    await alice.send({"type": "assign", "conversation": closed, "agent": "me"})
    assert (await alice.until("error"))[-1]["code"] == "closed"
    await bob.send({"type": "take_over", "conversation": cid})
    await alice.until("conversation.update", cid, status="agent")
    await alice.send({"type": "assign", "conversation": cid, "agent": "me"})
    err = (await alice.until("error"))[-1]
    assert err["code"] == "not_owner" and err["agent"] == "Bob"
    await alice.send({"type": "away", "away": "yes"})
    assert (await alice.until("error"))[-1]["code"] == "invalid"
    conv = await database_sync_to_async(Conversation.objects.get)(pk=cid)
    assert conv.assignee_id == bob.user.pk  # nothing refused was stored


def test_auto_assign_alternates_under_the_limit_and_skips_away_agents(settings: Any) -> None:
    settings.KEFU_AUTO_ASSIGN = True
    settings.KEFU_ASSIGN_LIMIT = 2
    alice, bob, carol = (make_user(n, first_name=n.title()) for n in ("alice", "bob", "carol"))
    online(alice, bob)  # carol is offline
    ids = waiting(5)
    made = assignment.auto_assign()
    assert [m.assignee_name for m in made] == ["Alice", "Bob", "Alice", "Bob"]
    assert assignees(ids) == ["Alice", "Bob", "Alice", "Bob", ""]  # the limit holds: the fifth waits
    assert assignment.auto_assign() == []
    # Bob goes away: his conversations are Unassigned, and go to Alice only as far as her limit.
    released = assignment.agent_away_set(agent=bob, away=True)
    assert sorted(str(r.conversation_id) for r in released) == sorted([ids[1], ids[3]])
    services.conversation_close(conversation_id=Conversation._meta.pk.to_python(ids[0]), agent=alice)
    assert [m.assignee_name for m in assignment.auto_assign()] == ["Alice"]
    assert assignees(ids)[1:] == ["Alice", "Alice", "", ""]
    team = {a["name"]: a for a in assignment.team()}
    assert (team["Alice"]["away"], team["Alice"]["open"], team["Bob"]["away"]) == (False, 2, True)
    assert "Carol" not in team


def test_off_by_default_and_a_gone_assignee_gives_back(settings: Any) -> None:
    alice = make_user("alice", first_name="Alice")
    online(alice)
    ids = waiting(2)
    assert assignment.auto_assign() == []  # KEFU_AUTO_ASSIGN defaults to off
    assert assignees(ids) == ["", ""]
    cid = Conversation._meta.pk.to_python(ids[0])
    assignment.conversation_assign(conversation_id=cid, to=alice.pk, by=alice)
    other = Conversation._meta.pk.to_python(ids[1])
    services.conversation_take_over(conversation_id=other, agent=alice)
    assert assignees(ids) == ["Alice", "Alice"]  # a take-over assigns
    assert assignment.release_unavailable() == []
    AgentLease.objects.update(expires_at=timezone.now() - timedelta(seconds=1))  # her lease ran out
    released = assignment.release_unavailable()
    # What she only owned is Unassigned; what she held is the lease rule's (chat.sweeper).
    assert [(r.conversation_id, r.reason) for r in released] == [(cid, "gone")]
    assert assignees(ids) == ["", "Alice"]


async def test_viewing_and_typing_reach_the_other_agents_on_the_conversation(make_agent: Any) -> None:  # noqa: F811
    [cid] = await database_sync_to_async(waiting)(1)
    alice = await make_agent("alice", "Alice")
    bob = await make_agent("bob", "Bob")
    await bob.send({"type": "open", "conversation": cid})
    await bob.until("history", cid)
    await alice.send({"type": "open", "conversation": cid})
    seen = (await bob.until("collision", cid))[-1]
    assert (seen["agent"], seen["agent_id"], seen["what"]) == ("Alice", alice.user.pk, "viewing")
    assert seen["ttl_s"] > 0
    await alice.until("history", cid)
    await alice.send({"type": "collide", "conversation": cid, "what": "typing"})
    assert (await bob.until("collision", cid))[-1]["what"] == "typing"
    await alice.send({"type": "collide", "conversation": cid, "what": "dancing"})
    frames = await alice.until("error")
    assert frames[-1]["code"] == "invalid"
    # Alice never got her own presence back; she leaves for another conversation: "left".
    assert not [f for f in frames if f["type"] == "collision" and f.get("agent") == "Alice"]
    [other] = await database_sync_to_async(waiting)(1)
    await alice.send({"type": "open", "conversation": other})
    assert (await bob.until("collision", cid))[-1]["what"] == "left"


async def test_away_is_shown_to_every_console(make_agent: Any) -> None:  # noqa: F811
    alice = await make_agent("alice", "Alice")
    assert alice.ready["away"] is False and [a["name"] for a in alice.ready["team"]] == ["Alice"]
    bob = await make_agent("bob", "Bob")
    await bob.send({"type": "away", "away": True})
    team = (
        await alice.until(
            "team",
            None,
            agents=[
                {"id": alice.user.pk, "name": "Alice", "away": False, "open": 0},
                {"id": bob.user.pk, "name": "Bob", "away": True, "open": 0},
            ],
        )
    )[-1]
    assert team["type"] == "team"
