"""Logs without shopper text or personal data (docs/security.md, "Logs").

kefu's own log lines never carry what a shopper wrote: where a line would name a question or an
answer it logs :func:`shopper_text` of it, which is only its length unless the operator set
``KEFU_LOG_SHOPPER_TEXT`` (for a developer chasing a bug on their own machine).

:class:`RedactPersonalData` is the backstop on the log handlers for every other line (a library's
exception message that quotes its input, say): e-mail addresses and runs of 10 or more digits
(phone numbers, card numbers, Chinese ID numbers; a message id stays readable) become
``[email]`` / ``[number]``, in the message and in a traceback's text.
"""

from __future__ import annotations

import logging
import re

from django.conf import settings

__all__ = ["RedactPersonalData", "redact", "shopper_text"]

_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
# 10+ digits, possibly split by spaces, dots, dashes or brackets ("+86 138 0013 8000",
# "4111-1111-1111-1111", "11010519491231002X"), or 7+ after a "+" (an international number).
_NUMBER = re.compile(r"(?<![\w.])(?:\+\s?\d(?:[\s.()-]?\d){6,}|\d(?:[\s.()-]?\d){9,}[Xx]?)(?![\w])")


def redact(text: str) -> str:
    """``text`` with e-mail addresses and long digit runs replaced (see the module docstring)."""
    return _NUMBER.sub("[number]", _EMAIL.sub("[email]", text))


def shopper_text(text: str | None) -> str:
    """What a log line may say of a shopper's (or a model's) text: ``"<N chars>"``, or the text
    itself when ``KEFU_LOG_SHOPPER_TEXT`` is on."""
    if getattr(settings, "KEFU_LOG_SHOPPER_TEXT", False):
        return repr(text)
    return f"<{len(text or '')} chars>"


class RedactPersonalData(logging.Filter):
    """A handler filter: the record's message (its arguments merged in) and its traceback text
    pass through :func:`redact`. Off when ``KEFU_LOG_SHOPPER_TEXT`` is on. Never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(settings, "KEFU_LOG_SHOPPER_TEXT", False):
            return True
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: leave it to the formatter's own error path
            return True
        record.msg, record.args = redact(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True
