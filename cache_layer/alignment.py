"""Word alignment: every word on which two questions differ must be explained (issue 40).

The slot vocabulary (``cache_layer/slots.py``) refuses a hit when two questions name different
values of a slot it knows; a word it does not know ("nightstand" / "bookshelf", "Lisbon" /
"Osaka", "subscribe" / "unsubscribe", 橡木 / 松木) it cannot see, and the same-intent and
same-slots rules served such look-alikes. This check is the other way round: nothing is assumed
interchangeable. The content words of the two questions are compared; each word one question has
and the other lacks must be

- a word that frames a question without changing what it asks (stopwords, the store's generic
  words ``similarity.GENERIC_STORE_WORDS``, :data:`FRAMING_EN`, :data:`FRAMING_ZH`), or
- paired with a word the other question has instead, with a word-level cosine of at least
  ``word_threshold`` (the shared sentence embedder run on the two words alone), and not an
  opposite made by a prefix (``un-``, ``dis-``, ``de-``...: the embedder rates "subscribe" /
  "unsubscribe" 0.94, above "ship" / "deliver" 0.87) nor by a particle ("turn on" / "turn off",
  "opt in" / "opt out"), nor (Chinese) by a reversing character (退, 解, 取消...).

One unexplained word on either side is no hit. English content words are the similarity guard's
lemmas (``similarity.key_terms``); Chinese has no spaces and no segmenter is installed, so the
content characters (stop characters dropped) of the two questions are aligned as sequences
(``difflib``); a differing span must be framing (如何, 现在, 一下...) or nothing explains it:
on two to four characters the embedder rates look-alikes as high as paraphrases (measured on
the tuning set), so no Chinese span is judged by word similarity.

Pure: the word similarity is a function the caller passes (``services`` uses the embedder, whose
LRU keeps the words it has seen). Symmetric.
"""

from __future__ import annotations

import difflib
import functools
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lib.text import CJK_CLASS

from .similarity import _A_NOT_A, GENERIC_STORE_WORDS, STOPCHARS_ZH, STOPWORDS_EN, _lemma, key_terms

#: ``pairs -> cosines``: the word-level similarity of each ``(word_a, word_b)``, in order.
WordSimilarity = Callable[[Sequence[tuple[str, str]]], Sequence[float]]

_CJK = CJK_CLASS
_CJK_CHAR = re.compile(rf"[{_CJK}]")

#: English words that frame a question without changing what it asks (lemmas, as
#: ``similarity._lemma`` makes them). General language, not store vocabulary.
FRAMING_EN = frozenset(
    _lemma(w)
    for w in [
        "right",
        "best",
        "proper",
        "properly",
        "correct",
        "step",
        "steps",
        "process",
        "procedure",
        "possible",
        "currently",
        "current",
        "now",
        "right now",
        "available",
        "anything",
        "something",
        "any",
        "kind",
        "sort",
        "actually",
        "exactly",
        "somehow",
        "okay",
        "fine",
        "good",
        "idea",
        "advice",
        "recommend",
        "suggest",
        "someone",
        "anyone",
        "able",
        "allow",
        "manage",
    ]
)

#: Chinese strings that frame a question (removed from a span one question has alone, longest first).
FRAMING_ZH = tuple(
    sorted(
        [
            "应该",
            "如何",
            "现在",
            "目前",
            "一下",
            "具体",
            "到底",
            "大概",
            "一般",
            "是否",
            "什么",
            "怎么",
            "怎样",
            "哪里",
            "哪儿",
            "哪",
            "里",
            "儿",
            "多少",
            "些",
            "请",
            "问",
            "帮忙",
            "帮",
            "下",
            "比较",
            "需要",
            "需",
            "得",
            "呀",
            "好",
            "很",
            "非常",
            "特别",
            "真的",
        ],
        key=len,
        reverse=True,
    )
)

# Opposites a prefix makes ("unsubscribe", "disable", "deactivate", "unlink").
_OPPOSITE_PREFIXES = ("un", "dis", "de", "non", "in", "im", "ir", "il", "anti", "counter")
# Particles whose swap reverses a verb ("turn on" / "turn off", "opt in" / "opt out").
_OPPOSITE_PARTICLES = (("on", "off"), ("in", "out"), ("up", "down"), ("into", "out"), ("to", "from"))
# Chinese characters that reverse an action (退订, 解绑, 取消, 取关, 停用, 关掉, 禁用, 删除, 撤销, 拉黑).
_REVERSING_ZH = re.compile(r"退|解|取消|取关|停|关|禁|删|撤|反|黑|屏蔽|移出")


@dataclass(frozen=True)
class Alignment:
    """Whether two questions align: ``ok``; ``reason`` ``"aligned"`` or why not
    (``"unexplained: words"``, ``"opposite: a / b"``, ``"not_near_synonyms: a / b (cosine)"``)."""

    ok: bool
    reason: str


def _framing_en(word: str) -> bool:
    return word in STOPWORDS_EN or word in GENERIC_STORE_WORDS or word in FRAMING_EN


@functools.lru_cache(maxsize=8192)
def _english_terms(text: str) -> frozenset[str]:
    t = re.sub(rf"[{_CJK}]", " ", text)
    # The crude lemma twice: "settings" -> "setting" -> "sett", as "setting" makes in one step.
    lemmas = {_lemma(w) for w in key_terms(t).content if w.isascii()}
    return frozenset(w for w in lemmas if len(w) > 1 and not _framing_en(w))  # "what's" leaves an "s"


_PARTICLE_WORDS = frozenset(w for pair in _OPPOSITE_PARTICLES for w in pair)


def _particles(text: str) -> Counter[str]:
    """How often each particle of :data:`_OPPOSITE_PARTICLES` occurs in ``text``."""
    words = re.findall(r"[a-z]+", unicodedata.normalize("NFKC", text).lower())
    return Counter(w for w in words if w in _PARTICLE_WORDS)


@functools.lru_cache(maxsize=8192)
def _chinese_content(text: str) -> str:
    t = _A_NOT_A.sub("", unicodedata.normalize("NFKC", text).lower())  # "会不会" asks, it does not negate
    for f in FRAMING_ZH:  # framing words before the stop characters split them ("现在" -> "现")
        if len(f) > 1:
            t = t.replace(f, " ")
    return "".join(ch for ch in t if _CJK_CHAR.match(ch) and ch not in STOPCHARS_ZH)


def _strip_framing_zh(span: str) -> str:
    for f in FRAMING_ZH:
        span = span.replace(f, "")
    return span


def _prefix_opposite(a: str, b: str) -> bool:
    return any(a == p + b or b == p + a for p in _OPPOSITE_PREFIXES)


def differing_units(question_a: str, question_b: str) -> tuple[list[tuple[str, str]], list[str], str]:
    """What sets the two questions apart: ``(substitutions, unexplained, opposite)``.

    ``substitutions``: ``(word_a, word_b)`` pairs whose word-level similarity decides (every
    candidate pairing of the English words one side has alone). ``unexplained``: words one side has and the other has nothing in their place.
    ``opposite``: a non-empty description when a prefix, particle or reversing character makes
    the difference an opposite."""
    subs: list[tuple[str, str]] = []
    unexplained: list[str] = []
    # English.
    ea, eb = _english_terms(question_a), _english_terms(question_b)
    only_a, only_b = sorted(ea - eb), sorted(eb - ea)
    pa, pb = _particles(question_a), _particles(question_b)
    more_a, more_b = pa - pb, pb - pa  # "turn on ... on the website" / "turn off ... on the website"
    for x, y in _OPPOSITE_PARTICLES:
        if (more_a[x] and more_b[y]) or (more_a[y] and more_b[x]):
            return [], [], f"{x} / {y}"
    for wa in only_a:
        for wb in only_b:
            if _prefix_opposite(wa, wb):
                return [], [], f"{wa} / {wb}"
    if only_a and only_b:
        subs += [(wa, wb) for wa in only_a for wb in only_b]
    else:
        unexplained += only_a + only_b
    # Chinese.
    ca, cb = _chinese_content(question_a), _chinese_content(question_b)
    if ca != cb:
        matcher = difflib.SequenceMatcher(None, ca, cb, autojunk=False)
        for op, i1, i2, j1, j2 in matcher.get_opcodes():
            if op == "equal":
                continue
            span_a, span_b = ca[i1:i2], cb[j1:j2]
            rev_a, rev_b = bool(_REVERSING_ZH.search(span_a)), bool(_REVERSING_ZH.search(span_b))
            if rev_a != rev_b:
                return [], [], f"{span_a or '-'} / {span_b or '-'}"
            core_a, core_b = _strip_framing_zh(span_a), _strip_framing_zh(span_b)
            if core_a != core_b:
                # Not judged by word similarity: on two to four characters the embedder does not
                # tell a paraphrase from a look-alike (tuning set: look-alike spans at a median
                # cosine of 0.90, paraphrase spans 0.91; 老年人 / 婴儿 0.94).
                unexplained.append("/".join(c for c in (core_a, core_b) if c))
    return subs, unexplained, ""


def align(question_a: str, question_b: str, *, word_similarity: WordSimilarity, word_threshold: float) -> Alignment:
    """Whether every word on which the two questions differ is explained (module docstring).

    ``word_similarity`` is called once, with every substitution to judge (not at all when there
    is none or the pair is refused before); ``word_threshold`` is a cosine in [-1, 1]. English
    substitutions: each word one side has alone needs a partner on the other side at or above
    the threshold."""
    subs, unexplained, opposite = differing_units(question_a, question_b)
    if opposite:
        return Alignment(False, f"opposite: {opposite}")
    if unexplained:
        return Alignment(False, "unexplained: " + " ".join(unexplained))
    if not subs:
        return Alignment(True, "aligned")
    sims = list(word_similarity(subs))
    best: dict[tuple[int, str], float] = {}
    for (wa, wb), sim in zip(subs, sims, strict=True):
        best[(0, wa)] = max(best.get((0, wa), -1.0), sim)
        best[(1, wb)] = max(best.get((1, wb), -1.0), sim)
    for (_side, word), sim in best.items():
        if sim < word_threshold:
            return Alignment(False, f"not_near_synonyms: {word} ({sim:.3f})")
    return Alignment(True, "aligned")
