"""Whether a shopper's message asks for a person, in every language of ``KEFU_LANGUAGES``.

A word such as "human", "operator", "agent", "persona" or "担当" counts only when the sentence
asks for one: per language, a *person* word (``nouns``) and a *contact* word (``verbs``: talk,
connect, transfer, call back...) in the same sentence, within ``WINDOW`` characters of each
other in either order; or a message that is nothing but a person word ("human please",
"人工客服", "상담원 연결"); or one of a few phrases that ask on their own (``phrases``: "real
person", "转人工", "有人対応"). "Is the linen throw safe for human skin?", "Where is the operator
manual?" and "Which shipping agent delivers to Norway?" name a person word but ask for no one.

The phrase data were written for kefu, tuned on the ``tune`` half of bench/data/handoff_labels.jsonl
and measured on its ``held`` half (bench/handoff_eval.py; figures in bench/README.md).

Latin and Cyrillic words match at a word start (``\\b`` before, any ending after: "agente",
"agenten", "оператором"); Chinese, Japanese and Korean ones match as substrings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

#: Most characters between a contact word and a person word of one request ("I'd like to chat
#: with a member of your staff": 26). Measured on the tune half: 40 misses none of its requests
#: and takes none of its look-alikes.
WINDOW = 40

#: Polite filler a person-word-only message may carry ("human please", "un agente, por favor").
_FILLER = (
    r"(please|pls|plz|now|asap|por favor|s'il vous plaît|svp|bitte|per favore|alstublieft|"
    r"пожалуйста|请|麻烦|お願いします|주세요|a|an|un|una|une|um|uma|ein|einen|een|a real|real|"
    r"live|echten|vrai|human|humano|humain|umano|mens)"
)

#: Per language: ``nouns`` (a person kefu could hand over to), ``verbs`` (asking to reach one),
#: ``phrases`` (ask on their own). Regular-expression fragments, matched case-insensitively.
PHRASES: dict[str, dict[str, tuple[str, ...]]] = {
    "en": {
        "nouns": (
            "human",
            "person",
            "people",
            "agent",
            "operator",
            "representative",
            r"reps?\b",
            "someone",
            "somebody",
            "staff",
            "member of (your )?(staff|team)",
            "customer (service|support|care)",
            "manager",
            "supervisor",
        ),
        "verbs": (
            "talk",
            "speak",
            "chat",
            "connect",
            "transfer",
            "put me through",
            "get me",
            "give me",
            "pass me",
            "reach",
            "call me",
            "contact me",
            "escalate",
            r"(want|need|like|prefer) (a|an|to have a|to get a)\b",
        ),
        "phrases": ("real person", "live (agent|person|chat)", "actual person", "not a (bot|robot)"),
    },
    "zh": {
        "nouns": ("客服", "工作人员", "真人", "专员", "人来", "个人", "人工"),
        "verbs": ("转", "联系", "说话", "聊", "谈", "沟通", "找", "接", "换", "让"),
        "phrases": (
            "人工(?!智能|材料|湖|合成|皮)",
            "真人",
            "转接",
            "客服人员",
            "找客服",
            "接线员",
            "换个人",
            "找你们经理",
            "叫你们领导",
        ),
    },
    "ja": {
        "nouns": (
            "担当",
            "オペレーター",
            "スタッフ",
            "人間",
            "カスタマーサービス",
            "窓口",
            "係の",
            "人と",
            "人に",
            "サポートの方",
        ),
        "verbs": ("話", "つな", "繋", "代わ", "替わ", "連絡", "対応", "電話"),
        "phrases": ("有人対応", "人間と話", "人と話"),
    },
    "ko": {
        "nouns": ("상담원", "상담사", "직원", "사람", "담당자", "상담 ?직원", "매니저"),
        "verbs": ("이야기", "얘기", "대화", "연결", "바꿔", "통화", "물어", "채팅", "상담"),
        "phrases": ("상담원 ?연결", "사람이랑", "사람과 ?(대화|통화|이야기)"),
    },
    "es": {
        "nouns": (
            "persona",
            "agente",
            "humano",
            "representante",
            "operador",
            "empleado",
            "alguien",
            "atención al cliente",
            "asesor",
            "encargado",
        ),
        "verbs": (
            "habl",
            "comuníc",
            "comunic",
            "p[aá]s",
            "pon(me|ga)",
            "atiend",
            "atender",
            "transfi",
            "transfer",
            "contact",
            "conect",
            "llám",
            "llam",
        ),
        "phrases": ("carne y hueso", "persona real"),
    },
    "fr": {
        "nouns": (
            "conseill",
            "humain",
            "agent",
            "personne",
            "opérat",
            "service client",
            "quelqu'un",
            "interlocut",
            "membre de l'équipe",
            "vrai",
        ),
        "verbs": ("parl", "discut", "échang", "pass", "mett", "transf", "rappel", "relation", "contact"),
        "phrases": ("vraie personne", "interlocuteur humain"),
    },
    "de": {
        "nouns": (
            "mitarbeiter",
            "mensch",
            "berater",
            "person",
            "kundenservice",
            "kundendienst",
            "jemand",
            "agent",
            "operator",
            "ansprechpartner",
        ),
        "verbs": (
            "sprech",
            "rede",
            "verbind",
            "durchstell",
            "stellen sie mich",
            "zurückruf",
            "chatt",
            "hätte gern",
            "möchte",
            "will",
        ),
        "phrases": ("echten? (person|menschen)", "menschlichen ansprechpartner"),
    },
    "it": {
        "nouns": (
            "persona",
            "operator",
            "agente",
            "essere umano",
            "umano",
            "servizio clienti",
            "qualcuno",
            "consulente",
            "addetto",
        ),
        "verbs": ("parl", "pass", "mett", "contatt", "richiam", "chiam"),
        "phrases": ("persona reale", "operatore umano"),
    },
    "pt": {
        "nouns": (
            "pessoa",
            "atendente",
            "humano",
            "atendimento ao cliente",
            "alguém",
            "agente",
            "operador",
            "representante",
            "funcionári",
        ),
        "verbs": ("fal(ar|e|o)", "pass", "transf", "atendid", "lig(ar|ue|a)", "convers", "contat"),
        "phrases": ("pessoa de verdade", "pessoa real"),
    },
    "nl": {
        "nouns": ("mens", "medewerker", "klantenservice", "persoon", "iemand", "agent", "adviseur", "operator"),
        "verbs": (
            "prat",
            "spreek",
            "spreken",
            "verbind",
            "terugbel",
            "doorverbind",
            "zet me door",
            "aan de lijn",
            "geef me",
        ),
        "phrases": ("echt persoon", "echte mens"),
    },
    "ru": {
        "nouns": (
            "человек",
            "оператор",
            "сотрудник",
            "специалист",
            "менеджер",
            "консультант",
            "поддержк",
            "кто-нибудь",
            "кто-то",
        ),
        "verbs": ("поговор", "говор", "соедин", "переключ", "позов", "перезвон", "общат", "связ", "свяж"),
        "phrases": ("живо(й|го|м) (человек|сотрудник|оператор)", "живым (человеком|сотрудником|оператором)"),
    },
}

_CJK = {"zh", "ja", "ko"}
_SENTENCE_END = re.compile(r"[.!?。！？;；\n]+")


@dataclass(frozen=True)
class _Compiled:
    noun: re.Pattern[str]
    verb: re.Pattern[str]
    phrase: re.Pattern[str]
    only: re.Pattern[str]


def _alternation(parts: tuple[str, ...], *, words: bool, end: str = "") -> str:
    body = "|".join(f"(?:{p})" for p in parts)
    return rf"\b(?:{body}){end}" if words else f"(?:{body})"


@cache
def _compiled(locale: str) -> _Compiled:
    data = PHRASES[locale]
    words = locale not in _CJK
    # English person words are whole words ("humane" is not "human"); other languages' are stems.
    noun = _alternation(data["nouns"], words=words, end=r"s?\b" if locale == "en" else "")
    return _Compiled(
        noun=re.compile(noun, re.IGNORECASE),
        verb=re.compile(_alternation(data["verbs"], words=words), re.IGNORECASE),
        phrase=re.compile(_alternation(data["phrases"], words=words), re.IGNORECASE),
        only=re.compile(
            rf"^\W*(?:{_FILLER}\W+)*{noun}\w*(?:\W+{_FILLER})*\W*$"
            if words
            else rf"^\W*(?:请|麻烦)?转?{noun}(?:客服|服务)?\s*(?:연결|お願いします|주세요|を?お願い)?\W*$",
            re.IGNORECASE,
        ),
    )


# What a shopper gives along with a request (an e-mail, an order number, any token with a digit):
# not words, so "mei@example.com human please" is still nothing but a person word.
_DATA_PIECES = re.compile(r"[^\s@]+@[^\s@]+|\S*\d\S*")


@dataclass(frozen=True)
class PersonRequest:
    """Why a message was taken as asking for a person: ``locale`` whose phrase data matched,
    ``how`` (``"phrase"``, ``"only"``: nothing but a person word, or ``"asks"``: a contact word
    near a person word) and ``words``, the matched text (for ``"asks"``, the person word)."""

    locale: str
    how: str
    words: str


def _asks(sentence: str, c: _Compiled) -> str:
    """The person word of ``sentence`` that a contact word meets within ``WINDOW``, or ``""``."""
    nouns = list(c.noun.finditer(sentence))
    if not nouns:
        return ""
    for v in c.verb.finditer(sentence):
        for n in nouns:
            lo, hi = min(v.start(), n.start()), max(v.end(), n.end())
            if hi - lo <= WINDOW + max(len(v.group(0)), len(n.group(0))):
                return n.group(0)
    return ""


def asks_in(sentence: str, locale: str) -> str:
    """The person word that a contact word meets within ``WINDOW`` in ``sentence``, by
    ``locale``'s phrase data (``""`` when none, or ``locale`` has no phrase data)."""
    return _asks(sentence, _compiled(locale)) if locale in PHRASES else ""


def person_request(text: str, locale: str = "en") -> PersonRequest | None:
    """Whether ``text`` asks for a person, and why (:class:`PersonRequest`); ``None`` when it
    does not. ``locale``: the message's language (``lib.text.detect_locale``); its phrase data
    are tried first, then English's, then every other language's: a short message is often not
    told apart ("Ponme con un operador" reads as English), and the look-alikes of every language
    are measured against every language's data (bench/handoff_eval.py). Pure and cheap (regular
    expressions, ~0.1 ms)."""
    for lang in dict.fromkeys((locale, "en", *PHRASES)):
        if lang not in PHRASES:
            continue
        c = _compiled(lang)
        m = c.phrase.search(text)
        if m:
            return PersonRequest(lang, "phrase", m.group(0))
        if c.only.match(text) or c.only.match(_DATA_PIECES.sub(" ", text)):
            noun = c.noun.search(text)
            return PersonRequest(lang, "only", noun.group(0) if noun else text.strip())
        for sentence in _SENTENCE_END.split(text):
            words = _asks(sentence, c)
            if words:
                return PersonRequest(lang, "asks", words)
    return None


def wants_person(text: str, locale: str = "en") -> bool:
    """Whether ``text`` (in ``locale``) asks for a person (:func:`person_request`)."""
    return person_request(text, locale) is not None
