"""Fencing of bot streams: once an agent takes a conversation over (or it is handed back or
closed), no chunk of a bot answer started under the old owner reaches the shopper.

``Conversation.owner_epoch`` is the truth: every change of owner bumps it in the database, in
the same UPDATE that changes the owner (``chat.services.conversation_take_over`` and friends). A
bot answer reads the epoch under the row lock when its row is created (``bot_message_begin``)
and streams under that epoch. Before every chunk it checks ``Fence.broken`` — a plain attribute,
no I/O — which is set:

* in the same process, synchronously, by ``advance()``, called by whoever committed the change
  right after the commit and before any frame about it is published;
* from other processes, by the change's ``fence.epoch`` event on the channel-layer group
  ``fence.<conversation hex>`` (``publish_epoch``), which each running stream listens to;
* and, to close the window between the start of the stream and its listener joining that group,
  by one database read of the epoch right after the listener joined.

A stream started under epoch N is broken by any epoch > N. The shopper socket also drops
``stream.delta`` events whose ``epoch`` is below the highest epoch it has seen on a ``status``
event (``ShopperConsumer.chat_frame``), so a delta still in flight from another process cannot
overtake the take-over's status frame.
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from contextlib import suppress

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

from .models import Conversation

log = logging.getLogger(__name__)


class Fenced(Exception):
    """The conversation changed owner while a bot answer streamed: stop sending it."""


def fence_group(conversation_id: uuid.UUID | str) -> str:
    return f"fence.{uuid.UUID(str(conversation_id)).hex}"


class Fence:
    """The epoch a bot stream runs under. ``check()`` raises ``Fenced`` once it is stale."""

    def __init__(self, conversation_id: uuid.UUID, epoch: int) -> None:
        self.conversation_id = conversation_id
        self.epoch = epoch
        self.broken = False
        self._listener: asyncio.Task[None] | None = None

    def check(self) -> None:
        if self.broken:
            raise Fenced(f"{self.conversation_id}: owner changed (stream epoch {self.epoch})")

    def see(self, epoch: int) -> None:
        if epoch > self.epoch:
            self.broken = True


# Streams running in this process, per conversation (usually one).
_active: dict[uuid.UUID, set[Fence]] = {}


def advance(conversation_id: uuid.UUID, epoch: int) -> None:
    """The conversation's owner epoch is now ``epoch``: break this process's streams started
    under an older one. Synchronous and immediate (call it right after the commit)."""
    for fence in list(_active.get(conversation_id, ())):
        fence.see(epoch)


def _epoch_in_db(conversation_id: uuid.UUID) -> int:
    return int(Conversation.objects.filter(pk=conversation_id).values_list("owner_epoch", flat=True).first() or 0)


async def _listen(fence: Fence) -> None:
    """Follow ``fence.epoch`` events of other processes while the stream runs."""
    layer = get_channel_layer()
    channel = await layer.new_channel()
    group = fence_group(fence.conversation_id)
    await layer.group_add(group, channel)
    try:
        # A change committed before we joined the group sent its event to nobody: read the truth.
        fence.see(await database_sync_to_async(_epoch_in_db)(fence.conversation_id))
        while not fence.broken:
            event = await layer.receive(channel)
            if event.get("type") == "fence.epoch":
                fence.see(int(event["epoch"]))
    finally:
        with suppress(Exception):  # the layer is gone (shutdown): nothing left to leave
            await asyncio.shield(layer.group_discard(group, channel))


def watch(conversation_id: uuid.UUID, epoch: int) -> Fence:
    """Start fencing a stream that runs under ``epoch``; call ``release`` when it ends."""
    fence = Fence(conversation_id, epoch)
    _active.setdefault(conversation_id, set()).add(fence)
    fence._listener = asyncio.get_running_loop().create_task(_listen(fence))
    return fence


async def release(fence: Fence) -> None:
    """Stop fencing (the stream ended)."""
    fences = _active.get(fence.conversation_id)
    if fences is not None:
        fences.discard(fence)
        if not fences:
            del _active[fence.conversation_id]
    task = fence._listener
    if task is not None and not task.done():
        task.cancel()
        with suppress(asyncio.CancelledError, Exception):
            await task
    elif task is not None and task.done() and not task.cancelled() and task.exception() is not None:
        log.warning("fence listener of %s failed: %r", fence.conversation_id, task.exception())


async def publish_epoch(conversation_id: uuid.UUID, epoch: int) -> None:
    """Tell every process's streams of this conversation that the owner epoch is now ``epoch``
    (after the change committed). Breaks this process's streams first, synchronously."""
    advance(conversation_id, epoch)
    await get_channel_layer().group_send(fence_group(conversation_id), {"type": "fence.epoch", "epoch": epoch})
