"""The console's rows have a face (issue 31 item 2): the widget's time zone is stored with a new
conversation (``hello``'s ``time_zone``, an extension: docs/protocol.md §4.2), and each console row
carries it with the shopper's own last words (``last_shopper``), never the bot's notice after them.

WebsocketCommunicator on the real ASGI application (SQLite, in-memory channel layer), as
tests/chat/test_console.py. Personas: a shopper in Shanghai writing Chinese, ``alice`` (an agent).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async

from chat.models import Conversation, Message

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_console import make_agent  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.django_db(transaction=True)]


@database_sync_to_async
def stored_time_zone(conversation_id: str) -> str:
    return Conversation.objects.get(pk=conversation_id).time_zone


@database_sync_to_async
def roles(conversation_id: str) -> list[str]:
    return list(Message.objects.filter(conversation_id=conversation_id).order_by("seq").values_list("role", flat=True))


async def test_a_waiting_row_names_the_visitors_time_zone_and_shows_their_words_not_the_notice(
    make_client: Any,
    make_agent: Any,  # noqa: F811
    faq: Any,
) -> None:
    shopper = await make_client()
    assert (await shopper.hello(locale="zh", time_zone="Asia/Shanghai"))["type"] == "conversation"
    await shopper.say("我要人工客服")
    frames = await shopper.until("status")
    assert frames[-1]["status"] == "waiting_agent"
    assert await stored_time_zone(shopper.conversation) == "Asia/Shanghai"
    # No agent was online: the shopper was told so, in a stored notice after their words.
    await shopper.until("message")
    assert (await roles(shopper.conversation))[-1] == "system"

    alice = await make_agent("alice", "Alice")
    (row,) = [r for r in alice.queue["conversations"] if r["id"] == shopper.conversation]
    assert row["status"] == "waiting_agent"
    assert (row["time_zone"], row["locale"]) == ("Asia/Shanghai", "zh")
    assert row["last_message"]["role"] == "system"
    assert row["last_shopper"]["text"] == "我要人工客服"
    assert row["last_shopper"]["seq"] == 1 and row["last_shopper"]["at"]


async def test_a_time_zone_that_is_not_a_name_is_refused_and_an_unknown_one_is_not_stored(make_client: Any) -> None:
    shopper = await make_client()
    refused = await shopper.hello(time_zone=["Asia/Shanghai"])
    assert refused["type"] == "error" and refused["code"] == "invalid"
    assert "time_zone" in refused["message"]
    # The hello may be sent again on the same socket; a zone this server does not know is dropped.
    assert (await shopper.hello(time_zone="Mars/Olympus_Mons"))["type"] == "conversation"
    assert await stored_time_zone(shopper.conversation) == ""
