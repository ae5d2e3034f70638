"""``{% load staff_time %}``: times on staff pages in the agent's time zone and locale.

The time zone is the one ``config.staff_locale`` activated (the browser's, else UTC); the format
is the active language's ``DATETIME_FORMAT`` (config/formats/: "7 Dec 2026, 18:05:09",
"2026年12月7日 18:05:09").
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django import template
from django.utils import formats, timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

register = template.Library()


def _when(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            return None
    return None


@register.filter
def staff_time(value: Any, fmt: str = "DATETIME_FORMAT") -> SafeString | Any:
    """An aware datetime or ISO 8601 string as ``<time datetime="ISO">local text</time>`` in the
    active time zone and language's ``fmt`` (a Django format name, default ``DATETIME_FORMAT``).
    None, "" and text that is no ISO time are returned as they are; a naive time is taken as UTC."""
    when = _when(value)
    if when is None:
        return value
    if timezone.is_naive(when):
        when = when.replace(tzinfo=UTC)
    local = timezone.localtime(when)
    return format_html('<time datetime="{}">{}</time>', when.isoformat(), formats.date_format(local, fmt))


@register.filter
def local_datetime(value: Any, fmt: str = "DATETIME_FORMAT") -> str | Any:
    """Like ``staff_time`` but the formatted text alone (for a ``<time>`` element the template
    writes itself)."""
    when = _when(value)
    if when is None:
        return value
    if timezone.is_naive(when):
        when = when.replace(tzinfo=UTC)
    return formats.date_format(timezone.localtime(when), fmt)


@register.filter
def status_label(value: str) -> str:
    """A conversation's stored status (``waiting_agent``) as the staff's words in the active
    language ("Waiting for an agent", "等待客服"); an unknown value as it is."""
    from chat.models import ConversationStatus

    try:
        return str(ConversationStatus(value).label)
    except ValueError:
        return value


@register.filter
def role_label(value: str) -> str:
    """A message's stored role (``shopper``) as the staff's word in the active language; an
    unknown value as it is."""
    from chat.models import Role

    try:
        return str(Role(value).label)
    except ValueError:
        return value
