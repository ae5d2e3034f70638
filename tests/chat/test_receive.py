"""Storing a shopper message and claiming it for answering in the same transaction
(``services.message_receive(claim=True)``): a message is claimed only when no older one waits, so
messages are always answered in order."""

from __future__ import annotations

import pytest

from chat import services
from chat.errors import AgentHolds, AnswerInFlight
from chat.models import Conversation, ConversationStatus, Message, MessageState, Role
from routing.types import AnswerRecord

pytestmark = pytest.mark.django_db


def answered_seq(conv: Conversation) -> int:
    return Conversation.objects.values_list("answered_seq", flat=True).get(pk=conv.pk)


def test_a_message_in_an_idle_conversation_is_claimed_with_its_store() -> None:
    conv, _ = services.conversation_start()
    got = services.message_receive(conversation_id=conv.id, client_id="c1", text="Do you ship to Canada?", claim=True)
    assert got.created and got.claimed is not None and got.claimed.answered_seq == got.message.seq == 1
    assert answered_seq(conv) == 1
    assert services.answer_claim(conversation_id=conv.id) is None  # nothing else to answer


def answer(conv: Conversation, seq: int, text: str = "An answer.") -> Message:
    """Store the fixed answer to shopper message ``seq`` (which ends its claim)."""
    record = AnswerRecord(text=text, route="faq", ttft_ms=1.0, latency_ms=1.0, cut=False)
    return services.bot_message_answered(conversation_id=conv.id, reply_to_seq=seq, record=record)[0]


def test_a_message_is_not_claimed_while_an_older_one_waits_and_the_older_is_answered_first() -> None:
    # Issue 29 (one answer at a time per conversation): the second claim comes after the first
    # message's answer is stored; before it, the second is not claimed (the tests below).
    conv, _ = services.conversation_start()
    older = services.message_receive(conversation_id=conv.id, client_id="c1", text="first question", claim=False)
    newer = services.message_receive(conversation_id=conv.id, client_id="c2", text="second question", claim=True)
    assert older.claimed is None and newer.claimed is None
    assert answered_seq(conv) == 0
    claimed = services.answer_claim(conversation_id=conv.id)
    assert claimed is not None and claimed[0].text == "first question"
    answer(conv, claimed[0].seq)
    claimed = services.answer_claim(conversation_id=conv.id)
    assert claimed is not None and claimed[0].text == "second question"
    assert answered_seq(conv) == newer.message.seq


def test_a_message_is_not_claimed_while_the_answer_before_it_is_claimed() -> None:
    """Issue 29: the first message is claimed (its answer is being prepared, maybe on another
    worker); the second is stored but not claimed, and a loop asking for it is told to wait."""
    conv, _ = services.conversation_start()
    first = services.message_receive(conversation_id=conv.id, client_id="c1", text="first question", claim=True)
    second = services.message_receive(conversation_id=conv.id, client_id="c2", text="second question", claim=True)
    assert first.claimed is not None and second.created and second.claimed is None
    with pytest.raises(AnswerInFlight):
        services.answer_claim(conversation_id=conv.id)
    assert answered_seq(conv) == first.message.seq
    answer(conv, first.message.seq)
    claimed = services.answer_claim(conversation_id=conv.id)
    assert claimed is not None and claimed[0].pk == second.message.pk and answered_seq(conv) == second.message.seq


def test_a_message_is_not_claimed_while_an_answer_streams_and_is_once_it_ended() -> None:
    """Issue 29: an answer row still streaming holds the next message back (its claim ended when
    the row was written); once the row is finished, the message is claimed."""
    conv, _ = services.conversation_start()
    first = services.message_receive(conversation_id=conv.id, client_id="c1", text="first question", claim=True)
    bot, _epoch = services.bot_message_begin(
        conversation_id=conv.id, reply_to_seq=first.message.seq, route="llm.simple"
    )
    assert Conversation.objects.get(pk=conv.pk).claim_until is None
    second = services.message_receive(conversation_id=conv.id, client_id="c2", text="second question", claim=True)
    assert second.claimed is None
    with pytest.raises(AnswerInFlight):
        services.answer_claim(conversation_id=conv.id)
    record = AnswerRecord(text="The first answer.", route="llm.simple", ttft_ms=1.0, latency_ms=2.0, cut=False)
    assert services.bot_message_finish(message_id=bot.pk, record=record) is not None
    claimed = services.answer_claim(conversation_id=conv.id)
    assert claimed is not None and claimed[0].pk == second.message.pk


def test_an_answer_streaming_in_another_conversation_holds_nothing_back() -> None:
    other, _ = services.conversation_start()
    asked = services.message_receive(conversation_id=other.id, client_id="c1", text="question", claim=True)
    services.bot_message_begin(conversation_id=other.id, reply_to_seq=asked.message.seq, route="llm.simple")
    conv, _ = services.conversation_start()
    got = services.message_receive(conversation_id=conv.id, client_id="c1", text="mine", claim=True)
    assert got.claimed is not None


def test_bot_and_agent_messages_in_between_do_not_block_the_claim() -> None:
    # The answer is finished before the second message (issue 29: one still streaming holds the
    # next message back, test_a_message_is_not_claimed_while_an_answer_streams_and_is_once_it_ended).
    conv, _ = services.conversation_start()
    first = services.message_receive(conversation_id=conv.id, client_id="c1", text="hello there", claim=True)
    assert first.claimed is not None
    bot, _epoch = services.bot_message_begin(conversation_id=conv.id, reply_to_seq=first.message.seq, route="faq")
    record = AnswerRecord(text="Hello!", route="faq", ttft_ms=1.0, latency_ms=1.0, cut=False)
    assert services.bot_message_finish(message_id=bot.pk, record=record) is not None
    second = services.message_receive(conversation_id=conv.id, client_id="c2", text="and returns?", claim=True)
    assert second.claimed is not None and second.message.seq == bot.seq + 1
    assert answered_seq(conv) == second.message.seq
    assert list(Message.objects.filter(conversation=conv).order_by("seq").values_list("role", flat=True)) == [
        Role.SHOPPER,
        Role.BOT,
        Role.SHOPPER,
    ]


def test_a_resend_is_neither_stored_nor_claimed_twice() -> None:
    conv, _ = services.conversation_start()
    a = services.message_receive(conversation_id=conv.id, client_id="same", text="Where is my parcel?", claim=True)
    b = services.message_receive(conversation_id=conv.id, client_id="same", text="Where is my parcel?", claim=True)
    assert a.created and not b.created and b.claimed is None and b.message.pk == a.message.pk
    assert Message.objects.filter(conversation=conv).count() == 1 and answered_seq(conv) == 1


def test_a_fixed_answer_is_stored_done_in_one_write_and_ends_the_claim() -> None:
    conv, _ = services.conversation_start()
    asked = services.message_receive(conversation_id=conv.id, client_id="c1", text="returns?", claim=True)
    record = AnswerRecord(
        text="You can return unused items within 30 days.", route="faq", ttft_ms=4.0, latency_ms=4.0, cut=False
    )
    bot, epoch = services.bot_message_answered(conversation_id=conv.id, reply_to_seq=asked.message.seq, record=record)
    row = Message.objects.get(pk=bot.pk)
    assert (row.seq, row.role, row.state, row.text, row.route, row.reply_to_seq, row.lease_until) == (
        2,
        Role.BOT,
        MessageState.DONE,
        "You can return unused items within 30 days.",
        "faq",
        1,
        None,
    )
    conv.refresh_from_db()
    assert conv.last_seq == 2 and conv.claim_until is None and epoch == conv.owner_epoch


def test_a_fixed_answer_to_a_conversation_an_agent_holds_writes_nothing() -> None:
    conv, _ = services.conversation_start()
    asked = services.message_receive(conversation_id=conv.id, client_id="c1", text="returns?", claim=True)
    Conversation.objects.filter(pk=conv.id).update(status=ConversationStatus.AGENT)
    record = AnswerRecord(text="Within 30 days.", route="faq", ttft_ms=1.0, latency_ms=1.0, cut=False)
    with pytest.raises(AgentHolds):
        services.bot_message_answered(conversation_id=conv.id, reply_to_seq=asked.message.seq, record=record)
    conv.refresh_from_db()
    assert conv.last_seq == 1 and conv.claim_until is not None
    assert list(Message.objects.filter(conversation=conv).values_list("role", flat=True)) == [Role.SHOPPER]


def test_the_claim_returns_what_answering_reads() -> None:
    conv, _ = services.conversation_start(locale="zh")
    services.message_receive(conversation_id=conv.id, client_id="c1", text="运费多少？", claim=False)
    claimed = services.answer_claim(conversation_id=conv.id)
    assert claimed is not None
    message, conversation = claimed
    assert (message.text, message.seq, message.role) == ("运费多少？", 1, Role.SHOPPER)
    assert (conversation.id, conversation.status, conversation.locale) == (conv.id, ConversationStatus.BOT, "zh")
    assert (conversation.answered_seq, conversation.last_seq) == (1, 1)
    assert Conversation.objects.get(pk=conv.pk).claim_until is not None


@pytest.mark.django_db(transaction=True)
def test_two_loops_claiming_at_once_claim_every_message_once() -> None:
    # Each loop answers what it claimed before claiming again (issue 29: while one claim is in
    # flight no other message of the conversation is claimed, so a loop that finds one in flight
    # asks again). Every message is claimed once, in order, never two at a time.
    import threading

    from django.db import connection

    conv, _ = services.conversation_start()
    for i in range(12):
        services.message_receive(conversation_id=conv.id, client_id=f"c{i}", text=f"question {i}", claim=False)
    claimed: list[list[int]] = [[], []]
    unanswered_before: list[tuple[int, list[int]]] = []
    start = threading.Barrier(2)

    def loop(mine: list[int]) -> None:
        try:
            start.wait()
            while True:
                try:
                    got = services.answer_claim(conversation_id=conv.id)
                except AnswerInFlight:
                    continue
                if got is None:
                    return
                seq = got[0].seq
                answered = set(
                    Message.objects.filter(conversation=conv, role=Role.BOT).values_list("reply_to_seq", flat=True)
                )
                if missing := [s for s in range(1, seq) if s not in answered]:
                    unanswered_before.append((seq, missing))
                mine.append(seq)
                answer(conv, seq)
        finally:
            connection.close()

    threads = [threading.Thread(target=loop, args=(c,)) for c in claimed]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(claimed[0] + claimed[1]) == list(range(1, 13))
    assert claimed[0] == sorted(claimed[0]) and claimed[1] == sorted(claimed[1])
    assert unanswered_before == []  # each message was claimed after every one before it was answered


def test_a_sweep_finishing_a_dead_workers_answer_keeps_its_question_ahead_of_the_next() -> None:
    """Issue 29: the answer's worker died; the sweep ends its row as cut and answers the question
    again, holding the claim on it meanwhile, so the message waiting behind it is not answered
    first (and its prompt then has the answer again)."""
    conv, _ = services.conversation_start()
    first = services.message_receive(conversation_id=conv.id, client_id="c1", text="first question", claim=True)
    bot, _epoch = services.bot_message_begin(
        conversation_id=conv.id, reply_to_seq=first.message.seq, route="llm.simple"
    )
    second = services.message_receive(conversation_id=conv.id, client_id="c2", text="second question", claim=True)
    assert second.claimed is None
    row = services.orphan_finish(message_id=bot.pk, text="Yes, the", answer_again=True)
    assert row is not None and row.cut and row.state == MessageState.DONE
    assert Conversation.objects.get(pk=conv.pk).claim_until is not None
    with pytest.raises(AnswerInFlight):
        services.answer_claim(conversation_id=conv.id)
    answer(conv, first.message.seq, "Yes, the lamp has a dimmer.")  # the question answered again
    claimed = services.answer_claim(conversation_id=conv.id)
    assert claimed is not None and claimed[0].pk == second.message.pk


def test_a_sweep_taking_an_orphaned_claim_holds_it_for_the_answer() -> None:
    from datetime import timedelta

    from django.utils import timezone

    conv, _ = services.conversation_start()
    services.message_receive(conversation_id=conv.id, client_id="c1", text="first question", claim=True)
    ran_out = timezone.now() - timedelta(seconds=1)
    Conversation.objects.filter(pk=conv.pk).update(claim_until=ran_out)
    second = services.message_receive(conversation_id=conv.id, client_id="c2", text="second question", claim=True)
    assert second.claimed is None
    assert services.orphan_claim_take(conversation_id=conv.id, claim_until=ran_out)
    held = Conversation.objects.get(pk=conv.pk).claim_until
    assert held is not None and held > timezone.now()
    with pytest.raises(AnswerInFlight):
        services.answer_claim(conversation_id=conv.id)


def test_the_claimed_conversation_carries_its_session_start_on_both_claim_paths() -> None:
    # The router's task state and complaint checks are per session (Question.session_from_seq):
    # before, both claim statements left it at 0, so a task of an earlier session still applied.
    conv, _ = services.conversation_start()
    first = services.message_receive(conversation_id=conv.id, client_id="c1", text="Hello", claim=True)
    answer(conv, first.message.seq)
    Conversation.objects.filter(pk=conv.pk).update(session_from_seq=2)  # a new session began after seq 2
    got = services.message_receive(conversation_id=conv.id, client_id="c2", text="Where is my order?", claim=True)
    assert got.claimed is not None and got.claimed.session_from_seq == 2
    answer(conv, got.message.seq)
    services.message_receive(conversation_id=conv.id, client_id="c3", text="And the other one?", claim=False)
    claimed = services.answer_claim(conversation_id=conv.id)
    assert claimed is not None and claimed[1].session_from_seq == 2
