"""HTTP endpoints of e-mail (docs/email.md, docs/protocol.md "Resuming from an e-mail"): the
widget's exchange of a resume code for its conversation.

Errors are JSON ``{"error": {"code": STR, "message": STR}}``. The endpoints take no cookies (a
code or a token authorises them), so they are exempt from CSRF and answer CORS for the widget's
origins (``KEFU_WIDGET_ORIGINS``, as the shopper socket admits them: ``chat.origins``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from . import mail
from .errors import AccessDenied
from .origins import origin_allowed


def error(status: int, code: str, message: str) -> JsonResponse:
    """The endpoints' error response: ``{"error": {"code", "message"}}`` with ``status``."""
    return JsonResponse({"error": {"code": code, "message": message}}, status=status)


def _cors(view: Callable[[HttpRequest], HttpResponse]) -> Callable[[HttpRequest], Any]:
    """Answer a preflight, and let the widget's origins read the response (module docstring)."""

    @wraps(view)
    def wrapper(request: HttpRequest) -> HttpResponse:
        origin = request.headers.get("Origin", "")
        allowed = bool(origin) and origin_allowed(origin, request.get_host(), list(settings.KEFU_WIDGET_ORIGINS))
        if request.method == "OPTIONS":
            response = HttpResponse(status=204 if allowed else 403)
        else:
            response = view(request)
        if allowed:
            response["Access-Control-Allow-Origin"] = origin
            response["Access-Control-Allow-Methods"] = "POST, OPTIONS"
            response["Access-Control-Allow-Headers"] = "Content-Type"
            response["Access-Control-Max-Age"] = "600"
            response["Vary"] = "Origin"
        response["Cache-Control"] = "no-store"
        return response

    return wrapper


def _json_body(request: HttpRequest) -> dict[str, Any] | None:
    try:
        body = json.loads(request.body or b"{}")
    except (ValueError, UnicodeDecodeError):
        return None
    return body if isinstance(body, dict) else None


@csrf_exempt
@_cors
def resume(request: HttpRequest) -> HttpResponse:
    """``POST /api/chat/resume`` ``{"code": STR}`` (the ``kefu-resume`` code of an e-mail's
    link): ``200 {"conversation": UUID, "token": STR}``, which the widget then sends in its
    ``hello``. The code works once and expires (``KEFU_RESUME_CODE_TTL_S``). ``400 invalid``
    (not JSON, no code), ``403 resume_invalid`` (unknown, used or expired), ``405`` other methods."""
    if request.method != "POST":
        return error(405, "method_not_allowed", "use POST")
    body = _json_body(request)
    if body is None or not isinstance(body.get("code"), str):
        return error(400, "invalid", 'send JSON {"code": "..."}')
    try:
        conversation, token = mail.resume_exchange(body["code"])
    except AccessDenied:
        return error(403, "resume_invalid", "This link was already used or has expired.")
    return JsonResponse({"conversation": str(conversation.pk), "token": token})
