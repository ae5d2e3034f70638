"""The prompt's history puts every bot answer right after the question it replies to (issue 29):
two messages sent 50 ms apart are stored as seqs 1 and 2, and the first answer's row, written
once it was ready, takes seq 3. The second message waits for that answer (one answer at a time per
conversation, tests/chat/test_serial_across_workers.py), and its prompt must read question 1,
answer 1, question 2 — not question 1 alone (the answer's seq is past the second question's)."""

from __future__ import annotations

import pytest

from chat import selectors, services
from chat.models import Conversation, Message, MessageState, Role

pytestmark = pytest.mark.django_db

Q1 = "Do you ship to Canada?"
A1 = "Yes, we ship to Canada in 5 to 8 business days."
Q2 = "And how much does that cost?"
A2 = "Shipping to Canada costs 12 USD."
Q3 = "Can I track it?"


def conversation(*rows: tuple[int, str, str, int | None, str]) -> Conversation:
    """A conversation holding ``rows``: (seq, role, text, reply_to_seq, state)."""
    conv, _ = services.conversation_start()
    for seq, role, text, reply_to, state in rows:
        Message.objects.create(conversation=conv, seq=seq, role=role, text=text, reply_to_seq=reply_to, state=state)
    Conversation.objects.filter(pk=conv.pk).update(last_seq=max(r[0] for r in rows))
    return conv


def history(conv: Conversation, before_seq: int, turns: int = 6) -> list[tuple[str, str]]:
    rows, _summary, _older = selectors.prompt_history(conversation_id=conv.pk, before_seq=before_seq, turns=turns)
    return [(m.role, m.text) for m in rows]


DONE = MessageState.DONE


def test_the_second_prompt_has_the_first_answer_written_after_the_second_question() -> None:
    conv = conversation(
        (1, Role.SHOPPER, Q1, None, DONE), (2, Role.SHOPPER, Q2, None, DONE), (3, Role.BOT, A1, 1, DONE)
    )
    assert history(conv, before_seq=2) == [(Role.SHOPPER, Q1), (Role.BOT, A1)]


def test_answers_follow_their_questions_whatever_seq_they_took() -> None:
    conv = conversation(
        (1, Role.SHOPPER, Q1, None, DONE),
        (2, Role.SHOPPER, Q2, None, DONE),
        (3, Role.BOT, A1, 1, DONE),
        (4, Role.BOT, A2, 2, DONE),
        (5, Role.SHOPPER, Q3, None, DONE),
    )
    assert history(conv, before_seq=5) == [(Role.SHOPPER, Q1), (Role.BOT, A1), (Role.SHOPPER, Q2), (Role.BOT, A2)]


def test_the_answer_to_the_question_itself_or_a_later_one_is_never_in_its_history() -> None:
    conv = conversation(
        (1, Role.SHOPPER, Q1, None, DONE),
        (2, Role.SHOPPER, Q2, None, DONE),
        (3, Role.BOT, A2, 2, DONE),  # answered out of order: the second question's answer
        (4, Role.BOT, A1, 1, DONE),
    )
    assert history(conv, before_seq=2) == [(Role.SHOPPER, Q1), (Role.BOT, A1)]


def test_an_answer_still_streaming_is_left_out() -> None:
    conv = conversation(
        (1, Role.SHOPPER, Q1, None, DONE), (2, Role.SHOPPER, Q2, None, DONE), (3, Role.BOT, "Yes, we", 1, "streaming")
    )
    assert history(conv, before_seq=2) == [(Role.SHOPPER, Q1)]


def test_the_turn_limit_keeps_the_latest_whole_turns() -> None:
    conv = conversation(
        (1, Role.SHOPPER, Q1, None, DONE),
        (2, Role.SHOPPER, Q2, None, DONE),
        (3, Role.BOT, A1, 1, DONE),
        (4, Role.BOT, A2, 2, DONE),
        (5, Role.SHOPPER, Q3, None, DONE),
    )
    assert history(conv, before_seq=5, turns=1) == [(Role.SHOPPER, Q2), (Role.BOT, A2)]
