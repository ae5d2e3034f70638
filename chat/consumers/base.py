"""What both WebSockets share: JSON frames, a channel-layer receive that survives the layer's
transient errors, and frames for a socket that is gone dropped. The consumers hold no business
rules: they validate frames, call ``chat.services`` to store and ``chat.answering`` to answer, and
relay the conversation group's frames."""

from __future__ import annotations

import asyncio
import logging
from functools import cached_property
from typing import Any

from autobahn.exception import Disconnected
from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import get_channel_layer
from channels.utils import await_many_dispatch

from .. import answering, regroup, shutdown, sweeper
from ..protocol import error_frame
from . import framing

log = logging.getLogger(__name__)

#: Close codes: refused (bad token, not an agent) and too many sockets from one address.
CLOSE_FORBIDDEN = 4403
#: A signed identity token was refused (an ``error`` frame with its code comes first: chat.identity).
CLOSE_IDENTITY = 4401
CLOSE_TOO_MANY = 4429
#: The layer (Redis) is down even after retries: reconnect later. (The registry's 1013 "Try Again
#: Later" would say the same, but Autobahn, under Daphne, lets a server close only with 1000 or 3000-4999.)
CLOSE_TRY_AGAIN = 4503


class FrameSocket(AsyncWebsocketConsumer):
    """What both sockets share: JSON frames, and frames for a socket that is gone are dropped
    (``closed``); ``_release`` (each subclass's own) leaves groups and frees counted slots."""

    closed = False  # the socket is gone: frames for it are dropped

    async def _release(self) -> None:
        raise NotImplementedError

    # --- groups ------------------------------------------------------------------------------
    # The groups this socket is in are remembered so that they can be joined again when the
    # layer's Redis lost them (a restart without persistence, a failover: ``chat.regroup``).

    async def join(self, group: str) -> None:
        """Join ``group`` (channel-layer ``group_add``). Raises what the layer raises."""
        self.groups_joined.add(group)
        await self.channel_layer.group_add(group, self.channel_name)

    async def leave(self, group: str) -> None:
        """Leave ``group``; a layer failure is logged (the membership expires in the layer anyway)."""
        self.groups_joined.discard(group)
        try:
            await self.channel_layer.group_discard(group, self.channel_name)
        except Exception:  # the layer is gone (shutdown, Redis down): nothing left to leave
            log.debug("group_discard of %s failed", group, exc_info=True)

    async def rejoin(self) -> None:
        """Join every group of this socket again (idempotent in the layer)."""
        for group in list(self.groups_joined):
            await self.channel_layer.group_add(group, self.channel_name)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Channels' ``AsyncConsumer.__call__``, with two differences:

        * the channel-layer receive survives the layer's transient errors (``_channel_receive``):
          in channels' own loop a Redis read timeout in that receive ends the consumer, and Daphne
          closes the shopper's socket with 1011 mid-conversation (seen in the two-worker test);
        * whatever ends the consumer (a clean close, a crash, a cancelled task), ``_release``
          runs: counted slots are given back and groups are left.
        """
        self.scope = scope
        self.channel_layer = get_channel_layer(self.channel_layer_alias)
        self.channel_name = await self.channel_layer.new_channel()
        self.channel_receive = self._channel_receive
        self.base_send = send
        self.groups_joined: set[str] = set()
        sweeper.ensure_sweeper()  # every process gives back the conversations of agents who vanished
        shutdown.install()  # and drains on SIGTERM instead of dropping what it streams
        answering.keep_upstreams_warm()  # and keeps its upstream connections open while idle
        regroup.register(self)  # and joins its sockets' groups again after Redis lost them
        # Events this process publishes to a group of this socket arrive in its in-process inbox
        # (chat.layer, local fan-out); the others through the layer's receive.
        local_inbox = getattr(self.channel_layer, "local_inbox", None)
        sources = [receive, self.channel_receive]
        if local_inbox is not None:
            sources.append(local_inbox(self.channel_name).get)
        try:
            await await_many_dispatch(sources, self.dispatch)
        except StopConsumer:
            pass
        finally:
            if local_inbox is not None:
                self.channel_layer.local_close(self.channel_name)
            regroup.unregister(self)
            await self._release()

    #: Waits between attempts after a failed channel-layer receive, seconds (then the last repeats).
    LAYER_RETRY_S = (0.05, 0.25, 1.0, 2.0)

    async def _channel_receive(self) -> dict[str, Any]:
        """The next event of this socket's channel. A failure of the layer (Redis timeout, lost
        connection) is logged and retried with backoff instead of closing the socket: events
        published meanwhile may be missed, but everything is stored, and the shopper's widget
        catches up from the stored messages (``hello`` with ``after``) on its next reconnect."""
        attempt = 0
        while True:
            try:
                return await self.channel_layer.receive(self.channel_name)
            except Exception as e:  # CancelledError is not an Exception: a close still ends it
                wait = self.LAYER_RETRY_S[min(attempt, len(self.LAYER_RETRY_S) - 1)]
                log.warning("channel layer receive failed (%s: %s); retrying in %.2f s", type(e).__name__, e, wait)
                attempt += 1
                await asyncio.sleep(wait)

    async def dispatch(self, message: dict[str, Any]) -> None:
        """Channels' ``dispatch`` without its ``aclose_old_connections()`` before every handler.

        That call is a hop to the single sync thread (the one every ``database_sync_to_async``
        call runs in) for each frame received and each group event, every ``stream.delta``
        included: a profile of the routing-overhead check showed it costing ~4.6 ms of CPU per
        answered message, and each hop waits behind whatever database work that thread is
        doing. It is not needed here: these consumers never touch the ORM on the event loop;
        their database work goes through ``database_sync_to_async``, which closes old and
        unusable connections around each call itself."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def disconnect(self, code: int) -> None:
        self.closed = True
        await self._release()

    @cached_property
    def frame_budget(self) -> int:
        """The frame budget in bytes (``framing.frame_budget``), read from the settings once per
        socket, not once per frame sent."""
        return framing.frame_budget()

    async def _send(self, frame: Any) -> None:
        """Send ``frame`` as JSON. The guard of every frame a socket sends: one over the byte
        budget (``framing.frame_budget``, below ``KEFU_WS_MAX_MESSAGE_BYTES``) is never sent; an
        ``error`` frame ``too_large`` goes instead (and the cause is logged), so the client never
        closes the socket over a frame it refuses. Frames that can grow with the data are built
        to fit beforehand (``framing.fit_list``); this is the net under them."""
        text = framing.encode(frame)
        # A code point takes at most 4 UTF-8 bytes: a frame that short is under the budget without
        # encoding it to measure (every delta, acknowledgement and stream end).
        if len(text) * 4 > self.frame_budget and (size := framing.byte_size(text)) > self.frame_budget:
            kind = frame.get("type") if isinstance(frame, dict) else type(frame).__name__
            log.error("a %s frame of %d bytes is over the frame budget: not sent", kind, size)
            refusal: dict[str, Any] = dict(error_frame("too_large", f"a {kind} frame was too large to send"))
            if isinstance(frame, dict) and isinstance(frame.get("conversation"), str):
                refusal["conversation"] = frame["conversation"]
            text = framing.encode(refusal)
        await self._send_text(text)

    async def _send_text(self, text: str) -> None:
        """Send an encoded frame that was built to fit (``framing.fit_list``)."""
        if self.closed:
            return
        try:
            await self.send(text_data=text)
        except Disconnected:
            # The client went away while a frame was on its way (e.g. mid-stream): what it was
            # sent is stored anyway; this socket just stops receiving.
            self.closed = True
