"""ASGI entry point: HTTP through Django, WebSockets through Channels (served by Daphne)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter
from django.conf import settings

import chat.routing
from chat.origins import WidgetOriginValidator
from config.body_limit import BodyLimit, install_daphne_guard
from lib.settings_env import env


def _close_oversized_frames_with_1009() -> None:
    """A WebSocket message over Daphne's size limit (1 MiB) gets a close frame 1009 "message too
    big", as RFC 6455 says, instead of a dropped TCP connection (1006 at the client): Autobahn,
    under Daphne, fails connections by dropping them unless ``failByDrop`` is off, and Daphne has
    no option for it. Its factory is built when the server starts, after this module is imported."""
    try:
        from autobahn.websocket.protocol import WebSocketServerFactory
    except ImportError:  # another ASGI server: nothing to do
        return
    reset = WebSocketServerFactory.resetProtocolOptions
    if getattr(reset, "_kefu", False):
        return

    def reset_protocol_options(self: WebSocketServerFactory) -> None:
        reset(self)
        self.failByDrop = False

    reset_protocol_options._kefu = True  # type: ignore[attr-defined]
    WebSocketServerFactory.resetProtocolOptions = reset_protocol_options  # type: ignore[method-assign]


def _set_websocket_size_limit() -> None:
    """Set the WebSocket message (and frame) size limit to ``KEFU_WS_MAX_MESSAGE_BYTES`` on the
    server explicitly, whatever the command line says: Daphne passes its own defaults (1 MiB)
    to Autobahn's ``setProtocolOptions`` when it starts, and the consoles' frame builder
    (``chat.consumers.base``) keeps every frame it sends under the same number. Without this,
    the limit would be whatever the server's version defaults to."""
    try:
        from autobahn.websocket.protocol import WebSocketServerFactory
    except ImportError:  # another ASGI server: set its limit to the same number (docs/configuration.md)
        return
    set_options = WebSocketServerFactory.setProtocolOptions
    if getattr(set_options, "_kefu", False):
        return

    def set_protocol_options(self: WebSocketServerFactory, **options: object) -> None:
        if "maxMessagePayloadSize" in options or "maxFramePayloadSize" in options:
            options["maxMessagePayloadSize"] = settings.KEFU_WS_MAX_MESSAGE_BYTES
            options["maxFramePayloadSize"] = settings.KEFU_WS_MAX_MESSAGE_BYTES
        set_options(self, **options)

    set_protocol_options._kefu = True  # type: ignore[attr-defined]
    WebSocketServerFactory.setProtocolOptions = set_protocol_options  # type: ignore[method-assign,assignment]


_close_oversized_frames_with_1009()
_set_websocket_size_limit()
# Bodies over kefu's limits are refused before they are read (config/body_limit.py).
install_daphne_guard()

application = ProtocolTypeRouter(
    {
        "http": BodyLimit(django_asgi_app),
        "websocket": WidgetOriginValidator(URLRouter(chat.routing.websocket_urlpatterns)),
    }
)

if env.raw("KEFU_NO_WARMUP") != "1":
    # Train the FAQ model and warm the router (SDK import, tokenizers, tier classifier) in the
    # background as the server starts; /healthz says 503 until both are ready.
    from routing.services import router_start

    router_start()
