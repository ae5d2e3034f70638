"""Normalisation of a question into the key of the exact answer cache.

Two questions share an exact key when they differ only in case, full/half-width forms, punctuation
and spacing, in English and Chinese alike: ``"Do you ship to Canada?"``, ``"do you ship to canada"``
and ``"ＤＯ　ＹＯＵ ship to Canada ？"`` all give ``"do you ship to canada"``.

Unlike ``routing.faq.model.normalise_text`` this keeps numbers and names as they are: the exact
key must never merge two questions that need different answers (order numbers are refused by the
policy before they reach a key at all, see :mod:`cache_layer.policy`).
"""

from __future__ import annotations

import re
import unicodedata

from lib.text import CJK_CLASS

# Any run of characters that is neither a word character (letters, digits, CJK) nor whitespace.
# The apostrophe is dropped rather than turned into a space so "don't" and "dont" share a key.
_APOSTROPHE = re.compile(r"[’'`]")
_PUNCT = re.compile(r"[^\w\s]|_", re.UNICODE)
_SPACES = re.compile(r"\s+")
# Spaces between two CJK characters carry no meaning ("怎么 退货" == "怎么退货").
_CJK = rf"[{CJK_CLASS}]"
_CJK_GAP = re.compile(rf"(?<={_CJK})\s+(?={_CJK})")


def exact_key_text(text: str) -> str:
    """The exact-cache key text of ``text``.

    NFKC (full-width letters, digits and punctuation to their ASCII forms, ideographic space to a
    space), case folded, apostrophes removed, other punctuation to spaces, whitespace collapsed,
    spaces between Chinese characters removed. May return ``""`` (e.g. for ``"??"``): callers
    treat an empty key as uncacheable.
    """
    t = unicodedata.normalize("NFKC", text).casefold()
    t = _APOSTROPHE.sub("", t)
    t = _PUNCT.sub(" ", t)
    t = _SPACES.sub(" ", t).strip()
    return _CJK_GAP.sub("", t)
