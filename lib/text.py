"""Text helpers shared by every part: the CJK character class and the shopper's language.

A locale is an ISO 639-1 code (``"en"``, ``"zh"``, ``"es"``...), one of ``KEFU_LANGUAGES``;
``"en"`` and ``"zh"`` are always among them (protocol 1's ``hello.locale``).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from lingua import IsoCode639_1, Language, LanguageDetectorBuilder

#: The CJK ideograph ranges kefu treats as Chinese (Unified Ideographs, Extension A and the
#: Compatibility Ideographs), as a character-class body: use ``rf"[{CJK_CLASS}]"``.
CJK_CLASS = "\u3400-\u9fff\uf900-\ufaff"
#: One CJK ideograph.
CJK = re.compile(rf"[{CJK_CLASS}]")
#: Hiragana, katakana (with the phonetic extensions and half-width forms): only Japanese has them.
KANA = re.compile(r"[\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f]")
#: Hangul syllables and jamo: only Korean.
HANGUL = re.compile(r"[\uac00-\ud7af\u1100-\u11ff\u3130-\u318f]")
_LETTER = re.compile(r"[^\W\d_]")

#: The languages kefu detects when ``KEFU_LANGUAGES`` is not set (ISO 639-1).
DEFAULT_LANGUAGES = ("en", "zh", "ja", "ko", "es", "fr", "de", "it", "pt", "nl", "ru")
#: Below this confidence (lingua's relative confidence, 0..1) a message is not taken as showing
#: its language. Measured on the 4,244 English Bitext questions (misspelt, terse: "refund $299",
#: "contact agent") and the team's short questions in eleven languages: bench/language_eval.py.
DEFAULT_MIN_CONFIDENCE = 0.5
#: Under that confidence, the conversation's language stands when lingua gives it at least this
#: share of the best language's value, else English ("y el azul?" in a Spanish conversation stays
#: Spanish; "Do you ship to Canada?", English at 0.27, is not taken for Spanish).
UNSURE_PRIOR_SHARE = 0.5
#: A text of one word or fewer letters than this is too short to tell ("ok" reads as Dutch at
#: 0.51, "no" as Italian): it takes the conversation's language when its script allows.
SHORT_TEXT_LETTERS = 8
#: Detections remembered per detector (least recently used dropped first): a store's traffic
#: repeats its questions, and one message is detected up to three times on its way (the answering
#: loop, the classifier, the strategy), each with the same text and conversation language.
MEMO_SIZE = 4096
#: Texts longer than this (code points) are detected afresh each time, not remembered: the memo's
#: memory stays under ~MEMO_SIZE × 4 KB.
MEMO_MAX_CHARS = 1000


@dataclass(frozen=True)
class Detected:
    """A message's language: ``locale`` (ISO 639-1) and whether the text itself showed it
    (``confident``), rather than the conversation's language standing in for a short or
    ambiguous text."""

    locale: str
    confident: bool


def language_code(value: str) -> str:
    """The primary subtag of a language tag, lower case: ``"es-MX"`` -> ``"es"``, ``"zh_CN"`` ->
    ``"zh"``; ``""`` for an empty value."""
    return re.split(r"[-_]", value.strip().lower(), maxsplit=1)[0]


def _language(code: str) -> Language:
    """lingua's language for an ISO 639-1 code. Raises ``ValueError`` naming an unknown code."""
    try:
        return Language.from_iso_code_639_1(getattr(IsoCode639_1, code.upper()))
    except (AttributeError, ValueError):
        raise ValueError(f"unknown language code {code!r} (ISO 639-1 expected, e.g. 'es')") from None


def check_language_code(code: str) -> None:
    """Raises ``ValueError`` naming ``code`` unless it is an ISO 639-1 code lingua detects."""
    _language(language_code(code))


def language_name(code: str) -> str:
    """The English name of the language ``code`` (``"es"`` -> ``"Spanish"``), as a model is
    told which language to answer in; ``"English"`` for an unknown code."""
    try:
        return _language(language_code(code)).name.title()
    except ValueError:
        return "English"


class LanguageDetector:
    """The language of a shopper's message among ``languages`` (ISO 639-1 codes; ``en`` and
    ``zh`` are always added).

    Script first, where a script belongs to one language: kana -> ``ja``, Hangul -> ``ko``,
    CJK ideographs without kana -> ``zh``. Everything else goes to lingua (high-accuracy mode,
    n-gram models shipped inside its wheel; ~0.1 ms a question on 2 cores, models loaded once per
    process by :meth:`warm`):

    - no letter at all ("???", "123"): the conversation's language (``fallback``);
    - too short to tell (one word, or under ``SHORT_TEXT_LETTERS`` letters): the fallback where
      its script allows it, else English, else lingua's best guess;
    - lingua's confidence at least ``min_confidence``: that language, ``confident``;
    - below it: the fallback when lingua gives it at least ``UNSURE_PRIOR_SHARE`` of the best
      value, else English where the script allows it, else lingua's best guess.

    Only the third case is ``confident``.

    Raises ``ValueError`` naming a code lingua does not know.
    """

    def __init__(self, languages: Sequence[str], *, min_confidence: float = DEFAULT_MIN_CONFIDENCE) -> None:
        codes = dict.fromkeys(["en", "zh", *(language_code(c) for c in languages if c.strip())])
        self.languages: tuple[str, ...] = tuple(codes)
        self.min_confidence = min_confidence
        self._lingua = [_language(c) for c in self.languages]
        self._detector: object | None = None
        self._lock = threading.Lock()
        # Bounded LRU of detect(text, fallback); lru_cache is thread-safe, and Detected is frozen.
        self._memo = lru_cache(maxsize=MEMO_SIZE)(self._detect)

    def supports(self, code: str) -> bool:
        return language_code(code) in self.languages

    def _lingua_detector(self) -> object:
        if self._detector is None:
            with self._lock:
                if self._detector is None:
                    # Models load lazily, per language a text's script allows: kana, Hangul and
                    # Chinese characters never reach lingua, so their models (~70 MB) never load.
                    self._detector = LanguageDetectorBuilder.from_languages(*self._lingua).build()
        return self._detector

    def warm(self) -> None:
        """Load lingua's models for Latin and Cyrillic texts now (~1 s, ~190 MB for the default
        languages), not at the first message."""
        detector = self._lingua_detector()
        for sample in ("Where is my order?", "Где мой заказ?"):
            detector.compute_language_confidence_values(sample)  # type: ignore[attr-defined]

    def detect(self, text: str, fallback: str = "en") -> Detected:
        """The language of ``text``; ``fallback`` is the conversation's (an unsupported one
        counts as ``en``). Remembered per ``(text, fallback)`` for texts up to
        ``MEMO_MAX_CHARS`` (the last ``MEMO_SIZE``): a repeated question costs a dict lookup."""
        if len(text) <= MEMO_MAX_CHARS:
            return self._memo(text, fallback)
        return self._detect(text, fallback)

    def can_show_language(self, text: str) -> bool:
        """Whether :meth:`detect` could call ``text`` ``confident``, i.e. whether it can change a
        conversation's language: False, without detecting, for a text with no letter, or too
        short to tell (one word, or under ``SHORT_TEXT_LETTERS`` letters) with no kana, Hangul
        or CJK ideograph ("ok", "Merci", "123", "???"). Cheap: two regular-expression scans."""
        if CJK.search(text) or KANA.search(text) or HANGUL.search(text):
            return True
        return len(text.split()) >= 2 and len(_LETTER.findall(text)) >= SHORT_TEXT_LETTERS

    def _detect(self, text: str, fallback: str) -> Detected:
        fallback = language_code(fallback)
        if fallback not in self.languages:
            fallback = "en"
        if not _LETTER.search(text):
            return Detected(fallback, False)
        if KANA.search(text) and "ja" in self.languages:
            return Detected("ja", True)
        if HANGUL.search(text) and "ko" in self.languages:
            return Detected("ko", True)
        if CJK.search(text):
            return Detected("zh", True)
        values = self._lingua_detector().compute_language_confidence_values(text)  # type: ignore[attr-defined]
        best = values[0]
        code = best.language.iso_code_639_1.name.lower()
        value = {v.language.iso_code_639_1.name.lower(): v.value for v in values}
        if len(text.split()) < 2 or len(_LETTER.findall(text)) < SHORT_TEXT_LETTERS:
            # "ok", "no", "Merci", "hola": too short to tell; any language of its script will do,
            # the conversation's first, then English.
            prior = next((p for p in (fallback, "en") if value.get(p, 0.0) > 0), code)
            return Detected(prior, False)
        if best.value >= self.min_confidence:
            return Detected(code, True)
        # Not sure: the conversation's language when lingua gives it at least half the best value,
        # else English (the commonest language of terse, misspelt store text) where the script
        # allows it, else the best guess.
        if value.get(fallback, 0.0) >= UNSURE_PRIOR_SHARE * best.value:
            return Detected(fallback, False)
        return Detected("en" if value.get("en", 0.0) > 0 else code, False)


@lru_cache(maxsize=4)
def detector_for(languages: tuple[str, ...], min_confidence: float) -> LanguageDetector:
    """One shared detector per configuration (lingua's models take ~20 MB a language)."""
    return LanguageDetector(languages, min_confidence=min_confidence)


def configured_detector() -> LanguageDetector:
    """The detector for ``KEFU_LANGUAGES`` and ``KEFU_LANGUAGE_MIN_CONFIDENCE``."""
    from django.conf import settings

    return detector_for(
        tuple(getattr(settings, "KEFU_LANGUAGES", DEFAULT_LANGUAGES)),
        float(getattr(settings, "KEFU_LANGUAGE_MIN_CONFIDENCE", DEFAULT_MIN_CONFIDENCE)),
    )


def detect_language(text: str, fallback: str = "en") -> Detected:
    """:meth:`LanguageDetector.detect` with the configured detector."""
    return configured_detector().detect(text, fallback)


def can_show_language(text: str) -> bool:
    """:meth:`LanguageDetector.can_show_language` with the configured detector."""
    return configured_detector().can_show_language(text)


def detect_locale(text: str, fallback: str = "en") -> str:
    """The locale of ``text`` (see :class:`LanguageDetector`); ``fallback`` is the
    conversation's, used for a text too short or ambiguous to tell ("ok", "???", "123")."""
    return configured_detector().detect(text, fallback).locale


def supported_locale(value: object, default: str = "en") -> str:
    """``value`` (a client's ``hello.locale``, e.g. ``"es-MX"``) as a configured locale, else
    ``default``."""
    if not isinstance(value, str):
        return default
    code = language_code(value)
    return code if configured_detector().supports(code) else default
