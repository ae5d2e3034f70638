"""ASGI entry point: HTTP through Django, WebSockets through Channels (served by Daphne)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter

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


_close_oversized_frames_with_1009()
# Bodies over kefu's limits are refused before they are read (config/body_limit.py).
install_daphne_guard()

application = ProtocolTypeRouter(
    {
        "http": BodyLimit(django_asgi_app),
        "websocket": WidgetOriginValidator(AuthMiddlewareStack(URLRouter(chat.routing.websocket_urlpatterns))),
    }
)

if env.raw("KEFU_NO_WARMUP") != "1":
    # Train the FAQ model and warm the router (SDK import, tokenizers, tier classifier) in the
    # background as the server starts; /healthz says 503 until both are ready.
    from routing.services import router_start

    router_start()
