"""Fencing of bot streams: once an agent takes a conversation over (or it is handed back or
closed), no chunk of a bot answer started under the old owner reaches the shopper.

``Conversation.owner_epoch`` is the truth: every change of owner bumps it in the database, in
the same UPDATE that changes the owner (``chat.services.conversation_take_over`` and friends). A
bot answer reads the epoch under the row lock when its row is created (``bot_message_begin``)
and streams under that epoch. Before every chunk it checks ``Fence.broken`` — a plain attribute,
no I/O — which is set:

* in the same process, synchronously, by ``advance()``, called by whoever committed the change
  right after the commit and before any frame about it is published;
* from other processes, through Redis: the change raises the conversation's epoch there
  (``publish_epoch`` -> ``chat.streams.epoch_raise``) and every delta is appended to the stream
  buffer only if that epoch is not past the stream's, in one atomic step
  (``chat.streams.append``); a refused append breaks the fence before the delta is sent or kept.
  So a delta is either before the take-over (sent, stored) or after it (neither), as Redis
  ordered them;
* as a fallback (Redis failing, or no Redis), by each running stream re-reading the epoch from
  the database every ``POLL_S`` seconds (``_listen``).

A stream started under epoch N is broken by any epoch > N. The shopper and console sockets also
drop ``stream.delta`` events whose ``epoch`` is below the highest epoch they have seen on a
``status`` event (``chat_frame`` of both consumers), so a delta appended just before the take-over
and still in flight from another process never follows the take-over's status frame; the stored
row and ``stream.end`` have it.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from contextlib import suppress

from channels.db import database_sync_to_async

from . import streams
from .models import Conversation

log = logging.getLogger(__name__)


class Fenced(Exception):
    """The conversation changed owner while a bot answer streamed: stop sending it."""


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


#: How often a running stream re-reads its conversation's epoch, seconds (other processes' take-overs).
POLL_S = 0.25


async def _listen(fence: Fence) -> None:
    """Follow owner changes made by other processes while the stream runs: re-read the epoch
    every :data:`POLL_S` seconds. (Not a channel-layer receiver per stream: cancelling such a
    blocking receive at the end of every answer is the suspect of Redis read timeouts that closed
    shopper sockets with 1011.) Within one process ``advance()`` breaks the fence at once, and a
    shopper socket drops deltas older than the last status epoch it saw, so nothing sent after a
    take-over reaches the shopper in the poll's gap either."""
    while not fence.broken:
        fence.see(await database_sync_to_async(_epoch_in_db)(fence.conversation_id))
        if fence.broken:
            return
        await asyncio.sleep(POLL_S)


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
    """The owner epoch is now ``epoch`` (after the change committed): break this process's
    streams at once, and raise the epoch in Redis, where every process's next delta is checked
    against it atomically (``chat.streams.append``): a stream in another process adds and sends
    nothing generated after this point. Without Redis (one process) ``advance`` is all it takes;
    the database poll (``_listen``) stays as the fallback when Redis fails."""
    advance(conversation_id, epoch)
    await streams.epoch_raise(conversation_id, epoch)
