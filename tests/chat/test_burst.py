"""Burst debounce (chat.answering): a shopper who types one question in fragments gets one answer
to all of them; a message with no typing after it is answered at once.

Real sockets into the real ASGI application, the real ``openai`` client against the fake
upstream (tests/fake_openai.py), whose first token is slow enough for the shopper to type on.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from channels.db import database_sync_to_async

from chat.models import Message
from routing.models import UpstreamCall
from routing.upstream import ledger

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fake_openai import Behaviour

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

FIRST = "Does the walnut floor lamp come with a dimmer switch"
SECOND = "and does it ship to Canada?"
ANSWER = "Yes to both: an inline dimmer, and we ship it to Canada."


@pytest.fixture
def burst(settings, remote):
    """A short pause and bound, so the test waits little; the first token may take its time."""
    settings.KEFU_BURST_PAUSE_S = 0.4
    settings.KEFU_BURST_MAX_WAIT_S = 5.0
    settings.KEFU_LLM_FIRST_TOKEN_TIMEOUT_S = 30.0
    return remote


@database_sync_to_async
def rows(conversation_id: str) -> list[tuple[str, str, bool, bool, int | None]]:
    return [
        (m.role, m.text, m.cut, m.superseded, m.reply_to_seq)
        for m in Message.objects.filter(conversation_id=conversation_id).order_by("seq")
    ]


async def keep_typing(shopper, every_s: float = 0.1) -> None:
    """Typing frames until cancelled, as the widget sends them while keys are pressed."""
    while True:
        await shopper.send({"type": "typing"})
        await asyncio.sleep(every_s)


def answer_requests(remote) -> list[dict]:
    return [r for r in remote.requests if r["messages"][0]["role"] == "system" and r.get("max_tokens") != 60]


async def test_fragments_typed_on_are_answered_as_one_question(make_client, faq, burst):
    # Every request answers after 3 s: time to type on. (Whether the first fragment's request
    # reaches the upstream before the typing frame drops it depends on the machine's load.)
    burst.default = Behaviour(text=ANSWER, ttft_ms=3000)
    shopper = await make_client()
    await shopper.hello()
    await shopper.say(FIRST)
    ack = await shopper.recv()
    assert ack["type"] == "message" and ack["text"] == FIRST
    # The shopper types on (the widget sends a typing frame every second while keys are pressed):
    # the first answer has shown nothing yet, so it is dropped.
    typer = asyncio.create_task(keep_typing(shopper))
    try:
        dropped = (await shopper.until("stream.end"))[-1]
        assert dropped["text"] == "" and dropped["cut"] is True and dropped["superseded"] is True
    finally:
        typer.cancel()
        await asyncio.gather(typer, return_exceptions=True)
    await shopper.say(SECOND)
    frames = await shopper.until("stream.end")
    assert frames[0]["type"] == "message" and frames[0]["text"] == SECOND  # stored and acknowledged at once
    assert [f["type"] for f in frames[1:3]] == ["stream.start", "stream.delta"]
    end = frames[-1]
    assert end["text"] == ANSWER and "superseded" not in end and not end.get("cut")
    assert await shopper.comm.receive_nothing(timeout=0.5)  # one answer, no error frame

    requests = answer_requests(burst)
    # The first fragment's request reached the upstream, or was dropped on its way (a loaded
    # machine: the typing frame came first); either way the call is abandoned, and then asked once.
    assert [r["messages"][-1]["content"] for r in requests] in ([FIRST, f"{FIRST}\n{SECOND}"], [f"{FIRST}\n{SECOND}"])
    joined = requests[-1]["messages"]
    assert joined[-1] == {"role": "user", "content": f"{FIRST}\n{SECOND}"}
    assert FIRST not in [m["content"] for m in joined[1:-1]]  # the fragments are in the question, not its history
    assert await rows(shopper.conversation) == [
        ("shopper", FIRST, False, False, None),
        ("bot", "", True, True, 1),
        ("shopper", SECOND, False, False, None),
        ("bot", ANSWER, False, False, 3),
    ]
    # The abandoned call is in the ledger, its prompt counted: what the drop cost.
    await ledger.flush()
    calls = await database_sync_to_async(
        lambda: list(UpstreamCall.objects.order_by("created_at").values_list("outcome", "error_code", "prompt_tokens"))
    )()
    assert [(o, e) for o, e, _ in calls] == [("failed", "abandoned"), ("ok", "")]
    assert calls[0][2] > 0


async def test_a_message_with_no_typing_after_it_is_answered_at_once(make_client, faq, burst):
    burst.push(Behaviour(text="Yes, it has an inline dimmer."))
    shopper = await make_client()
    await shopper.hello()
    await shopper.say(FIRST + "?")
    end = (await shopper.until("stream.end"))[-1]
    assert end["text"] == "Yes, it has an inline dimmer." and "superseded" not in end
    assert len(answer_requests(burst)) == 1
    assert [r[3] for r in await rows(shopper.conversation)] == [False, False]


async def test_typing_after_an_faq_answer_never_drops_it(make_client, faq, burst):
    shopper = await make_client()
    await shopper.hello()
    await shopper.say("can I pay with paypal?")
    await shopper.send({"type": "typing"})
    end = (await shopper.until("stream.end"))[-1]
    assert end["route"] == "faq" and end["text"] == "We accept Visa, Mastercard, PayPal and Apple Pay."
    assert "superseded" not in end and answer_requests(burst) == []


async def test_a_shopper_who_never_pauses_is_answered_at_the_bound(make_client, faq, burst, settings):
    settings.KEFU_BURST_MAX_WAIT_S = 1.0
    # Every request answers after 3 s: time to type on. (Whether the first fragment's request
    # reaches the upstream before the typing frame drops it depends on the machine's load.)
    burst.default = Behaviour(text=ANSWER, ttft_ms=3000)
    shopper = await make_client()
    await shopper.hello()
    await shopper.say(FIRST)
    await shopper.recv()
    typer = asyncio.create_task(keep_typing(shopper))
    try:
        assert (await shopper.until("stream.end"))[-1]["superseded"] is True
        end = (await shopper.until("stream.end"))[-1]
        assert not typer.done()  # still typing, yet answered: the bound holds
    finally:
        typer.cancel()
        await asyncio.gather(typer, return_exceptions=True)
    assert end["text"] == ANSWER
    assert answer_requests(burst)[-1]["messages"][-1]["content"] == FIRST
