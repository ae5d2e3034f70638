"""Small talk answered by kefu itself over /ws/chat/, with a remote model configured: greetings,
"how are you", thanks, compliments, "are you a robot?", jokes and goodbyes get kefu's own reply
(route ``decline``) in the shopper's language, with no request to the model and no handoff."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest
from channels.db import database_sync_to_async

from chat.models import Conversation
from routing.decide import smalltalk

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

SEED = smalltalk.load_seed()


def reply(category: str, locale: str) -> str:
    return SEED[category]["replies"][locale]  # type: ignore[index,return-value]


# (message, locale of the conversation, the category whose reply kefu must give). None of these
# is in the seed (routing/demo/smalltalk_seed.json).
CASES = [
    ("hi, how are you today?", "en", "how_are_you"),
    ("thanks, you're great", "en", "compliment"),
    ("tell me a joke please", "en", "joke"),
    ("are you a robot?", "en", "bot"),
    ("okay, bye bye", "en", "goodbye"),
    ("你好啊", "zh", "greeting"),
    ("谢谢你的帮忙", "zh", "thanks"),
    ("给我讲一个笑话吧", "zh", "joke"),
    ("你是机器人还是程序？", "zh", "bot"),
    ("好的，拜拜", "zh", "goodbye"),
]


@pytest.mark.parametrize("text, locale, category", CASES)
async def test_small_talk_is_answered_by_kefu_itself(make_client, faq, remote, text, locale, category):
    shopper = await make_client()
    await shopper.hello(locale=locale)
    await shopper.say(text)
    end = (await shopper.until("stream.end"))[-1]
    assert end["route"] == "decline"
    assert end["text"] == reply(category, locale)
    assert remote.requests == []  # never a paid model
    assert await shopper.comm.receive_nothing(timeout=0.3)  # no status frame: no handoff
    status = await database_sync_to_async(lambda: Conversation.objects.get(pk=uuid.UUID(shopper.conversation)).status)()
    assert status != "waiting_agent"


async def test_a_store_question_that_starts_with_a_greeting_is_not_small_talk(make_client, faq, remote):
    from fake_openai import Behaviour

    remote.push(Behaviour(text="The oak table seats six."))
    shopper = await make_client()
    await shopper.hello()
    await shopper.say("hi! how many people can sit at the big oak dining table?")
    end = (await shopper.until("stream.end"))[-1]
    assert end["route"] == "llm.simple" and end["text"] == "The oak table seats six."
