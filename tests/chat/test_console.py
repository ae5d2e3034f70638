"""The agent console: /ws/agent/ (WebsocketCommunicator on the real ASGI application, SQLite,
in-memory channel layer) next to real shopper sockets, and the console's HTTP pages.

Personas: ``shopper``, ``other_shopper`` (WebSocket clients), ``alice`` and ``bob`` (agents),
``mallory`` (staff without the agents' permission), ``carol`` (a customer account, not staff).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from chat import services
from chat.models import CannedReply, Conversation, InternalNote, Message

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fake_openai import Behaviour
from sockets import status_frame

pytestmark = [pytest.mark.django_db(transaction=True)]  # async tests run under asyncio_mode = "auto"

HOST = [(b"host", b"127.0.0.1:8000")]
SAME_ORIGIN = [(b"origin", b"http://127.0.0.1:8000")]


def make_user(username: str, *, staff: bool = True, agent: bool = True, first_name: str = "") -> Any:
    from django.contrib.auth.models import Permission, User

    known = User.objects.filter(username=username).first()
    if known is not None:  # the same agent again (a second console, a reconnect)
        return known
    user = User.objects.create_user(username, password="pw-" + username, is_staff=staff, first_name=first_name)
    if agent:
        user.user_permissions.add(Permission.objects.get(codename="handle_conversations"))
    return User.objects.get(pk=user.pk)  # fresh: no stale permission cache


def session_cookie(user: Any) -> bytes:
    from django.test import Client

    c = Client()
    c.force_login(user)
    return f"sessionid={c.cookies['sessionid'].value}".encode()


class AgentSocket:
    """An agent console socket."""

    def __init__(self, cookie: bytes | None, origin: bytes = b"http://127.0.0.1:8000") -> None:
        from config.asgi import application

        headers = [*HOST, (b"origin", origin)]
        if cookie is not None:
            headers.append((b"cookie", cookie))
        self.comm = WebsocketCommunicator(application, "/ws/agent/", headers=headers)

    async def recv(self, timeout: float = 20) -> dict[str, Any]:
        return await self.comm.receive_json_from(timeout=timeout)

    async def send(self, frame: dict[str, Any]) -> None:
        await self.comm.send_json_to(frame)

    async def until(self, kind: str, conversation: str | None = None, **match: Any) -> list[dict[str, Any]]:
        """Frames up to and including the first of type ``kind`` (for ``conversation``, with ``match``)."""
        frames = []
        while True:
            f = await self.recv()
            frames.append(f)
            if (
                f["type"] == kind
                and (conversation is None or f.get("conversation") == conversation)
                and all(f.get(k) == v for k, v in match.items())
            ):
                return frames


@pytest.fixture
async def make_agent() -> Any:
    """Factory: ``await make_agent("alice", "Alice")`` -> a connected agent socket past its
    ``ready`` and ``queue`` frames (``.ready``, ``.queue``, ``.user``). All are closed afterwards."""
    sockets: list[AgentSocket] = []

    async def make(username: str, name: str = "") -> AgentSocket:
        user = await database_sync_to_async(make_user)(username, first_name=name)
        sock = AgentSocket(await database_sync_to_async(session_cookie)(user))
        connected, _ = await sock.comm.connect()
        assert connected
        sockets.append(sock)
        sock.user = user
        sock.ready = await sock.recv()
        sock.queue = await sock.recv()
        assert sock.ready["type"] == "ready" and sock.queue["type"] == "queue"
        return sock

    yield make
    for s in sockets:
        try:
            await s.comm.disconnect()
        except Exception:
            pass


@database_sync_to_async
def stored(conversation_id: str) -> list[tuple[str, str]]:
    return [(m.role, m.text) for m in Message.objects.filter(conversation_id=conversation_id).order_by("seq")]


@database_sync_to_async
def conversation(conversation_id: str) -> Conversation:
    return Conversation.objects.get(pk=conversation_id)


async def handed_off(shopper: Any, text: str = "can I talk to a human please") -> list[dict[str, Any]]:
    await shopper.say(text)
    return await shopper.until("status")


async def held_by_alice(
    make_client: Any, make_agent: Any, *, locale: str = "en", ask: str = "can I talk to a human please"
) -> tuple[Any, Any]:
    """A shopper who asked for a person, and Alice, who took the conversation over: ``(shopper, alice)``."""
    shopper = await make_client()
    await shopper.hello(locale=locale)
    alice = await make_agent("alice", "Alice")
    await handed_off(shopper, ask)
    await alice.send({"type": "take_over", "conversation": shopper.conversation})
    assert (await shopper.until("status"))[-1] == status_frame("agent", agent="Alice", online=1)
    return shopper, alice


# --- security ------------------------------------------------------------------------------


@pytest.mark.parametrize("who", ["anonymous", "customer", "staff_without_permission", "agent_not_staff"])
async def test_non_agents_are_refused_with_4403(who):
    cookie = None
    if who == "customer":
        cookie = await database_sync_to_async(lambda: session_cookie(make_user("carol", staff=False, agent=False)))()
    elif who == "staff_without_permission":
        cookie = await database_sync_to_async(lambda: session_cookie(make_user("mallory", agent=False)))()
    elif who == "agent_not_staff":
        cookie = await database_sync_to_async(lambda: session_cookie(make_user("dave", staff=False)))()
    sock = AgentSocket(cookie)
    connected, _ = await sock.comm.connect()
    assert connected  # accepted, then closed: the browser sees the code
    assert await sock.comm.receive_output(timeout=5) == {"type": "websocket.close", "code": 4403}


async def test_agent_socket_from_a_storefront_origin_is_refused(settings):
    user = await database_sync_to_async(make_user)("alice")
    sock = AgentSocket(await database_sync_to_async(session_cookie)(user), origin=b"http://shop.example")
    connected, _ = await sock.comm.connect()
    assert not connected


async def test_shopper_token_cannot_open_another_conversation(make_client, faq):
    shopper = await make_client()
    await shopper.hello()
    await shopper.say("do you accept paypal?")
    await shopper.until("stream.end")
    other_shopper = await make_client()
    await other_shopper.hello()
    await other_shopper.send({"type": "hello", "conversation": shopper.conversation, "token": other_shopper.token})
    # the second hello on a started socket is refused; a fresh socket with the wrong token is closed
    assert (await other_shopper.recv())["code"] == "invalid"
    intruder = await make_client()
    await intruder.send({"type": "hello", "conversation": shopper.conversation, "token": other_shopper.token})
    assert await intruder.comm.receive_output(timeout=5) == {"type": "websocket.close", "code": 4403}
    await other_shopper.say("cancel everything")
    await other_shopper.until("stream.end")
    rows = await stored(shopper.conversation)
    assert [r[0] for r in rows] == ["shopper", "bot"]  # nothing written into the shopper's conversation


async def test_internal_notes_never_reach_the_shopper(make_client, make_agent, faq):
    alice = await make_agent("alice", "Alice")
    shopper = await make_client()
    await shopper.hello()
    await handed_off(shopper)
    await alice.send({"type": "open", "conversation": shopper.conversation})
    history = (await alice.until("history"))[-1]
    assert history["notes"] == []
    await alice.send({"type": "note", "conversation": shopper.conversation, "text": "VIP; refund already approved"})
    note = (await alice.until("note"))[-1]
    assert note["text"] == "VIP; refund already approved" and note["author"] == "Alice"
    assert note["conversation"] == shopper.conversation
    assert await shopper.comm.receive_nothing(timeout=0.5)
    # nor on resume: notes are not messages
    again = await make_client()
    await again.hello(conversation=shopper.conversation, token=shopper.token)
    replay = []
    while not await again.comm.receive_nothing(timeout=0.5):
        replay.append(await again.recv())
    assert all("VIP" not in f.get("text", "") for f in replay)
    assert [r for r in await stored(shopper.conversation) if "VIP" in r[1]] == []
    assert await database_sync_to_async(InternalNote.objects.filter(conversation_id=shopper.conversation).count)() == 1


# --- list and escalation -----------------------------------------------------------------------


async def test_queue_lists_waiting_longest_first_then_agent_then_bot(make_client, make_agent, faq):
    first = await make_client()
    await first.hello()
    await handed_off(first, "I want to speak to a real person")
    chatting = await make_client()
    await chatting.hello()
    await chatting.say("do you take credit cards?")
    await chatting.until("stream.end")
    second = await make_client()
    await second.hello()
    await handed_off(second, "我要转人工")
    alice = await make_agent("alice", "Alice")
    rows = alice.queue["conversations"]
    assert [(r["id"], r["status"]) for r in rows] == [
        (first.conversation, "waiting_agent"),
        (second.conversation, "waiting_agent"),
        (chatting.conversation, "bot"),
    ]
    bot_row = rows[2]
    assert bot_row["last_message"]["role"] == "bot" and bot_row["last_message"]["route"] == "faq"
    assert rows[0]["waiting_since"] <= rows[1]["waiting_since"]


async def test_shopper_asking_for_a_human_reaches_the_console_with_a_packet(make_client, make_agent, faq):
    alice = await make_agent("alice", "Alice")
    assert alice.ready["agents_online"] >= 1
    shopper = await make_client()
    await shopper.hello()
    await shopper.say("do you accept paypal?")
    await shopper.until("stream.end")
    frames = await handed_off(shopper, "ok, can I talk to a human please")
    assert frames[-1] == status_frame("waiting_agent", online=1, position=1)
    assert await shopper.comm.receive_nothing(timeout=0.5)  # an agent is online: no "nobody here" notice
    handoff = (await alice.until("handoff", shopper.conversation))[-1]
    packet = handoff["packet"]
    assert handoff["info"]["status"] == "waiting_agent" and handoff["info"]["waiting_since"]
    assert packet["rule"] == "asked_for_person" and packet["route"] == "handoff"
    assert packet["matched"] == "human"
    assert packet["shopper_request"]["text"] == "ok, can I talk to a human please"
    assert [b["route"] for b in packet["bot_told"]] == ["faq", "handoff"]
    assert packet["bot_told"][0]["text"] == "We accept Visa, Mastercard, PayPal and Apple Pay."
    assert "2 shopper message(s)" in packet["summary"]
    conv = await conversation(shopper.conversation)
    # The console's copy adds the rule's name in the agent's language (chat/staff_text.py).
    assert packet.pop("rule_text") == "the shopper asked for a person"
    assert conv.status == "waiting_agent" and conv.handoff_packet == packet


async def test_nobody_online_the_shopper_is_told_and_the_bot_keeps_helping(make_client, faq):
    shopper = await make_client()
    await shopper.hello()
    await handed_off(shopper, "I need a human")
    notice = await shopper.recv()
    assert (
        notice["type"] == "message"
        and notice["role"] == "system"
        and "No one from our team is online" in notice["text"]
    )
    await shopper.say("how long does delivery take?")
    frames = await shopper.until("stream.end")
    assert frames[-1]["route"] == "faq"
    # asking again while waiting: status again, but no second notice
    await handed_off(shopper, "human please")
    assert await shopper.comm.receive_nothing(timeout=0.5)
    assert [r[0] for r in await stored(shopper.conversation)].count("system") == 1


# --- take over, exchange, hand back -----------------------------------------------------------


async def test_take_over_exchange_and_hand_back(make_client, make_agent, faq):
    shopper = await make_client()
    await shopper.hello()
    alice = await make_agent("alice", "Alice")
    await handed_off(shopper)
    await alice.until("handoff", shopper.conversation)
    await alice.send({"type": "open", "conversation": shopper.conversation})
    history = (await alice.until("history"))[-1]
    assert [m["role"] for m in history["messages"]] == ["shopper", "bot"]
    assert history["messages"][1]["route"] == "handoff"

    await alice.send({"type": "take_over", "conversation": shopper.conversation})
    assert await shopper.recv() == status_frame("agent", agent="Alice", online=1)
    status = (await alice.until("status", shopper.conversation))[-1]
    assert status["agent"] == "Alice"

    await shopper.say("my parcel arrived broken")
    ack = await shopper.recv()
    assert ack["role"] == "shopper"
    assert await shopper.comm.receive_nothing(timeout=0.7)  # the bot stays silent
    seen = (await alice.until("message", shopper.conversation, role="shopper", seq=ack["seq"]))[-1]
    assert seen["text"] == "my parcel arrived broken"

    await shopper.send({"type": "typing"})
    assert (await alice.until("typing", shopper.conversation))[-1]["role"] == "shopper"
    await alice.send({"type": "typing", "conversation": shopper.conversation})
    assert await shopper.recv() == {"type": "typing", "role": "agent", "agent": "Alice"}

    await alice.send(
        {"type": "message", "conversation": shopper.conversation, "text": "Sorry! I'll send a new one today."}
    )
    reply = await shopper.recv()
    assert reply["type"] == "message" and reply["role"] == "agent" and reply["agent"] == "Alice"
    assert reply["text"] == "Sorry! I'll send a new one today."

    await alice.send({"type": "hand_back", "conversation": shopper.conversation})
    assert await shopper.recv() == status_frame("bot", online=1)
    await shopper.say("which payment methods do you accept?")
    frames = await shopper.until("stream.end")
    assert frames[-1]["route"] == "faq"
    assert [r[0] for r in await stored(shopper.conversation)] == [
        "shopper",
        "bot",
        "shopper",
        "agent",
        "shopper",
        "bot",
    ]
    conv = await conversation(shopper.conversation)
    assert conv.status == "bot" and conv.agent_id is None and conv.owner_epoch == 2


async def test_hand_back_answers_what_the_shopper_sent_after_the_agent_as_one_question(
    make_client, make_agent, faq, remote
):
    shopper, alice = await held_by_alice(make_client, make_agent)
    fragments = ["Does the walnut floor lamp come with a dimmer switch?", "and is the shade linen?"]
    acks = []
    for text in fragments:
        await shopper.say(text)
        acks.append(await shopper.recv())
    assert await shopper.comm.receive_nothing(timeout=0.5)  # the bot stays silent while Alice holds it
    answer = "Yes: an inline dimmer, and the shade is natural linen."
    remote.push(Behaviour(text=answer))

    await alice.send({"type": "hand_back", "conversation": shopper.conversation})
    frames = await shopper.until("stream.end")

    assert frames[0] == status_frame("bot", online=1)
    assert [f["type"] for f in frames].count("stream.start") == 1  # one answer to both fragments
    end = frames[-1]
    assert end["route"] == "llm.simple" and end["text"] == answer
    [request] = remote.requests
    assert request["messages"][-1] == {"role": "user", "content": "\n".join(fragments)}
    rows = await database_sync_to_async(
        lambda: list(
            Message.objects.filter(conversation_id=shopper.conversation, seq__gt=acks[-1]["seq"]).values_list(
                "role", "reply_to_seq", "text"
            )
        )
    )()
    assert rows == [("bot", acks[-1]["seq"], answer)]
    assert await shopper.comm.receive_nothing(timeout=0.5)  # and nothing more


async def test_hand_back_after_the_agent_answered_everything_adds_no_bot_answer(make_client, make_agent, faq):
    shopper, alice = await held_by_alice(make_client, make_agent)
    await shopper.say("my parcel arrived broken")
    await shopper.recv()
    await alice.send({"type": "message", "conversation": shopper.conversation, "text": "A new one ships today."})
    await shopper.until("message")
    await alice.send({"type": "hand_back", "conversation": shopper.conversation})
    assert await shopper.recv() == status_frame("bot", online=1)
    assert await shopper.comm.receive_nothing(timeout=0.7)
    assert [r[0] for r in await stored(shopper.conversation)] == ["shopper", "bot", "shopper", "agent"]


# --- presence: leases, heartbeats, agents who vanish ------------------------------------------


@database_sync_to_async
def expire_leases(username: str) -> int:
    from django.utils import timezone

    from chat.models import AgentLease

    return AgentLease.objects.filter(agent__username=username).update(expires_at=timezone.now())


async def online() -> int:
    from chat import presence

    return await database_sync_to_async(presence.agents_online)()


async def test_agents_online_counts_agents_with_a_live_lease_once_each(make_agent):
    alice = await make_agent("alice", "Alice")
    await make_agent("alice", "Alice")  # a second console of the same agent
    bob = await make_agent("bob", "Bob")
    assert bob.ready["agents_online"] == 2 and bob.ready["heartbeat_s"] == 10.0
    assert await online() == 2
    await alice.comm.disconnect()
    assert await online() == 2  # a closed console keeps its lease until it runs out (a reload is no leave)
    assert await expire_leases("alice") == 2
    assert await online() == 1


async def test_a_heartbeat_moves_the_lease_ahead(make_agent, settings):
    from django.utils import timezone

    from chat.models import AgentLease

    alice = await make_agent("alice", "Alice")
    await expire_leases("alice")
    assert await online() == 0
    await alice.send({"type": "heartbeat"})
    deadline = asyncio.get_running_loop().time() + 10
    while await online() == 0:
        assert asyncio.get_running_loop().time() < deadline, "the heartbeat did not renew the lease"
        await asyncio.sleep(0.05)
    lease = await database_sync_to_async(AgentLease.objects.get)(agent__username="alice")
    assert (lease.expires_at - timezone.now()).total_seconds() > settings.KEFU_AGENT_LEASE_S - 5
    assert await alice.comm.receive_nothing(timeout=0.3)  # nothing is sent back


async def test_an_agent_who_vanishes_gives_the_conversation_back_and_the_shopper_is_told(make_client, make_agent, faq):
    from chat import sweeper

    shopper, alice = await held_by_alice(make_client, make_agent)
    await shopper.say("how long does delivery take?")
    ack = await shopper.recv()
    await alice.comm.disconnect()  # the browser closed
    assert await sweeper.release_gone_agents() == 0  # still within the lease
    await expire_leases("alice")

    assert await sweeper.release_gone_agents() == 1
    frames = await shopper.until("stream.end")
    assert frames[0] == status_frame("waiting_agent", position=1)
    notice = frames[1]
    assert notice["type"] == "message" and notice["role"] == "system"
    assert notice["text"].startswith("Alice had to leave. Your conversation is back in the queue")
    end = frames[-1]
    assert end["route"] == "faq" and end["text"].startswith("Orders ship within 1 business day")
    conv = await conversation(shopper.conversation)
    assert (conv.status, conv.agent_id, conv.agent_name, conv.owner_epoch) == ("waiting_agent", None, "", 2)
    bot = await database_sync_to_async(Message.objects.get)(pk=end["id"])
    assert bot.reply_to_seq == ack["seq"]
    assert await sweeper.release_gone_agents() == 0  # released once


async def test_with_the_bot_action_the_bot_takes_the_conversation_back(make_client, make_agent, faq, settings):
    from chat import sweeper

    settings.KEFU_AGENT_GONE_ACTION = "bot"
    shopper, alice = await held_by_alice(make_client, make_agent, locale="zh", ask="我要人工客服")
    await alice.comm.disconnect()
    await expire_leases("alice")
    assert await sweeper.release_gone_agents() == 1
    assert await shopper.recv() == status_frame("bot")
    notice = await shopper.recv()
    assert notice["text"] == "Alice 暂时离开了。在此期间由我继续为您解答。"
    assert (await conversation(shopper.conversation)).status == "bot"
    assert await shopper.comm.receive_nothing(timeout=0.5)  # nothing unanswered: no bot answer


async def test_every_process_sweeps_on_its_own(make_client, make_agent, faq, settings):
    from chat import sweeper

    settings.KEFU_AGENT_SWEEP_S = 0.1
    try:
        shopper, alice = await held_by_alice(make_client, make_agent)
        await alice.comm.disconnect()
        await expire_leases("alice")
        frames = await shopper.until("status")  # no explicit sweep: the process's sweeper found it
        assert frames[-1] == status_frame("waiting_agent", position=1)
    finally:
        await sweeper.stop_sweeper()


async def test_an_agent_message_resent_after_a_reconnect_is_stored_and_delivered_once(make_client, make_agent, faq):
    shopper = await make_client()
    await shopper.hello()
    alice = await make_agent("alice", "Alice")
    await handed_off(shopper)
    await alice.until("handoff", shopper.conversation)
    await alice.send({"type": "take_over", "conversation": shopper.conversation})
    assert (await shopper.recv())["status"] == "agent"

    frame = {
        "type": "message",
        "conversation": shopper.conversation,
        "client_id": "c-7f3a",
        "text": "A new vase ships today.",
    }
    await alice.send(frame)
    reply = await shopper.recv()
    assert reply["role"] == "agent" and reply["text"] == "A new vase ships today." and reply["client_id"] == "c-7f3a"

    # The console lost its socket before it saw the acknowledgement, reconnects and resends.
    await alice.comm.disconnect()
    again = await make_agent("alice", "Alice")
    await again.send(frame)
    ack = (await again.until("message", shopper.conversation))[-1]
    assert ack["id"] == reply["id"] and ack["seq"] == reply["seq"] and ack["client_id"] == "c-7f3a"
    assert await shopper.comm.receive_nothing(timeout=0.7)  # the shopper got it once
    assert [r for r in await stored(shopper.conversation) if r[0] == "agent"] == [("agent", "A new vase ships today.")]

    # After a hand-back the resend is still only acknowledged, never stored or refused.
    await again.send({"type": "hand_back", "conversation": shopper.conversation})
    assert (await shopper.recv())["status"] == "bot"
    await again.send(frame)
    assert (await again.until("message", shopper.conversation))[-1]["id"] == reply["id"]
    # A new client_id from an agent who no longer holds it is refused, and the error names it.
    await again.send({**frame, "client_id": "c-8b01", "text": "late"})
    err = (await again.until("error"))[-1]
    assert err["code"] == "not_owner" and err["client_id"] == "c-8b01" and err["conversation"] == shopper.conversation
    assert [r for r in await stored(shopper.conversation) if r[0] == "agent"] == [("agent", "A new vase ships today.")]


async def test_close_and_transcript_routes(make_client, make_agent, faq, client):
    shopper = await make_client()
    await shopper.hello()
    await shopper.say("can I pay by card?")
    await shopper.until("stream.end")
    alice = await make_agent("alice", "Alice")
    await alice.send({"type": "close", "conversation": shopper.conversation})
    assert await shopper.recv() == status_frame("closed", online=1)
    await alice.send({"type": "open", "conversation": shopper.conversation})
    history = (await alice.until("history"))[-1]
    assert [(m["role"], m.get("route")) for m in history["messages"]] == [("shopper", None), ("bot", "faq")]
    await database_sync_to_async(client.force_login)(alice.user)
    page = await database_sync_to_async(client.get)(f"/console/conversations/{shopper.conversation}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "<code>faq</code>" in html and "We accept Visa, Mastercard, PayPal and Apple Pay." in html


async def test_take_over_mid_stream_cuts_the_bot_and_no_token_follows(make_client, make_agent, faq, remote):
    words = [f"word{i} " for i in range(60)]
    remote.push(Behaviour(chunks=words, token_ms=60))
    shopper = await make_client()
    await shopper.hello()
    alice = await make_agent("alice", "Alice")
    await shopper.say("Does the walnut floor lamp come with a dimmer switch?")
    frames = await shopper.until("stream.delta")
    await alice.send({"type": "take_over", "conversation": shopper.conversation})
    frames += await shopper.until("stream.end")
    kinds = [f["type"] for f in frames]
    status_at = kinds.index("status")
    assert frames[status_at] == status_frame("agent", agent="Alice", online=1)
    assert "stream.delta" not in kinds[status_at:]  # no bot token after the take-over
    end = frames[-1]
    assert end["cut"] is True
    sent = "".join(f["text"] for f in frames if f["type"] == "stream.delta")
    assert end["text"] == sent and 0 < len(sent) < len("".join(words))
    assert await shopper.comm.receive_nothing(timeout=0.5)  # no error frame, no handoff
    row = await database_sync_to_async(Message.objects.get)(pk=end["id"])
    assert row.cut and row.text == sent and row.state == "done"


async def test_two_agents_take_over_at_once_exactly_one_wins(make_client, make_agent, faq):
    alice = await make_agent("alice", "Alice")
    bob = await make_agent("bob", "Bob")
    shopper = await make_client()
    await shopper.hello()
    await handed_off(shopper)
    take = {"type": "take_over", "conversation": shopper.conversation}
    await asyncio.gather(alice.send(take), bob.send(take))

    async def outcome(agent: AgentSocket) -> dict[str, Any]:
        while True:
            f = await agent.recv()
            if f["type"] == "error" or (f["type"] == "conversation.update" and f.get("status") == "agent"):
                return f

    results = await asyncio.gather(outcome(alice), outcome(bob))
    conv = await conversation(shopper.conversation)
    winner_name = conv.agent_name
    assert winner_name in ("Alice", "Bob") and conv.status == "agent" and conv.owner_epoch == 1
    errors = [r for r in results if r["type"] == "error"]
    assert len(errors) == 1 and errors[0]["code"] == "taken" and errors[0]["agent"] == winner_name
    assert await shopper.recv() == status_frame("agent", agent=winner_name, online=2)
    assert await shopper.comm.receive_nothing(timeout=0.5)  # exactly one status frame

    winner, loser = (alice, bob) if winner_name == "Alice" else (bob, alice)
    await loser.send({"type": "message", "conversation": shopper.conversation, "text": "hi, I'm here"})
    refused = (await loser.until("error"))[-1]
    assert refused["code"] == "not_owner" and refused["agent"] == winner_name
    await shopper.say("hello? anyone")
    await winner.send({"type": "message", "conversation": shopper.conversation, "text": "Hi, how can I help?"})
    got = [await shopper.recv(), await shopper.recv()]
    assert {(f["role"], f["text"]) for f in got} == {("shopper", "hello? anyone"), ("agent", "Hi, how can I help?")}
    assert [r[0] for r in await stored(shopper.conversation)] == ["shopper", "bot", "shopper", "agent"]


RACE = r"""
import json, threading, django
django.setup()
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from chat import services
call_command("migrate", verbosity=0)
users = [User.objects.create_user(n, first_name=n.title(), is_staff=True) for n in ("alice", "bob", "carol", "dave")]
outcomes = []
for _ in range(5):
    conv, _token = services.conversation_start()
    barrier = threading.Barrier(len(users))
    results = {}
    def race(user):
        try:
            barrier.wait()
            results[user.username] = services.conversation_take_over(conversation_id=conv.id, agent=user)
        finally:
            connection.close()
    threads = [threading.Thread(target=race, args=(u,)) for u in users]
    [t.start() for t in threads]
    [t.join() for t in threads]
    conv.refresh_from_db()
    outcomes.append({"changed": sorted(r.changed for r in results.values()), "named": sorted({r.agent for r in results.values()}),
                     "owner": conv.agent.first_name, "epoch": conv.owner_epoch})
print(json.dumps(outcomes))
"""


def _race(database_url: str) -> list[dict[str, Any]]:
    import json
    import os
    import subprocess

    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "KEFU_NO_WARMUP": "1",
    }
    env.pop("REDIS_URL", None)
    done = subprocess.run([sys.executable, "-c", RACE], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _assert_one_owner(outcomes: list[dict[str, Any]]) -> None:
    assert len(outcomes) == 5
    for o in outcomes:
        assert o["changed"] == [False, False, False, True]  # four agents at once: one wins
        assert o["named"] == [o["owner"]]  # every caller is told the one owner
        assert o["epoch"] == 1


def test_take_over_guard_sqlite_file_four_connections(tmp_path):
    """Four threads, four database connections, one barrier: the conditional UPDATE lets one through."""
    _assert_one_owner(_race(f"sqlite:///{tmp_path / 'race.sqlite3'}"))


def test_take_over_guard_postgresql_four_connections(pg_database):
    _assert_one_owner(_race(pg_database))


# --- agent help --------------------------------------------------------------------------------


async def test_bad_frames_get_errors_and_the_socket_stays_open(make_client, make_agent, faq):
    shopper = await make_client()
    await shopper.hello()
    alice = await make_agent("alice", "Alice")
    cases = [
        ("not json", "invalid"),
        ("[" * 100_000 + "]" * 100_000, "invalid"),
        ('{"type": "fly"}', "invalid"),
        ('{"type": "open"}', "invalid"),
        ('{"type": "open", "conversation": "00000000-0000-0000-0000-000000000000"}', "not_found"),
        ('{"type": "message", "conversation": "%s", "text": "   "}' % shopper.conversation, "invalid"),
        ('{"type": "message", "conversation": "%s", "text": "%s"}' % (shopper.conversation, "x" * 2001), "too_long"),
        ('{"type": "message", "conversation": "%s", "text": "hi"}' % shopper.conversation, "not_owner"),
        ('{"type": "hand_back", "conversation": "%s"}' % shopper.conversation, "not_owner"),
    ]
    for raw, code in cases:
        await alice.comm.send_to(text_data=raw)
        err = (await alice.until("error"))[-1]
        assert err["code"] == code and err["message"], raw
    await alice.send({"type": "open", "conversation": shopper.conversation})
    assert (await alice.until("history"))[-1]["conversation"] == shopper.conversation
    assert await shopper.comm.receive_nothing(timeout=0.3)


async def test_canned_replies_and_suggested_reply(make_client, make_agent, faq):
    await database_sync_to_async(CannedReply.objects.create)(title="Greeting", text="Hi, I'm here to help.", position=1)
    await database_sync_to_async(CannedReply.objects.create)(title="Old", text="x", active=False)
    alice = await make_agent("alice", "Alice")
    shopper = await make_client()
    await shopper.hello()
    await shopper.say("how many days do I have to send an item back?")
    await shopper.until("stream.end")
    await handed_off(shopper, "human please")
    assert [(c["title"], c["text"]) for c in alice.ready["canned"]] == [("Greeting", "Hi, I'm here to help.")]
    await alice.send({"type": "suggest", "conversation": shopper.conversation})
    suggestion = (await alice.until("suggestion"))[-1]
    # the latest message only asks for a person: the draft answers the question before it
    assert suggestion["route"] == "faq" and suggestion["for_seq"] == 1
    assert suggestion["text"] == "You can return unused items within 30 days for a full refund."
    assert await shopper.comm.receive_nothing(timeout=0.5)  # a draft is never sent on its own
    assert [r[0] for r in await stored(shopper.conversation)] == ["shopper", "bot", "shopper", "bot"]


async def test_a_suggested_reply_from_the_remote_model_is_in_the_ledger_as_a_suggestion(
    make_client, make_agent, faq, remote, settings
):
    from routing.models import UpstreamCall
    from routing.upstream import ledger

    settings.KEFU_CACHE_ENABLED = False  # the draft must come from the model, not the cached answer
    remote.push(
        Behaviour(text="Not in walnut yet, sorry."), Behaviour(text="Walnut arrives in May; shall I note your email?")
    )
    alice = await make_agent("alice", "Alice")
    shopper = await make_client()
    await shopper.hello()
    await shopper.say("Does the oak side table come in walnut?")
    assert (await shopper.until("stream.end"))[-1]["route"] == "llm.simple"
    await handed_off(shopper, "human please")
    await alice.send({"type": "suggest", "conversation": shopper.conversation})
    suggestion = (await alice.until("suggestion"))[-1]
    assert (
        suggestion["route"] == "llm.simple" and suggestion["text"] == "Walnut arrives in May; shall I note your email?"
    )
    assert await shopper.comm.receive_nothing(timeout=0.5)  # never sent on its own
    await ledger.flush()
    rows = await database_sync_to_async(
        lambda: list(UpstreamCall.objects.order_by("id").values_list("purpose", "outcome", "conversation_id"))
    )()
    conv = await conversation(shopper.conversation)
    assert rows == [("answer", "ok", conv.pk), ("suggestion", "ok", conv.pk)]


# --- HTTP ----------------------------------------------------------------------------------------


def test_console_page_is_for_agents_only(client, db):
    assert client.get("/console/").status_code == 302
    assert client.get("/console/")["Location"].startswith("/console/login/")
    client.force_login(make_user("carol", staff=False, agent=False))
    assert client.get("/console/").status_code == 403
    client.force_login(make_user("mallory", agent=False))
    assert client.get("/console/").status_code == 403
    conv, _ = services.conversation_start()
    assert client.get(f"/console/conversations/{conv.id}/").status_code == 403
    client.force_login(make_user("alice", first_name="Alice"))
    page = client.get("/console/")
    assert page.status_code == 200 and "script-src 'self'" in page["Content-Security-Policy"]
    assert b"console.js" in page.content and b"<script>" not in page.content


def test_login_page_signs_an_agent_in(client, db):
    make_user("alice", first_name="Alice")
    assert client.get("/console/login/").status_code == 200
    response = client.post("/console/login/", {"username": "alice", "password": "pw-alice"})
    assert response.status_code == 302 and response["Location"] == "/console/"
    assert client.get("/console/").status_code == 200


async def test_agents_see_why_an_answer_took_its_route_and_the_shopper_never_does(make_client, make_agent, faq):
    shopper = await make_client()
    await shopper.hello()
    await shopper.say("do you accept paypal?")
    frames = await shopper.until("stream.end")
    assert frames[-1]["route"] == "faq"
    assert not any("reason" in f for f in frames)  # the router's words are for agents only
    reason = await database_sync_to_async(
        lambda: Message.objects.get(conversation_id=shopper.conversation, role="bot").route_reason
    )()
    assert reason.startswith("faq payment_methods p=")
    alice = await make_agent("alice", "Alice")
    await alice.send({"type": "open", "conversation": shopper.conversation})
    history = (await alice.until("history"))[-1]
    [bot] = [m for m in history["messages"] if m["role"] == "bot"]
    assert bot["reason"] == reason
    [asked] = [m for m in history["messages"] if m["role"] == "shopper"]
    assert "reason" not in asked


async def test_a_closed_conversation_takes_the_shoppers_satisfaction_once_closed(make_client, make_agent, faq):
    shopper = await make_client()
    await shopper.hello()
    await shopper.say("can I pay by card?")
    await shopper.until("stream.end")
    # Not asked before it closes.
    await shopper.send({"type": "csat", "score": 5})
    assert await shopper.recv() == {
        "type": "error",
        "code": "invalid",
        "message": "satisfaction is asked once the conversation is closed",
    }
    alice = await make_agent("alice", "Alice")
    await alice.send({"type": "close", "conversation": shopper.conversation})
    assert (await shopper.recv())["status"] == "closed"
    for bad in (0, 6, "5", True, 4.5):
        await shopper.send({"type": "csat", "score": bad})
        assert (await shopper.recv())["message"] == "score must be an integer from 1 to 5"
    await shopper.send({"type": "csat", "score": 2, "comment": "  slow  "})
    assert await shopper.recv() == {"type": "csat.saved", "score": 2}

    def stored() -> tuple[int | None, str, bool]:
        row = Conversation.objects.get(pk=shopper.conversation)
        return row.csat_score, row.csat_comment, row.csat_at is not None

    assert await database_sync_to_async(stored)() == (2, "slow", True)
    await shopper.send({"type": "csat", "score": 4})  # the latest answer wins, comment and all
    assert await shopper.recv() == {"type": "csat.saved", "score": 4}
    assert await database_sync_to_async(stored)() == (4, "", True)
