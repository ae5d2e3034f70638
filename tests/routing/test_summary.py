"""The rolling summary (chat.summary, routing.prompt.summary / chat.tasks.summarise_conversation): turns that left the
prompt window are folded into ``Conversation.summary`` by the ``simple`` tier after a bot answer,
in the background (Celery runs eagerly in the tests, as in the embedded defaults), as a row of
the cost ledger; without a model nothing is summarised."""

from __future__ import annotations

import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async

from chat import tasks as chat_tasks
from chat.models import Conversation
from chat.summary import conversation_summarise, summary_work
from routing.models import UpstreamCall
from routing.prompt.summary import SUMMARY_MAX_TOKENS
from routing.providers.openai_remote import close_clients
from routing.upstream import ledger

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fake_openai import Behaviour

QUESTIONS = [
    "Is the oak side table solid wood?",
    "Is the linen sofa cover machine washable?",
    "Does the walnut floor lamp come with a dimmer switch?",
]
SUMMARY = "The shopper asked whether the oak side table is solid wood; it is solid oak."


@pytest.fixture(autouse=True)
def _fresh_guards(settings: Any, routing_guards: None) -> None:
    settings.KEFU_CONTEXT_TURNS = 2
    settings.KEFU_SUMMARY_MIN_TURNS = 1


@pytest.fixture
async def _flushed() -> AsyncIterator[None]:
    yield
    await chat_tasks.drain()
    await ledger.flush()
    await close_clients()


async def chat(make_client: Any, questions: list[str]) -> Any:
    shopper = await make_client()
    await shopper.hello()
    for q in questions:
        await shopper.say(q)
        await shopper.until("stream.end")
    return shopper


def conversation(shopper: Any) -> Conversation:
    return Conversation.objects.get(pk=shopper.conversation)


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_turns_that_leave_the_window_are_summarised_by_the_simple_tier(make_client, faq, remote, _flushed):
    remote.push(
        Behaviour(text="Yes, solid oak."),
        Behaviour(text="Yes, at 30 degrees."),
        Behaviour(text="Yes, an inline dimmer."),
        Behaviour(text=SUMMARY, prompt_tokens=300, completion_tokens=40),
    )
    shopper = await chat(make_client, QUESTIONS)  # 3 turns, a window of 2: the first one left it
    await chat_tasks.drain()
    conv = await database_sync_to_async(conversation)(shopper)
    assert conv.summary == SUMMARY and conv.summary_upto_seq == 2  # the first shopper message and its answer
    assert len(remote.requests) == 4
    request = remote.requests[-1]
    assert (
        request["model"] == "fake-simple"
        and request["max_tokens"] == SUMMARY_MAX_TOKENS
        and request["temperature"] == 0
    )
    transcript = request["messages"][-1]["content"]
    assert "Shopper: Is the oak side table solid wood?" in transcript and "Store: Yes, solid oak." in transcript
    assert QUESTIONS[1] not in transcript  # still in the window: not summarised
    await ledger.flush()
    rows = await database_sync_to_async(lambda: list(UpstreamCall.objects.filter(message=None)))()
    assert [(r.outcome, r.conversation_id, r.prompt_tokens, r.purpose) for r in rows] == [
        ("ok", conv.pk, 300, "summary")
    ]


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_next_summary_folds_in_the_previous_one(make_client, faq, remote, _flushed):
    remote.push(
        Behaviour(text="Yes, solid oak."),
        Behaviour(text="Yes, at 30 degrees."),
        Behaviour(text="Yes, an inline dimmer."),
        Behaviour(text=SUMMARY),
        Behaviour(text="Yes, to Norway in 5 days."),
        Behaviour(text="Oak table, solid; sofa cover washable."),
    )
    shopper = await chat(make_client, QUESTIONS)
    await chat_tasks.drain()
    await shopper.say("Do you ship the oak side table to Norway?")
    await shopper.until("stream.end")
    await chat_tasks.drain()
    conv = await database_sync_to_async(conversation)(shopper)
    assert conv.summary == "Oak table, solid; sofa cover washable." and conv.summary_upto_seq == 4
    transcript = remote.requests[-1]["messages"][-1]["content"]
    assert f"Summary so far:\n{SUMMARY}" in transcript
    assert QUESTIONS[1] in transcript and QUESTIONS[0] not in transcript  # only the turns not yet summarised


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_answering_loop_never_waits_for_a_summary(make_client, faq, remote, monkeypatch, _flushed):
    release, started = threading.Event(), threading.Event()

    def held(*, conversation_id: Any) -> None:
        started.set()
        release.wait(30)

    monkeypatch.setattr(chat_tasks, "conversation_summarise", held)
    shopper = await chat(make_client, QUESTIONS)
    assert started.wait(10)  # the summary (eager Celery) is running, and held
    await shopper.say("Do you ship the oak side table to Norway?")
    end = (await shopper.until("stream.end"))[-1]  # answered while the summary is still held
    assert end["route"] == "llm.simple" and not release.is_set()
    release.set()


@pytest.mark.django_db
def test_without_a_model_nothing_is_summarised(settings):
    settings.KEFU_TIERS = {t: cfg.with_current(api_key="") for t, cfg in settings.KEFU_TIERS.items()}
    conv = Conversation.objects.create(token_hash="0" * 64)
    assert conversation_summarise(conversation_id=conv.pk) is None
    assert chat_tasks.maybe_summarise(conversation_id=conv.pk) is False
    conv.refresh_from_db()
    assert conv.summary == "" and conv.summary_upto_seq == 0


@pytest.mark.django_db
def test_nothing_is_due_while_the_turns_fit(settings):
    from chat.models import Message

    conv = Conversation.objects.create(token_hash="0" * 64)
    for seq, (role, text) in enumerate(
        [("shopper", QUESTIONS[0]), ("bot", "Yes."), ("shopper", QUESTIONS[1]), ("bot", "Yes.")], 1
    ):
        Message.objects.create(conversation=conv, seq=seq, role=role, text=text, state="done")
    assert summary_work(conversation_id=conv.pk) is None  # 2 turns, a window of 2
    Message.objects.create(conversation=conv, seq=5, role="shopper", text=QUESTIONS[2], state="done")
    work = summary_work(conversation_id=conv.pk)
    assert work is not None and work.turns == [[("shopper", QUESTIONS[0]), ("bot", "Yes.")]] and work.new_upto_seq == 2
    settings.KEFU_SUMMARY_MIN_TURNS = 2  # batches of 2: one turn out is not enough yet
    assert summary_work(conversation_id=conv.pk) is None


@pytest.mark.django_db(transaction=True)
def test_duplicate_tasks_of_one_window_pay_for_one_summary(remote):
    """Two tasks for the same window at once (a duplicate enqueue, a redelivery): one calls the
    model, the other finds the window claimed and returns; the summary is stored once, paid once."""
    from chat.models import Message

    conv = Conversation.objects.create(token_hash="1" * 64)
    for seq, (role, text) in enumerate(
        [("shopper", QUESTIONS[0]), ("bot", "Yes."), ("shopper", QUESTIONS[1]), ("bot", "Yes."), ("shopper", "ok")], 1
    ):
        Message.objects.create(conversation=conv, seq=seq, role=role, text=text, state="done")
    remote.push(Behaviour(text=SUMMARY, ttft_ms=600))  # slow enough for the second to arrive meanwhile
    results: list[str | None] = []
    threads = [
        threading.Thread(target=lambda: results.append(conversation_summarise(conversation_id=conv.pk)))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(results, key=str) == [None, SUMMARY]
    assert len(remote.requests) == 1
    conv.refresh_from_db()
    assert conv.summary == SUMMARY and conv.summary_upto_seq == 2
    # the claim is released: a later window (or a retry after a failure) is not blocked
    from django.core.cache import cache

    assert cache.get(f"kefu:summary-claim:{conv.pk.hex}:0") is None
