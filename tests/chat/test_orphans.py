"""An answer left streaming by a process that died (kill -9 mid-answer) is finished by the sweep
of a live process: the shopper sees the partial answer marked interrupted, and the question is
answered again. Nothing is left `streaming`, and nothing the shopper asked is left unanswered."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from chat import services, streams, sweeper
from chat.models import Conversation, Message

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

QUESTION = "how long does delivery take?"
PARTIAL = "Orders ship wi"


@database_sync_to_async
def killed_mid_answer(*, lease_left_s: float, route: str = "faq") -> tuple[Conversation, str, Message]:
    """A conversation as a worker killed mid-answer leaves it: the question stored and claimed, the
    bot row ``streaming``, its lease running out in ``lease_left_s`` seconds (negative: ran out)."""
    conv, token = services.conversation_start(locale="en")
    Message.objects.create(conversation=conv, seq=1, role="shopper", text=QUESTION, client_id="c-1")
    bot = Message.objects.create(conversation=conv, seq=2, role="bot", route=route, state="streaming", reply_to_seq=1)
    Message.objects.filter(pk=bot.pk).update(lease_until=timezone.now() + timedelta(seconds=lease_left_s))
    Conversation.objects.filter(pk=conv.pk).update(last_seq=2, answered_seq=1)
    return conv, token, bot


@database_sync_to_async
def rows(conversation_id: Any) -> list[tuple[int, str, str, str, bool, int | None]]:
    return list(
        Message.objects.filter(conversation_id=conversation_id)
        .order_by("seq")
        .values_list("seq", "role", "state", "text", "cut", "reply_to_seq")
    )


async def test_an_orphaned_answer_is_finished_as_cut_and_the_question_answered_again(make_client, faq, settings):
    conv, token, bot = await killed_mid_answer(lease_left_s=-1)
    await streams.begin(message_id=bot.pk, seq=2, route="faq")  # the buffer survived (Redis in production)
    await streams.append(message_id=bot.pk, text=PARTIAL, conversation_id=conv.pk, epoch=0)
    shopper = await make_client()
    await shopper.hello(conversation=str(conv.pk), token=token)
    replay = await shopper.until("stream.delta")
    assert [f["type"] for f in replay[-2:]] == ["stream.start", "stream.delta"] and replay[-1]["text"] == PARTIAL

    assert await sweeper.finish_orphaned_answers() == 1

    end = await shopper.recv()
    assert (end["type"], end["id"], end["cut"], end["text"]) == ("stream.end", bot.pk, True, PARTIAL)
    error = await shopper.recv()
    assert error["type"] == "error" and error["code"] == "unavailable"
    again = await shopper.until("stream.end")
    assert again[0]["type"] == "stream.start" and again[0]["id"] != bot.pk
    assert again[-1]["route"] == "faq" and again[-1]["text"].startswith("Orders ship within 1 business day")
    stored = await rows(conv.pk)
    assert stored[1] == (2, "bot", "done", PARTIAL, True, 1)
    assert stored[2][:3] == (3, "bot", "done") and stored[2][5] == 1  # the new answer replies to the question
    assert await sweeper.finish_orphaned_answers() == 0  # finished once


async def test_an_answer_still_within_its_lease_is_left_alone(make_client, faq):
    conv, _token, bot = await killed_mid_answer(lease_left_s=5)
    assert await sweeper.finish_orphaned_answers() == 0
    row = await database_sync_to_async(Message.objects.get)(pk=bot.pk)
    assert row.state == "streaming"


async def test_an_orphan_whose_buffer_is_gone_ends_empty_and_is_answered_again(make_client, faq, settings):
    conv, token, bot = await killed_mid_answer(lease_left_s=-1)
    shopper = await make_client()
    await shopper.hello(conversation=str(conv.pk), token=token)
    await shopper.recv()  # the replayed question
    assert await sweeper.finish_orphaned_answers() == 1
    frames = await shopper.until("stream.end")  # the orphan's end (its start sent first: never seen)
    assert frames[-1]["id"] == bot.pk and frames[-1]["cut"] is True and frames[-1]["text"] == ""
    again = await shopper.until("stream.end")
    assert again[-1]["route"] == "faq"
    assert (await rows(conv.pk))[1][2:5] == ("done", "", True)


async def test_a_row_without_a_lease_counts_from_its_creation(make_client, faq, settings):
    """Rows written before answers had leases: orphans once a lease's length has passed."""
    conv, _token, bot = await killed_mid_answer(lease_left_s=0)
    await database_sync_to_async(Message.objects.filter(pk=bot.pk).update)(lease_until=None)
    assert await sweeper.finish_orphaned_answers() == 0
    await database_sync_to_async(Message.objects.filter(pk=bot.pk).update)(
        created_at=timezone.now() - timedelta(seconds=settings.KEFU_ANSWER_LEASE_S + 1)
    )
    assert await sweeper.finish_orphaned_answers() == 1


async def test_a_remote_orphan_gets_its_estimated_ledger_row(make_client, faq, settings):
    """The dead process never wrote the ledger row of the call it was streaming: the sweep writes
    it, estimated from the question and the text the shopper had, at the tier's prices."""
    from routing.models import UpstreamCall
    from routing.upstream.ledger import TYPICAL_PROMPT_TOKENS, cost_usd

    conv, _token, bot = await killed_mid_answer(lease_left_s=-1, route="llm.simple")
    await streams.begin(message_id=bot.pk, seq=2, route="llm.simple")
    await streams.append(message_id=bot.pk, text=PARTIAL, conversation_id=conv.pk, epoch=0)
    assert await sweeper.finish_orphaned_answers() == 1
    row = await database_sync_to_async(UpstreamCall.objects.get)(conversation_id=conv.pk)
    assert (row.tier, row.outcome, row.error_code, row.estimated) == ("simple", "failed", "process_died", True)
    assert row.prompt_tokens > TYPICAL_PROMPT_TOKENS and row.completion_tokens > 0
    assert row.cost_usd == cost_usd(
        tier="simple", prompt_tokens=row.prompt_tokens, completion_tokens=row.completion_tokens
    )
    assert row.cost_usd > 0


@database_sync_to_async
def claimed_and_killed(*, claim_left_s: float, status: str = "bot") -> tuple[Conversation, str]:
    """A conversation as a worker killed right after storing and claiming a message leaves it:
    the question claimed (``answered_seq``), no answer row, the claim running out in
    ``claim_left_s`` seconds (negative: ran out)."""
    conv, token = services.conversation_start(locale="en")
    Message.objects.create(conversation=conv, seq=1, role="shopper", text=QUESTION, client_id="c-1")
    Conversation.objects.filter(pk=conv.pk).update(
        last_seq=1, answered_seq=1, status=status, claim_until=timezone.now() + timedelta(seconds=claim_left_s)
    )
    return conv, token


async def test_a_claimed_message_whose_process_died_before_answering_is_answered(make_client, faq):
    conv, token = await claimed_and_killed(claim_left_s=-1)
    shopper = await make_client()
    await shopper.hello(conversation=str(conv.pk), token=token)
    assert (await shopper.recv())["seq"] == 1  # the replayed question
    assert await sweeper.answer_orphaned_claims() == 1
    frames = await shopper.until("stream.end")
    assert frames[-1]["route"] == "faq" and frames[-1]["text"].startswith("Orders ship within 1 business day")
    stored = await rows(conv.pk)
    assert stored[1][:3] == (2, "bot", "done") and stored[1][5] == 1
    assert await sweeper.answer_orphaned_claims() == 0  # taken once
    claim = await database_sync_to_async(lambda: Conversation.objects.get(pk=conv.pk).claim_until)()
    assert claim is None


async def test_a_live_claim_or_an_agents_conversation_is_left_alone(make_client, faq):
    live, _ = await claimed_and_killed(claim_left_s=10)
    held, _ = await claimed_and_killed(claim_left_s=-1, status="agent")
    assert await sweeper.answer_orphaned_claims() == 0
    assert [r[1] for r in await rows(live.pk)] == ["shopper"]
    assert [r[1] for r in await rows(held.pk)] == ["shopper"]


async def test_an_answer_writes_its_row_and_drops_the_claim(make_client, faq):
    shopper = await make_client()
    await shopper.hello()
    await shopper.say(QUESTION)
    await shopper.until("stream.end")
    conv = await database_sync_to_async(Conversation.objects.get)(pk=shopper.conversation)
    assert conv.answered_seq == 1 and conv.claim_until is None


async def test_a_bot_answer_cut_short_answers_nothing_for_a_hand_back():
    """A take-over cut the bot's answer to the question: the agent left without replying, so the
    question is still unanswered (it is answered again when the conversation goes back)."""

    @database_sync_to_async
    def check() -> None:
        conv, _ = services.conversation_start(locale="en")
        Message.objects.create(conversation=conv, seq=1, role="shopper", text="hi", client_id="a")
        Message.objects.create(conversation=conv, seq=2, role="bot", text="Hel", cut=True, reply_to_seq=1)
        assert [m.seq for m in services.unanswered_by_anyone(conv.pk)] == [1]
        Message.objects.create(conversation=conv, seq=3, role="bot", text="Hello!", reply_to_seq=1)
        assert services.unanswered_by_anyone(conv.pk) == []

    await check()
