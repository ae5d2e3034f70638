"""routing.decide.repeat without a socket: which messages say "that's not what I asked" (each
default language), the window of turns a complaint holds for, and the same-question rule."""

from __future__ import annotations

import numpy as np
import pytest

from routing.decide.repeat import MISSED, REPLIES, TURNS, complaint_in_reach, same_question, says_missed
from routing.faq.model import FaqMatch
from routing.types import Question

SAYS_MISSED = {
    "en": "No, that's not what I asked!",
    "zh": "我不是问这个。",
    "ja": "質問の答えになっていません",
    "ko": "제가 물어본 게 아니에요",
    "es": "No, eso no es lo que pregunté",
    "fr": "Ce n’est pas ce que j’ai demandé.",
    "de": "Nein, das habe ich nicht gefragt.",
    "it": "Non è quello che ho chiesto",
    "pt": "Não foi isso que eu perguntei",
    "nl": "Dat is niet wat ik vroeg",
    "ru": "Я не об этом спрашивал",
}

NOT_MISSED = [
    "That's not what I asked, I want to know how long delivery takes",  # goes on to ask
    "What did I ask about earlier?",
    "How long does delivery take?",
    "I asked for a refund last week, where is it?",
    "这不是我买的颜色",
    "Das ist nicht meine Bestellung",
]


def test_every_default_language_has_phrases_and_a_reply():
    assert set(MISSED) == set(REPLIES) == {"en", "zh", "ja", "ko", "es", "fr", "de", "it", "pt", "nl", "ru"}


@pytest.mark.parametrize("locale", list(SAYS_MISSED))
def test_a_message_that_says_the_answer_missed_is_recognised(locale):
    assert says_missed(SAYS_MISSED[locale])


@pytest.mark.parametrize("text", NOT_MISSED)
def test_a_question_is_not_taken_for_a_complaint(text):
    assert not says_missed(text)


def question(seq: int, *, at: int = 4, session_from: int = 0) -> Question:
    return Question(
        conversation_id=None,
        message_id=None,
        seq=seq,
        text="x",
        session_from_seq=session_from,
        complaint_at_seq=at,
        complaint_kind="down",
        complaint_question="How long does delivery take?",
    )


def test_a_complaint_holds_for_the_next_three_shopper_messages():
    # Complained at seq 4 (the rated answer); the shopper's next messages are 5, 7, 9, 11.
    assert TURNS == 3
    assert [complaint_in_reach(question(seq)) for seq in (5, 7, 9, 11)] == [True, True, True, False]
    assert not complaint_in_reach(question(5, at=0))  # no complaint
    assert not complaint_in_reach(question(5, session_from=4 + 1))  # made in an earlier session


def match(intent: str | None, accepted: bool = True) -> FaqMatch:
    return FaqMatch(
        entry_id=1 if accepted else None,
        intent=intent if accepted else None,
        confidence=0.9 if accepted else 0.1,
        similarity=0.8,
        accepted=accepted,
        reason="confident" if accepted else "low_confidence",
    )


def test_the_faq_intent_decides_before_the_cosine():
    a, b = np.array([1.0, 0.0]), np.array([0.6, 0.8])  # cosine 0.6
    assert same_question(a, b, match("shipping_time"), match("shipping_time"))
    near = np.array([0.999, np.sqrt(1 - 0.999**2)])  # cosine 0.999
    assert not same_question(a, near, match("shipping_time"), match("shipping_costs"))
    assert not same_question(a, near, match("shipping_time"), match(None, accepted=False))
    # No FAQ verdict (a language the FAQ lacks), or neither accepted: the cosine.
    assert same_question(a, near, None, None)
    assert same_question(a, near, match(None, accepted=False), match(None, accepted=False))
    assert not same_question(a, b, None, None)
