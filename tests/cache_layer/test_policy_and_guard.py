"""Pure functions: exact keys, what may be cached, the key-term guard."""

from __future__ import annotations

import pytest

from cache_layer.normalise import exact_key_text
from cache_layer.policy import is_follow_up, may_cache_answer, may_cache_question, personal_data
from cache_layer.similarity import guard


@pytest.mark.parametrize(
    "a, b",
    [
        ("Do you ship to Canada?", "do you ship to canada"),
        ("ＤＯ　ＹＯＵ ship to Canada ？", "do you ship to canada"),
        ("Don't you ship to Canada?!", "dont you ship   to canada"),
        ("多久能送到？", "多久 能 送到"),
    ],
)
def test_exact_key_text_merges_case_width_punctuation_spacing(a: str, b: str) -> None:
    assert exact_key_text(a) == exact_key_text(b)


def test_exact_key_text_keeps_numbers() -> None:
    assert exact_key_text("2 items") != exact_key_text("3 items")


@pytest.mark.parametrize(
    "text, reason",
    [
        ("Where is my order 48213377? It has not arrived.", "order_number"),
        ("please write to alice@example.com", "email"),
        ("my number is +1 (555) 123-4567", "phone_number"),
        ("card 4111 1111 1111 1111 was declined", "card_number"),
        ("send it to 221 Baker Street", "street_address"),
        ("送到南京路100号", "street_address"),
        ("my name is bob and I need help", "name"),
        ("I am Alice, where is my parcel", "name"),
        ("我叫小明", "name"),
        ("Mr. Smith ordered a lamp, is it shipped?", "name"),
        ("can Dr Jones pick up the parcel", "name"),
        ("Mrs. Lee wants a refund", "name"),
        ("ask mr smith about the delivery", "name"),
        ("and the blue one?", "follow_up"),
        ("what about it", "follow_up"),
        ("那这个呢", "follow_up"),
        ("how much is it?", "follow_up"),
        ("", "empty"),
    ],
)
def test_questions_that_may_not_be_cached(text: str, reason: str) -> None:
    assert may_cache_question(text) == (False, reason)


@pytest.mark.parametrize(
    "text",
    ["Do you ship to Canada?", "How do I cancel my order?", "I am unhappy with the delivery time", "多久能送到？"],
)
def test_standalone_questions_may_be_cached(text: str) -> None:
    assert may_cache_question(text) == (True, "ok")
    assert not is_follow_up(text)


def test_answers_with_personal_data_or_empty_are_refused() -> None:
    assert may_cache_answer("Your order 48213377 ships tomorrow.") == (False, "order_number")
    assert may_cache_answer("  ") == (False, "empty")
    assert may_cache_answer("Orders ship within 1 business day.") == (True, "ok")


@pytest.mark.parametrize(
    "text",
    [
        "Thanks, Alice! Yes, we ship to Canada.",
        "Hi Bob, the lamp has a dimmer.",
        "Yes. Thank you, Chen. Orders ship in 2 days.",
        "Welcome back, Maria!",
        "Dear Ms Chen, your refund is on its way.",
    ],
)
def test_answers_that_greet_someone_by_name_are_refused(text: str) -> None:
    assert may_cache_answer(text)[0] is False


@pytest.mark.parametrize(
    "text",
    [
        "Hello there! We ship to Canada.",
        "Thanks for asking. Orders ship in 2 days.",
        "Hi! The lamp has a dimmer.",
        "Sorry, Canada is not covered yet.",
        "Hi, Canada orders ship in 3 days.",
    ],
)
def test_greetings_without_a_name_may_be_cached(text: str) -> None:
    assert may_cache_answer(text) == (True, "ok")


@pytest.mark.parametrize(
    "a, b, reason_start",
    [
        ("How do I cancel my order?", "How do I cancel my subscription?", "content_substituted"),
        ("I was charged twice", "I was never charged", "numbers_differ"),
        ("I was charged", "I was never charged", "negation_mismatch"),
        ("Can I return 2 items?", "Can I return 3 items?", "numbers_differ"),
        ("我收到货了", "我没收到货", "negation_mismatch"),
    ],
)
def test_guard_blocks_look_alikes(a: str, b: str, reason_start: str) -> None:
    ok, reason = guard(a, b)
    assert not ok and reason.startswith(reason_start)
    assert guard(b, a)[0] is False  # symmetric


@pytest.mark.parametrize(
    "a, b",
    [
        ("How do I cancel my order?", "how can I cancel my purchase"),
        ("Do you ship to Canada?", "do you deliver to canada"),
        ("能不能退货", "可以退货吗"),
    ],
)
def test_guard_lets_paraphrases_through(a: str, b: str) -> None:
    assert guard(a, b) == (True, "ok")


@pytest.mark.parametrize(
    "text, kind",
    [
        ("Your reference is Acc41652be85a, see you", None),  # digits inside a hash-like token
        ("ORD48213377 has not arrived", "order_number"),  # letter prefix only: still an order number
        ("order 48213377th", "order_number"),
        ("call 555-123-4567", "phone_number"),
    ],
)
def test_digits_inside_a_word_are_not_personal_but_ids_are(text: str, kind: str | None) -> None:
    assert personal_data(text) == kind


def test_hard_guard_numbers_negation_and_named_things() -> None:
    from cache_layer.similarity import hard_guard

    assert hard_guard("shipping to Detroit", "shipping to Toronto") == (False, "named_thing_differs: detroit toronto")
    assert hard_guard("cancelling Pro account", "cancelling pro account") == (True, "ok")
    assert hard_guard("I need help with 2 items", "I need help with 3 items") == (False, "numbers_differ")
    assert hard_guard("I was charged", "I was not charged") == (False, "negation_mismatch")


def test_semantic_verdict_rules() -> None:
    from cache_layer.intent_model import Resolved
    from cache_layer.similarity import Verdict, semantic_verdict

    same = (Resolved("cancel_order", 0.9), Resolved("cancel_order", 0.8))
    other = (Resolved("cancel_order", 0.9), Resolved("change_order", 0.9))
    kw = dict(lexical_threshold=0.95, intent_threshold=0.85, intent_confidence=0.7)
    assert (
        semantic_verdict("cancel my order", "call off my purchase", similarity=0.88, resolved=same, **kw).rule
        == "same_intent"
    )
    assert semantic_verdict("cancel my order", "call off my purchase", similarity=0.80, resolved=same, **kw).ok is False
    # Different intents never hit, however close the cosine.
    assert semantic_verdict("cancel my order", "change my order", similarity=0.99, resolved=other, **kw) == Verdict(
        False, "intent_differs"
    )
    # Unsure intents fall back to the lexical rule.
    unsure = (Resolved("cancel_order", 0.5), Resolved("cancel_order", 0.5))
    assert (
        semantic_verdict("cancel my order", "cancel my order please", similarity=0.97, resolved=unsure, **kw).rule
        == "lexical"
    )
    assert (
        semantic_verdict("cancel my order", "call off my purchase", similarity=0.97, resolved=unsure, **kw).ok is False
    )
