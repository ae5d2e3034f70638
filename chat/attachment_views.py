"""HTTP views of attachments (issue 33; CONTRACT.md, "Attachments"; docs/protocol.md, "Attachments").

- ``POST /api/chat/attachments`` (:func:`attachment_upload`): a shopper's file, with the
  conversation's id and token in ``X-Kefu-Conversation`` / ``X-Kefu-Token``; or an agent's, with
  the console's session and ``X-Kefu-Conversation`` alone (same origin only). ``OPTIONS``: the CORS
  preflight, answered for the origins of ``KEFU_WIDGET_ORIGINS`` only (the widget runs on the
  store's origin). Never with credentials: a shopper is authorised by the token, not a cookie.
- ``GET /api/chat/attachments/<signed>`` (:func:`attachment_serve`): the file behind a signed
  link (``chat.attachments.link_sign``), under headers that keep a browser from running anything
  in it.

Errors are JSON ``{"error": {"code", "message"}}``.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.files.storage import storages
from django.core.files.uploadedfile import UploadedFile
from django.http import FileResponse, HttpRequest, HttpResponse, JsonResponse
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt

from . import attachments, errors, limits, selectors, services
from .attachments import Judged, TooLarge, Unsupported
from .origins import origin_allowed
from .protocol import parse_uuid

log = logging.getLogger(__name__)

#: The headers a cross-origin upload may send (the preflight's answer).
ALLOWED_HEADERS = "X-Kefu-Conversation, X-Kefu-Token, Content-Type"
#: How long a browser may keep a preflight's answer, seconds.
PREFLIGHT_MAX_AGE_S = 600
#: A served file runs nothing and loads nothing, even opened as a page of its own.
SERVE_CSP = "default-src 'none'; sandbox"


def _error(status: int, code: str, message: str, *, origin: str = "") -> JsonResponse:
    response = JsonResponse({"error": {"code": code, "message": message}}, status=status)
    if origin:
        _cors(response, origin)
    return response


def _cors(response: HttpResponseBase, origin: str) -> None:
    response["Access-Control-Allow-Origin"] = origin
    response["Vary"] = "Origin"


def _origin(request: HttpRequest) -> tuple[str, bool]:
    """The request's Origin ("" when none) and whether it may upload: a widget origin
    (``KEFU_WIDGET_ORIGINS``), kefu's own host, or no Origin at all (not a browser)."""
    origin = request.headers.get("Origin", "")
    return origin, origin_allowed(origin, request.get_host(), list(settings.KEFU_WIDGET_ORIGINS))


def _read(request: HttpRequest) -> tuple[UploadedFile | None, str]:
    """The uploaded ``file`` (parsing the multipart body), or None and why."""
    files = request.FILES.getlist("file")
    if len(files) != 1:
        return None, "send one file in the multipart field 'file'"
    return files[0], ""


def _judge(upload: UploadedFile) -> Judged:
    """Read and judge ``upload`` (``chat.attachments.judge``); raises ``TooLarge``/``Unsupported``."""
    if upload.size is not None and upload.size > settings.KEFU_ATTACHMENT_MAX_BYTES:
        raise TooLarge(f"the file is over {settings.KEFU_ATTACHMENT_MAX_BYTES} bytes")
    data = upload.read(settings.KEFU_ATTACHMENT_MAX_BYTES + 1)
    return attachments.judge(data, name=upload.name or "attachment")


@csrf_exempt
async def attachment_upload(request: HttpRequest) -> HttpResponse:
    """``POST /api/chat/attachments`` (module docstring): ``201`` ``{"id", "name",
    "content_type", "size", "url"}`` (``url``: an absolute signed link). Errors: ``400``
    ``invalid`` (no single ``file`` field), ``403`` ``forbidden`` (a wrong token or conversation,
    an origin not allowed, a non-agent without a token), ``413`` ``too_large`` (over
    ``KEFU_ATTACHMENT_MAX_BYTES``, an image's pixel limits, the conversation's caps), ``415``
    ``unsupported_type``, ``429`` ``rate_limited`` (a shopper's uploads per address; with
    ``Retry-After``). ``OPTIONS``: ``204`` with the CORS headers for an allowed origin, else ``403``."""
    origin, allowed = _origin(request)
    cors_origin = origin if allowed else ""
    if request.method == "OPTIONS":
        if not origin or not allowed:
            return _error(403, "forbidden", "this origin may not upload to this chat")
        response = HttpResponse(status=204)
        _cors(response, origin)
        response["Access-Control-Allow-Methods"] = "POST, OPTIONS"
        response["Access-Control-Allow-Headers"] = ALLOWED_HEADERS
        response["Access-Control-Max-Age"] = str(PREFLIGHT_MAX_AGE_S)
        return response
    if request.method != "POST":
        return _error(405, "method_not_allowed", "upload a file with POST", origin=cors_origin)
    if not allowed:
        return _error(403, "forbidden", "this origin may not upload to this chat")
    conversation_id = parse_uuid(request.headers.get("X-Kefu-Conversation"))
    if conversation_id is None:
        return _error(403, "forbidden", "X-Kefu-Conversation must be the conversation's id", origin=cors_origin)
    token = request.headers.get("X-Kefu-Token")
    role = await _uploader(request, conversation_id=conversation_id, token=token, origin=origin)
    if role is None:
        return _error(403, "forbidden", "not this conversation's token", origin=cors_origin)
    if role == "shopper":
        address = str(request.META.get("REMOTE_ADDR") or "unknown")
        if not await limits.upload_allowed(address):
            response = _error(429, "rate_limited", "too many files; wait a moment and send again", origin=cors_origin)
            response["Retry-After"] = "10"
            return response
    try:
        upload, why = await sync_to_async(_read, thread_sensitive=False)(request)
        if upload is None:
            return _error(400, "invalid", why, origin=cors_origin)
        judged = await sync_to_async(_judge, thread_sensitive=False)(upload)
        stored = await sync_to_async(services.attachment_store)(
            conversation_id=conversation_id, judged=judged, role=role
        )
    except TooLarge as e:
        return _error(413, e.code, e.message, origin=cors_origin)
    except Unsupported as e:
        return _error(415, e.code, e.message, origin=cors_origin)
    response = JsonResponse(
        {
            "id": stored.id,
            "name": stored.name,
            "content_type": stored.content_type,
            "size": stored.size,
            "url": request.build_absolute_uri(attachments.link_sign(stored.id)),
        },
        status=201,
    )
    response["Cache-Control"] = "no-store"
    if cors_origin:
        _cors(response, cors_origin)
    return response


async def _uploader(request: HttpRequest, *, conversation_id: uuid.UUID, token: str | None, origin: str) -> str | None:
    """Who uploads: "shopper" (the conversation's token), "agent" (no token, an agent's session,
    from kefu's own origin or none), or None (refused)."""
    if token:
        try:
            await sync_to_async(services.conversation_authenticate)(conversation_id=conversation_id, token=token)
        except errors.AccessDenied:
            return None
        return "shopper"
    if origin and not origin_allowed(origin, request.get_host(), []):
        return None  # an agent's upload comes from the console's own page
    user = await request.auser()
    if not user.is_authenticated:
        return None
    is_agent = await sync_to_async(selectors.user_is_agent)(user)
    exists = await sync_to_async(selectors.conversation_exists)(conversation_id=conversation_id)
    return "agent" if is_agent and exists else None


def attachment_serve(request: HttpRequest, signed: str) -> HttpResponseBase:
    """``GET /api/chat/attachments/<signed>``: the file, with ``X-Content-Type-Options:
    nosniff``, ``Content-Security-Policy: default-src 'none'; sandbox``, ``Cache-Control:
    private, no-store`` (never kept by a cache), ``Content-Disposition`` ``attachment`` for a PDF
    (a download, never shown inline) and ``inline`` for an image. Errors: ``403`` ``forbidden``
    (a link that is not valid), ``410`` ``expired``, ``404`` ``not_found`` (the file was deleted)."""
    if request.method not in ("GET", "HEAD"):
        return _error(405, "method_not_allowed", "use GET")
    try:
        attachment_id = attachments.link_open(signed)
    except attachments.LinkExpired as e:
        return _error(410, "expired", str(e))
    except attachments.LinkInvalid as e:
        return _error(403, "forbidden", str(e))
    found = selectors.attachment_file(attachment_id=attachment_id)
    if found is None:
        return _error(404, "not_found", "the file was deleted")
    name, content_type, display = found
    try:
        handle: Any = storages["attachments"].open(name, "rb")
    except OSError:
        return _error(404, "not_found", "the file was deleted")
    response = FileResponse(
        handle,
        content_type=content_type,
        as_attachment=content_type == "application/pdf",
        filename=display,
    )
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = SERVE_CSP
    response["Cache-Control"] = "private, no-store"
    response["Cross-Origin-Resource-Policy"] = "cross-origin"  # the widget shows it on the store's page
    response["Referrer-Policy"] = "no-referrer"
    return response
