"""HTTP views: the demo storefront and the agent console's pages."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib.auth.views import LoginView, redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.http.response import HttpResponseBase
from django.shortcuts import render
from django.utils import translation

from . import selectors, staff_text
from .errors import InvalidSearch
from .search import search
from .selectors import (
    conversation_exists,
    conversation_task,
    conversation_transcript,
    product_lookup,
    user_is_agent,
)
from .services import agent_display_name, conversation_task_clear

# The demo page runs under the strict policy the widget promises to work under (no inline script
# or style); a store embedding the widget needs connect-src for its kefu host (docs/widget.md).
STOREFRONT_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self' ws: wss:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)


def storefront(request: HttpRequest) -> HttpResponse:
    """``GET /``: a demo storefront with the chat widget; ``?lang=zh`` for the Chinese page."""
    lang = "zh" if request.GET.get("lang", "").lower().startswith("zh") else "en"
    response = render(request, "storefront.html", {"lang": lang})
    response["Content-Security-Policy"] = STOREFRONT_CSP
    return response


# --- Agent console (docs/console.md) -------------------------------------------------------------

# The console runs under the same strict policy as the storefront (no inline script or style).
CONSOLE_CSP = STOREFRONT_CSP
_HOST_SOURCE = re.compile(r"^[a-z0-9.-]+$")


def console_csp() -> str:
    """The console's policy: :data:`CONSOLE_CSP`, whose ``img-src`` also allows the store's
    domains and ``KEFU_PRODUCT_IMAGE_HOSTS`` (and their subdomains), where a product card's image
    may come from (docs/console.md, "Product cards"). No query."""
    hosts = sorted({*selectors.answer_link_domains(), *selectors.card_image_hosts()})
    sources = " ".join(f"{h} *.{h}" for h in hosts if _HOST_SOURCE.match(h))
    if not sources:
        return CONSOLE_CSP
    return CONSOLE_CSP.replace("img-src 'self' data:;", f"img-src 'self' data: {sources};", 1)


CONSOLE_LOGIN_URL = "/console/login/"


def _agent_only(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Anonymous users are sent to the console's login page; signed-in users who are not agents
    (``selectors.user_is_agent``) get 403."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path(), CONSOLE_LOGIN_URL)
        if not user_is_agent(request.user):
            raise PermissionDenied("agents only")
        response = view(request, *args, **kwargs)
        response["Content-Security-Policy"] = console_csp()
        response["Cache-Control"] = "no-store"
        return response

    return wrapper


@_agent_only
def console(request: HttpRequest) -> HttpResponse:
    """``GET /console/``: the agent console (the page is a shell; everything live comes over ``/ws/agent/``)."""
    # The console speaks the agent's language (config/staff_locale.py: the agent's choice, else
    # Accept-Language); ?lang=zh still overrides it for one page.
    try:
        lang = translation.get_supported_language_variant(request.GET.get("lang", ""))
    except LookupError:
        lang = translation.get_language()
    with translation.override(lang):
        # A catalog path on a product card ("/products/ember") is on the store's own site: its first
        # widget origin (docs/console.md, "Product cards").
        origins = getattr(settings, "KEFU_WIDGET_ORIGINS", []) or [""]
        return render(
            request,
            "console.html",
            {"agent_name": agent_display_name(request.user), "store_origin": origins[0]},
        )


@_agent_only
def console_transcript(request: HttpRequest, conversation_id: uuid.UUID) -> HttpResponse:
    """``GET /console/conversations/<id>/``: the whole stored conversation, each bot message with
    the route that answered it, the escalation packet and the internal notes (agents only)."""
    transcript = conversation_transcript(conversation_id=conversation_id)
    if transcript is None:
        raise Http404("no such conversation")
    # The router's and the handoff's own words in the agent's language (the request's).
    transcript["conversation"]["packet"] = staff_text.packet_for_staff(transcript["conversation"]["packet"])
    for m in transcript["messages"]:
        if m.get("reason"):
            m["reason"] = staff_text.reason_text(m["reason"])
    return render(request, "console_transcript.html", transcript)


@_agent_only
def console_task(request: HttpRequest, conversation_id: uuid.UUID) -> HttpResponse:
    """``GET /console/conversations/<id>/task``: what the shopper is doing across messages (the
    router's task, ``routing.orders.tasks``) as JSON ``{"task": {"intent", "order_number",
    "email", "awaiting", "source", "session_from_seq", "updated_at", "expires_at", "expired"} |
    null}``. ``POST`` with ``clear=1`` (form or JSON): forget it and any change it offered, so a
    later "yes" confirms nothing -> ``{"task": null, "cleared": bool}`` (whether there was one).
    404 for an unknown conversation, 400 for a POST without ``clear``, 405 for other methods;
    errors are ``{"error": {"code", "message"}}``. Agents only."""
    if request.method not in ("GET", "POST"):
        return _json_error(405, "method_not_allowed", "use GET to read the task, POST clear=1 to clear it")
    if not conversation_exists(conversation_id=conversation_id):
        return _json_error(404, "not_found", "no such conversation")
    if request.method == "GET":
        return JsonResponse({"task": conversation_task(conversation_id=conversation_id)})
    wanted = request.POST.get("clear", "")
    if not wanted and request.content_type == "application/json":
        try:
            body = json.loads(request.body or b"{}")
        except ValueError:
            return _json_error(400, "invalid", "the body is not JSON")
        wanted = str(body.get("clear", "")) if isinstance(body, dict) else ""
    if wanted.lower() not in ("1", "true"):
        return _json_error(400, "invalid", "say clear=1 to clear the conversation's task")
    cleared = conversation_task_clear(conversation_id=conversation_id, by=agent_display_name(request.user))
    return JsonResponse({"task": None, "cleared": cleared})


def _json_error(status: int, code: str, message: str) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message}}, status=status)


@_agent_only
def console_search(request: HttpRequest) -> HttpResponse:
    """``GET /console/api/search?q=TEXT`` (CONTRACT.md, "Staff search"; docs/search.md): JSON
    ``{"results": [{"conversation", "status", "last_message_at", "snippet"}, ...]}``, newest first,
    at most 50. A bad query is ``400 {"error": {"code": "invalid" | "too_long", "message"}}``."""
    try:
        hits = search(text=request.GET.get("q", ""), agent=request.user)
    except InvalidSearch as e:
        return JsonResponse({"error": {"code": e.code, "message": e.message}}, status=400)
    return JsonResponse({"results": [h.as_json() for h in hits]})


@_agent_only
def console_products(request: HttpRequest) -> HttpResponse:
    """``GET /console/api/products?q=TEXT&locale=en`` (docs/console.md, *Product lookup*;
    issue 36): the catalog's products whose SKU starts with ``TEXT`` or whose title holds it,
    an exact SKU first, at most 8, as product cards in ``locale`` (the conversation's; default
    ``en``): ``{"results": [card, ...]}`` (docs/protocol.md, *Product cards*). ``[]`` for a blank
    query; a query over 100 characters is ``400 {"error": {"code": "too_long", ...}}``."""
    q = request.GET.get("q", "")
    if len(q) > 100:
        return _json_error(400, "too_long", "a product lookup is at most 100 characters")
    locale = request.GET.get("locale", "en")[:16] or "en"
    return JsonResponse({"results": product_lookup(text=q, locale=locale)})


class ConsoleLoginView(LoginView):
    """``/console/login/``: Django's login form, then the console."""

    template_name = "registration/login.html"
    redirect_authenticated_user = False
    next_page = "/console/"

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        response = super().dispatch(request, *args, **kwargs)
        response["Content-Security-Policy"] = CONSOLE_CSP
        return response
