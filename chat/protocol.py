"""Every frame of the shopper WebSocket ``/ws/chat/`` (protocol 1, see
docs/protocol.md) as a ``TypedDict``, plus the validation of client frames.

Lengths are counted in Unicode code points (``len`` of a Python ``str``).
"""

from __future__ import annotations

import unicodedata
import uuid
import zoneinfo
from typing import Any, Literal, NotRequired, TypedDict

PROTOCOL_VERSION = 1
CLIENT_ID_MAX = 64


class Usage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float  # USD, rounded to 6 decimals
    saved_usd: float  # USD, rounded to 6 decimals
    ttft_ms: float | None
    latency_ms: float | None
    estimated: bool


class AvailabilityInfo(TypedDict):
    """What a shopper is told about people (``chat.availability``): agents online now, the
    place in the agents' queue (1 = next; None unless waiting), the estimated wait in seconds
    (None: unknown) and whether the shopper left an e-mail address."""

    agents_online: int
    queue_position: int | None
    expected_wait_s: int | None
    contact_saved: bool


class ConversationFrame(TypedDict):
    type: Literal["conversation"]
    id: str
    token: str
    status: str
    protocol: int
    availability: NotRequired[AvailabilityInfo]


class AttachmentInfo(TypedDict):
    """A file of a message (issue 33): ``url`` is a signed link that expires
    (``KEFU_ATTACHMENT_LINK_TTL_S``), signed afresh in every frame."""

    id: str
    name: str
    content_type: str
    size: int
    url: str


class ProductCardInfo(TypedDict):
    """A product card (issue 36; docs/protocol.md, *Product cards*): plain text and checked
    addresses (``url``/``image``: ``http(s)`` on the store's domains or a ``/`` path; "" none)."""

    sku: str
    title: str
    price: str
    currency: str
    price_text: str
    stock: int | None
    url: str
    image: str
    price_max: NotRequired[str]
    description: NotRequired[str]
    facts: NotRequired[list[list[str]]]


class MessageFrame(TypedDict):
    type: Literal["message"]
    id: int
    seq: int
    role: str
    text: str
    client_id: NotRequired[str]
    route: NotRequired[str]
    cut: NotRequired[bool]
    superseded: NotRequired[bool]
    agent: NotRequired[str]
    attachments: NotRequired[list[AttachmentInfo]]
    cards: NotRequired[list[ProductCardInfo]]


class StreamStartFrame(TypedDict):
    type: Literal["stream.start"]
    id: int
    seq: int
    role: Literal["bot"]
    route: str


class StreamDeltaFrame(TypedDict):
    type: Literal["stream.delta"]
    id: int
    text: str


class StreamEndFrame(TypedDict):
    type: Literal["stream.end"]
    id: int
    seq: int
    text: str
    route: str
    model: str | None
    usage: Usage
    cut: NotRequired[bool]
    superseded: NotRequired[bool]
    cards: NotRequired[list[ProductCardInfo]]


class StatusFrame(TypedDict):
    type: Literal["status"]
    status: str
    agent: NotRequired[str]
    availability: NotRequired[AvailabilityInfo]


#: Longest e-mail address a ``contact`` frame may carry (RFC 5321's path limit, as Django's EmailField).
MAX_EMAIL_CHARS = 254


def validate_contact(content: dict[str, Any]) -> str:
    """The e-mail address of a ``contact`` frame (``{"type": "contact", "email": STR}``), trimmed.
    Raises :class:`ProtocolError` ``invalid`` when it is not a string, longer than
    :data:`MAX_EMAIL_CHARS` code points or not an address Django's ``validate_email`` accepts."""
    from django.core.exceptions import ValidationError
    from django.core.validators import validate_email

    email = content.get("email")
    if not isinstance(email, str) or is_blank(email):
        raise ProtocolError("invalid", "email must be a non-blank string")
    email = email.strip()
    if len(email) > MAX_EMAIL_CHARS:
        raise ProtocolError("invalid", f"email is {len(email)} characters; the limit is {MAX_EMAIL_CHARS}")
    try:
        validate_email(email)
    except ValidationError:
        raise ProtocolError("invalid", "that is not a valid e-mail address") from None
    return email


class NoticeFrame(TypedDict):
    """A passing word about the service (not stored, never replayed): ``code`` is stable
    (``starting``: the message is stored and will be answered once the bot is ready)."""

    type: Literal["notice"]
    code: str
    message: str


class CsatSavedFrame(TypedDict):
    """The reply to a shopper's ``{"type": "csat", "score": 1-5, "comment"?}`` on a closed
    conversation: the score stored."""

    type: Literal["csat.saved"]
    score: int


class ErrorFrame(TypedDict):
    type: Literal["error"]
    code: str
    message: str
    client_id: NotRequired[str]
    #: ``replay_limited`` only: whole seconds to wait before asking for the replay again.
    retry_after: NotRequired[int]


# --- Agent console: the shopper's orders (docs/protocol.md §6.1; chat.services.orders) -----------


class OrderItem(TypedDict):
    title: str
    quantity: int


class OrderTracking(TypedDict):
    """The latest parcel: ``url`` is "" when the carrier gives none."""

    carrier: str
    number: str
    url: str


class OrderRefundInfo(TypedDict):
    amount: str  # a decimal string in the order's currency ("129.00")
    status: str  # pending, succeeded, failed


class OrderInfo(TypedDict):
    """One order as the console shows it (no address, no e-mail: agents open the store's admin
    for those). ``placed_at``: ISO 8601 (UTC); ``total``: a decimal string in ``currency``."""

    number: str
    status: str
    placed_at: str
    total: str
    currency: str
    items: list[OrderItem]
    tracking: OrderTracking | None
    refunds: list[OrderRefundInfo]
    can_cancel: bool
    can_return: bool
    can_change_address: bool


class OrdersFrame(TypedDict):
    type: Literal["orders"]
    conversation: str
    orders: list[OrderInfo]
    source: Literal["verified", "proved", "none"]


class OrderActionFrame(TypedDict):
    type: Literal["order.action"]
    conversation: str
    request_id: str
    ok: Literal[True]
    action: str
    order: OrderInfo
    repeated: bool
    return_id: NotRequired[str]


#: What an agent may ask of an order (``store.types.ACTIONS``); the last three change it.
ORDER_ACTIONS = ("status", "refund_status", "cancel", "return", "change_address")
REQUEST_ID_MAX = 64
ORDER_NUMBER_MAX = 32


def validate_request_id(content: dict[str, Any]) -> str:
    """The ``request_id`` of an ``orders``/``order.action`` frame: 1-64 characters, printable."""
    request_id = content.get("request_id")
    if (
        not isinstance(request_id, str)
        or not request_id.strip()
        or len(request_id) > REQUEST_ID_MAX
        or not _encodable(request_id)
        or not request_id.isprintable()
    ):
        raise ProtocolError("invalid", f"request_id must be a string of 1-{REQUEST_ID_MAX} printable characters")
    return request_id


def validate_order_action(content: dict[str, Any]) -> tuple[str, str, str, dict[str, Any] | None]:
    """Check an agent's ``order.action`` frame; returns ``(order, action, request_id, address)``
    (``address`` only for ``change_address``: an object, its fields checked by the store).

    Raises ``ProtocolError("invalid")`` naming the first bad field."""
    request_id = validate_request_id(content)
    number = content.get("order")
    if (
        not isinstance(number, str)
        or not number.strip()
        or len(number) > ORDER_NUMBER_MAX
        or not _encodable(number)
        or not number.isprintable()
    ):
        raise ProtocolError("invalid", f"order must be an order number of 1-{ORDER_NUMBER_MAX} characters")
    action = content.get("action")
    if action not in ORDER_ACTIONS:
        raise ProtocolError("invalid", f"action must be one of {', '.join(ORDER_ACTIONS)}")
    address = None
    if action == "change_address":
        address = content.get("address")
        if not isinstance(address, dict):
            raise ProtocolError("invalid", "change_address needs an address object")
    return number.strip(), str(action), request_id, address


class ProtocolError(Exception):
    """A client frame that breaks the protocol. ``code`` is the ``error`` frame's code
    (``invalid`` or ``too_long``); ``client_id`` is echoed when the frame carried a usable one."""

    def __init__(self, code: str, message: str, client_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.client_id = client_id


def valid_time_zone(content: dict[str, Any]) -> str:
    """The ``time_zone`` of a ``hello`` (an extension, docs/protocol.md §4.2): an IANA name such
    as ``"Asia/Shanghai"`` this server's time zone database knows, else ``""`` (absent, or a name
    it does not know: a browser may report one newer than the server's database, and the chat
    must not fail for it). Raises :class:`ProtocolError` ``invalid`` when it is present but not a
    string of 1 to 64 characters."""
    zone = content.get("time_zone")
    if zone is None:
        return ""
    if not isinstance(zone, str) or not 1 <= len(zone) <= 64:
        raise ProtocolError("invalid", "time_zone must be an IANA time zone name of at most 64 characters")
    try:
        zoneinfo.ZoneInfo(zone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return ""
    return zone


def error_frame(code: str, message: str, client_id: str | None = None) -> ErrorFrame:
    frame: ErrorFrame = {"type": "error", "code": code, "message": message}
    if client_id is not None:
        frame["client_id"] = client_id
    return frame


def parse_uuid(value: Any) -> uuid.UUID | None:
    """``value`` as a UUID, or None when it is not a string holding one."""
    if not isinstance(value, str):
        return None
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


def _encodable(value: str) -> bool:
    """False for strings JSON can carry but UTF-8 cannot (lone surrogates such as "\\ud800")."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def is_blank(text: str) -> bool:
    """True when ``text`` holds only whitespace and invisible format characters (zero-width
    space, BOM, joiners: Unicode category Cf)."""
    return all(ch.isspace() or unicodedata.category(ch) == "Cf" for ch in text)


#: Most attachments one message may carry.
MAX_ATTACHMENTS = 10


def _short_strings(content: dict[str, Any], key: str, limit: int, what: str) -> list[str]:
    """``content[key]``: absent (``[]``) or a list of at most ``limit`` strings of 1-64
    characters (ids, SKUs). Raises ``ProtocolError("invalid")`` naming ``what`` otherwise."""
    values = content.get(key)
    if values is None:
        return []
    if (
        not isinstance(values, list)
        or len(values) > limit
        or not all(isinstance(v, str) and 0 < len(v) <= 64 for v in values)
    ):
        client_id = content.get("client_id")
        raise ProtocolError(
            "invalid",
            f"{key} must be a list of at most {limit} {what}",
            client_id if isinstance(client_id, str) else None,
        )
    return list(values)


def validate_message_files(content: dict[str, Any], *, max_chars: int) -> tuple[str, str, list[str]]:
    """Check a client ``message`` frame that may carry files (issue 33): ``attachments``, a list
    of at most :data:`MAX_ATTACHMENTS` attachment ids (strings), optional; with one at least,
    ``text`` may be empty or blank (a photo alone). Returns ``(client_id, text, ids)``. Raises
    like :func:`validate_message`, and ``ProtocolError("invalid")`` for a bad ``attachments``."""
    ids = _short_strings(content, "attachments", MAX_ATTACHMENTS, "attachment ids")
    text = content.get("text", "")
    if ids and isinstance(text, str) and is_blank(text):  # a photo alone (is_blank("") is True)
        client_id, _ = validate_message({**content, "text": "."}, max_chars=max_chars)
        return client_id, "", ids
    client_id, text = validate_message(content, max_chars=max_chars)
    return client_id, text, ids


#: Most product cards an agent's message may carry (``routing.types.MAX_CARDS``).
MAX_MESSAGE_CARDS = 3


def validate_cards(content: dict[str, Any]) -> list[str]:
    """The product SKUs of an agent's ``message`` frame (``cards``, optional: a list of at most
    :data:`MAX_MESSAGE_CARDS` SKU strings of 1-64 characters; issue 36), duplicates dropped.
    Raises ``ProtocolError("invalid")`` for anything else."""
    return list(dict.fromkeys(_short_strings(content, "cards", MAX_MESSAGE_CARDS, "product SKUs")))


def validate_message(content: dict[str, Any], *, max_chars: int) -> tuple[str, str]:
    """Check a client ``message`` frame; returns ``(client_id, text)``.

    Raises ``ProtocolError("invalid")`` for a missing/blank/over-long ``client_id`` or a
    non-string or blank ``text``, and ``ProtocolError("too_long")`` for text over ``max_chars``
    code points. The text is stored as sent (not stripped): nothing the shopper typed is lost.
    """
    client_id = content.get("client_id")
    if not isinstance(client_id, str) or not client_id.strip() or len(client_id) > CLIENT_ID_MAX:
        raise ProtocolError("invalid", f"client_id must be a non-empty string of at most {CLIENT_ID_MAX} characters")
    if not _encodable(client_id):
        raise ProtocolError("invalid", "client_id is not valid Unicode (lone surrogate)")
    text = content.get("text")
    if not isinstance(text, str):
        raise ProtocolError("invalid", "text must be a string", client_id)
    if not _encodable(text):
        raise ProtocolError("invalid", "text is not valid Unicode (lone surrogate)", client_id)
    if is_blank(text):
        raise ProtocolError("invalid", "text is blank", client_id)
    if len(text) > max_chars:
        raise ProtocolError("too_long", f"text is {len(text)} characters; the limit is {max_chars}", client_id)
    if "\x00" in text:
        raise ProtocolError("invalid", "text contains a NUL character", client_id)
    return client_id, text


def validate_text(content: dict[str, Any], *, max_chars: int, field: str = "text") -> str:
    """Check the ``text`` of an agent frame (``message``, ``note``); returns it as sent.

    Raises ``ProtocolError("invalid")`` for a non-string, blank, NUL-holding or non-UTF-8 text
    and ``ProtocolError("too_long")`` for one over ``max_chars`` code points.
    """
    text = content.get(field)
    if not isinstance(text, str):
        raise ProtocolError("invalid", f"{field} must be a string")
    if not _encodable(text):
        raise ProtocolError("invalid", f"{field} is not valid Unicode (lone surrogate)")
    if is_blank(text):
        raise ProtocolError("invalid", f"{field} is blank")
    if len(text) > max_chars:
        raise ProtocolError("too_long", f"{field} is {len(text)} characters; the limit is {max_chars}")
    if "\x00" in text:
        raise ProtocolError("invalid", f"{field} contains a NUL character")
    return text
