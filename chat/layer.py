"""kefu's channel layer: channels-redis' ``RedisChannelLayer`` with a receive that a closing socket
cannot eat, and group sends that deliver to this process's own sockets without Redis
(``CHANNEL_LAYERS`` names it when ``REDIS_URL`` is set).

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

Local fan-out. channels-redis sends a group event with four Redis round trips (drop expired
members, read the members, drop expired messages, push) and then every receiving process pops it
back (``BZPOPMIN``, a backup copy, msgpack both ways), even when the socket is in the process that
sent it, as most are: a shopper's socket is served by the worker that answers it. Here
:meth:`~ShieldedRedisChannelLayer.group_send` reads the members in one round trip, hands the event
to the in-process inbox of each member that this process serves (:meth:`local_inbox`, read by
``FrameSocket`` next to the layer's own receive), and pushes to the other processes' queues in one
more round trip only when there are any (one script that also drops their expired messages).
Membership itself stays in Redis, exact: a socket that joins in another worker gets the next
event. Delivery order per socket is the publishing coroutine's order, as before. An event handed
to local inboxes is one object shared by them (channels-redis gave each a msgpack copy): handlers
must not mutate an event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from channels_redis.core import RedisChannelLayer

log = logging.getLogger(__name__)


# Push one group event to the queues of other processes (one key per process queue), dropping
# messages past their expiry first: channels-redis' group-send script plus the ZREMRANGEBYSCORE it
# sends as a separate pipeline. ARGV: the messages (one per key), the capacities, now, expiry.
_PUSH = """
local over_capacity = 0
local current_time = tonumber(ARGV[#ARGV - 1])
local expiry = tonumber(ARGV[#ARGV])
for i=1,#KEYS do
    redis.call('ZREMRANGEBYSCORE', KEYS[i], 0, current_time - expiry)
    if redis.call('ZCOUNT', KEYS[i], '-inf', '+inf') < tonumber(ARGV[i + #KEYS]) then
        redis.call('ZADD', KEYS[i], current_time, ARGV[i])
        redis.call('EXPIRE', KEYS[i], expiry)
    else
        over_capacity = over_capacity + 1
    end
end
return over_capacity
"""


class ShieldedRedisChannelLayer(RedisChannelLayer):
    """``RedisChannelLayer`` whose shared pop survives the cancellation of the socket doing it, and
    whose group sends reach this process's own sockets through in-process inboxes (module
    docstring). ``group_sends`` / ``local_deliveries`` / ``remote_pushes`` count what it did
    (tests, benchmarks)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._inboxes: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self.group_sends = self.local_deliveries = self.remote_pushes = 0

    # --- local fan-out ------------------------------------------------------------------------

    def local_inbox(self, channel: str) -> asyncio.Queue[dict[str, Any]]:
        """The in-process inbox of ``channel`` (a name from :meth:`new_channel` of this layer),
        made on first call: group events and sends for it from this process are put there instead
        of going through Redis. The caller reads it next to :meth:`receive` and calls
        :meth:`local_close` when the channel's consumer ends. Bounded by the layer's capacity
        (events past it are dropped and logged, as channels-redis drops them)."""
        inbox = self._inboxes.get(channel)
        if inbox is None:
            inbox = self._inboxes[channel] = asyncio.Queue(self.capacity)
        return inbox

    def local_close(self, channel: str) -> None:
        """Forget ``channel``'s inbox (its consumer ended); what it still held is dropped."""
        self._inboxes.pop(channel, None)

    def _is_local(self, channel: str) -> bool:
        return channel in self._inboxes  # only this layer's own channels get an inbox

    def _deliver(self, channel: str, message: dict[str, Any]) -> None:
        try:
            self._inboxes[channel].put_nowait(message)
            self.local_deliveries += 1
        except asyncio.QueueFull:
            log.info("local inbox of %s over capacity; event dropped", channel)

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        """channels-redis' ``send``; to a channel of this process with an inbox, in process."""
        if self._is_local(channel):
            self._deliver(channel, message)
            return
        await super().send(channel, message)

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        """Send ``message`` to every member of ``group``: in process to the members with a local
        inbox, through Redis to the others (module docstring). One Redis round trip to read the
        members, one more only when some are served by other processes. Raises what the Redis
        client raises (``redis.RedisError``, ``OSError``); members already handed the event keep
        it."""
        assert self.require_valid_group_name(group), "Group name not valid"
        self.group_sends += 1
        key = self._group_key(group)
        connection = self.connection(self.consistent_hash(group))
        async with connection.pipeline(transaction=False) as pipe:
            pipe.zremrangebyscore(key, min=0, max=int(time.time()) - self.group_expiry)
            pipe.zrange(key, 0, -1)
            _, members = await pipe.execute()
        remote = []
        for raw in members:
            name = raw.decode("utf8")
            if self._is_local(name):
                self._deliver(name, message)
            else:
                remote.append(name)
        if remote:
            await self._push(group, remote, message)

    async def _push(self, group: str, channel_names: list[str], message: dict[str, Any]) -> None:
        """Push ``message`` to the queues of ``channel_names`` (not this process's) with one
        script per Redis shard."""
        by_connection, messages, capacities = self._map_channel_keys_to_connection(channel_names, message)
        for index, keys in by_connection.items():
            args = [messages[k] for k in keys] + [capacities[k] for k in keys] + [time.time(), self.expiry]
            over = await self.connection(index).eval(_PUSH, len(keys), *keys, *args)
            self.remote_pushes += 1
            if over > 0:
                log.info("%s of %s channels over capacity in group %s", over, len(channel_names), group)

    # --- the shared pop -----------------------------------------------------------------------

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
