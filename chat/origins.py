"""Origin check for the shopper socket: the widget runs on storefronts of other origins, so the
check is an allow-list (``KEFU_WIDGET_ORIGINS``), not Django's ALLOWED_HOSTS.

An entry ``scheme://host`` admits that host on any port; ``scheme://host:port`` only that port;
``*`` admits every origin. A page served by kefu itself (same host as the request) is always
admitted. A request without an Origin header (a server-side integration, not a browser) is
admitted: the shopper socket is authorised by its conversation token, not by cookies, so there is
no cross-site request to forge. A refused handshake gets HTTP 403.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings


def origin_allowed(origin: str, host_header: str, allowed: list[str]) -> bool:
    if not origin:
        return True
    parts = urlsplit(origin.lower())
    if not parts.scheme or not parts.hostname:
        return False
    if host_header and parts.netloc == host_header.lower():
        return True
    for entry in allowed:
        if entry == "*":
            return True
        e = urlsplit(entry.lower())
        if e.scheme != parts.scheme or e.hostname != parts.hostname:
            continue
        if e.port is None or e.port == parts.port:
            return True
    return False


class WidgetOriginValidator:
    """ASGI middleware: refuses WebSocket handshakes from origins not allowed (see module doc)."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket":
            headers = dict(scope.get("headers") or [])
            origin = headers.get(b"origin", b"").decode("latin-1")
            host = headers.get(b"host", b"").decode("latin-1")
            if not origin_allowed(origin, host, list(settings.KEFU_WIDGET_ORIGINS)):
                denier = WebsocketDenier()
                return await denier(scope, receive, send)
        return await self.application(scope, receive, send)
