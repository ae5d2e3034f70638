"""Text helpers shared by every part: the CJK character class and language detection.

Locales are ``"en"`` and ``"zh"`` (protocol 1's ``hello.locale``).
"""

from __future__ import annotations

import re

#: The CJK ideograph ranges kefu treats as Chinese (Unified Ideographs, Extension A and the
#: Compatibility Ideographs), as a character-class body: use ``rf"[{CJK_CLASS}]"``.
CJK_CLASS = "\u3400-\u9fff\uf900-\ufaff"
#: One CJK ideograph.
CJK = re.compile(rf"[{CJK_CLASS}]")
_LATIN = re.compile(r"[A-Za-z]")


def detect_locale(text: str, fallback: str = "en") -> str:
    """``"zh"`` when ``text`` holds a CJK ideograph, ``"en"`` when it holds a Latin letter, else
    ``fallback`` (e.g. the conversation's locale for "???" or "123")."""
    if CJK.search(text):
        return "zh"
    if _LATIN.search(text):
        return "en"
    return fallback
