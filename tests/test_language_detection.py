"""The shopper's language (lib/text.py): script first, lingua for the rest, the conversation's
language for a text too short to tell, and a clear error for a language kefu cannot detect."""

from __future__ import annotations

import pytest

from lib.text import DEFAULT_LANGUAGES, Detected, LanguageDetector, language_name, supported_locale
from tests.test_settings import check


@pytest.fixture(scope="module")
def detector() -> LanguageDetector:
    return LanguageDetector(DEFAULT_LANGUAGES)


@pytest.mark.parametrize(
    ("text", "locale"),
    [
        ("¿Hacen envíos a México?", "es"),
        ("Je voudrais retourner un article", "fr"),
        ("Ich möchte meine Bestellung stornieren", "de"),
        ("Onde está a minha encomenda?", "pt"),
        ("Vorrei restituire un prodotto", "it"),
        ("Waar is mijn bestelling?", "nl"),
        ("Где мой заказ?", "ru"),
        ("주문을 취소하고 싶어요", "ko"),
        ("你们发货到加拿大吗？", "zh"),
        ("I need help with my PayPal payment", "en"),
    ],
)
def test_a_plain_question_is_told_confidently(detector: LanguageDetector, text: str, locale: str) -> None:
    assert detector.detect(text, "en") == Detected(locale, True)


def test_japanese_with_kanji_is_japanese_not_chinese(detector: LanguageDetector) -> None:
    # Kanji alone read as Chinese before; the kana give Japanese away.
    assert detector.detect("注文をキャンセルしたいです", "zh") == Detected("ja", True)
    assert detector.detect("配送料はいくらですか？", "en").locale == "ja"


def test_terse_misspelt_english_store_questions_stay_english(detector: LanguageDetector) -> None:
    # Bitext's style: lingua alone reads these as German, French or Spanish at low confidence.
    for text in ("refund $299", "contact agent", "can I orderr from Mexico?", "edit order 00123842"):
        assert detector.detect(text, "en").locale == "en", text


def test_a_short_turn_keeps_the_conversations_language(detector: LanguageDetector) -> None:
    assert detector.detect("y el azul?", "es") == Detected("es", False)
    assert detector.detect("ok", "fr") == Detected("fr", False)
    assert detector.detect("???", "de") == Detected("de", False)
    assert detector.detect("12345", "es-MX") == Detected("es", False)


def test_english_in_a_spanish_conversation_is_answered_in_english(detector: LanguageDetector) -> None:
    # lingua gives short English questions low confidence (0.27 here): English stands all the same.
    assert detector.detect("Do you ship to Canada?", "es").locale == "en"
    assert detector.detect("Where is my order?", "fr").locale == "en"


def test_latin_text_in_a_chinese_conversation_is_not_chinese(detector: LanguageDetector) -> None:
    # Chinese is not possible for Latin letters, so the conversation's language cannot stand in.
    assert detector.detect("ok thanks", "zh").locale == "en"


def test_a_language_outside_the_configured_set_is_never_returned() -> None:
    only = LanguageDetector(["en", "de"])
    assert only.languages == ("en", "zh", "de")
    assert only.detect("¿Hacen envíos a México?", "en").locale in {"en", "de"}
    assert only.detect("注文をキャンセルしたいです", "en").locale == "zh"  # no Japanese: its kanji read as Chinese


def test_unknown_language_codes_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown language code 'xx'"):
        LanguageDetector(["en", "xx"])


def test_client_locales_are_taken_by_their_primary_subtag(settings) -> None:
    settings.KEFU_LANGUAGES = list(DEFAULT_LANGUAGES)
    assert supported_locale("es-MX") == "es"
    assert supported_locale("zh_CN") == "zh"
    assert supported_locale("tlh") == "en"  # not configured
    assert supported_locale(None) == "en"
    assert supported_locale(42) == "en"


def test_language_names_for_the_model() -> None:
    assert language_name("es") == "Spanish"
    assert language_name("ja-JP") == "Japanese"
    assert language_name("zh") == "Chinese"
    assert language_name("xx") == "English"


def test_a_bad_language_setting_stops_start_up_naming_it() -> None:
    result = check(KEFU_LANGUAGES="en,zh,klingon")
    assert result.returncode != 0
    assert "KEFU_LANGUAGES: unknown language code 'klingon'" in result.stderr
