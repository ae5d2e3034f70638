"""Search terms of a text, the same at write time and at query time (chat.search).

A message's terms are a space-separated string of index keys (``Message.search_terms``), which
PostgreSQL indexes as an array (GIN) and SQLite as an FTS5 column split on spaces only. The terms
are computed in Python when the row is written, so the index needs no tokenizer of the database's
own, and one- and two-character Chinese words are found: a trigram index (FTS5's ``trigram``,
``pg_trgm``) cannot serve a query under three characters, and two characters is Chinese's
commonest word length.

Terms of a text (:func:`index_terms`), after NFKC and case folding:

- words of spaced scripts (Latin, Cyrillic, Greek, Arabic, Hangul...): each ``\\w`` run;
- scripts written without spaces (Chinese, Japanese kana, Thai, Lao, Khmer, Myanmar): every
  character and every pair of neighbouring characters (unigrams and bigrams), so a query word of
  any length is the set of its bigrams (one character: itself);
- e-mail addresses, whole (``ann@example.com``) besides their words;
- order numbers and other codes (``KF-1001``, ``#1001``, ``A12-77``): whole without ``#`` and
  hyphens (``kf1001``) besides their parts (``kf``, ``1001``), so "KF-1001", "kf1001", "#1001"
  and "order 1001" all find a message naming ``KF-1001``.

:func:`query_terms` gives the terms every matching text must hold (AND), and the runs of unspaced
script of three characters or more, which the caller checks against the text itself (bigrams
``AB BC CD`` also occur in a text holding ``AB`` and ``BCD`` apart).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

__all__ = ["MAX_TERMS", "Query", "index_terms", "looks_like_email", "normalise", "query_terms"]

#: At most this many distinct terms are kept per text (first come first kept): a 2,000-character
#: Chinese message yields about 4,000 (unigrams + bigrams), and a message is capped at 2,000
#: characters by the console and the widget, so this bounds the row without cutting real messages.
MAX_TERMS = 4096

# Scripts written without spaces between words: Han (CJK ideographs, Extension A, compatibility
# ideographs), Hiragana, Katakana, Thai, Lao, Myanmar, Khmer.
_UNSPACED = "\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u0e00-\u0e7f\u0e80-\u0eff\u1000-\u109f\u1780-\u17ff"
_UNSPACED_RUN = re.compile(rf"[{_UNSPACED}]+")
# A word of a spaced script: \w without the unspaced scripts and without "_".
_WORD = re.compile(rf"[^\W_{_UNSPACED}]+")
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
# A code: letters and digits joined by "-" or "#", holding at least one digit ("KF-1001", "#1001").
_CODE = re.compile(r"#?[a-z0-9]+(?:[-#][a-z0-9]+)+|#[0-9]+")
_EMAIL_ALONE = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")


def normalise(text: str) -> str:
    """NFKC then case folding: full-width ``ＫＦ－１００１`` is ``kf-1001``, ``Straße`` is ``strasse``."""
    return unicodedata.normalize("NFKC", text).casefold()


def looks_like_email(text: str) -> bool:
    """Whether ``text`` (stripped) is one e-mail address (``local@domain.tld``)."""
    return bool(_EMAIL_ALONE.match(text.strip()))


def _codes(norm: str) -> list[str]:
    return [
        m.group(0).replace("#", "").replace("-", "")
        for m in _CODE.finditer(norm)
        if any(c.isdigit() for c in m.group(0))
    ]


def index_terms(text: str) -> str:
    """The terms of ``text`` as one space-separated string, each once, at most :data:`MAX_TERMS`
    (``""`` for a text without any). Pure and deterministic: the same text always gives the same
    string."""
    norm = normalise(text)
    seen: dict[str, None] = {}

    def add(term: str) -> None:
        if term and len(seen) < MAX_TERMS:
            seen.setdefault(term, None)

    for email in _EMAIL.findall(norm):
        add(email)
    for code in _codes(norm):
        add(code)
    for word in _WORD.findall(norm):
        add(word)
    for run in _UNSPACED_RUN.findall(norm):
        for i, ch in enumerate(run):
            add(ch)
            if i + 1 < len(run):
                add(run[i : i + 2])
    return " ".join(seen)


@dataclass(frozen=True)
class Query:
    """What a search text asks for: ``terms`` every matching text holds (its index terms, AND),
    ``phrases`` (normalised runs of unspaced script, three characters or more) the text must also
    contain as written, ``email`` (the normalised address when the whole query is one e-mail,
    else ``""``) and ``raw`` (the query stripped, for exact ids such as a customer id)."""

    terms: tuple[str, ...]
    phrases: tuple[str, ...]
    email: str
    raw: str


def query_terms(text: str) -> Query:
    """The :class:`Query` of a search text. An empty ``terms`` means nothing to look up in the
    message index (a query of punctuation only)."""
    norm = normalise(text).strip()
    terms: dict[str, None] = {}
    email = norm if looks_like_email(norm) else ""
    for found in _EMAIL.findall(norm):
        terms.setdefault(found, None)
    rest = _EMAIL.sub(" ", norm)
    codes = _codes(rest)
    for code in codes:
        terms.setdefault(code, None)
    rest = _CODE.sub(lambda m: " " if any(c.isdigit() for c in m.group(0)) else m.group(0), rest)
    for word in _WORD.findall(rest):
        terms.setdefault(word, None)
    phrases: list[str] = []
    for run in _UNSPACED_RUN.findall(rest):
        if len(run) == 1:
            terms.setdefault(run, None)
            continue
        for i in range(len(run) - 1):
            terms.setdefault(run[i : i + 2], None)
        if len(run) >= 3:
            phrases.append(run)
    return Query(terms=tuple(terms), phrases=tuple(phrases), email=email, raw=text.strip())
