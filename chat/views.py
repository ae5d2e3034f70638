"""HTTP views: the demo storefront, the health check and the agent console's pages."""
from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from functools import wraps
from typing import Any

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.core.cache import cache
from django.db import connection
from django.contrib.auth.views import LoginView, redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from .selectors import conversation_transcript, user_is_agent
from .services import agent_display_name

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


def _check_database() -> str:
    with connection.cursor() as c:
        c.execute("SELECT 1")
    return "ok"


def _check_cache() -> str:
    cache.set("kefu:healthz", "1", 5)
    return "ok" if cache.get("kefu:healthz") == "1" else "error"


async def healthz(request: HttpRequest) -> JsonResponse:
    """``GET /healthz``: ``{"status", "database", "channel_layer", "cache", "faq_model", "router"}``,
    each ``ok``/``loading``/``error: ...``; HTTP 200 only when all are ``ok``, else 503. ``router``
    is the start-up warm-up (``routing.warmup``)."""
    from routing import warmup
    from routing.services import registry

    result: dict[str, str] = {}
    try:
        result["database"] = await sync_to_async(_check_database)()
    except Exception as e:  # health checks report failures rather than raise
        result["database"] = f"error: {type(e).__name__}"
    try:
        layer = get_channel_layer()
        name = await asyncio.wait_for(layer.new_channel(), 2)
        await asyncio.wait_for(layer.send(name, {"type": "healthz"}), 2)
        await asyncio.wait_for(layer.receive(name), 2)
        result["channel_layer"] = "ok"
    except Exception as e:
        result["channel_layer"] = f"error: {type(e).__name__}"
    try:
        result["cache"] = await sync_to_async(_check_cache)()
    except Exception as e:
        result["cache"] = f"error: {type(e).__name__}"
    if registry.ready:
        result["faq_model"] = "ok"
    else:
        result["faq_model"] = f"error: {registry.error}" if registry.error else "loading"
    result["router"] = warmup.status()
    ok = all(v == "ok" for v in result.values())
    return JsonResponse({"status": "ok" if ok else "unavailable", **result}, status=200 if ok else 503)


# --- Agent console (docs/console.md) -------------------------------------------------------------

# The console runs under the same strict policy as the storefront (no inline script or style).
CONSOLE_CSP = STOREFRONT_CSP
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
        response["Content-Security-Policy"] = CONSOLE_CSP
        response["Cache-Control"] = "no-store"
        return response

    return wrapper


@_agent_only
def console(request: HttpRequest) -> HttpResponse:
    """``GET /console/``: the agent console (the page is a shell; everything live comes over ``/ws/agent/``)."""
    return render(request, "console.html", {"agent_name": agent_display_name(request.user)})


@_agent_only
def console_transcript(request: HttpRequest, conversation_id: uuid.UUID) -> HttpResponse:
    """``GET /console/conversations/<id>/``: the whole stored conversation, each bot message with
    the route that answered it, the escalation packet and the internal notes (agents only)."""
    transcript = conversation_transcript(conversation_id=conversation_id)
    if transcript is None:
        raise Http404("no such conversation")
    return render(request, "console_transcript.html", transcript)


class ConsoleLoginView(LoginView):
    """``/console/login/``: Django's login form, then the console."""

    template_name = "registration/login.html"
    redirect_authenticated_user = False
    next_page = "/console/"

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response = super().dispatch(request, *args, **kwargs)
        response["Content-Security-Policy"] = CONSOLE_CSP
        return response
