"""WebSocket URLs of the chat app."""
from django.urls import path

from . import consumers

websocket_urlpatterns = [
    path("ws/chat/", consumers.ShopperConsumer.as_asgi()),
]
