"""HTTP views: the demo storefront and the health check."""
from __future__ import annotations

import asyncio

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.core.cache import cache
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

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
    """``GET /healthz``: ``{"status", "database", "channel_layer", "cache", "faq_model"}``, each
    ``ok``/``loading``/``error: ...``; HTTP 200 only when all are ``ok``, else 503."""
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
    ok = all(v == "ok" for v in result.values())
    return JsonResponse({"status": "ok" if ok else "unavailable", **result}, status=200 if ok else 503)
