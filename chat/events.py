"""Live events: every socket of a conversation joins the group ``conv.<uuid hex>``; frames for
the shopper are published to that group only after the write they describe has committed.

Group event shape: ``{"type": "chat.frame", "frame": <protocol frame>}`` plus, for stream deltas,
``"pos"`` (code points of the answer before this delta) so a socket that joined mid-stream and
already got the text so far can drop what it has (see ``ShopperConsumer.chat_frame``).
"""

from __future__ import annotations

import logging
import uuid
from decimal import Decimal
from typing import Any

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.db import DatabaseError

from routing import services as router

from . import availability, fencing, regroup, selectors
from .attachments import attachment_json
from .models import Message
from .protocol import MessageFrame, StreamEndFrame, Usage

log = logging.getLogger(__name__)


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
    if msg.superseded:
        frame["superseded"] = True
    if msg.role == "agent":
        frame["agent"] = msg.agent_name or "Agent"
    if msg.attachments:
        # Signed afresh for every frame built, replays and history pages too (issue 33).
        frame["attachments"] = [attachment_json(a) for a in msg.attachments]
    if msg.cards:
        frame["cards"] = list(msg.cards)
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
    if msg.superseded:
        frame["superseded"] = True
    if msg.cards:
        frame["cards"] = list(msg.cards)
    return frame


# Frames whose publication also updates the console's conversation list (see ``_list_update``).
_LISTED = frozenset({"message", "stream.end", "status"})


async def _group_send(group: str, event: dict[str, Any]) -> bool:
    """``group_send`` that reports a failure of the layer instead of raising it: False (logged)
    when the layer could not take the event even after its connection retries
    (lib/redis_conn.py); the sockets of the group this process serves get it anyway. Live
    frames are a copy of what is stored; a socket that missed one catches up from the stored
    messages when it resumes."""
    try:
        await get_channel_layer().group_send(group, event)
        return True
    except Exception as e:  # Redis down beyond the retries: the stored rows remain the truth
        # This process's own sockets in the group still get it (chat.regroup.deliver_locally).
        local = await regroup.deliver_locally(group, event)
        log.warning(
            "publishing a %s frame to %s failed (%r); delivered to %d local sockets",
            event.get("frame", {}).get("type"),
            group,
            e,
            local,
        )
        return False


async def publish(conversation_id: uuid.UUID | str, frame: Any, **extra: Any) -> bool:
    """Send ``frame`` to every socket of the conversation (call only after the write committed):
    the shopper's sockets and the agent sockets following it. The event also names the
    conversation (``conversation``, for agent sockets). Stored messages, stream ends and status
    changes are also summarised to every agent console (group ``agents``). Never raises for a
    failing layer: returns False (logged) when the conversation's group could not be sent to."""
    cid = str(conversation_id)
    sent = await _group_send(
        conversation_group(cid), {"type": "chat.frame", "frame": frame, "conversation": cid, **extra}
    )
    if frame.get("type") in _LISTED:
        update = _list_update(cid, frame)
        if frame["type"] == "status":
            # The list's sections changed size: every console shows the new counts, also those
            # that do not list this conversation (they get only the counts; docs/console.md#paging).
            update["counts"] = await _console_counts()
        if frame["type"] == "status" or update.get("last_message", {}).get("seq") == 1:
            # A console that does not list it yet shows its row with the shopper's face (name, time
            # zone, language), not a bare "Visitor" (issue 31).
            info = await _console_row(cid)
            if info is not None:
                update["info"] = info
        await publish_agents(update)
    return sent


async def _console_row(conversation_id: str) -> dict[str, Any] | None:
    """The conversation's console row (``selectors.console_rows``: one query), or None when it is
    gone or the database could not say (the frame then goes without it)."""
    try:
        return await database_sync_to_async(selectors.console_row)(conversation_id=conversation_id)
    except DatabaseError:
        log.warning("console row unavailable", exc_info=True)
        return None


async def _console_counts() -> dict[str, int] | None:
    """The console list's counts (``selectors.console_counts``: one query), or None when the
    database could not say (the frame then goes without them)."""
    try:
        return await database_sync_to_async(selectors.console_counts)()
    except DatabaseError:
        log.warning("console counts unavailable", exc_info=True)
        return None


async def publish_answer(conversation_id: uuid.UUID | str, msg: Message, *, epoch: int) -> bool:
    """Send a fixed answer stored whole (``services.bot_message_answered``, after it committed) as
    its stream in one group event (``chat.frames``): ``stream.start``, one ``stream.delta`` with
    the whole text (``pos`` 0), ``stream.end``, the order :func:`publish` would have sent them in
    three events; then the console list update of the ``stream.end``. ``epoch``: the owner epoch
    it was written under. False (logged) when the layer failed."""
    cid = str(conversation_id)
    frames: list[Any] = [
        {"type": "stream.start", "id": msg.pk, "seq": msg.seq, "role": "bot", "route": msg.route},
    ]
    pos = 0
    for piece in router.answer_pieces(
        msg.text
    ):  # pieces as a stream would bring them; the widget shows them as they come
        frames.append({"type": "stream.delta", "id": msg.pk, "text": piece, "pos": pos})
        pos += len(piece)
    end = stream_end_frame(msg)
    frames.append(end)
    sent = await _group_send(
        conversation_group(cid),
        {"type": "chat.frames", "frames": frames, "conversation": cid, "epoch": epoch},
    )
    await publish_agents(_list_update(cid, end))
    return sent


def frames_of(event: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``chat.frame`` events a ``chat.frames`` event stands for, in order, each with the
    group event's ``conversation``, ``epoch`` and (for its delta) ``pos``: what a consumer hands
    to its ``chat_frame`` one by one."""
    extra: dict[str, Any] = {k: event[k] for k in ("conversation", "epoch") if k in event}
    out = []
    for frame in event["frames"]:
        one: dict[str, Any] = {"type": "chat.frame", "frame": frame, **extra}
        if frame["type"] == "stream.delta":
            one["frame"] = {k: v for k, v in frame.items() if k != "pos"}
            one["pos"] = frame.get("pos", 0)
        out.append(one)
    return out


# --- Staff-only events (agent console; docs/console.md). The shopper's sockets never join these groups.

AGENTS_GROUP = "agents"


def staff_group(conversation_id: uuid.UUID | str) -> str:
    """Agent sockets following a conversation: internal notes, the shopper's typing."""
    return f"staff.{uuid.UUID(str(conversation_id)).hex}"


def _list_update(conversation_id: str, frame: Any) -> dict[str, Any]:
    """A ``conversation.update`` frame for the console list from a published conversation frame."""
    update: dict[str, Any] = {"type": "conversation.update", "conversation": conversation_id}
    if frame["type"] == "status":
        update["status"] = frame["status"]
        update["agent"] = frame.get("agent", "")
    else:
        last: dict[str, Any] = {"seq": frame["seq"], "role": frame.get("role", "bot"), "text": frame["text"][:200]}
        if frame.get("route"):
            last["route"] = frame["route"]
        if frame.get("agent"):
            last["agent"] = frame["agent"]
        update["last_message"] = last
    return update


async def publish_agents(frame: Any) -> bool:
    """Send ``frame`` to every agent console socket (after the write it describes committed);
    False (logged) when the layer failed."""
    return await _group_send(AGENTS_GROUP, {"type": "agents.frame", "frame": frame})


async def publish_staff(conversation_id: uuid.UUID | str, frame: Any) -> bool:
    """Send ``frame`` to the agent sockets following the conversation, never to the shopper;
    False (logged) when the layer failed."""
    cid = str(conversation_id)
    return await _group_send(staff_group(cid), {"type": "staff.frame", "frame": frame, "conversation": cid})


async def publish_owner_change(*, conversation_id: uuid.UUID, status: str, agent: str, epoch: int) -> None:
    """After a take-over, hand-back or close committed: stop this conversation's bot streams in
    every process (``chat.fencing``), then send the ``status`` frame (with ``agent`` when one
    holds it) to the conversation and the console list. The event carries ``epoch`` so shopper
    sockets drop bot deltas of older epochs still in flight. The frame carries the shopper's
    ``availability`` (``chat.availability.status_frame``)."""
    cid = uuid.UUID(str(conversation_id))
    await fencing.publish_epoch(cid, epoch)
    await publish(conversation_id, await availability.status_frame(cid, status, agent=agent), epoch=epoch)
