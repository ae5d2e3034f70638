"""The shopper WebSocket ``/ws/chat/`` (protocol 1; docs/protocol.md) and the agent console's
WebSocket ``/ws/agent/`` (docs/console.md).

The consumer holds no business rules: it validates frames, calls ``chat.services`` to store,
``chat.answering`` to get an answer going, and relays the conversation group's frames, dropping
what this socket already has (a socket that joins mid-stream gets the text so far once).
"""
from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Any

from autobahn.exception import Disconnected
from channels.db import database_sync_to_async
from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.layers import get_channel_layer
from channels.utils import await_many_dispatch
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from routing import strategy

from . import answering, events, limits, presence, selectors, services, streams, suggest
from .models import MessageState
from .protocol import PROTOCOL_VERSION, ProtocolError, error_frame, parse_uuid, validate_message, validate_text

log = logging.getLogger(__name__)

CLOSE_FORBIDDEN = 4403
CLOSE_TOO_MANY = 4429


class _FrameSocket(AsyncWebsocketConsumer):
    """What both sockets share: JSON frames, and frames for a socket that is gone are dropped
    (``closed``); ``_release`` (each subclass's own) leaves groups and frees counted slots."""

    closed = False  # the socket is gone: frames for it are dropped

    async def _release(self) -> None:
        raise NotImplementedError

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
        try:
            await await_many_dispatch([receive, self.channel_receive], self.dispatch)
        except StopConsumer:
            pass
        finally:
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

    async def _send(self, frame: Any) -> None:
        if self.closed:
            return
        try:
            await self.send(text_data=json.dumps(frame, ensure_ascii=False))
        except Disconnected:
            # The client went away while a frame was on its way (e.g. mid-stream): what it was
            # sent is stored anyway; this socket just stops receiving.
            self.closed = True


class ShopperConsumer(_FrameSocket):
    conversation_id: uuid.UUID | None = None
    counted = False  # holds a slot in the per-address socket count

    async def connect(self) -> None:
        client = self.scope.get("client") or ("unknown", 0)
        self.address = str(client[0])
        self.sent_ids: set[int] = set()  # message ids this socket has as finished messages
        self.stream_sent: dict[int, int] = {}  # streaming message id -> code points sent
        # Highest owner epoch seen on a status event: a bot delta of an older epoch that is still
        # in flight (from another process) after a take-over is dropped (chat.fencing).
        self.owner_epoch = 0
        await self.accept()
        if not limits.socket_open(self.address):
            await self._send(error_frame("rate_limited", "too many open connections from this address"))
            await self.close(code=CLOSE_TOO_MANY)
            return
        self.counted = True

    async def _release(self) -> None:
        if self.counted:
            limits.socket_close(self.address)
            self.counted = False
        if self.conversation_id is not None and getattr(self, "channel_name", None):
            try:
                await self.channel_layer.group_discard(events.conversation_group(self.conversation_id), self.channel_name)
            except Exception:  # the layer is gone (shutdown): nothing left to leave
                log.debug("group_discard failed", exc_info=True)


    # --- client frames -------------------------------------------------------------------
    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if text_data is None:
            await self._send(error_frame("invalid", "frames must be JSON text"))
            return
        try:
            content = json.loads(text_data)
        except ValueError:
            await self._send(error_frame("invalid", "frame is not valid JSON"))
            return
        except RecursionError:  # e.g. 100,000 nested arrays: the decoder's recursion limit
            await self._send(error_frame("invalid", "frame is nested too deeply"))
            return
        if not isinstance(content, dict) or not isinstance(content.get("type"), str):
            await self._send(error_frame("invalid", "a frame is a JSON object with a string 'type'"))
            return
        kind = content["type"]
        try:
            if kind == "hello":
                await self.on_hello(content)
            elif self.conversation_id is None:
                raise ProtocolError("invalid", "send 'hello' first")
            elif kind == "message":
                await self.on_message(content)
            elif kind == "typing":
                # Relayed to the agents following the conversation; nothing stored.
                await events.publish_staff(self.conversation_id, {"type": "typing", "role": "shopper"})
            elif kind == "feedback":
                await self.on_feedback(content)
            else:
                raise ProtocolError("invalid", f"unknown frame type {kind!r}")
        except ProtocolError as e:
            await self._send(error_frame(e.code, e.message, e.client_id))

    async def on_hello(self, content: dict[str, Any]) -> None:
        if self.conversation_id is not None:
            raise ProtocolError("invalid", "hello was already sent on this connection")
        after = content.get("after", 0)
        if not isinstance(after, int) or isinstance(after, bool) or after < 0:
            raise ProtocolError("invalid", "after must be a non-negative integer")
        locale = content.get("locale", "en")
        if locale not in ("en", "zh"):
            locale = "en"
        if content.get("conversation") is not None:
            conv_id = parse_uuid(content.get("conversation"))
            if conv_id is None:
                await self.close(code=CLOSE_FORBIDDEN)
                return
            try:
                conv = await database_sync_to_async(services.conversation_authenticate)(
                    conversation_id=conv_id, token=content.get("token")
                )
            except services.AccessDenied:
                await self.close(code=CLOSE_FORBIDDEN)
                return
            token = content["token"]
            resumed = True
        else:
            conv, token = await database_sync_to_async(services.conversation_start)(locale=locale)
            resumed = False
        self.conversation_id = conv.id
        self.locale = conv.locale
        # Join before reading the replay: a frame published in between is then both replayed and
        # queued, and chat_frame drops the copy; the other order could lose it.
        await self.channel_layer.group_add(events.conversation_group(conv.id), self.channel_name)
        await self._send(
            {"type": "conversation", "id": str(conv.id), "token": token, "status": conv.status, "protocol": PROTOCOL_VERSION}
        )
        if resumed:
            await self._replay(after)
            answering.kick(conv.id)  # answers anything stored but not answered (e.g. after a restart)

    async def _replay(self, after: int) -> None:
        assert self.conversation_id is not None
        for msg in await database_sync_to_async(selectors.messages_after)(conversation_id=self.conversation_id, after=after):
            if msg.state == MessageState.STREAMING:
                live = await streams.get(msg.pk)
                if live is not None:
                    self.stream_sent[msg.pk] = len(live.text)
                    await self._send({"type": "stream.start", "id": msg.pk, "seq": msg.seq, "role": "bot", "route": live.route})
                    if live.text:
                        await self._send({"type": "stream.delta", "id": msg.pk, "text": live.text})
                    continue
                # Its stream buffer is gone: it ended meanwhile, and its stream.end (queued for us)
                # will be sent with a stream.start before it (see chat_frame).
                continue
            self.sent_ids.add(msg.pk)
            await self._send(events.message_frame(msg))

    async def on_message(self, content: dict[str, Any]) -> None:
        assert self.conversation_id is not None
        client_id, text = validate_message(content, max_chars=settings.KEFU_MAX_MESSAGE_CHARS)
        if not await limits.message_allowed(self.address):
            raise ProtocolError("rate_limited", "too many messages; wait a moment and send again", client_id)
        strategy.prefetch(text=text, conversation_locale=self.locale)
        received = await database_sync_to_async(services.message_receive)(
            conversation_id=self.conversation_id, client_id=client_id, text=text,
            claim=answering.is_idle(self.conversation_id),
        )
        if not received.created:
            # A resend: the original acknowledgement again, to this socket only; nothing stored twice.
            await self._send(events.message_frame(received.message))
            return
        await events.publish(self.conversation_id, events.message_frame(received.message))
        if received.reopened:
            await events.publish(self.conversation_id, {"type": "status", "status": "bot"})
        if received.claimed is not None:
            answering.enqueue_claimed(received.message, received.claimed)
        else:
            answering.kick(self.conversation_id)

    async def on_feedback(self, content: dict[str, Any]) -> None:
        assert self.conversation_id is not None
        try:
            await database_sync_to_async(services.feedback_record)(
                conversation_id=self.conversation_id, message_id=content.get("message_id"), rating=content.get("rating")
            )
        except ValueError as e:
            raise ProtocolError("invalid", str(e)) from None

    # --- group events --------------------------------------------------------------------
    async def chat_frame(self, event: dict[str, Any]) -> None:
        frame = event["frame"]
        kind = frame["type"]
        if kind == "message":
            if frame["id"] in self.sent_ids:
                return
            self.sent_ids.add(frame["id"])
        elif kind == "stream.start":
            if frame["id"] in self.stream_sent or frame["id"] in self.sent_ids:
                return
            self.stream_sent[frame["id"]] = 0
        elif kind == "status":
            self.owner_epoch = max(self.owner_epoch, int(event.get("epoch", 0)))
        elif kind == "stream.delta":
            have = self.stream_sent.get(frame["id"])
            if have is None or int(event.get("epoch", self.owner_epoch)) < self.owner_epoch:
                return
            pos, text = int(event.get("pos", have)), frame["text"]
            if pos + len(text) <= have:
                return
            if pos < have:
                frame = {**frame, "text": text[have - pos:]}
            self.stream_sent[frame["id"]] = pos + len(text)
        elif kind == "stream.end":
            if frame["id"] in self.sent_ids:
                return
            if frame["id"] not in self.stream_sent:
                # We never saw its start (joined after the buffer was dropped): send it whole.
                await self._send({"type": "stream.start", "id": frame["id"], "seq": frame["seq"], "role": "bot", "route": frame["route"]})
            self.stream_sent.pop(frame["id"], None)
            self.sent_ids.add(frame["id"])
        await self._send(frame)


NOTE_MAX_CHARS = 4000


class AgentConsumer(_FrameSocket):
    """``/ws/agent/``: the agent console's socket (session authentication; docs/console.md).

    Every agent socket is in the ``agents`` group (the console list, handoff notifications). It
    follows one conversation at a time (``open``): it then also joins that conversation's group
    (every frame the shopper gets, the bot's stream included) and its staff group (internal notes,
    the shopper's typing), which shopper sockets never join. Frames about a conversation carry
    its id in ``conversation``. Like the shopper consumer it holds no business rules: it
    validates, calls ``chat.services`` and publishes what they return.
    """

    user: Any = None
    following: uuid.UUID | None = None
    in_agents_group = False
    counted = False

    async def connect(self) -> None:
        await self.accept()
        user = self.scope.get("user")
        if not await database_sync_to_async(selectors.user_is_agent)(user):
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.user = user
        self.name = services.agent_display_name(user)
        await self.channel_layer.group_add(events.AGENTS_GROUP, self.channel_name)
        self.in_agents_group = True
        presence.agent_connected()
        self.counted = True
        canned, queue = await database_sync_to_async(lambda: (selectors.canned_replies(), selectors.console_queue()))()
        await self._send({"type": "ready", "agent": self.name, "agent_id": user.pk,
                          "agents_online": presence.agents_online(), "canned": canned,
                          "max_chars": settings.KEFU_MAX_MESSAGE_CHARS})
        await self._send({"type": "queue", "conversations": queue})

    async def _release(self) -> None:
        if self.counted:
            presence.agent_disconnected()
            self.counted = False
        try:
            if self.in_agents_group:
                self.in_agents_group = False
                await self.channel_layer.group_discard(events.AGENTS_GROUP, self.channel_name)
            await self._unfollow()
        except Exception:  # the layer is gone (shutdown): nothing left to leave
            log.debug("group_discard failed", exc_info=True)


    async def _unfollow(self) -> None:
        if self.following is not None:
            cid, self.following = self.following, None
            await self.channel_layer.group_discard(events.conversation_group(cid), self.channel_name)
            await self.channel_layer.group_discard(events.staff_group(cid), self.channel_name)

    # --- client frames -------------------------------------------------------------------
    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.user is None:
            return  # refused at connect (4403); nothing is answered
        try:
            content = json.loads(text_data) if text_data is not None else None
        except (ValueError, RecursionError):  # not JSON, or nested deeper than the decoder goes
            content = None
        if not isinstance(content, dict) or not isinstance(content.get("type"), str):
            await self._send(error_frame("invalid", "a frame is a JSON object with a string 'type'"))
            return
        handler = self.HANDLERS.get(content["type"])
        try:
            if handler is None:
                raise ProtocolError("invalid", f"unknown frame type {content['type']!r}")
            cid = parse_uuid(content.get("conversation"))
            if cid is None:
                raise ProtocolError("invalid", "conversation must be a conversation id (UUID string)")
            await handler(self, cid, content)
        except ProtocolError as e:
            await self._send(self._error(e.code, e.message, content))
        except services.NotFound:
            await self._send(self._error("not_found", "no such conversation", content))
        except services.NotOwner as e:
            err = self._error("not_owner", f"{e.owner} is handling this conversation" if e.owner
                              else f"take the conversation over first (it is {e.status})", content)
            if e.owner:
                err["agent"] = e.owner
            await self._send(err)

    @staticmethod
    def _error(code: str, message: str, content: dict[str, Any]) -> dict[str, Any]:
        """An ``error`` frame about the client frame ``content``: it names the conversation and,
        for a ``message``, echoes its ``client_id`` (so the console drops that pending message)."""
        frame: dict[str, Any] = dict(error_frame(code, message))
        conversation, client_id = content.get("conversation"), content.get("client_id")
        if isinstance(conversation, str) and parse_uuid(conversation) is not None:
            frame["conversation"] = conversation
        if content.get("type") == "message" and isinstance(client_id, str) and 0 < len(client_id) <= 64:
            frame["client_id"] = client_id
        return frame

    async def on_open(self, cid: uuid.UUID, content: dict[str, Any]) -> None:
        """Follow ``cid``: join its groups first, then send its ``history`` (a frame published
        in between reaches the console twice; it drops what it has, by id and stream ``pos``)."""
        if self.following != cid:
            await self._unfollow()
            self.following = cid
            await self.channel_layer.group_add(events.conversation_group(cid), self.channel_name)
            await self.channel_layer.group_add(events.staff_group(cid), self.channel_name)
        transcript = await database_sync_to_async(selectors.conversation_transcript)(conversation_id=cid)
        if transcript is None:
            await self._unfollow()
            raise services.NotFound(str(cid))
        for item in transcript["messages"]:
            if item["state"] == MessageState.STREAMING:
                live = await streams.get(item["id"])
                if live is not None:
                    item["text"] = live.text
        await self._send({"type": "history", "conversation": str(cid), "info": transcript["conversation"],
                          "messages": transcript["messages"], "notes": transcript["notes"]})

    async def on_take_over(self, cid: uuid.UUID, content: dict[str, Any]) -> None:
        change = await database_sync_to_async(services.conversation_take_over)(conversation_id=cid, agent=self.user)
        if change.changed:
            await events.publish_owner_change(conversation_id=cid, status=change.status, agent=change.agent, epoch=change.epoch)
        elif change.agent_id == self.user.pk:
            await self._send({"type": "conversation.update", "conversation": str(cid), "status": change.status, "agent": change.agent})
        else:
            err = self._error("taken", f"{change.agent} is already handling this conversation", content)
            err["agent"] = change.agent
            await self._send(err)

    async def on_hand_back(self, cid: uuid.UUID, content: dict[str, Any]) -> None:
        change = await database_sync_to_async(services.conversation_hand_back)(conversation_id=cid, agent=self.user)
        await events.publish_owner_change(conversation_id=cid, status=change.status, agent="", epoch=change.epoch)

    async def on_close(self, cid: uuid.UUID, content: dict[str, Any]) -> None:
        change = await database_sync_to_async(services.conversation_close)(conversation_id=cid, agent=self.user)
        if change.changed:
            await events.publish_owner_change(conversation_id=cid, status=change.status, agent="", epoch=change.epoch)

    async def on_message(self, cid: uuid.UUID, content: dict[str, Any]) -> None:
        """An agent's message. With a ``client_id`` (the console always sends one) it is stored
        once however often it is resent; a resend is acknowledged to this socket only."""
        client_id = content.get("client_id")
        if client_id is not None:
            client_id, text = validate_message(content, max_chars=settings.KEFU_MAX_MESSAGE_CHARS)
        else:
            text = validate_text(content, max_chars=settings.KEFU_MAX_MESSAGE_CHARS)
        sent = await database_sync_to_async(services.agent_message_send)(
            conversation_id=cid, agent=self.user, text=text, client_id=client_id)
        if not sent.created:
            await self._send({**events.message_frame(sent.message), "conversation": str(cid)})
            return
        await events.publish(cid, events.message_frame(sent.message))

    async def on_typing(self, cid: uuid.UUID, content: dict[str, Any]) -> None:
        owner = await database_sync_to_async(selectors.conversation_owner)(conversation_id=cid)
        if owner is None:
            raise services.NotFound(str(cid))
        status, agent_id, agent_name = owner
        if status != "agent" or agent_id != self.user.pk:
            raise services.NotOwner(owner=agent_name if status == "agent" else "", status=status)
        await events.publish(cid, {"type": "typing", "role": "agent", "agent": self.name})

    async def on_note(self, cid: uuid.UUID, content: dict[str, Any]) -> None:
        text = validate_text(content, max_chars=NOTE_MAX_CHARS)
        note = await database_sync_to_async(services.note_add)(conversation_id=cid, author=self.user, text=text)
        frame = {"type": "note", **selectors.note_item(note)}
        await events.publish_staff(cid, frame)
        if self.following != cid:  # the author always gets it back
            await self._send({**frame, "conversation": str(cid)})

    async def on_suggest(self, cid: uuid.UUID, content: dict[str, Any]) -> None:
        draft = await suggest.draft_reply(conversation_id=cid)
        if draft is None:
            raise services.NotFound(str(cid))
        await self._send({"type": "suggestion", "conversation": str(cid), "text": draft.text,
                          "route": draft.route, "for_seq": draft.for_seq})

    async def on_cache_wrong(self, cid: uuid.UUID, content: dict[str, Any]) -> None:
        """``cache.wrong``: the cached answer of bot message ``message`` was wrong. Any agent may
        mark it (not only the holder); its cached entry is evicted and the mark recorded
        (``services.cache_answer_mark_wrong``, in a thread). Reply to this socket only:
        ``cache.wrong.done`` with ``evicted`` (``false``: the entry was already gone)."""
        message_id = content.get("message")
        if not isinstance(message_id, int) or isinstance(message_id, bool) or message_id <= 0:
            raise ProtocolError("invalid", "message must be a message id (a positive integer)")
        try:
            result = await database_sync_to_async(services.cache_answer_mark_wrong)(
                conversation_id=cid, message_id=message_id, agent=self.user
            )
        except services.NotAgent:
            raise ProtocolError("forbidden", "you are no longer an agent") from None
        except services.NotFound as e:
            raise ProtocolError("not_found", str(e)) from None
        except services.NotCached:
            raise ProtocolError("not_cached", "this message was not served from the answer cache") from None
        await self._send({"type": "cache.wrong.done", "conversation": str(cid), "message": result.message_id,
                          "evicted": result.evicted})

    HANDLERS = {
        "open": on_open, "take_over": on_take_over, "hand_back": on_hand_back, "close": on_close,
        "message": on_message, "typing": on_typing, "note": on_note, "suggest": on_suggest,
        "cache.wrong": on_cache_wrong,
    }

    # --- group events --------------------------------------------------------------------
    async def chat_frame(self, event: dict[str, Any]) -> None:
        """A frame of the followed conversation (as its shopper gets it), with its id."""
        if event.get("conversation") != (str(self.following) if self.following else None):
            return  # an event of a conversation this socket just stopped following
        frame = {**event["frame"], "conversation": event["conversation"]}
        if frame["type"] == "stream.delta":
            frame["pos"] = int(event.get("pos", 0))
        await self._send(frame)

    async def staff_frame(self, event: dict[str, Any]) -> None:
        """Agents only: internal notes, the shopper's typing."""
        if event.get("conversation") != (str(self.following) if self.following else None):
            return
        await self._send({**event["frame"], "conversation": event["conversation"]})

    async def agents_frame(self, event: dict[str, Any]) -> None:
        """The console list: ``conversation.update`` and ``handoff``."""
        await self._send(event["frame"])
