"""HTTP endpoints of e-mail (docs/email.md, docs/protocol.md "Resuming from an e-mail"): the
widget's exchange of a resume code for its conversation, and the inbound webhook that turns a
shopper's e-mailed reply into their message (Mailgun's format, through django-anymail).

Errors are JSON ``{"error": {"code": STR, "message": STR}}``. The endpoints take no cookies (a
code or a token authorises them), so they are exempt from CSRF and answer CORS for the widget's
origins (``KEFU_WIDGET_ORIGINS``, as the shopper socket admits them: ``chat.origins``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Callable
from functools import wraps
from typing import Any

from anymail.webhooks.mailgun import MailgunInboundWebhookView
from asgiref.sync import async_to_sync
from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from . import answering, availability, events, inbound, mail, services
from .errors import AccessDenied
from .models import Message
from .origins import origin_allowed
from .protocol import ProtocolError, validate_contact

log = logging.getLogger(__name__)


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
            response["Access-Control-Allow-Headers"] = "Content-Type, X-Kefu-Conversation, X-Kefu-Token"
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


@csrf_exempt
@_cors
def transcript(request: HttpRequest) -> HttpResponse:
    """``POST /api/chat/transcript`` ``{"email": STR}`` with the conversation's id and token in
    ``X-Kefu-Conversation`` / ``X-Kefu-Token`` (never in the URL): the widget's "e-mail me the
    transcript" after a conversation closed. ``202 {"status": "queued"}`` (the e-mail leaves with
    the next sweep; asked again with nothing new: ``{"status": "already_queued"}``); ``400
    invalid`` (no valid address), ``403 forbidden`` (wrong id or token)."""
    if request.method != "POST":
        return error(405, "method_not_allowed", "use POST")
    try:
        conversation_id = uuid.UUID(request.headers.get("X-Kefu-Conversation", ""))
        services.conversation_authenticate(
            conversation_id=conversation_id, token=request.headers.get("X-Kefu-Token", "")
        )
    except (ValueError, AccessDenied):
        return error(403, "forbidden", "unknown conversation or wrong token")
    body = _json_body(request)
    try:
        email = validate_contact(body or {})
    except ProtocolError as e:
        return error(400, "invalid", e.message)
    queued = mail.transcript_owed(conversation_id=conversation_id, email=email)
    return JsonResponse({"status": "queued" if queued else "already_queued"}, status=202)


# --- replies by e-mail -----------------------------------------------------------------------------


async def _announce(conversation_id: uuid.UUID, message: Message, reopened: bool) -> None:
    await events.publish(conversation_id, events.message_frame(message))
    if reopened:
        await events.publish(conversation_id, await availability.status_frame(conversation_id, "bot"))
    answering.kick(conversation_id)  # answered as a message from the widget is


def inbound_receive(message: Any, *, event_id: str | None) -> Message | None:
    """Append an inbound e-mail (an ``AnymailInboundMessage``) to the conversation it answers
    (``chat.inbound.conversation_of``) as the shopper's message, quoted text and signature
    stripped, at most ``KEFU_MAX_MESSAGE_CHARS``; it is answered as usual. Stored once per
    ``Message-ID`` (a provider's retry stores nothing). Returns the stored message, or None when
    the e-mail names no conversation or holds no new text. Blocking."""
    recipients = [str(a.addr_spec) for a in (message.to or [])] + [str(message.envelope_recipient or "")]
    conversation_id = inbound.conversation_of(
        recipients=recipients,
        in_reply_to=str(message.get("In-Reply-To", "") or ""),
        references=str(message.get("References", "") or ""),
    )
    if conversation_id is None:
        log.info("inbound e-mail %s names no conversation; dropped", event_id)
        return None
    text = inbound.strip_reply(message.text or "") or inbound.strip_reply(message.stripped_text or "")
    if not text:
        log.info("inbound e-mail %s for %s holds no new text; dropped", event_id, conversation_id)
        return None
    key = str(message.get("Message-ID", "") or event_id or text)
    client_id = "email:" + hashlib.sha256(key.encode()).hexdigest()[:40]
    received = services.message_receive(
        conversation_id=conversation_id, client_id=client_id, text=text[: settings.KEFU_MAX_MESSAGE_CHARS]
    )
    if received.created:
        async_to_sync(_announce)(conversation_id, received.message, received.reopened)
    return received.message


class _Inbound(MailgunInboundWebhookView):
    """Anymail's Mailgun inbound view (signature checked against the webhook signing key; a bad
    one is a 400), handing each e-mail to :func:`inbound_receive` instead of a global signal."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        self.run_validators(request)
        for event in self.parse_events(request):
            inbound_receive(event.message, event_id=event.event_id)
        return HttpResponse()


def mailgun_inbound(request: HttpRequest) -> HttpResponse:
    """``POST /api/email/inbound/mailgun``: Mailgun's inbound route (``forward()`` to this URL,
    fully parsed or raw MIME), signed with ``KEFU_MAILGUN_WEBHOOK_SIGNING_KEY``: ``200`` (stored,
    or dropped when it names no conversation), ``400`` for a missing or wrong signature, ``404``
    when the key is not set (replies by e-mail off)."""
    key = settings.KEFU_MAILGUN_WEBHOOK_SIGNING_KEY
    if not key:
        raise Http404("replies by e-mail are off (KEFU_MAILGUN_WEBHOOK_SIGNING_KEY)")
    response: HttpResponse = _Inbound.as_view(webhook_signing_key=key)(request)
    return response
