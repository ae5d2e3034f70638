"""What detecting a message's language costs (issue 39, item 1): a text that cannot show its
language is not detected by the answering loop (``lib.text.can_show_language``), and a repeated
text is detected once (the detector's bounded LRU). Both must leave every answer as it was: the
cheap check never says "cannot" for a text the detector would call confident."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lib.text import DEFAULT_LANGUAGES, MEMO_MAX_CHARS, MEMO_SIZE, Detected, LanguageDetector

ROOT = Path(__file__).resolve().parents[1]

SHORT = ["ok", "no", "Merci", "hola", "thanks", "???", "123", "ok!", "#4411", "y el azul?", "da"]


@pytest.fixture(scope="module")
def detector() -> LanguageDetector:
    return LanguageDetector(DEFAULT_LANGUAGES)


def team_questions() -> list[str]:
    """The team's short store questions in eleven languages (bench/language_eval.py's set)."""
    lines = (ROOT / "bench" / "data" / "language_questions.tsv").read_text(encoding="utf-8").splitlines()
    return [line.split("\t", 1)[1] for line in lines if "\t" in line]


@pytest.mark.parametrize("text", SHORT)
def test_a_text_too_short_to_tell_cannot_show_its_language(detector: LanguageDetector, text: str) -> None:
    assert not detector.can_show_language(text)
    for fallback in ("en", "es", "fr", "zh"):
        assert not detector.detect(text, fallback).confident


@pytest.mark.parametrize(
    "text", ["好", "はい", "네", "Where is my order?", "¿Hacen envíos a México?", "Где мой заказ?"]
)
def test_a_script_or_a_sentence_can_show_its_language(detector: LanguageDetector, text: str) -> None:
    assert detector.can_show_language(text)


def test_the_check_never_hides_a_confident_detection(detector: LanguageDetector) -> None:
    """Over every team question and its first word and two words (short texts of every script),
    in an English and a Chinese conversation: "cannot show" implies "not confident"."""
    texts = team_questions()
    assert len(texts) > 100
    probes = set(texts) | {t.split()[0] for t in texts if t.split()} | {" ".join(t.split()[:2]) for t in texts}
    hidden = [
        (t, f)
        for t in sorted(probes)
        for f in ("en", "zh")
        if not detector.can_show_language(t) and detector.detect(t, f).confident
    ]
    assert hidden == []


class CountingLingua:
    """lingua's detector, counting the texts it is asked about."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.asked = inner, []

    def compute_language_confidence_values(self, text: str) -> Any:
        self.asked.append(text)
        return self.inner.compute_language_confidence_values(text)


def test_a_repeated_text_is_detected_once_and_told_the_same() -> None:
    detector = LanguageDetector(["en", "es", "fr"])
    counting = CountingLingua(detector._lingua_detector())
    detector._detector = counting
    first = detector.detect("Je voudrais retourner un article", "en")
    again = [detector.detect("Je voudrais retourner un article", "en") for _ in range(5)]
    assert first == Detected("fr", True) and all(a == first for a in again)
    assert counting.asked == ["Je voudrais retourner un article"]
    # The conversation's language is part of what is remembered: another one is asked afresh.
    assert detector.detect("y el azul?", "es") == Detected("es", False)
    assert detector.detect("y el azul?", "en") == Detected("en", False)
    assert counting.asked.count("y el azul?") == 2


def test_the_memo_is_bounded_and_long_texts_are_not_kept() -> None:
    detector = LanguageDetector(["en", "es"])
    counting = CountingLingua(detector._lingua_detector())
    detector._detector = counting
    long_text = "Where is my order? " * (MEMO_MAX_CHARS // 19 + 1)
    assert len(long_text) > MEMO_MAX_CHARS
    detector.detect(long_text, "en")
    detector.detect(long_text, "en")
    assert counting.asked.count(long_text) == 2
    assert detector._memo.cache_info().maxsize == MEMO_SIZE
    for i in range(MEMO_SIZE + 10):
        detector.detect(f"order number {i} where is it", "en")
    assert detector._memo.cache_info().currsize == MEMO_SIZE
