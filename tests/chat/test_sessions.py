"""Sessions: a shopper message to a closed conversation, or after KEFU_SESSION_IDLE_S without
activity, starts a new session. The prompt, the follow-up context, the summary and the handoff
packet see only the current session; the stored transcript keeps everything."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from chat import selectors
from chat.models import Conversation
from tests.fake_openai import Behaviour
from tests.sockets import status_frame

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

FIRST = "Does the walnut floor lamp come with a dimmer switch?"
SECOND = "Is the oak side table solid wood or veneer?"
LATER = "Do you sell the linen sofa cover in charcoal?"


async def two_turns(make_client: Any, remote: Any) -> Any:
    shopper = await make_client()
    await shopper.hello()
    for question, answer in ((FIRST, "Yes, an inline dimmer."), (SECOND, "Solid oak.")):
        remote.push(Behaviour(text=answer))
        await shopper.say(question)
        end = (await shopper.until("stream.end"))[-1]
        assert end["route"] == "llm.simple" and end["text"] == answer
    return shopper


def users_in(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "user"]


@database_sync_to_async
def conversation(conversation_id: str) -> Conversation:
    return Conversation.objects.get(pk=conversation_id)


@database_sync_to_async
def set_conversation(conversation_id: str, **fields: Any) -> None:
    Conversation.objects.filter(pk=conversation_id).update(**fields)  # update(): no auto_now bump


async def test_within_a_session_the_prompt_keeps_the_earlier_turns(make_client, faq, remote):
    shopper = await two_turns(make_client, remote)
    remote.push(Behaviour(text="Yes, in charcoal."))
    await shopper.say(LATER)
    await shopper.until("stream.end")
    assert users_in(remote.requests[-1]) == [FIRST, SECOND, LATER]
    assert (await conversation(shopper.conversation)).session_from_seq == 0


async def test_a_reopened_conversation_starts_a_new_session(make_client, faq, remote):
    shopper = await two_turns(make_client, remote)
    await set_conversation(shopper.conversation, status="closed", summary="Asked about a lamp and a table.")
    remote.push(Behaviour(text="Yes, in charcoal."))
    await shopper.say(LATER)
    frames = await shopper.until("stream.end")
    ack = frames[0]
    assert ack["type"] == "message" and ack["seq"] == 5

    assert users_in(remote.requests[-1]) == [LATER]  # none of the closed session's turns
    assert "Asked about a lamp" not in remote.requests[-1]["messages"][0]["content"]
    conv = await conversation(shopper.conversation)
    assert (conv.status, conv.session_from_seq, conv.summary, conv.summary_upto_seq) == ("bot", 4, "", 4)
    # The transcript keeps everything.
    transcript = await database_sync_to_async(selectors.conversation_transcript)(conversation_id=conv.pk)
    assert [m["text"] for m in transcript["messages"] if m["role"] == "shopper"] == [FIRST, SECOND, LATER]


async def test_coming_back_after_the_idle_timeout_starts_a_new_session(make_client, faq, remote, settings):
    shopper = await two_turns(make_client, remote)
    idle = timezone.now() - timedelta(seconds=settings.KEFU_SESSION_IDLE_S + 60)
    await set_conversation(shopper.conversation, updated_at=idle)
    remote.push(Behaviour(text="Yes, in charcoal."))
    await shopper.say(LATER)
    await shopper.until("stream.end")
    assert users_in(remote.requests[-1]) == [LATER]
    assert (await conversation(shopper.conversation)).session_from_seq == 4


async def test_the_handoff_packet_tells_the_current_session_only(make_client, faq, remote):
    shopper = await two_turns(make_client, remote)
    await set_conversation(
        shopper.conversation, status="closed", handoff_reason="old", handoff_packet={"rule": "old packet"}
    )
    await shopper.say("can I talk to a human please")
    frames = await shopper.until("stream.end")
    assert status_frame("bot") in frames  # reopened
    assert (await shopper.until("status"))[-1] == status_frame("waiting_agent", position=1)
    conv = await conversation(shopper.conversation)
    packet = conv.handoff_packet
    assert packet["shopper_request"]["text"] == "can I talk to a human please"
    assert [b["route"] for b in packet["bot_told"]] == ["handoff"]  # not the old session's answers
    assert packet["summary"].startswith("1 shopper message(s), 1 bot answer(s).")
