"""The same question asked again after a complaint hands off (routing.decide.repeat), over
/ws/chat/: a thumbs-down (the ``feedback`` frame) or a "that's not what I asked", then the
question reworded within 3 turns, goes to a person; another question, or the same one later, is
answered as usual."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from channels.db import database_sync_to_async

from chat.models import Conversation, Message

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

QUESTION = "How long does delivery take?"
REWORDED = "How long will it take to deliver my order?"  # cosine 0.957 with QUESTION
OTHERS = ["Which payment methods do you accept?", "What is your return policy?", "can I pay with paypal"]


async def conversation(shopper) -> Conversation:
    return await database_sync_to_async(Conversation.objects.get)(pk=uuid.UUID(shopper.conversation))


async def ask(shopper, text: str) -> dict:
    await shopper.say(text)
    return (await shopper.until("stream.end"))[-1]


async def thumbs_down(shopper, answer: dict) -> None:
    await shopper.send({"type": "feedback", "message_id": answer["id"], "rating": "down"})
    # No reply on success: wait (up to 20 s) until the rating is stored.
    rating = database_sync_to_async(lambda: Message.objects.get(pk=answer["id"]).rating)
    deadline = time.monotonic() + 20
    while await rating() != "down":
        assert time.monotonic() < deadline, "the thumbs-down was not stored"
        await asyncio.sleep(0.02)


async def test_a_reworded_question_after_a_thumbs_down_goes_to_a_person(make_client, faq):
    shopper = await make_client()
    await shopper.hello()
    first = await ask(shopper, QUESTION)
    assert first["route"] == "faq"
    await thumbs_down(shopper, first)
    await shopper.say(REWORDED)
    frames = await shopper.until("status")
    end = next(f for f in frames if f["type"] == "stream.end")
    assert end["route"] == "handoff"
    assert frames[-1]["status"] == "waiting_agent"
    conv = await conversation(shopper)
    assert conv.status == "waiting_agent"
    assert conv.handoff_reason == "asked again after a thumbs-down"
    assert conv.handoff_packet["rule"] == "asked_again"
    assert conv.handoff_packet["shopper_request"]["text"] == REWORDED


@pytest.mark.parametrize(
    "locale, question, missed, again",
    [
        ("en", QUESTION, "No, that's not what I asked.", REWORDED),
        ("zh", "多久能送到？", "我不是问这个", "几天能送到？"),
    ],
)
async def test_the_question_again_after_thats_not_what_i_asked_goes_to_a_person(
    make_client, faq, locale, question, missed, again
):
    shopper = await make_client()
    await shopper.hello(locale=locale)
    assert (await ask(shopper, question))["route"] == "faq"
    sorry = await ask(shopper, missed)
    assert sorry["route"] == "decline"
    assert (
        sorry["text"]
        == {
            "en": "Sorry I missed your question. Could you ask it again in other words? If I get it wrong again, "
            "I'll pass you to a person.",
            "zh": "抱歉，我没理解您的问题。能换个说法再问一次吗？如果我还是答不上，会为您转接人工客服。",
        }[locale]
    )
    await shopper.say(again)
    frames = await shopper.until("status")
    assert next(f for f in frames if f["type"] == "stream.end")["route"] == "handoff"
    conv = await conversation(shopper)
    assert conv.status == "waiting_agent"
    assert conv.handoff_reason == 'asked again after "that\'s not what I asked"'


async def test_another_question_after_a_thumbs_down_is_answered(make_client, faq):
    shopper = await make_client()
    await shopper.hello()
    first = await ask(shopper, QUESTION)
    await thumbs_down(shopper, first)
    end = await ask(shopper, OTHERS[0])
    assert end["route"] == "faq" and end["text"] == "We accept Visa, Mastercard, PayPal and Apple Pay."
    assert await shopper.comm.receive_nothing(timeout=0.3)  # no status frame: no handoff
    assert (await conversation(shopper)).status == "bot"


async def test_the_third_turn_after_a_thumbs_down_still_counts(make_client, faq):
    shopper = await make_client()
    await shopper.hello()
    first = await ask(shopper, QUESTION)
    await thumbs_down(shopper, first)
    for text in OTHERS[:2]:
        assert (await ask(shopper, text))["route"] == "faq"
    assert (await ask(shopper, REWORDED))["route"] == "handoff"


async def test_the_question_again_beyond_three_turns_is_answered(make_client, faq):
    shopper = await make_client()
    await shopper.hello()
    first = await ask(shopper, QUESTION)
    await thumbs_down(shopper, first)
    for text in OTHERS:
        assert (await ask(shopper, text))["route"] == "faq"
    end = await ask(shopper, REWORDED)
    assert end["route"] == "faq" and end["text"].startswith("Orders ship within 1 business day")
    assert (await conversation(shopper)).status == "bot"


async def test_saying_it_twice_keeps_the_question_complained_about(make_client, faq):
    shopper = await make_client()
    await shopper.hello()
    await ask(shopper, QUESTION)
    assert (await ask(shopper, "that's not what I asked"))["route"] == "decline"
    assert (await ask(shopper, "No. That is not what I asked."))["route"] == "decline"
    assert (await conversation(shopper)).complaint_question == QUESTION
    assert (await ask(shopper, REWORDED))["route"] == "handoff"
