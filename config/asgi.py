"""ASGI entry point: HTTP through Django, WebSockets through Channels (served by Daphne)."""
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

import chat.routing  # noqa: E402
from chat.origins import WidgetOriginValidator  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": WidgetOriginValidator(AuthMiddlewareStack(URLRouter(chat.routing.websocket_urlpatterns))),
    }
)

if os.environ.get("KEFU_NO_WARMUP") != "1":
    # Train the FAQ model and warm the router (SDK import, tokenizers, tier classifier) in the
    # background as the server starts; /healthz says 503 until both are ready.
    from routing import warmup
    from routing.services import registry

    registry.start_background()
    warmup.start()
