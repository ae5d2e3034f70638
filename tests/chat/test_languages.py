"""Every shopper answered in their own language, over /ws/chat/ with the fake upstream: the remote
model is told the language, the FAQ answers only in languages it has entries for, the cache keeps
languages apart, fixed texts fall back to English, and the conversation follows the shopper."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest
from channels.db import database_sync_to_async

from cache_layer.models import CachedAnswer
from chat.models import Conversation
from routing.decide import answers

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fake_openai import Behaviour

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

# The test FAQ (tests/conftest.py) answers payment questions in English only, and delivery times
# in Chinese only.
PAY_ES = "¿Qué métodos de pago aceptan? ¿Puedo pagar con PayPal?"
DELIVERY_JA = "配送にはどのくらい時間がかかりますか？"


async def ask(make_client, text: str, **hello) -> dict:
    shopper = await make_client()
    await shopper.hello(**hello)
    await shopper.say(text)
    return (await shopper.until("stream.end"))[-1]


def system_prompt(request: dict) -> str:
    return request["messages"][0]["content"]


async def locale_of(conversation_id: str) -> str:
    return await database_sync_to_async(lambda: Conversation.objects.get(pk=uuid.UUID(conversation_id)).locale)()


async def test_a_spanish_question_is_not_given_the_english_faq_answer(make_client, faq, remote):
    remote.push(Behaviour(text="Aceptamos Visa, Mastercard, PayPal y Apple Pay."))
    end = await ask(make_client, PAY_ES)
    # The English entry matches by meaning (a multilingual model), but it is English: the model answers.
    assert end["route"] == "llm.simple"
    assert end["text"] == "Aceptamos Visa, Mastercard, PayPal y Apple Pay."
    prompt = system_prompt(remote.requests[-1])
    assert "Answer in the language of the shopper's last message (Spanish)" in prompt
    assert "We accept Visa, Mastercard, PayPal and Apple Pay." in prompt  # grounded on the English entry


async def test_an_english_question_still_gets_the_faq_answer(make_client, faq, remote):
    end = await ask(make_client, "Can I pay with PayPal?")
    assert end["route"] == "faq" and end["text"] == "We accept Visa, Mastercard, PayPal and Apple Pay."
    assert remote.requests == []


async def test_a_japanese_question_is_not_routed_as_chinese(make_client, faq, remote):
    # Its kanji made it Chinese before, and the Chinese delivery-time entry answered it in Chinese.
    remote.push(Behaviour(text="通常2〜4営業日でお届けします。"))
    end = await ask(make_client, DELIVERY_JA)
    assert end["route"] == "llm.simple" and end["text"] == "通常2〜4営業日でお届けします。"
    assert "(Japanese)" in system_prompt(remote.requests[-1])


async def test_a_chinese_question_gets_the_chinese_faq_answer(make_client, faq, remote):
    end = await ask(make_client, "快递要几天？")
    assert end["route"] == "faq" and end["text"] == "订单在一个工作日内发货，2到4个工作日送达。"


async def test_the_cache_keeps_languages_apart(make_client, faq, remote):
    remote.push(
        Behaviour(text="Sí, la lámpara de pie de nogal tiene regulador."),
        Behaviour(text="Yes, the walnut floor lamp has a dimmer."),
    )
    es = "¿La lámpara de pie de nogal viene con regulador de intensidad?"
    first = await ask(make_client, es)
    again = await ask(make_client, es)
    english = await ask(make_client, "Does the walnut floor lamp come with a dimmer switch?")
    assert first["route"] == "llm.simple"
    assert again["route"] == "cache.exact" and again["text"] == "Sí, la lámpara de pie de nogal tiene regulador."
    assert english["route"] == "llm.simple" and english["text"] == "Yes, the walnut floor lamp has a dimmer."
    scopes = await database_sync_to_async(lambda: sorted(CachedAnswer.objects.values_list("scope", flat=True)))()
    assert len(scopes) == 2 and "|locale=en|" in scopes[0] and "|locale=es|" in scopes[1]


async def test_fixed_texts_fall_back_to_english(make_client, faq):
    # No remote model configured: a question the FAQ cannot answer in Spanish goes to a person,
    # and the handoff text has no Spanish version.
    end = await ask(make_client, PAY_ES)
    assert end["route"] == "handoff"
    assert end["text"] == answers.handoff_text("es") == answers.handoff_text("en")


async def test_the_conversation_follows_the_language_the_shopper_writes(make_client, faq, remote):
    remote.push(
        Behaviour(text="Tenemos la lámpara en azul y en verde."),
        Behaviour(text="¿Tienen la lámpara de pie en azul?"),  # the simple tier's standalone rewrite
        Behaviour(text="El azul cuesta 89 €."),
    )
    shopper = await make_client()
    hello = await shopper.hello(locale="en-GB")
    assert await locale_of(hello["id"]) == "en"
    await shopper.say("¿Tienen la lámpara de pie en otros colores?")
    await shopper.until("stream.end")
    assert await locale_of(hello["id"]) == "es"
    # Too short to tell on its own ("y el azul?" is Spanish at 0.23): the conversation's language.
    await shopper.say("y el azul?")
    end = (await shopper.until("stream.end"))[-1]
    assert end["text"] == "El azul cuesta 89 €."
    rewrite, answer = remote.requests[-2:]
    assert "Spanish" in str(rewrite["messages"]) and "y el azul?" in str(rewrite["messages"])
    assert "(Spanish)" in system_prompt(answer)


async def test_hello_takes_a_configured_language_by_its_primary_subtag(make_client):
    shopper = await make_client()
    assert (await shopper.hello(locale="es-MX"))["type"] == "conversation"
    assert await locale_of(shopper.conversation) == "es"
    other = await make_client()
    await other.hello(locale="tlh")  # not a language kefu detects: English
    assert await locale_of(other.conversation) == "en"
