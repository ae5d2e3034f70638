"""ASGI entry point: HTTP through Django, WebSockets through Channels (served by Daphne)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter

import chat.routing
from chat.origins import WidgetOriginValidator

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": WidgetOriginValidator(AuthMiddlewareStack(URLRouter(chat.routing.websocket_urlpatterns))),
    }
)

if os.environ.get("KEFU_NO_WARMUP") != "1":
    # Train the FAQ model and warm the router (SDK import, tokenizers, tier classifier) in the
    # background as the server starts; /healthz says 503 until both are ready.
    from routing.services import router_start

    router_start()
