"""The guard beyond cosine: two questions may share a cached answer only if their key terms agree.

Measured here (../shared/STYLE.md, and ``bench/cache_guard_eval.py``): look-alike questions
that need different answers ("cancel my order" / "cancel my subscription", "I was charged twice" /
"I was never charged") score a HIGHER cosine than many true paraphrases, so no cosine threshold
alone separates them. :func:`guard` therefore blocks a semantic hit when

1. the numbers differ (``"2 items"`` / ``"3 items"``, ``"twice"`` / ``"once"``);
2. one question is negated and the other is not (not/never/no/n't/without ..., 没/不/未/无/别);
3. the content words differ: after dropping a small stopword list and reducing words to a crude
   lemma (plural, -ed, -ing, a few e-commerce synonyms), one question has a content word that the
   other lacks, beyond ``max_extra`` added words, or each side has a word the other lacks
   (a substitution: "order" vs "subscription").

Chinese has no spaces: each CJK character outside a small stop-character set is a content unit.
The guard is symmetric and pure (no Django, no model): ``guard(a, b) == guard(b, a)``.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

from lib.text import CJK_CLASS

from .normalise import exact_key_text
from .slots import anchored, slot_words, slots_agree

_CJK = CJK_CLASS
_TOKEN = re.compile(rf"[{_CJK}]|[a-z]+|\d+(?:\.\d+)?")

# Function words, question words, politeness and generic "I want to..." verbs: they do not change
# which answer is right. Kept small on purpose: a word missing here only costs a miss.
STOPWORDS_EN = frozenset(
    [
        "a",
        "an",
        "the",
        "to",
        "of",
        "in",
        "on",
        "at",
        "for",
        "from",
        "by",
        "with",
        "about",
        "as",
        "into",
        "onto",
        "over",
        "under",
        "up",
        "out",
        "off",
        "than",
        "then",
        "i",
        "me",
        "my",
        "mine",
        "myself",
        "we",
        "us",
        "our",
        "you",
        "your",
        "yours",
        "he",
        "him",
        "his",
        "she",
        "her",
        "it",
        "its",
        "they",
        "them",
        "their",
        "this",
        "that",
        "these",
        "those",
        "is",
        "am",
        "are",
        "was",
        "were",
        "be",
        "been",
        "being",
        "do",
        "does",
        "did",
        "doing",
        "have",
        "has",
        "had",
        "having",
        "will",
        "would",
        "shall",
        "should",
        "can",
        "could",
        "may",
        "might",
        "must",
        "ought",
        "get",
        "got",
        "getting",
        "gets",
        "what",
        "which",
        "who",
        "whom",
        "whose",
        "when",
        "where",
        "why",
        "how",
        "whether",
        "if",
        "or",
        "and",
        "but",
        "so",
        "because",
        "while",
        "also",
        "too",
        "just",
        "please",
        "pls",
        "plz",
        "kindly",
        "thanks",
        "thank",
        "thx",
        "hi",
        "hello",
        "hey",
        "dear",
        "sir",
        "madam",
        "ok",
        "okay",
        "yes",
        "yeah",
        "well",
        "want",
        "wanna",
        "need",
        "needs",
        "like",
        "would",
        "love",
        "wish",
        "trying",
        "try",
        "tried",
        "help",
        "assist",
        "know",
        "tell",
        "let",
        "show",
        "see",
        "there",
        "here",
        "some",
        "any",
        "all",
        "each",
        "every",
        "much",
        "many",
        "more",
        "most",
        "very",
        "really",
        "quite",
        "still",
        "already",
        "again",
        "possible",
        "way",
        "ways",
        "able",
        "going",
        "gonna",
        "one",
        "someone",
        "somebody",
        "something",
        "anything",
        "thing",
        "things",
    ]
)
# Chinese characters that carry no key meaning (particles, pronouns, auxiliaries, question words).
STOPCHARS_ZH = frozenset(
    "的了吗呢吧啊呀么嘛哦噢我你您他她它们这那是在有和与及或就都也还要想请问能可以会该怎样么什哪个把被给让对吧嗯哈啦"
)

# Negations. Apostrophes are removed by exact_key_text, so "don't" arrives as "dont".
NEGATIONS_EN = frozenset(
    [
        "not",
        "no",
        "never",
        "none",
        "nothing",
        "nobody",
        "nowhere",
        "neither",
        "nor",
        "without",
        "cannot",
        "cant",
        "dont",
        "doesnt",
        "didnt",
        "isnt",
        "arent",
        "wasnt",
        "werent",
        "wont",
        "wouldnt",
        "shouldnt",
        "couldnt",
        "havent",
        "hasnt",
        "hadnt",
        "aint",
        "unable",
        "fail",
        "failed",
    ]
)
_NEG_ZH = re.compile(r"没|不|未|无|别|非|勿")
# "能不能", "是不是", "有没有": an A-not-A question, not a negation.
_A_NOT_A = re.compile(rf"([{_CJK}])(?:不|没)\1")

NUMBER_WORDS = {
    "zero": "0",
    "one": "1",
    "once": "1x",
    "single": "1",
    "two": "2",
    "twice": "2x",
    "double": "2x",
    "three": "3",
    "thrice": "3x",
    "triple": "3x",
    "four": "4",
    "five": "5",
    "six": "6",
    "seven": "7",
    "eight": "8",
    "nine": "9",
    "ten": "10",
    "first": "1st",
    "second": "2nd",
    "third": "3rd",
    "一": "1",
    "两": "2",
    "二": "2",
    "三": "3",
    "四": "4",
    "五": "5",
    "六": "6",
    "七": "7",
    "八": "8",
    "九": "9",
    "十": "10",
}
# "one" and "first" are too often not numbers ("the blue one", "first time"): numbers only when
# they follow or precede a counted noun is more than this guard needs; we keep them as content.
_AMBIGUOUS_NUMBER_WORDS = frozenset({"one", "first", "second", "single", "double"})

# A few e-commerce synonyms mapped to one lemma so common paraphrases stay hits.
SYNONYMS = {
    "purchase": "order",
    "purchased": "order",
    "bought": "buy",
    "parcel": "package",
    "shipment": "package",
    "delivery": "ship",
    "deliver": "ship",
    "delivered": "ship",
    "shipping": "ship",
    "shipped": "ship",
    "send": "ship",
    "sent": "ship",
    "arrive": "ship",
    "arrival": "ship",
    "cost": "price",
    "fee": "price",
    "fees": "price",
    "charge": "charge",
    "charged": "charge",
    "money": "refund",
    "reimbursement": "refund",
    "reimburse": "refund",
    "return": "return",
    "returning": "return",
    "mail": "email",
    "e": "",
    "cellphone": "phone",
    "telephone": "phone",
    "mobile": "phone",
    "acct": "account",
    "pwd": "password",
    "delete": "remove",
    "erase": "remove",
    "modify": "change",
    "edit": "change",
    "update": "change",
    "alter": "change",
    "terminate": "cancel",
    "cancellation": "cancel",
    "canceled": "cancel",
    "cancelled": "cancel",
    "quickly": "fast",
    "quick": "fast",
    "rapid": "fast",
    "big": "large",
    "huge": "large",
    "small": "small",
    "tiny": "small",
    "reach": "contact",
    "speak": "talk",
}


def _lemma(word: str) -> str:
    """A crude lemma: synonym table, then plural/-ed/-ing stripped (applied to both sides alike)."""
    w = SYNONYMS.get(word, word)
    if len(w) > 4 and w.endswith("ies"):
        w = w[:-3] + "y"
    elif len(w) > 4 and w.endswith("ing"):
        w = w[:-3]
    elif (len(w) > 4 and w.endswith("ed")) or (len(w) > 3 and w.endswith("es") and w[-3] in "sxz"):
        w = w[:-2]
    elif len(w) > 3 and w.endswith("s") and not w.endswith("ss"):
        w = w[:-1]
    return SYNONYMS.get(w, w)


@dataclass(frozen=True)
class KeyTerms:
    """What must agree between two questions: numbers, negation, content lemmas."""

    numbers: frozenset[str]
    negated: bool
    content: frozenset[str]


@functools.lru_cache(maxsize=8192)
def key_terms(text: str) -> KeyTerms:
    """The key terms of ``text`` (any language; Chinese by character). Memoised: a lookup judges
    the same cached questions again and again."""
    t = exact_key_text(text)
    tokens = _TOKEN.findall(t)
    numbers: set[str] = set()
    content: set[str] = set()
    negated = False
    zh = "".join(ch for ch in t if re.match(rf"[{_CJK}]", ch))
    if zh and _NEG_ZH.search(_A_NOT_A.sub("", zh)):
        negated = True
    for tok in tokens:
        if tok[0].isdigit():
            numbers.add(tok.lstrip("0") or "0")
        elif tok in NEGATIONS_EN:
            negated = True
        elif tok in NUMBER_WORDS and tok not in _AMBIGUOUS_NUMBER_WORDS:
            numbers.add(NUMBER_WORDS[tok])
        elif re.match(rf"[{_CJK}]", tok):
            if tok not in STOPCHARS_ZH and not _NEG_ZH.match(tok):
                content.add(tok)
        elif tok not in STOPWORDS_EN:
            lemma = _lemma(tok)
            if lemma and lemma not in STOPWORDS_EN:
                content.add(lemma)
    return KeyTerms(frozenset(numbers), negated, frozenset(content))


#: Content words one question may have beyond the other (none may be substituted). Chosen by
#: ``bench/cache_guard_eval.py``; see the figures in that script's docstring.
DEFAULT_MAX_EXTRA = 1


def guard(question_a: str, question_b: str, *, max_extra: int = DEFAULT_MAX_EXTRA) -> tuple[bool, str]:
    """Whether ``question_b`` may be served ``question_a``'s answer as far as key terms go.

    Returns ``(True, "ok")`` or ``(False, reason)`` with reason ``"numbers_differ"``,
    ``"negation_mismatch"``, ``"content_substituted: a_words / b_words"``,
    ``"content_added: words"`` or ``"no_content"`` (a question with no content word at all, e.g.
    "how?", is too vague to share). Cosine similarity is checked by the caller; this is the
    second, independent test.
    """
    a, b = key_terms(question_a), key_terms(question_b)
    if a.numbers != b.numbers:
        return False, "numbers_differ"
    if a.negated != b.negated:
        return False, "negation_mismatch"
    if not a.content or not b.content:
        return (False, "no_content") if a.content != b.content or not a.content else (True, "ok")
    only_a, only_b = a.content - b.content, b.content - a.content
    if only_a and only_b:
        return False, f"content_substituted: {' '.join(sorted(only_a))} / {' '.join(sorted(only_b))}"
    extra = only_a or only_b
    if len(extra) > max_extra:
        return False, f"content_added: {' '.join(sorted(extra))}"
    return True, "ok"


# Words written with a capital inside a sentence name a thing (a city, a brand, a plan): "shipping
# to Detroit" and "shipping to Toronto" resolve to the same intent but need different answers.
_CAPITALISED = re.compile(r"(?<![.!?]\s)(?<!^)\b[A-Z][a-zA-Z]+")


@functools.lru_cache(maxsize=8192)
def named_things(text: str) -> frozenset[str]:
    """Lowercased words written with a capital letter anywhere but at the start of a sentence,
    excluding "I" and the stopwords (``"Can I ship to Detroit?"`` -> ``{"detroit"}``)."""
    t = unicodedata.normalize("NFKC", text).strip()
    out = set()
    for m in _CAPITALISED.finditer(t):
        w = m.group().lower()
        if w not in STOPWORDS_EN and w not in NEGATIONS_EN:
            out.add(_lemma(w))
    return frozenset(out)


# What a question asks for: "why" and "when" questions about the same words need other answers.
# "what/which/how/can/is" are left out: they are often interchangeable ("how can I pay" / "what
# payment methods"). Measured on QQP label-0 pairs that passed every other rule (bench/cache_guard_eval.py).
_QUESTION_KINDS = (
    ("quantity", re.compile(r"\bhow (?:many|much)\b")),
    ("duration", re.compile(r"\bhow long\b")),
    ("reason", re.compile(r"\bwhy\b|为什么|为啥")),
    ("time", re.compile(r"\bwhen\b|什么时候|何时")),
    ("place", re.compile(r"\bwhere\b|哪里|哪儿")),
    ("person", re.compile(r"\bwho(?:se|m)?\b|谁")),
)
# Words that make the order of two content words matter ("convert miles to kilometres").
_DIRECTED = re.compile(r"\b(?:to|into|from|than|over|vs|versus|instead|but)\b")


@functools.lru_cache(maxsize=8192)
def question_kinds(text: str) -> frozenset[str]:
    """The kinds of answer a question asks for (``"reason"``, ``"time"``, ``"place"``, ...)."""
    t = unicodedata.normalize("NFKC", text).lower()
    return frozenset(kind for kind, rx in _QUESTION_KINDS if rx.search(t))


@functools.lru_cache(maxsize=8192)
def _content_sequence(text: str) -> tuple[str, ...]:
    seen: list[str] = []
    for tok in _TOKEN.findall(exact_key_text(text)):
        if tok.isascii() and tok.isalpha() and tok not in STOPWORDS_EN and tok not in NEGATIONS_EN:
            lemma = _lemma(tok)
            if lemma and lemma not in seen:
                seen.append(lemma)
    return tuple(seen)


def hard_guard(question_a: str, question_b: str) -> tuple[bool, str]:
    """The rules no similarity score may overrule: numbers equal, both negated or neither, no
    named thing on one side that the other lacks as a word, the same kinds of question (why /
    when / where / who / how many / how long), and the same order of the same content words
    when a directed word ("to", "into", "than"...) makes order matter, and the same values of
    every answer-changing slot (``cache_layer.slots``: kind of delivery, kind of address, payment
    method, account kind, time). Returns ``(ok, reason)`` with reason ``"ok"``,
    ``"numbers_differ"``, ``"negation_mismatch"``, ``"slot_differs: ..."``,
    ``"named_thing_differs: words"``, ``"question_kind_differs"`` or ``"order_differs"``.
    Symmetric and pure."""
    a, b = key_terms(question_a), key_terms(question_b)
    if a.numbers != b.numbers:
        return False, "numbers_differ"
    if a.negated != b.negated:
        return False, "negation_mismatch"
    ok, reason = slots_agree(question_a, question_b)
    if not ok:
        return False, reason
    # A capitalised word counts when the other question lacks the word entirely (in any case):
    # "Pro account" vs "pro account" agree; "Detroit" vs "Toronto" do not.
    differ = (named_things(question_a) - b.content) | (named_things(question_b) - a.content)
    if differ:
        return False, "named_thing_differs: " + " ".join(sorted(differ))
    if question_kinds(question_a) != question_kinds(question_b):
        return False, "question_kind_differs"
    seq_a, seq_b = _content_sequence(question_a), _content_sequence(question_b)
    if (
        seq_a != seq_b
        and sorted(seq_a) == sorted(seq_b)
        and _DIRECTED.search(exact_key_text(question_a))
        and _DIRECTED.search(exact_key_text(question_b))
    ):
        return False, "order_differs"
    return True, "ok"


#: Words of store chat that never change an answer on their own (lemmas, as ``_lemma`` makes
#: them): "If I pay for express delivery, how quickly will it arrive?" asks what "How long does
#: express shipping take?" asks. Written for kefu; the same-slots rule's residual check skips them.
GENERIC_STORE_WORDS = frozenset(
    _lemma(w)
    for w in [
        "order",
        "item",
        "product",
        "thing",
        "stuff",
        "purchase",
        "buy",
        "bought",
        "get",
        "got",
        "pay",
        "payment",
        "accept",
        "take",
        "option",
        "checkout",
        "possible",
        "use",
        "site",
        "website",
        "store",
        "shop",
        "online",
        "app",
        "day",
        "week",
        "hour",
        "time",
        "need",
        "want",
        "like",
        "would",
        "help",
        "know",
        "way",
        "available",
        "offer",
        "have",
        "come",
        "arrive",
        "arrival",
        "ship",
        "shipping",
        "delivery",
        "deliver",
        "parcel",
        "package",
        "send",
        "sent",
        "choose",
        "pick",
        "select",
        "quickly",
        "fast",
        "soon",
        "long",
        "usually",
        "normally",
        "typically",
        "also",
        "still",
        "please",
        "thanks",
        "thank",
        "hi",
        "hello",
        "able",
        "allowed",
        "ok",
        "okay",
        "really",
        "exactly",
        "just",
        "currently",
        "make",
        "go",
        "see",
        "find",
        "tell",
        "give",
        "let",
        "put",
        "try",
        "work",
        "support",
        "service",
        "customer",
        "place",
        "placed",
        "receive",
        "received",
        "usual",
        "possibility",
        "question",
        "ask",
        "wondering",
        "wonder",
        "info",
        "information",
        "detail",
        "details",
        "there",
    ]
)


@functools.lru_cache(maxsize=8192)
def residual_terms(text: str) -> frozenset[str]:
    """The content lemmas of an English ``text`` that its slots (``cache_layer.slots.slot_words``)
    and :data:`GENERIC_STORE_WORDS` do not account for: what a question asks about beyond its
    slots (``"Does the walnut floor lamp come with a dimmer switch?"`` -> ``{"floor", "dimmer",
    "switch"}``). Empty for text with CJK characters, whose content is read by character."""
    if re.search(rf"[{_CJK}]", text):
        return frozenset()
    covered = {_lemma(w) for w in slot_words(text)}
    return frozenset(w for w in key_terms(text).content if w not in covered and w not in GENERIC_STORE_WORDS)


@dataclass(frozen=True)
class Verdict:
    """Whether a cached question may answer a new one. ``rule``: ``"same_intent"`` or
    ``"lexical"`` when ``ok``, else why not (``"numbers_differ"``, ``"intent_differs"``, ...)."""

    ok: bool
    rule: str


def semantic_verdict(
    question: str,
    cached_question: str,
    *,
    similarity: float,
    resolved: tuple[object, object] | None,
    lexical_threshold: float,
    intent_threshold: float,
    intent_confidence: float,
    max_extra: int = 0,
    slot_threshold: float = 2.0,
    aligned: Callable[[str, str], tuple[bool, str]] | None = None,
    align_threshold: float = 2.0,
) -> Verdict:
    """The semantic cache's hit rule for one candidate (pure; the caller computed the cosine).

    1. :func:`hard_guard` must pass (numbers, negation, named things).
    2. ``resolved`` = the intents (:class:`cache_layer.intent_model.Resolved`) of the two questions,
       or ``None`` without an intent model. Both resolved to store intents with confidence >=
       ``intent_confidence``: the same intent and ``similarity >= intent_threshold`` is a hit
       (``"same_intent"``); different intents never are (``"intent_differs"``).
    3. Both name the same answer-changing slot values, the action, aspect and variant slots
       included (``cache_layer.slots.slots_agree(every_slot=True)``), at least one of an anchor
       slot (``cache_layer.slots.anchored``: delivery, address, payment, account, product,
       material), the same words beyond them (:func:`residual_terms`: "dimmer switch" is not
       "foot switch" on the same walnut lamp) and ``similarity >= slot_threshold``: a hit
       (``"same_slots"``).
       The slots anchor the topic and fix what changes its answer, so a paraphrase need not share
       the words ("How long does express shipping take?" / "If I pay for express delivery, how
       quickly will it arrive?"). Off with a threshold above 1 (the default, for callers that
       predate it).
    4. Otherwise the strict lexical rule: ``similarity >= lexical_threshold`` and :func:`guard`
       with ``max_extra`` added content words (``"lexical"``).

    With ``aligned`` (``(question, cached_question) -> (ok, reason)``, the word alignment of
    ``cache_layer.alignment``) and ``align_threshold`` at most 1, every rule above also needs the
    two questions to align (no word on either side left unexplained; else the alignment's reason),
    and an aligned pair at or above ``align_threshold`` is a hit of its own (``"aligned"``).
    Thresholds are cosines in [-1, 1]; confidences in [0, 1].
    """
    ok, reason = hard_guard(question, cached_question)
    if not ok:
        return Verdict(False, reason)
    same_intent = False
    if resolved is not None:
        a, b = resolved
        ia, ib = getattr(a, "intent", "other"), getattr(b, "intent", "other")
        ca, cb = getattr(a, "confidence", 0.0), getattr(b, "confidence", 0.0)
        confident = ia != "other" and ib != "other" and min(ca, cb) >= intent_confidence
        if confident and ia != ib:
            return Verdict(False, "intent_differs")
        same_intent = confident and ia == ib
    if aligned is not None and align_threshold <= 1.0:
        if similarity < min(align_threshold, lexical_threshold, intent_threshold, slot_threshold):
            return Verdict(False, "below_threshold")
        ok, reason = aligned(question, cached_question)
        if not ok:
            return Verdict(False, reason)
    if same_intent and similarity >= intent_threshold:
        return Verdict(True, "same_intent")
    if (
        aligned is not None
        and similarity >= align_threshold
        and slots_agree(question, cached_question, every_slot=True)[0]
    ):
        return Verdict(True, "aligned")
    if (
        similarity >= slot_threshold
        and anchored(question)
        and slots_agree(question, cached_question, every_slot=True)[0]
        and residual_terms(question) == residual_terms(cached_question)
    ):
        return Verdict(True, "same_slots")
    if similarity < lexical_threshold:
        return Verdict(False, "below_threshold")
    ok, reason = guard(question, cached_question, max_extra=max_extra)
    return Verdict(ok, "lexical" if ok else reason)


def promotable(question: str, cached_question: str) -> bool:
    """Whether a judge may be asked if ``cached_question``'s answer serves ``question``, and a
    verified cosine may later serve it: the hard guard passes and every slot agrees, the action,
    aspect and variant slots included (a judge never overrules numbers, negation or slots)."""
    return hard_guard(question, cached_question)[0] and slots_agree(question, cached_question, every_slot=True)[0]
