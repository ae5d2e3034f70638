"""The two WebSockets: the shopper's (``shopper``) and the agent console's (``agent``), on a
shared base (``base``)."""

from .agent import AgentConsumer
from .base import CLOSE_FORBIDDEN, CLOSE_TOO_MANY
from .shopper import ShopperConsumer

__all__ = ["CLOSE_FORBIDDEN", "CLOSE_TOO_MANY", "AgentConsumer", "ShopperConsumer"]
