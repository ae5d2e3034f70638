"""WebSocket URLs of the chat app.

``/ws/chat/`` admits the storefront origins of ``KEFU_WIDGET_ORIGINS`` (config/asgi.py wraps
every socket in ``WidgetOriginValidator``). ``/ws/agent/`` is authenticated by the session
cookie, so it also admits only origins on ``ALLOWED_HOSTS``: a storefront's page must not be
able to open an agent's socket with the agent's cookies (cross-site WebSocket hijacking).

Only the agent's socket goes through Channels' cookie, session and user middleware
(``AuthMiddlewareStack``): the shopper's socket reads neither session nor user (a shopper is
known by a signed token in ``hello``, chat.identity), and the session middleware wraps every
frame a socket sends, the many ``stream.delta`` frames of a shopper's answers included.
"""

from channels.auth import AuthMiddlewareStack
from channels.security.websocket import AllowedHostsOriginValidator
from django.urls import path

from . import consumers

websocket_urlpatterns = [
    path("ws/chat/", consumers.ShopperConsumer.as_asgi()),
    path("ws/agent/", AllowedHostsOriginValidator(AuthMiddlewareStack(consumers.AgentConsumer.as_asgi()))),
]
