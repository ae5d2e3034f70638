"""Attachments: what a file is, judged by its bytes, and the signed links that serve it (issue 33;
CONTRACT.md, "Attachments"; docs/security.md, "Attachments").

- :func:`judge`: the kind of an uploaded file from its content, never its name or the type the
  browser claimed. Images (JPEG, PNG, WebP, GIF, HEIC) are opened and verified by Pillow, refused
  when their pixel count or a side is over the limits (a decompression bomb) and re-encoded
  without any metadata (EXIF, GPS, camera, comments): JPEG, PNG and WebP stay what they are, a
  GIF becomes the PNG of its first frame, a HEIC a JPEG (its name and type say so). A PDF must
  open with pypdf and have at least one page; it is stored as sent (it is only ever served as a
  download). Anything else is :class:`Unsupported`.
- :func:`link_sign` / :func:`link_open`: a link to an attachment carries its id and an expiry,
  signed with ``SECRET_KEY`` (``django.core.signing``, salt ``kefu.attachment``); it is valid for
  ``KEFU_ATTACHMENT_LINK_TTL_S`` seconds. Every frame that shows an attachment signs a fresh one.

Pure functions: no database, no storage (``chat.services.attachments`` stores and deletes).
"""

from __future__ import annotations

import io
import time
import warnings
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from django.conf import settings
from django.core import signing
from PIL import Image, ImageOps, UnidentifiedImageError

from .protocol import AttachmentInfo

__all__ = [
    "Judged",
    "LinkExpired",
    "LinkInvalid",
    "TooLarge",
    "Unsupported",
    "attachment_json",
    "judge",
    "link_open",
    "link_sign",
]

#: Salt of the links' signatures: a link is never valid as any other signed value of kefu's.
LINK_SALT = "kefu.attachment"
#: The URL path of the serving view, before the signed part.
LINK_PREFIX = "/api/chat/attachments/"

#: Pillow's names of the image formats taken, and what each is stored as (format, content type, extension).
_IMAGE_OUT: dict[str, tuple[str, str, str]] = {
    "JPEG": ("JPEG", "image/jpeg", "jpg"),
    "PNG": ("PNG", "image/png", "png"),
    "WEBP": ("WEBP", "image/webp", "webp"),
    "GIF": ("PNG", "image/png", "png"),  # the first frame: nothing animated is served
    "HEIF": ("JPEG", "image/jpeg", "jpg"),  # browsers show no HEIC: stored as a JPEG
}

_heif_registered = False


class Unsupported(Exception):
    """Not an image or PDF kefu takes, or a damaged one (``code`` ``unsupported_type``, HTTP 415).
    ``message`` says why, for the shopper."""

    code = "unsupported_type"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class TooLarge(Exception):
    """Over a limit: ``KEFU_ATTACHMENT_MAX_BYTES``, an image's pixels or sides (a decompression
    bomb), or the conversation's cap (``code`` ``too_large``, HTTP 413)."""

    code = "too_large"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class LinkInvalid(Exception):
    """A link whose signature does not hold (tampered, or of another key)."""


class LinkExpired(Exception):
    """A link whose signature holds but whose time ran out."""


@dataclass(frozen=True)
class Judged:
    """What :func:`judge` found: the bytes to store (re-encoded for images), the name to show
    (the sent name's stem with the stored kind's extension), the content type, and an image's
    size in pixels (0 for a PDF)."""

    content: bytes
    name: str
    content_type: str
    width: int = 0
    height: int = 0

    @property
    def is_image(self) -> bool:
        return self.content_type.startswith("image/")


def _register_heif() -> None:
    global _heif_registered
    if not _heif_registered:
        from pillow_heif import register_heif_opener

        register_heif_opener()
        _heif_registered = True


def _display_name(sent: str, extension: str) -> str:
    """The sent name's last path part, without control characters, cut to 100 characters, with
    the stored kind's extension ("IMG_0042.HEIC" stored as JPEG -> "IMG_0042.jpg")."""
    base = PurePath(sent.replace("\\", "/")).name
    base = "".join(ch for ch in base if ch.isprintable() and ch not in '"<>').strip()
    stem = base.rsplit(".", 1)[0].strip() if "." in base else base
    return f"{(stem or 'attachment')[:100]}.{extension}"


def judge(data: bytes, *, name: str) -> Judged:
    """Judge an uploaded file by its bytes (module docstring). ``name``: as the client sent it
    (only its stem is kept, for showing). Raises :class:`TooLarge` (over
    ``KEFU_ATTACHMENT_MAX_BYTES``; an image over ``KEFU_ATTACHMENT_MAX_PIXELS`` pixels or
    ``KEFU_ATTACHMENT_MAX_SIDE`` pixels a side) and :class:`Unsupported` (anything else)."""
    if len(data) > settings.KEFU_ATTACHMENT_MAX_BYTES:
        raise TooLarge(f"the file is over {settings.KEFU_ATTACHMENT_MAX_BYTES} bytes")
    if not data:
        raise Unsupported("the file is empty")
    if data.startswith(b"%PDF-"):
        return _judge_pdf(data, name=name)
    return _judge_image(data, name=name)


def _judge_pdf(data: bytes, *, name: str) -> Judged:
    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pages = len(PdfReader(io.BytesIO(data), strict=False).pages)
    except (PyPdfError, ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError) as e:
        raise Unsupported(f"the PDF cannot be read ({type(e).__name__})") from None
    if pages < 1:
        raise Unsupported("the PDF has no pages")
    return Judged(content=data, name=_display_name(name, "pdf"), content_type="application/pdf")


def _judge_image(data: bytes, *, name: str) -> Judged:
    _register_heif()
    max_pixels = int(settings.KEFU_ATTACHMENT_MAX_PIXELS)
    max_side = int(settings.KEFU_ATTACHMENT_MAX_SIDE)
    try:
        with warnings.catch_warnings():
            # Pillow warns between MAX_IMAGE_PIXELS and twice that: an error here, at our own limit.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=list(_IMAGE_OUT)) as probe:
                kind = str(probe.format)
                width, height = probe.size
                if width * height > max_pixels or max(width, height) > max_side:
                    raise TooLarge(f"the image is {width}×{height} pixels; the limit is {max_side} a side")
                probe.verify()  # the whole file checked (CRCs, truncation) before it is decoded
            with Image.open(io.BytesIO(data), formats=[kind]) as image:
                image.seek(0)
                frame = ImageOps.exif_transpose(image)  # keep what the camera's rotation meant
                frame.load()
    except (Image.DecompressionBombWarning, Image.DecompressionBombError):
        raise TooLarge("the image has too many pixels") from None
    except UnidentifiedImageError:
        raise Unsupported("only JPEG, PNG, WebP, GIF, HEIC images and PDF files can be sent") from None
    except (OSError, SyntaxError, ValueError, EOFError, TypeError) as e:
        raise Unsupported(f"the image is damaged ({type(e).__name__})") from None
    out_format, content_type, extension = _IMAGE_OUT[kind]
    return Judged(
        content=_clean_copy(frame, out_format),
        name=_display_name(name, extension),
        content_type=content_type,
        width=frame.width,
        height=frame.height,
    )


def _clean_copy(frame: Image.Image, out_format: str) -> bytes:
    """The pixels of ``frame`` alone, encoded anew: a new image gets only the pixels (and a
    palette), never ``info`` or EXIF, so no metadata is carried over."""
    mode = frame.mode
    if out_format == "JPEG" and mode not in ("RGB", "L"):
        frame = frame.convert("RGBA").convert("RGB") if mode in ("P", "PA", "LA") else frame.convert("RGB")
    elif out_format != "JPEG" and mode not in ("RGB", "RGBA", "L", "LA", "P"):
        frame = frame.convert("RGBA")
    clean = Image.frombytes(frame.mode, frame.size, frame.tobytes())
    if frame.mode == "P":
        palette = frame.getpalette()
        if palette is not None:
            clean.putpalette(palette)
        if "transparency" in frame.info:  # which palette entry is see-through: pixels, not metadata
            clean.info["transparency"] = frame.info["transparency"]
    buffer = io.BytesIO()
    options: dict[str, Any] = {}
    if out_format == "JPEG":
        options = {"quality": 88, "optimize": True}
    elif out_format == "WEBP":
        options = {"quality": 88}
    elif out_format == "PNG":
        options = {"optimize": False}
    clean.save(buffer, format=out_format, **options)
    return buffer.getvalue()


# --- links ----------------------------------------------------------------------------------------


def link_sign(attachment_id: str, *, now: float | None = None) -> str:
    """A fresh link to attachment ``attachment_id``: ``/api/chat/attachments/<signed>``, valid
    for ``KEFU_ATTACHMENT_LINK_TTL_S`` seconds from ``now`` (epoch seconds; default: now)."""
    expires = int((time.time() if now is None else now) + settings.KEFU_ATTACHMENT_LINK_TTL_S)
    signed = signing.dumps([attachment_id, expires], salt=LINK_SALT, compress=False)
    return f"{LINK_PREFIX}{signed}"


def link_open(signed: str, *, now: float | None = None) -> str:
    """The attachment id of a link's signed part. Raises :class:`LinkInvalid` (tampered, not a
    link) and :class:`LinkExpired` (its time ran out)."""
    try:
        value = signing.loads(signed, salt=LINK_SALT)
    except signing.BadSignature:
        raise LinkInvalid("the link is not valid") from None
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], int)):
        raise LinkInvalid("the link is not valid")
    if value[1] < (time.time() if now is None else now):
        raise LinkExpired("the link has expired; reload the conversation for a new one")
    return value[0]


def attachment_json(meta: dict[str, Any]) -> AttachmentInfo:
    """A stored attachment's description (``{"id", "name", "content_type", "size"}``, as kept on
    its message) as frames show it: the same with a freshly signed ``url``."""
    return {
        "id": meta["id"],
        "name": meta["name"],
        "content_type": meta["content_type"],
        "size": meta["size"],
        "url": link_sign(meta["id"]),
    }
