"""The rolling summary (chat.summary, routing.prompt.summary / chat.tasks.summarise_conversation): turns that left the
prompt window are folded into ``Conversation.summary`` by the ``simple`` tier, in the background
(Celery runs eagerly in the tests, as in the embedded defaults), as a row of the cost ledger held
and settled on the shopper's spend budget; without a model nothing is summarised.

A summary is made only for what a prompt needs (issue 29, item 3): after a remote answer whose
prompt left out older turns no summary covers. Turns answered without a model (FAQ, cache, store)
never cause one on their own; they are folded in when a model's prompt leaves them out. The same
over real sockets of a Daphne worker, 1,000 FAQ questions and 40 model questions, is in
tests/chat/test_summary_live.py."""

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
    "Do you ship the oak side table to Norway?",
]
MORE_QUESTIONS = [
    "Does the walnut floor lamp come in black?",
    "Is the linen sofa cover sold in green?",
]
FAQ_QUESTIONS = ["can I pay by card?", "how many days do I have to send an item back?", "can I pay by card?"]
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
async def test_turns_a_remote_prompt_left_out_are_summarised_by_the_simple_tier(make_client, faq, remote, _flushed):
    remote.push(
        Behaviour(text="Yes, solid oak."),
        Behaviour(text="Yes, at 30 degrees."),
        Behaviour(text="Yes, an inline dimmer."),
    )
    shopper = await chat(make_client, QUESTIONS[:3])  # 3 turns, a window of 2: every prompt held all before it
    await chat_tasks.drain()
    assert len(remote.requests) == 3  # nothing was left out of a prompt: no summary yet
    remote.push(
        Behaviour(text="Yes, to Norway in 5 days."),
        Behaviour(text=SUMMARY, prompt_tokens=300, completion_tokens=40),
    )
    await shopper.say(QUESTIONS[3])  # its prompt leaves the first turn out
    await shopper.until("stream.end")
    await chat_tasks.drain()
    conv = await database_sync_to_async(conversation)(shopper)
    # 4 turns now: the first two left the window (messages 1 to 4)
    assert conv.summary == SUMMARY and conv.summary_upto_seq == 4
    assert len(remote.requests) == 5
    request = remote.requests[-1]
    assert (
        request["model"] == "fake-simple"
        and request["max_tokens"] == SUMMARY_MAX_TOKENS
        and request["temperature"] == 0
    )
    transcript = request["messages"][-1]["content"]
    assert "Shopper: Is the oak side table solid wood?" in transcript and "Store: Yes, solid oak." in transcript
    assert QUESTIONS[1] in transcript and QUESTIONS[2] not in transcript  # the third is still in the window
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
        Behaviour(text="Yes, to Norway in 5 days."),
        Behaviour(text=SUMMARY),
    )
    shopper = await chat(make_client, QUESTIONS)
    await chat_tasks.drain()
    remote.push(Behaviour(text="Yes, in black too."))
    await shopper.say(MORE_QUESTIONS[0])  # its prompt holds turns 3 and 4; 1 and 2 are summarised
    await shopper.until("stream.end")
    await chat_tasks.drain()
    assert len(remote.requests) == 6  # nothing left out that the summary does not cover: no summary
    remote.push(Behaviour(text="Yes, in green."), Behaviour(text="Oak table, solid; sofa cover washable."))
    await shopper.say(MORE_QUESTIONS[1])  # leaves turn 3 out, which no summary covers
    await shopper.until("stream.end")
    await chat_tasks.drain()
    conv = await database_sync_to_async(conversation)(shopper)
    assert conv.summary == "Oak table, solid; sofa cover washable." and conv.summary_upto_seq == 8
    assert len(remote.requests) == 8
    transcript = remote.requests[-1]["messages"][-1]["content"]
    assert f"Summary so far:\n{SUMMARY}" in transcript
    assert QUESTIONS[2] in transcript and QUESTIONS[3] in transcript  # turns 3 and 4 left the window since
    assert QUESTIONS[1] not in transcript and MORE_QUESTIONS[0] not in transcript  # summarised / still in it


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_faq_answers_never_cause_a_summary_on_their_own(make_client, faq, remote, _flushed):
    """Issue 29 item 3: FAQ-answered questions, however many leave the window, cost no model call."""
    shopper = await chat(make_client, FAQ_QUESTIONS * 2)  # 6 turns, a window of 2, batches of 1
    await chat_tasks.drain()
    conv = await database_sync_to_async(conversation)(shopper)
    assert remote.requests == [] and conv.summary == "" and conv.summary_upto_seq == 0


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_faq_turns_are_summarised_once_a_model_prompt_leaves_them_out(make_client, faq, remote, _flushed):
    """FAQ turns that left the window are folded in, in one summary, when a remote prompt needs them."""
    shopper = await chat(make_client, FAQ_QUESTIONS)  # 3 FAQ turns: no call
    assert remote.requests == []
    remote.push(Behaviour(text="Yes, solid oak."), Behaviour(text=SUMMARY))
    await shopper.say(QUESTIONS[0])  # the prompt holds FAQ turns 2 and 3 and leaves the first out
    await shopper.until("stream.end")
    await chat_tasks.drain()
    assert len(remote.requests) == 2
    transcript = remote.requests[-1]["messages"][-1]["content"]
    assert "Shopper: can I pay by card?" in transcript and "Visa, Mastercard" in transcript
    assert FAQ_QUESTIONS[1] in transcript  # turns 1 and 2 left the window of 2 after the fourth
    conv = await database_sync_to_async(conversation)(shopper)
    assert conv.summary == SUMMARY and conv.summary_upto_seq == 4


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_answering_loop_never_waits_for_a_summary(make_client, faq, remote, monkeypatch, _flushed):
    release, started = threading.Event(), threading.Event()

    def held(*, conversation_id: Any) -> None:
        started.set()
        release.wait(30)

    monkeypatch.setattr(chat_tasks, "conversation_summarise", held)
    shopper = await chat(make_client, QUESTIONS)  # the fourth's prompt left the first turn out
    assert started.wait(10)  # the summary (eager Celery) is running, and held
    await shopper.say(MORE_QUESTIONS[0])
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


def _conversation_with_turns(**fields: Any) -> Conversation:
    """A conversation of 2 turns and a third question: with a window of 2, the first turn is due."""
    from chat.models import Message

    conv = Conversation.objects.create(token_hash="2" * 64, **fields)
    for seq, (role, text) in enumerate(
        [("shopper", QUESTIONS[0]), ("bot", "Yes."), ("shopper", QUESTIONS[1]), ("bot", "Yes."), ("shopper", "ok")], 1
    ):
        Message.objects.create(conversation=conv, seq=seq, role=role, text=text, state="done")
    return conv


@pytest.mark.django_db(transaction=True)
def test_a_summary_is_paid_from_the_shoppers_budget_like_an_answer(settings, remote):
    from decimal import Decimal

    from routing.models import BudgetCounter

    settings.KEFU_BUDGETS_ENABLED = True
    conv = _conversation_with_turns(address_key="a" * 32)
    remote.push(Behaviour(text=SUMMARY, prompt_tokens=300, completion_tokens=40))
    assert conversation_summarise(conversation_id=conv.pk) == SUMMARY
    spent = {c.kind: c.spent_usd for c in BudgetCounter.objects.filter(period="day")}
    # fake-simple at the tests' list prices: 300 x $0.28/M + 40 x $0.42/M = $0.0001008, $0.000101 in
    # the ledger's and the counters' whole micro-dollars
    assert UpstreamCall.objects.get().cost_usd == Decimal("0.000101")
    assert spent["conversation"] == spent["address"] == Decimal("0.000101")


@pytest.mark.django_db(transaction=True)
def test_a_verified_customers_summary_is_on_her_budget(settings, remote):
    from routing.models import BudgetCounter

    settings.KEFU_BUDGETS_ENABLED = True
    conv = _conversation_with_turns(customer_id="demo-mei")
    remote.push(Behaviour(text=SUMMARY, prompt_tokens=300, completion_tokens=40))
    assert conversation_summarise(conversation_id=conv.pk) == SUMMARY
    assert BudgetCounter.objects.filter(kind="customer", period="day").count() == 1
    assert not BudgetCounter.objects.filter(kind="conversation").exists()


@pytest.mark.django_db(transaction=True)
def test_a_shopper_whose_budget_is_spent_gets_no_summary(settings, remote):
    from decimal import Decimal

    from django.utils import timezone

    from routing.models import BudgetCounter

    settings.KEFU_BUDGETS_ENABLED = True
    settings.KEFU_BUDGET_SHOPPER_DAY_USD = 0.01
    conv = _conversation_with_turns()
    BudgetCounter.objects.create(
        kind="conversation",
        key=str(conv.pk),
        period="day",
        starts_on=timezone.localdate(),
        spent_usd=Decimal("0.01"),
        limit_usd=Decimal("0.01"),
    )
    remote.push(Behaviour(text=SUMMARY))
    assert conversation_summarise(conversation_id=conv.pk) is None
    assert remote.requests == []
    conv.refresh_from_db()
    assert conv.summary == "" and conv.summary_upto_seq == 0


@pytest.mark.django_db
def test_the_prompt_history_says_whether_older_turns_lack_a_summary():
    """``chat.selectors.prompt_history``'s third value, read with the history's own two queries."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from chat.selectors import prompt_history

    conv = _conversation_with_turns()
    with CaptureQueriesContext(connection) as queries:
        rows, summary, older = prompt_history(conversation_id=conv.pk, before_seq=5, turns=1)
    assert [m.seq for m in rows] == [3, 4] and summary == "" and older is True and len(queries) == 2
    assert prompt_history(conversation_id=conv.pk, before_seq=5, turns=2)[2] is False  # all of it is in
    from chat.models import Message

    Message.objects.create(conversation=conv, seq=6, role="bot", text="Good.", state="done")
    rows, _, older = prompt_history(conversation_id=conv.pk, before_seq=7, turns=2)  # 3 whole turns, 2 kept
    assert [m.seq for m in rows] == [3, 4, 5, 6] and older is True
    Conversation.objects.filter(pk=conv.pk).update(summary="Asked about the oak table.", summary_upto_seq=2)
    assert prompt_history(conversation_id=conv.pk, before_seq=5, turns=1)[2] is False  # the summary covers it
    for seq in range(7, 30):  # more than a turn's worth of rows beyond the window: seen by seq
        Message.objects.create(conversation=conv, seq=seq, role="bot", text="More.", state="done")
    assert prompt_history(conversation_id=conv.pk, before_seq=30, turns=1)[2] is True
