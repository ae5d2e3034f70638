"""The shopper WebSocket ``/ws/chat/`` (protocol 1; docs/protocol.md).

The consumer validates frames, calls ``chat.services`` to store and ``chat.answering`` to get an
answer going, and relays the conversation group's frames, dropping what this socket already has
(a socket that joins mid-stream gets the text so far once).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings

from lib import metrics
from lib.loops import PerLoop
from lib.text import supported_locale

from .. import (
    answering,
    availability,
    errors,
    events,
    handoff,
    identity,
    limits,
    selectors,
    services,
    shopper_presence,
    shutdown,
    streams,
)
from ..models import Message, MessageState
from ..protocol import (
    PROTOCOL_VERSION,
    ProtocolError,
    error_frame,
    parse_uuid,
    valid_time_zone,
    validate_contact,
    validate_message_files,
)
from .base import CLOSE_FORBIDDEN, CLOSE_IDENTITY, CLOSE_TOO_MANY, CLOSE_TRY_AGAIN, FrameSocket

log = logging.getLogger(__name__)

#: One replay page at a time per process (per event loop): the pages of a burst of replays are
#: sent one after another, in slices (``ShopperConsumer.REPLAY_SLICE``), so another shopper's
#: answer waits for one slice at most between its own steps, not for a slice of every replay.
_replay_gates: PerLoop[asyncio.Semaphore] = PerLoop(lambda: asyncio.Semaphore(1))


class ShopperConsumer(FrameSocket):
    conversation_id: uuid.UUID | None = None
    counted = False  # holds a slot in the per-address socket count
    present: uuid.UUID | None = None  # the conversation this socket shows (chat.shopper_presence)

    async def connect(self) -> None:
        client = self.scope.get("client") or ("unknown", 0)
        self.address = str(client[0])
        self.sent_ids: set[int] = set()  # message ids this socket has as finished messages
        self.stream_sent: dict[int, int] = {}  # streaming message id -> code points sent
        # Highest owner epoch seen on a status event: a bot delta of an older epoch that is still
        # in flight (from another process) after a take-over is dropped (chat.fencing).
        self.owner_epoch = 0
        self.last_resync = float("-inf")
        await self.accept()
        if shutdown.draining():  # this process is stopping: go to another one
            await self.close(code=shutdown.CLOSE_RESTARTING)
            return
        if not limits.socket_open(self.address):
            await self._send(error_frame("rate_limited", "too many open connections from this address"))
            await self.close(code=CLOSE_TOO_MANY)
            return
        self.counted = True
        metrics.OPEN_SOCKETS.labels("shopper").inc()

    async def _release(self) -> None:
        if self.counted:
            limits.socket_close(self.address)
            metrics.OPEN_SOCKETS.labels("shopper").dec()
            self.counted = False
        if self.present is not None:  # seen until now (chat.shopper_presence): no e-mail of what it showed
            present, self.present = self.present, None
            await shopper_presence.socket_left(present)
        for group in list(getattr(self, "groups_joined", ())):
            await self.leave(group)

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
                # Relayed to the agents following the conversation; nothing stored. A remote answer
                # that has shown no text yet waits for the rest of the question (burst debounce).
                answering.shopper_typing(self.conversation_id)
                await events.publish_staff(self.conversation_id, {"type": "typing", "role": "shopper"})
            elif kind == "feedback":
                await self.on_feedback(content)
            elif kind == "csat":
                await self.on_csat(content)
            elif kind == "resync":
                await self.on_resync(content)
            elif kind == "older":
                await self.on_older(content)
            elif kind == "contact":
                await self.on_contact(content)
            elif kind == "ask_person":
                await self.on_ask_person(content)
            else:
                raise ProtocolError("invalid", f"unknown frame type {kind!r}")
        except ProtocolError as e:
            await self._send(error_frame(e.code, e.message, e.client_id))
        except Exception:
            # Redis, the channel layer or the database failed under this frame: the shopper gets an
            # error frame (a message frame's client_id with it, so the widget can send it again;
            # a resend is never stored twice), never a 1011 close. What was stored stays stored.
            log.exception("handling a %r frame failed", kind)
            client_id = content.get("client_id") if kind == "message" else None
            await self._send(
                error_frame(
                    "unavailable",
                    "Sorry, something went wrong on our side. Please try again.",
                    client_id if isinstance(client_id, str) else None,
                )
            )

    async def on_hello(self, content: dict[str, Any]) -> None:
        if self.conversation_id is not None:
            raise ProtocolError("invalid", "hello was already sent on this connection")
        after = content.get("after", 0)
        if not isinstance(after, int) or isinstance(after, bool) or after < 0:
            raise ProtocolError("invalid", "after must be a non-negative integer")
        # A language kefu detects (KEFU_LANGUAGES), by its primary subtag ("es-MX" -> "es"); else English.
        locale = supported_locale(content.get("locale"))
        time_zone = valid_time_zone(content)
        who: identity.ShopperIdentity | None = None
        if content.get("identity") is not None:
            # A signed identity token from the store (chat.identity): refused -> an error frame
            # that says why, then 4401. Checked before anything is read or started.
            try:
                who = await database_sync_to_async(identity.identity_verify)(content["identity"])
            except identity.IdentityRejected as e:
                await self._send(error_frame(e.code, e.message))
                await self.close(code=CLOSE_IDENTITY)
                return
        conv = None
        if content.get("conversation") is not None:
            conv_id = parse_uuid(content.get("conversation"))
            if conv_id is None:
                await self.close(code=CLOSE_FORBIDDEN)
                return
            try:
                conv = await database_sync_to_async(services.conversation_authenticate)(
                    conversation_id=conv_id, token=content.get("token")
                )
            except errors.AccessDenied:
                if who is None:
                    await self.close(code=CLOSE_FORBIDDEN)
                    return
                # A signed-in customer: what this browser held no longer opens (e.g. an anonymous
                # token of a conversation adopted before issue 29); she gets her own conversation.
                conv = None
            else:
                token = content["token"]
                resumed = True
        if who is not None:
            # Her own conversation, never the anonymous one this browser may hold (issue 29:
            # services.conversation_identify; docs/security.md, "Shared computers").
            resumed_before = conv
            conv, token, resumed = await database_sync_to_async(services.conversation_identify)(
                identity=who, locale=locale, conversation=conv, address_key=identity.address_key(self.address)
            )
            if resumed_before is None or resumed_before.pk != conv.pk:
                after = 0  # another conversation than the one this browser asked for: all of it
        elif conv is None:
            conv, token = await database_sync_to_async(services.conversation_start)(
                locale=locale, address_key=identity.address_key(self.address), time_zone=time_zone
            )
            resumed = False
        # Join before reading the replay: a frame published in between is then both replayed and
        # queued, and chat_frame drops the copy; the other order could lose it.
        try:
            await self.join(events.conversation_group(conv.id))
        except Exception:
            # The layer is down even after its retries (lib/redis_conn.py): tell the widget and
            # close with 1013 "try again later"; it reconnects with backoff and resumes.
            log.exception("joining the group of conversation %s failed", conv.id)
            await self._send(error_frame("unavailable", "Sorry, the chat is briefly unavailable. Reconnecting…"))
            await self.close(code=CLOSE_TRY_AGAIN)
            return
        self.conversation_id = conv.id
        self.present = conv.id
        await shopper_presence.socket_joined(conv.id)
        self.locale = conv.locale
        told = await database_sync_to_async(availability.of_conversation)(conv.id)
        await self._send(
            {
                "type": "conversation",
                "id": str(conv.id),
                "token": token,
                "status": conv.status,
                "protocol": PROTOCOL_VERSION,
                "availability": told.as_dict(),
                # A link in a bot answer to any other domain is shown as plain text (issue 29).
                "link_domains": selectors.answer_link_domains(),
                "image_hosts": selectors.card_image_hosts(),
                **({"customer": {"id": conv.customer_id, "name": conv.customer_name}} if conv.customer_id else {}),
            }
        )
        if resumed:
            await self._replay(after)
            answering.kick(conv.id)  # answers anything stored but not answered (e.g. after a restart)

    async def _replay_budget(self, cost: int | None) -> bool:
        """Take ``cost`` messages from this socket's and this address's replay budgets
        (``chat.limits.replay_allowed``); ``cost`` None: only check that both have room for one
        (``chat.limits.replay_wait``, before the page is read). False, after an ``error``
        ``replay_limited`` frame with ``retry_after`` (seconds) to this socket, when either is
        spent: nothing is sent then, and nothing stored is lost (ask again after ``retry_after``)."""
        if cost is None:
            wait = await limits.replay_wait(self.address, self.channel_name)
        else:
            wait = await limits.replay_allowed(self.address, self.channel_name, cost)
        if wait is None:
            return True
        frame = error_frame("replay_limited", f"too many messages replayed; ask again in {wait} s")
        frame["retry_after"] = wait
        await self._send(frame)
        return False

    #: A page is sent in slices of this many frames, the event loop given to the process's other
    #: sockets between two (a send to Daphne never yields by itself, and 200 frames in one go held
    #: other shoppers' answers back: bench/replay_load.py).
    REPLAY_SLICE = 10

    async def _replay(self, after: int, *, again: bool = False) -> None:
        """Send the newest ``KEFU_REPLAY_PAGE`` stored messages after seq ``after`` (issue 29,
        item 4), after a ``replay.more`` ``{"before": first seq sent}`` when older ones after
        ``after`` exist (the client asks for them with ``older``): finished ones as ``message``
        frames, one still streaming as ``stream.start`` + the text so far as one ``stream.delta``
        (``pos`` 0). What it sends is charged to the replay budgets first (``_replay_budget``:
        over them, an ``error`` ``replay_limited`` and nothing else).
        ``again`` (a ``resync``): also what this socket was already sent, and an answer that ended
        between the read and its buffer is sent finished (its ``stream.end`` may be the frame the
        socket missed)."""
        assert self.conversation_id is not None
        if not await self._replay_budget(None):
            return
        page, more = await database_sync_to_async(selectors.messages_page)(
            conversation_id=self.conversation_id, after=after, limit=settings.KEFU_REPLAY_PAGE
        )
        if not await self._replay_budget(len(page)):
            return
        async with _replay_gates.get():
            await self._send_replay(page, more, again=again)

    async def _send_replay(self, page: list[Message], more: bool, *, again: bool) -> None:
        """The frames of a replay's ``page`` (see ``_replay``), in slices."""
        assert self.conversation_id is not None
        if more:
            await self._send({"type": "replay.more", "before": page[0].seq})
        ended: list[int] = []
        for i, msg in enumerate(page, 1):
            if i % self.REPLAY_SLICE == 0:
                await asyncio.sleep(0)  # let the other sockets of this process run
            if msg.state == MessageState.STREAMING:
                live = await streams.get(msg.pk)
                if live is not None:
                    self.stream_sent[msg.pk] = len(live.text)
                    await self._send(
                        {"type": "stream.start", "id": msg.pk, "seq": msg.seq, "role": "bot", "route": live.route}
                    )
                    if live.text:
                        await self._send({"type": "stream.delta", "id": msg.pk, "text": live.text, "pos": 0})
                    continue
                # Its stream buffer is gone: it ended meanwhile, and its stream.end (queued for us)
                # will be sent with a stream.start before it (see chat_frame).
                if again:
                    ended.append(msg.seq)
                continue
            if not again and msg.pk in self.sent_ids:
                continue
            self.sent_ids.add(msg.pk)
            await self._send(events.message_frame(msg))
        if ended:
            for msg in await database_sync_to_async(selectors.messages_after)(
                conversation_id=self.conversation_id, after=min(ended) - 1
            ):
                if msg.seq in ended and msg.state != MessageState.STREAMING:
                    self.stream_sent.pop(msg.pk, None)
                    self.sent_ids.add(msg.pk)
                    await self._send(events.message_frame(msg))

    async def on_older(self, content: dict[str, Any]) -> None:
        """``older`` ``before``: the page of stored messages just before seq ``before`` (the
        newest ``KEFU_REPLAY_PAGE`` of them, in seq order, as ``message`` frames; a message still
        streaming is left to its live frames), then ``older.end`` ``{"before", "more"}`` (``more``:
        still older ones exist). Charged to the replay budgets like a replay (over them, an
        ``error`` ``replay_limited`` and no ``older.end``). A bad ``before`` → ``invalid``."""
        assert self.conversation_id is not None
        before = content.get("before")
        if not isinstance(before, int) or isinstance(before, bool) or before < 1:
            raise ProtocolError("invalid", "before must be a positive integer (a seq)")
        if not await self._replay_budget(None):
            return
        page, more = await database_sync_to_async(selectors.messages_page)(
            conversation_id=self.conversation_id, before=before, limit=settings.KEFU_REPLAY_PAGE
        )
        if not await self._replay_budget(len(page)):
            return
        async with _replay_gates.get():
            for i, msg in enumerate(page, 1):
                if i % self.REPLAY_SLICE == 0:
                    await asyncio.sleep(0)  # let the other sockets of this process run
                if msg.state == MessageState.STREAMING:
                    continue
                self.sent_ids.add(msg.pk)
                await self._send(events.message_frame(msg))
        await self._send({"type": "older.end", "before": before, "more": more})

    async def _mend_stream(self, message_id: int, *, upto: int) -> bool:
        """This socket missed frames of streaming answer ``message_id`` (the layer lost them): send
        what it lacks up to code point ``upto`` from the stream buffer (``stream.start`` first when
        it never had one). False when the buffer is gone (its ``stream.end`` will repair it)."""
        live = await streams.get(message_id)
        if live is None or len(live.text) < upto:
            return False
        have = self.stream_sent.get(message_id)
        if have is None:
            await self._send(
                {"type": "stream.start", "id": message_id, "seq": live.seq, "role": "bot", "route": live.route}
            )
            have = 0
        if upto > have:
            await self._send({"type": "stream.delta", "id": message_id, "text": live.text[have:upto], "pos": have})
        self.stream_sent[message_id] = upto
        return True

    #: A socket's resync requests are served at most this often, seconds.
    RESYNC_MIN_INTERVAL_S = 1.0

    async def on_resync(self, content: dict[str, Any]) -> None:
        """``resync`` ``after``: the widget saw a gap (a ``seq`` or a delta ``pos`` it did not
        expect, or a stream silent too long): the stored messages after ``after`` again (a page at
        most, as a replay: ``_replay``), then live frames as usual (docs/protocol.md, resync)."""
        after = content.get("after", 0)
        if not isinstance(after, int) or isinstance(after, bool) or after < 0:
            raise ProtocolError("invalid", "after must be a non-negative integer")
        now = time.monotonic()
        if now - self.last_resync < self.RESYNC_MIN_INTERVAL_S:
            raise ProtocolError("rate_limited", "resync at most once a second")
        self.last_resync = now
        await self._replay(after, again=True)

    async def on_message(self, content: dict[str, Any]) -> None:
        assert self.conversation_id is not None
        client_id, text, files = validate_message_files(content, max_chars=settings.KEFU_MAX_MESSAGE_CHARS)
        if not await limits.message_allowed(self.address):  # fails open when Redis is down
            raise ProtocolError("rate_limited", "too many messages; wait a moment and send again", client_id)
        answering.shopper_message(self.conversation_id)
        if text:
            answering.prepare(text=text, locale=self.locale)
        try:
            received = await database_sync_to_async(services.message_receive)(
                conversation_id=self.conversation_id,
                client_id=client_id,
                text=text,
                claim=answering.is_idle(self.conversation_id),
                attachments=files,
            )
        except errors.AttachmentRefused as e:  # nothing was stored
            raise ProtocolError(e.code, e.message, client_id) from None
        if not received.created:
            # A resend: the original acknowledgement again, to this socket only; nothing stored twice.
            await self._send(events.message_frame(received.message))
            return
        published = await events.publish(self.conversation_id, events.message_frame(received.message))
        if not published and received.message.pk not in self.sent_ids:
            # Stored, but the layer could not take the acknowledgement: this socket gets it
            # directly (unless the local delivery of chat.regroup already gave it).
            self.sent_ids.add(received.message.pk)
            await self._send(events.message_frame(received.message))
        if received.reopened:
            await events.publish(self.conversation_id, await availability.status_frame(self.conversation_id, "bot"))
        if received.claimed is not None:
            answering.enqueue_claimed(received.message, received.claimed)
        else:
            answering.kick(self.conversation_id)

    async def on_ask_person(self, content: dict[str, Any]) -> None:
        """``ask_person``: the widget's "talk to a person" button. The conversation enters the
        agents' queue at once (``chat.handoff.escalate_on_request``): every socket of it gets
        ``status`` ``waiting_agent`` (and the no-agent notice when no one is online). The frame
        carries no field; any other is refused (``invalid``)."""
        assert self.conversation_id is not None
        extra = sorted(set(content) - {"type"})
        if extra:
            raise ProtocolError("invalid", f"ask_person takes no fields (got {', '.join(extra)})")
        await handoff.escalate_on_request(conversation_id=self.conversation_id, locale=self.locale)

    async def on_contact(self, content: dict[str, Any]) -> None:
        """``contact`` ``email``: the shopper leaves an address for a reply (the widget offers it
        while no agent is online). Stored with the conversation; this socket gets
        ``contact.saved``, every socket of the conversation its ``availability`` (now
        ``contact_saved``), every console a ``conversation.update`` with ``contact_email``."""
        assert self.conversation_id is not None
        email = validate_contact(content)
        changed = await database_sync_to_async(services.contact_save)(conversation_id=self.conversation_id, email=email)
        await self._send({"type": "contact.saved", "email": email})
        if changed:
            told = await database_sync_to_async(availability.of_conversation)(self.conversation_id)
            await events.publish(self.conversation_id, {"type": "availability", **told.as_dict()})
            await events.publish_agents(
                {"type": "conversation.update", "conversation": str(self.conversation_id), "contact_email": email}
            )

    async def on_feedback(self, content: dict[str, Any]) -> None:
        assert self.conversation_id is not None
        try:
            await database_sync_to_async(services.feedback_record)(
                conversation_id=self.conversation_id, message_id=content.get("message_id"), rating=content.get("rating")
            )
        except errors.InvalidFeedback as e:
            raise ProtocolError(e.code, e.message) from None

    async def on_csat(self, content: dict[str, Any]) -> None:
        assert self.conversation_id is not None
        try:
            score = await database_sync_to_async(services.csat_record)(
                conversation_id=self.conversation_id, score=content.get("score"), comment=content.get("comment", "")
            )
        except errors.InvalidFeedback as e:
            raise ProtocolError(e.code, e.message) from None
        await self._send({"type": "csat.saved", "score": score})

    # --- group events --------------------------------------------------------------------
    async def chat_frames(self, event: dict[str, Any]) -> None:
        """Several frames of the conversation in one group event (``chat.events.publish_answer``),
        handled in order as if each had come alone."""
        for one in events.frames_of(event):
            await self.chat_frame(one)

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
            if int(event.get("epoch", self.owner_epoch)) < self.owner_epoch:
                return
            have = self.stream_sent.get(frame["id"])
            pos, text = int(event.get("pos", have or 0)), frame["text"]
            if have is None or pos > have:
                # A frame of this stream never reached this socket (its stream.start, or deltas):
                # mend it from the stream buffer before going on.
                if frame["id"] in self.sent_ids or not await self._mend_stream(frame["id"], upto=pos):
                    return
                have = self.stream_sent[frame["id"]]
            if pos + len(text) <= have:
                return
            if pos < have:
                frame = {**frame, "text": text[have - pos :]}
                pos = have
            # pos: code points of the answer before this delta; a widget that sees one it does not
            # expect has missed a delta and asks for a resync.
            frame = {**frame, "pos": pos}
            self.stream_sent[frame["id"]] = pos + len(frame["text"])
        elif kind == "stream.end":
            # An answer of this conversation ended, maybe on another worker: a message of it that
            # this process stored and holds back until then is claimed at once (issue 29).
            if self.conversation_id is not None:
                answering.answer_ended(self.conversation_id)
            if frame["id"] in self.sent_ids:
                return
            if frame["id"] not in self.stream_sent:
                # We never saw its start (joined after the buffer was dropped): send it whole.
                await self._send(
                    {
                        "type": "stream.start",
                        "id": frame["id"],
                        "seq": frame["seq"],
                        "role": "bot",
                        "route": frame["route"],
                    }
                )
            self.stream_sent.pop(frame["id"], None)
            self.sent_ids.add(frame["id"])
        await self._send(frame)
