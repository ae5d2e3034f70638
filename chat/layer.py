"""kefu's channel layer: channels-redis' ``RedisChannelLayer`` with a receive that a closing socket
cannot eat (``CHANNEL_LAYERS`` names it when ``REDIS_URL`` is set).

In channels-redis every socket of a process receives from one Redis queue of the process; one of
the sockets' receive calls at a time pops from it (``receive_single``: ``BZPOPMIN``, then a backup
copy) and hands each message to the buffer of the socket it is for. When the socket doing the pop
closes, its task is cancelled in the middle of that pop, and the pop does not stop at once: the
cancelled socket's consumer waits for it (Daphne kills consumers still running 10 s after their
socket closed: "took too long to shut down"), and what it popped, a frame for some other socket
of the process, is dropped with the cancellation.

Here the pop runs as its own task, shielded from the caller's cancellation: a cancelled caller
returns at once, the pop finishes on its own, and what it popped is sent again to the socket it
was for (it may arrive after frames sent later; stream deltas carry ``pos``, and the consumer puts
them right, see ``ShopperConsumer.chat_frame``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from channels_redis.core import RedisChannelLayer

log = logging.getLogger(__name__)


class ShieldedRedisChannelLayer(RedisChannelLayer):
    """``RedisChannelLayer`` whose shared pop survives the cancellation of the socket doing it."""

    async def receive_single(self, channel: str) -> Any:
        """channels-redis' ``receive_single`` (returns ``(channel, message)``), run as a task the
        caller's cancellation does not reach; when the caller was cancelled, its result is
        delivered to the receive buffer of the channel(s) it names."""
        task = asyncio.ensure_future(super().receive_single(channel))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():
                task.add_done_callback(self._deliver_orphan)
            raise

    def _deliver_orphan(self, task: asyncio.Future[Any]) -> None:
        """Send what a cancelled caller's pop received to its channel(s) again. (Not into their
        receive buffers: the socket that took over the pop waits in Redis, not on its buffer.)"""
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            log.debug("an abandoned channel-layer receive failed: %r", error)
            return
        message_channel, message = task.result()
        for chan in message_channel if isinstance(message_channel, list) else [message_channel]:
            resend = asyncio.ensure_future(self.send(chan, dict(message)))
            resend.add_done_callback(_log_failure)


def _log_failure(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("handing on a frame popped by a closed socket failed: %r", task.exception())
