"""Logs hold no shopper text and no personal data, at any level (lib/logredact.py, issue 14).

The flow test chats over the real ASGI application with every logger at DEBUG and reads every
record: the shopper's words, their e-mail address and phone number, and the model's answer never
appear in one. The filter is the backstop on the handlers for lines kefu does not write itself.
"""

from __future__ import annotations

import logging
import sys

import pytest

from lib.logredact import RedactPersonalData, redact, shopper_text
from tests.fake_openai import Behaviour

EMAIL, PHONE, CARD = "alice.wong@example.com", "+86 138 0013 8000", "4111 1111 1111 1111"


def test_redact_masks_emails_and_long_numbers_and_keeps_ids() -> None:
    line = f"mail {EMAIL}, phone {PHONE}, card {CARD}, id 11010519491231002X, message 48213 of conversation 7"
    assert redact(line) == "mail [email], phone [number], card [number], id [number], message 48213 of conversation 7"


def test_the_filter_masks_arguments_and_tracebacks() -> None:
    try:
        raise ValueError(f"bad input {EMAIL}")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed for %s", (PHONE,), sys.exc_info())
    assert RedactPersonalData().filter(record) is True
    assert record.getMessage() == "failed for [number]"
    assert record.exc_text is not None and EMAIL not in record.exc_text and "[email]" in record.exc_text


def test_shopper_text_is_only_a_length_unless_switched_on(settings) -> None:
    assert shopper_text("Where is my parcel?") == "<19 chars>"
    settings.KEFU_LOG_SHOPPER_TEXT = True
    assert shopper_text("Where is my parcel?") == "'Where is my parcel?'"


@pytest.mark.django_db(transaction=True)
async def test_a_chat_with_personal_data_leaves_none_of_it_in_the_logs(make_client, faq, remote, caplog) -> None:
    secret_words = "periwinkle ottoman"
    answer = "The periwinkle ottoman ships in five days."
    remote.push(
        Behaviour(text=answer),
        Behaviour(text="Is the periwinkle ottoman also sold in two parts?\nHere is more."),  # a refused rewrite
        Behaviour(text="It comes in one piece."),
    )
    caplog.set_level(logging.DEBUG)
    shopper = await make_client()
    await shopper.hello()
    await shopper.say(f"Does the {secret_words} ship to Canada? Mail me at {EMAIL} or call {PHONE}")
    await shopper.until("stream.end")  # refused by the cache: personal data (a debug line says so)
    await shopper.say(f"and is the {secret_words} sold in two parts?")
    await shopper.until("stream.end")  # a follow-up: its rewrite is refused (an info line says so)

    logged = "\n".join(
        r.getMessage() + (r.exc_text or "") for r in caplog.records if not r.name.startswith(("asyncio", "aiohttp"))
    )
    assert "cache store refused" in logged and "rewrite" in logged  # the lines are there...
    for private in (secret_words, EMAIL, PHONE, answer, "two parts"):
        assert private not in logged  # ...without what the shopper or the model wrote
