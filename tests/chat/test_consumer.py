"""The shopper WebSocket /ws/chat/ on the embedded defaults (SQLite, in-memory channel layer),
driven with Channels' WebsocketCommunicator on the real ASGI application."""

from __future__ import annotations

import uuid

import pytest
from channels.db import database_sync_to_async

from chat.models import Conversation, Message
from tests.sockets import status_frame

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def stream_text(frames: list[dict]) -> str:
    return "".join(f["text"] for f in frames if f["type"] == "stream.delta")


@database_sync_to_async
def stored(conversation_id: str) -> list[Message]:
    return list(Message.objects.filter(conversation_id=conversation_id).order_by("seq"))


async def test_new_conversation_gets_conversation_frame(make_client, faq):
    shopper = await make_client()
    frame = await shopper.hello()
    assert frame["type"] == "conversation"
    assert frame["status"] == "bot" and frame["protocol"] == 1
    assert uuid.UUID(frame["id"]) and len(frame["token"]) >= 32
    conv = await database_sync_to_async(Conversation.objects.get)(pk=frame["id"])
    assert conv.token_hash != frame["token"]  # only the hash is stored


async def test_faq_answer_streams_in_order_and_is_stored(make_client, faq):
    shopper = await make_client()
    await shopper.hello()
    client_id = await shopper.say("how many days do I have to send an item back?")
    frames = await shopper.until("stream.end")
    kinds = [f["type"] for f in frames]
    assert kinds[0] == "message" and kinds[1] == "stream.start" and kinds[-1] == "stream.end"
    assert set(kinds[2:-1]) == {"stream.delta"}
    ack, start, end = frames[0], frames[1], frames[-1]
    assert ack["role"] == "shopper" and ack["client_id"] == client_id and ack["seq"] == 1
    assert start["route"] == "faq" and start["seq"] == 2 and start["role"] == "bot"
    assert end["route"] == "faq" and end["model"] is None
    assert end["text"] == stream_text(frames)
    assert end["text"] == "You can return unused items within 30 days for a full refund."  # placeholder filled
    assert end["usage"]["prompt_tokens"] == 0 and end["usage"]["cost_usd"] == 0
    assert end["usage"]["saved_usd"] > 0
    rows = await stored(shopper.conversation)
    assert [(m.role, m.seq) for m in rows] == [("shopper", 1), ("bot", 2)]
    assert rows[1].text == end["text"] and rows[1].route == "faq" and rows[1].state == "done"


async def test_numbered_list_answer_keeps_line_breaks(make_client, faq):
    shopper = await make_client()
    await shopper.hello()
    await shopper.say("how long until my order gets here?")
    end = (await shopper.until("stream.end"))[-1]
    assert end["route"] == "faq"
    assert "\n1. Standard: 2-4 days\n2. Express: next day" in end["text"]


async def test_chinese_question_gets_chinese_answer(make_client, faq):
    shopper = await make_client()
    await shopper.hello(locale="zh")
    await shopper.say("快递大概要几天？")
    end = (await shopper.until("stream.end"))[-1]
    assert end["route"] == "faq"
    assert end["text"] == "订单在一个工作日内发货，2到4个工作日送达。"


async def test_resend_of_client_id_is_acknowledged_again_not_answered_twice(make_client, faq):
    shopper = await make_client()
    await shopper.hello()
    client_id = await shopper.say("do you accept paypal?")
    first = await shopper.until("stream.end")
    await shopper.say("do you accept paypal?", client_id=client_id)
    again = await shopper.recv()
    assert again == first[0]  # the original acknowledgement, same id and seq
    assert await shopper.comm.receive_nothing(timeout=0.5)
    rows = await stored(shopper.conversation)
    assert [m.role for m in rows] == ["shopper", "bot"]


@pytest.mark.parametrize(
    "frame, code",
    [
        ("not json", "invalid"),
        ('{"type": "message", "client_id": "a", "text": "   "}', "invalid"),
        ('{"type": "message", "client_id": "a", "text": 5}', "invalid"),
        ('{"type": "message", "text": "hi"}', "invalid"),
        ('{"type": "message", "client_id": "a", "text": "' + "x" * 2001 + '"}', "too_long"),
        ('{"type": "nonsense"}', "invalid"),
        ('["a list"]', "invalid"),
        ("[" * 100_000 + "]" * 100_000, "invalid"),  # deeper than the JSON decoder goes: no 1011 close
    ],
)
async def test_bad_frames_get_error_and_connection_stays_usable(make_client, faq, frame, code):
    shopper = await make_client()
    await shopper.hello()
    await shopper.say("can I pay by card?")
    await shopper.until("stream.end")
    await shopper.comm.send_to(text_data=frame)
    err = await shopper.recv()
    assert err["type"] == "error" and err["code"] == code and err["message"]
    await shopper.say("which payment methods do you take?")
    frames = await shopper.until("stream.end")
    assert frames[-1]["route"] == "faq"
    rows = await stored(shopper.conversation)
    assert [m.role for m in rows] == ["shopper", "bot", "shopper", "bot"]  # nothing lost, nothing bad stored


async def test_exactly_2000_code_points_are_accepted(make_client, faq):
    shopper = await make_client()
    await shopper.hello()
    text = "退" * 2000  # 2,000 code points, 6,000 bytes
    await shopper.say(text)
    ack = await shopper.recv()
    assert ack["type"] == "message" and ack["text"] == text


async def test_message_before_hello_is_an_error(make_client, faq):
    shopper = await make_client()
    await shopper.say("hi")
    err = await shopper.recv()
    assert err == {"type": "error", "code": "invalid", "message": "send 'hello' first"}


async def test_resume_replays_after_seq_and_nothing_else(make_client, faq):
    shopper = await make_client()
    await shopper.hello()
    await shopper.say("can I pay with apple pay?")
    await shopper.until("stream.end")
    await shopper.say("what is the return window?")
    await shopper.until("stream.end")
    await shopper.close()

    again = await make_client()
    frame = await again.hello(conversation=shopper.conversation, token=shopper.token, after=2)
    assert frame["id"] == shopper.conversation and frame["token"] == shopper.token
    replay = [await again.recv(), await again.recv()]
    assert [(f["type"], f["seq"], f["role"]) for f in replay] == [("message", 3, "shopper"), ("message", 4, "bot")]
    assert replay[1]["route"] == "faq"
    assert await again.comm.receive_nothing(timeout=0.3)

    full = await make_client()
    await full.hello(conversation=shopper.conversation, token=shopper.token)
    seqs = [(await full.recv())["seq"] for _ in range(4)]
    assert seqs == [1, 2, 3, 4]


@pytest.mark.parametrize(
    "hello",
    [
        {"conversation": "not-a-uuid", "token": "x"},
        {"conversation": str(uuid.uuid4()), "token": "x"},
        {"conversation": None},
    ],
)
async def test_bad_conversation_or_token_closes_4403(make_client, faq, hello):
    owner = await make_client()
    await owner.hello()
    intruder = await make_client()
    if hello.get("conversation") is None:
        hello = {"conversation": owner.conversation, "token": "wrong-token"}
    await intruder.send({"type": "hello", **hello})
    closed = await intruder.comm.receive_output(timeout=5)
    assert closed == {"type": "websocket.close", "code": 4403}


async def test_unanswerable_without_remote_model_hands_off(make_client, faq):
    shopper = await make_client()
    await shopper.hello()
    await shopper.say("The ceramic vase I bought has a hairline crack along the base, what now?")
    frames = await shopper.until("status")
    end = next(f for f in frames if f["type"] == "stream.end")
    assert end["route"] == "handoff" and "person" in end["text"]
    assert frames[-1] == status_frame("waiting_agent", position=1)
    conv = await database_sync_to_async(Conversation.objects.get)(pk=shopper.conversation)
    assert conv.status == "waiting_agent"


async def test_asking_for_a_person_hands_off(make_client, faq):
    shopper = await make_client()
    await shopper.hello()
    await shopper.say("我要转人工")
    frames = await shopper.until("status")
    end = next(f for f in frames if f["type"] == "stream.end")
    assert end["route"] == "handoff" and "人工" in end["text"]


async def test_out_of_scope_is_declined_without_handoff(make_client, faq):
    shopper = await make_client()
    await shopper.hello()
    await shopper.say("who won the football world cup in 2018?")
    frames = await shopper.until("stream.end")
    assert frames[-1]["route"] == "decline"
    assert await shopper.comm.receive_nothing(timeout=0.3)  # no status frame: no handoff


async def test_feedback_is_stored_and_bad_feedback_is_an_error(make_client, faq):
    shopper = await make_client()
    await shopper.hello()
    await shopper.say("do you take credit cards?")
    end = (await shopper.until("stream.end"))[-1]
    await shopper.send({"type": "feedback", "message_id": end["id"], "rating": "up"})
    await shopper.send({"type": "feedback", "message_id": end["id"], "rating": "meh"})
    err = await shopper.recv()
    assert err["code"] == "invalid"
    row = await database_sync_to_async(Message.objects.get)(pk=end["id"])
    assert row.rating == "up"


async def test_other_shopper_cannot_rate_my_messages(make_client, faq):
    shopper = await make_client()
    await shopper.hello()
    await shopper.say("do you take credit cards?")
    end = (await shopper.until("stream.end"))[-1]
    other_shopper = await make_client()
    await other_shopper.hello()
    await other_shopper.send({"type": "feedback", "message_id": end["id"], "rating": "down"})
    assert (await other_shopper.recv())["code"] == "invalid"
    row = await database_sync_to_async(Message.objects.get)(pk=end["id"])
    assert row.rating == ""


async def test_message_rate_limit(make_client, faq, settings):
    settings.KEFU_MESSAGES_PER_MINUTE_PER_IP = 2
    from chat import limits

    limits._limiters.clear()
    shopper = await make_client()
    await shopper.hello()
    for _ in range(2):
        await shopper.say("how can I pay?")
        await shopper.until("stream.end")
    cid = await shopper.say("how can I pay?")
    err = await shopper.recv()
    assert err["type"] == "error" and err["code"] == "rate_limited" and err["client_id"] == cid
    limits._limiters.clear()


async def test_socket_limit_per_address(make_client, faq, settings):
    settings.KEFU_MAX_SOCKETS_PER_IP = 2
    a, _b = await make_client(), await make_client()
    third = await make_client()
    err = await third.recv()
    assert err["code"] == "rate_limited"
    assert await third.comm.receive_output(timeout=2) == {"type": "websocket.close", "code": 4429}
    await a.close()
    fourth = await make_client()
    assert (await fourth.hello())["type"] == "conversation"


async def test_foreign_origin_is_refused(faq):
    from channels.testing import WebsocketCommunicator

    from config.asgi import application

    comm = WebsocketCommunicator(
        application, "/ws/chat/", headers=[(b"origin", b"https://evil.example"), (b"host", b"127.0.0.1:8000")]
    )
    connected, _ = await comm.connect()
    assert not connected


async def test_closed_conversation_reopens_on_message(make_client, faq):
    shopper = await make_client()
    await shopper.hello()
    await database_sync_to_async(Conversation.objects.filter(pk=shopper.conversation).update)(status="closed")
    await shopper.say("how can I pay?")
    frames = await shopper.until("stream.end")
    assert status_frame("bot") in frames
    assert frames[-1]["route"] == "faq"


async def test_frame_to_a_vanished_socket_neither_crashes_nor_leaks_its_slot(make_client, faq, settings, monkeypatch):
    """Daphne raises ``Disconnected`` when a frame is sent to a socket whose TCP connection is
    gone (a tab closed mid-answer). The consumer must survive it and give its slot back."""
    from autobahn.exception import Disconnected

    from chat.consumers import ShopperConsumer

    settings.KEFU_MAX_SOCKETS_PER_IP = 1
    real_send = ShopperConsumer.send

    async def send(self, text_data=None, bytes_data=None, close=False):
        if text_data and '"stream.delta"' in text_data:
            raise Disconnected("connection gone")
        return await real_send(self, text_data=text_data, bytes_data=bytes_data, close=close)

    monkeypatch.setattr(ShopperConsumer, "send", send)
    shopper = await make_client()
    await shopper.hello()
    await shopper.say("how long does delivery take?")
    frames = await shopper.until("stream.start")
    assert frames[-1]["route"] == "faq"
    assert await shopper.comm.receive_nothing(timeout=1)  # nothing more is sent to it, and no crash
    await shopper.close()
    again = await make_client()
    assert (await again.hello())["type"] == "conversation"  # the slot was given back


async def test_burst_of_messages_gets_every_ack_and_answer_in_order(make_client, faq):
    shopper = await make_client()
    await shopper.hello()
    # ~40 answers of several frames each: more than the channel layer's default capacity of 100
    questions = ["how long does delivery take?", "can I pay with paypal?", "what is your return policy?"] * 14
    for q in questions:
        await shopper.say(q)
    acks, ends = [], []
    while len(ends) < len(questions):
        f = await shopper.recv(timeout=30)
        if f["type"] == "message":
            acks.append(f["seq"])
        elif f["type"] == "stream.end":
            ends.append(f)
    assert len(acks) == len(questions)
    assert [e["route"] for e in ends] == ["faq"] * len(questions)
    # each answer follows its question: answers are in seq order and alternate with the questions
    assert [e["seq"] for e in ends] == sorted(e["seq"] for e in ends)
    rows = await stored(shopper.conversation)
    assert sum(m.role == "bot" for m in rows) == sum(m.role == "shopper" for m in rows) == len(questions)


async def test_an_answer_with_nothing_after_its_question_ends_the_loop_without_a_claim(make_client, faq, monkeypatch):
    """A question asked when the bot is idle is claimed as it is stored; once its answer took the
    next seq, nothing can be waiting, and the answering loop ends without asking the database
    (``answer_claim``). Three questions one after the other: three answers, no claim query."""
    from chat import services

    claims: list[object] = []
    original = services.answer_claim

    def counted(**kwargs: object) -> object:
        claims.append(kwargs)
        return original(**kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(services, "answer_claim", counted)
    shopper = await make_client()
    await shopper.hello()
    for q in ["how long does delivery take?", "can I pay with paypal?", "what is your return policy?"]:
        await shopper.say(q)
        assert (await shopper.until("stream.end"))[-1]["route"] == "faq"
        await wait_until_idle(shopper.conversation)
    assert claims == []
    rows = await stored(shopper.conversation)
    assert [(m.role, m.seq) for m in rows] == [
        ("shopper", 1),
        ("bot", 2),
        ("shopper", 3),
        ("bot", 4),
        ("shopper", 5),
        ("bot", 6),
    ]


async def wait_until_idle(conversation_id: str, timeout: float = 20) -> None:
    import asyncio
    import time

    from chat import answering

    deadline = time.monotonic() + timeout
    while not answering.is_idle(uuid.UUID(conversation_id)):
        assert time.monotonic() < deadline, "the answering loop did not end"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize(
    "raw",
    [
        '{"type": "message", "client_id": "x", "text": "\\ud800 lone"}',
        '{"type": "message", "client_id": "\\udfff", "text": "hello"}',
        '{"type": "message", "client_id": "x", "text": "\\u200b\\ufeff"}',
    ],
)
async def test_unstorable_or_invisible_text_is_invalid_and_socket_stays(make_client, faq, raw):
    shopper = await make_client()
    await shopper.hello()
    await shopper.comm.send_to(text_data=raw)
    err = await shopper.recv()
    assert err["type"] == "error" and err["code"] == "invalid"
    await shopper.say("can I pay by card?")
    assert (await shopper.until("stream.end"))[-1]["route"] == "faq"
    assert [m.role for m in await stored(shopper.conversation)] == ["shopper", "bot"]


@pytest.mark.parametrize(
    "text, reply",
    [
        ("hello", "Hello! I can help with products, orders, shipping, returns and payments. What can I do for you?"),
        ("Thanks!", "You're welcome! Ask me anything else any time."),
        ("谢谢", "不客气！还有其他问题随时问我。"),
    ],
)
async def test_small_talk_is_answered_by_the_bot_not_queued_for_a_person(make_client, faq, text, reply):
    shopper = await make_client()
    await shopper.hello()
    await shopper.say(text)
    end = (await shopper.until("stream.end"))[-1]
    assert end["route"] == "decline" and end["text"] == reply
    assert await shopper.comm.receive_nothing(timeout=0.3)  # no status frame: nobody was paged
    conv = await database_sync_to_async(Conversation.objects.get)(pk=shopper.conversation)
    assert conv.status == "bot"
