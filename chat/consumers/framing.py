"""Frames that never exceed the WebSocket size limit (docs/console.md#paging).

The server's message size limit is ``KEFU_WS_MAX_MESSAGE_BYTES`` (config/asgi.py sets it on
Daphne); a client that enforces the same limit (the ``websockets`` client's default ``max_size``
is the same 1 MiB) closes the socket on a bigger frame, and the console would reconnect and get
the same frame again. So every frame a socket sends is encoded here and measured in UTF-8 bytes
against :func:`frame_budget`; frames that carry a list (a page of the console list, a page of a
conversation's history) are built with :func:`fit_list`, which keeps as many items as fit.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from django.conf import settings


class FrameTooLarge(ValueError):
    """A frame that cannot be made to fit the byte budget (raised by :func:`fit_list` when not even
    one item fits; the generic guard in ``FrameSocket._send`` turns it into an ``error`` frame)."""


def encode(frame: Any) -> str:
    """The frame as sent: compact JSON, non-ASCII kept as is (``ensure_ascii=False``)."""
    return json.dumps(frame, ensure_ascii=False)


def byte_size(text: str) -> int:
    """The UTF-8 length of ``text``, bytes: what a WebSocket text message's payload measures."""
    return len(text.encode("utf-8", "surrogatepass"))


def frame_budget() -> int:
    """The most bytes a frame may take: ``KEFU_WS_MAX_MESSAGE_BYTES`` less 1/16 of it (64 KiB of
    the default 1 MiB), so that a field a caller adds after building a frame (``conversation``)
    or a proxy's re-framing never tips a page over the limit."""
    limit = int(settings.KEFU_WS_MAX_MESSAGE_BYTES)
    return limit - limit // 16


def fit_list(
    frame: dict[str, Any],
    key: str,
    items: list[Any],
    *,
    keep: Literal["head", "tail"],
    budget: int | None = None,
) -> tuple[str, int]:
    """Encode ``frame`` with ``frame[key]`` set to as many of ``items`` as fit in ``budget`` bytes
    (default :func:`frame_budget`): the first ones (``keep="head"``: a list page, in display
    order) or the last ones (``"tail"``: a history page, whose newest messages come last).
    Returns ``(encoded frame, how many items it holds)``; the caller sets its cursor from that
    count. ``frame`` itself is not changed. Raises :class:`FrameTooLarge` when the frame does not
    fit even with no item, or with items given, not even one fits."""
    limit = frame_budget() if budget is None else budget
    base = byte_size(encode({**frame, key: []}))
    if base > limit:
        raise FrameTooLarge(f"{frame.get('type')} frame of {base} bytes without its {key}")
    ordered = items if keep == "head" else list(reversed(items))
    used, count = base, 0
    for item in ordered:
        # json.dumps separates list items with ", " (2 bytes); the first item has none.
        cost = byte_size(encode(item)) + (2 if count else 0)
        if used + cost > limit:
            break
        used += cost
        count += 1
    if items and count == 0:
        raise FrameTooLarge(f"one item of the {frame.get('type')} frame's {key} is over {limit} bytes")
    kept = items[:count] if keep == "head" else items[len(items) - count :]
    text = encode({**frame, key: kept})
    assert byte_size(text) <= limit, "fit_list measured the frame wrong"
    return text, count
