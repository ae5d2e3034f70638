"""The remote-model path over /ws/chat/: the real ``openai`` client against the project's
OpenAI-compatible streaming test server (tests/fake_openai.py)."""

from __future__ import annotations

import asyncio
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from channels.db import database_sync_to_async

from chat.models import Message

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fake_openai import Behaviour
from sockets import status_frame

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

PRODUCT_Q = "Does the walnut floor lamp come with a dimmer switch?"


def deltas(frames):
    return "".join(f["text"] for f in frames if f["type"] == "stream.delta")


async def test_remote_answer_streams_with_usage_and_cost(make_client, faq, remote):
    remote.push(Behaviour(text="Yes, it has an inline dimmer.", prompt_tokens=1000, completion_tokens=200))
    shopper = await make_client()
    await shopper.hello()
    await shopper.say(PRODUCT_Q)
    frames = await shopper.until("stream.end")
    start, end = frames[1], frames[-1]
    assert start["type"] == "stream.start" and start["route"] == "llm.simple"
    assert end["route"] == "llm.simple" and end["model"] == "fake-simple"
    assert end["text"] == deltas(frames) == "Yes, it has an inline dimmer."
    usage = end["usage"]
    assert usage["prompt_tokens"] == 1000 and usage["completion_tokens"] == 200 and usage["estimated"] is False
    # deepseek-chat list prices: 1000 x $0.28/M + 200 x $0.42/M = $0.000364
    assert usage["cost_usd"] == 0.000364
    row = await database_sync_to_async(Message.objects.get)(pk=end["id"])
    assert row.cost_usd == Decimal("0.000364") and row.text == end["text"] and row.ttft_ms is not None


async def test_prompt_is_grounded_and_keeps_last_turns(make_client, faq, remote, settings):
    settings.KEFU_CONTEXT_TURNS = 2
    shopper = await make_client()
    await shopper.hello()
    for q in ("Is the oak side table solid wood?", "Can it hold a heavy lamp?", "What about the walnut one?"):
        await shopper.say(q)
        await shopper.until("stream.end")
    await shopper.say("Is the walnut one made in Portugal?")
    await shopper.until("stream.end")
    # The answer's request (follow-up rewrites and background summaries are requests of their own).
    body = next(
        r
        for r in reversed(remote.requests)
        if r["messages"][-1]["content"] == "Is the walnut one made in Portugal?" and r.get("max_tokens") != 60
    )
    assert body["model"] == "fake-simple" and body["stream"] is True
    msgs = body["messages"]
    assert msgs[0]["role"] == "system" and "Lantern & Loom" in msgs[0]["content"]
    assert msgs[0]["content"].count("- Q: ") == 3  # the 3 closest FAQ entries ground the answer
    # the last 2 turns (shopper message + answer each), then the new message
    assert [m["role"] for m in msgs[1:]] == ["user", "assistant", "user", "assistant", "user"]
    users = [m["content"] for m in msgs if m["role"] == "user"]
    assert users == ["Can it hold a heavy lamp?", "What about the walnut one?", "Is the walnut one made in Portugal?"]
    assert msgs[2]["content"] == "Echo: Can it hold a heavy lamp?"  # the stored bot answer


async def test_failure_before_first_token_falls_back_to_handoff(make_client, faq, remote):
    # every tier fails, retry included (3 tiers x 2 attempts): a person takes over
    remote.push(*[Behaviour(status=500)] * 6)
    shopper = await make_client()
    await shopper.hello()
    await shopper.say(PRODUCT_Q)
    frames = await shopper.until("status")
    end = next(f for f in frames if f["type"] == "stream.end")
    assert end["route"] == "handoff" and not end.get("cut")
    assert end["text"] == deltas(frames) and "person" in end["text"]
    assert frames[-1] == status_frame("waiting_agent", position=1)
    assert [r["model"] for r in remote.requests] == ["fake-simple"] * 2 + ["fake-medium"] * 2 + ["fake-complex"] * 2


async def test_429_is_retried_after_retry_after_then_answers(make_client, faq, remote):
    remote.push(Behaviour(status=429, retry_after=0.2), Behaviour(text="Yes, it dims."))
    shopper = await make_client()
    await shopper.hello()
    await shopper.say(PRODUCT_Q)
    frames = await shopper.until("stream.end")
    assert frames[-1]["route"] == "llm.simple" and frames[-1]["text"] == "Yes, it dims."
    assert [r["model"] for r in remote.requests] == ["fake-simple", "fake-simple"]


async def test_failing_tier_falls_back_to_the_next_one(make_client, faq, remote):
    remote.push(
        Behaviour(status=503),
        Behaviour(status=503),
        Behaviour(text="It has a dimmer.", prompt_tokens=1000, completion_tokens=200),
    )
    shopper = await make_client()
    await shopper.hello()
    await shopper.say(PRODUCT_Q)
    frames = await shopper.until("stream.end")
    start, end = frames[1], frames[-1]
    assert start["route"] == "llm.simple"  # what was tried first
    assert end["route"] == "llm.medium" and end["model"] == "fake-medium"  # stream.end is authoritative
    assert end["text"] == "It has a dimmer."
    # gemini-2.5-flash list prices: 1000 x $0.30/M + 200 x $2.50/M = $0.0008
    assert end["usage"]["cost_usd"] == 0.0008
    row = await database_sync_to_async(Message.objects.get)(pk=end["id"])
    assert row.route == "llm.medium" and row.cost_usd == Decimal("0.000800")


async def test_permanent_error_is_not_retried(make_client, faq, remote):
    remote.push(Behaviour(status=400), Behaviour(text="From the medium tier."))
    shopper = await make_client()
    await shopper.hello()
    await shopper.say(PRODUCT_Q)
    end = (await shopper.until("stream.end"))[-1]
    assert end["route"] == "llm.medium" and end["text"] == "From the medium tier."
    assert [r["model"] for r in remote.requests] == ["fake-simple", "fake-medium"]


async def test_stream_cut_after_first_token_is_stored_as_cut_with_error(make_client, faq, remote):
    remote.push(Behaviour(text="The lamp has a dimmer and a fabric shade in three colours", drop_after_chunks=3))
    shopper = await make_client()
    await shopper.hello()
    await shopper.say(PRODUCT_Q)
    frames = await shopper.until("error")
    end = next(f for f in frames if f["type"] == "stream.end")
    assert end["cut"] is True and end["text"] == deltas(frames) == "The lamp has "
    assert frames[-1]["code"] == "unavailable"
    row = await database_sync_to_async(Message.objects.get)(pk=end["id"])
    assert row.cut and row.text == "The lamp has "


async def test_message_sent_while_streaming_is_stored_at_once_and_answered_after(make_client, faq, remote):
    remote.push(Behaviour(text="one two three four five six", token_ms=150))
    # The second message is a follow-up: before it is answered, the simple tier rewrites it into a
    # standalone question for the answer cache (routing.prompt.rewrite), a call of its own.
    remote.push(Behaviour(text="Is the shade of the walnut floor lamp washable?"))
    remote.push(Behaviour(text="second answer"))
    shopper = await make_client()
    await shopper.hello()
    await shopper.say(PRODUCT_Q)
    first = [await shopper.recv(), await shopper.recv()]  # ack + stream.start
    assert first[1]["type"] == "stream.start"
    await shopper.say("And is the shade washable?")
    frames = await shopper.until("stream.end")
    # the second message is acknowledged while the first answer still streams
    ack2 = next(i for i, f in enumerate(frames) if f["type"] == "message")
    assert ack2 < len(frames) - 1 and frames[ack2]["seq"] == 3
    assert frames[-1]["text"] == "one two three four five six"
    second = await shopper.until("stream.end")
    assert second[0]["type"] == "stream.start" and second[0]["seq"] == 4
    assert second[-1]["text"] == "second answer"
    assert len(remote.requests) == 3 and remote.requests[1]["max_tokens"] == 60  # the rewrite, in between


async def test_resume_mid_stream_gets_text_so_far_then_the_rest(make_client, faq, remote):
    remote.push(Behaviour(text="alpha beta gamma delta epsilon zeta eta theta", token_ms=120))
    shopper = await make_client()
    await shopper.hello()
    await shopper.say(PRODUCT_Q)
    seen = await shopper.until("stream.delta")
    await asyncio.sleep(0.4)
    again = await make_client()
    await again.hello(conversation=shopper.conversation, token=shopper.token, after=1)
    frames = await again.until("stream.end")
    assert frames[0]["type"] == "stream.start" and frames[0]["id"] == seen[-1]["id"]
    assert frames[1]["type"] == "stream.delta" and len(frames[1]["text"]) > len("alpha ")
    assert deltas(frames) == frames[-1]["text"] == "alpha beta gamma delta epsilon zeta eta theta"
    original = await shopper.until("stream.end")
    assert deltas(seen + original) == original[-1]["text"]
