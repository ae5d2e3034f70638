"""Passing notices for the shopper (``notice`` frames): not stored, never replayed.

Texts per locale; a locale without its own texts gets English.
"""

from __future__ import annotations

from .protocol import NoticeFrame

NOTICES: dict[str, dict[str, str]] = {
    "starting": {
        "en": "We're just starting up. Your message is saved and we'll answer it in a moment.",
        "zh": "系统正在启动，您的消息已保存，稍后马上为您解答。",
    },
}


def notice_frame(code: str, locale: str) -> NoticeFrame:
    """The ``notice`` frame ``code`` in ``locale`` (English when the locale has no text).
    Raises ``KeyError`` for an unknown code."""
    texts = NOTICES[code]
    return {"type": "notice", "code": code, "message": texts.get(locale, texts["en"])}
