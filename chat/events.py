"""Live events: every socket of a conversation joins the group ``conv.<uuid hex>``; frames for
the shopper are published to that group only after the write they describe has committed.

Group event shape: ``{"type": "chat.frame", "frame": <protocol frame>}`` plus, for stream deltas,
``"pos"`` (code points of the answer before this delta) so a socket that joined mid-stream and
already got the text so far can drop what it has (see ``ShopperConsumer.chat_frame``).
"""
from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

from channels.layers import get_channel_layer

from .models import Message
from .protocol import MessageFrame, StreamEndFrame, Usage


def conversation_group(conversation_id: uuid.UUID | str) -> str:
    return f"conv.{uuid.UUID(str(conversation_id)).hex}"


def _usd(value: Decimal) -> float:
    return float(round(value, 6))


def message_frame(msg: Message) -> MessageFrame:
    """A stored message as a ``message`` frame (bot messages carry their route; cut ones ``cut``)."""
    frame: MessageFrame = {"type": "message", "id": msg.pk, "seq": msg.seq, "role": msg.role, "text": msg.text}
    if msg.client_id:
        frame["client_id"] = msg.client_id
    if msg.route:
        frame["route"] = msg.route
    if msg.cut:
        frame["cut"] = True
    if msg.role == "agent":
        frame["agent"] = msg.agent_name or "Agent"
    return frame


def usage_of(msg: Message) -> Usage:
    return {
        "prompt_tokens": msg.prompt_tokens,
        "completion_tokens": msg.completion_tokens,
        "cost_usd": _usd(msg.cost_usd),
        "saved_usd": _usd(msg.saved_usd),
        "ttft_ms": None if msg.ttft_ms is None else round(msg.ttft_ms, 1),
        "latency_ms": None if msg.latency_ms is None else round(msg.latency_ms, 1),
        "estimated": msg.usage_estimated,
    }


def stream_end_frame(msg: Message) -> StreamEndFrame:
    frame: StreamEndFrame = {
        "type": "stream.end",
        "id": msg.pk,
        "seq": msg.seq,
        "text": msg.text,
        "route": msg.route,
        "model": msg.model or None,
        "usage": usage_of(msg),
    }
    if msg.cut:
        frame["cut"] = True
    return frame


async def publish(conversation_id: uuid.UUID | str, frame: Any, **extra: Any) -> None:
    """Send ``frame`` to every socket of the conversation (call only after the write committed)."""
    layer = get_channel_layer()
    await layer.group_send(conversation_group(conversation_id), {"type": "chat.frame", "frame": frame, **extra})
