"""The agent console's WebSocket ``/ws/agent/`` (session authentication; docs/console.md)."""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.utils import translation

from lib import metrics

from .. import answering, assignment, errors, events, presence, selectors, services, staff_text, streams, suggest
from ..models import ConversationStatus, MessageState
from ..protocol import (
    OrderActionFrame,
    OrdersFrame,
    ProtocolError,
    error_frame,
    is_blank,
    parse_uuid,
    validate_cards,
    validate_message_files,
    validate_order_action,
    validate_request_id,
    validate_text,
)
from . import framing
from .base import CLOSE_FORBIDDEN, FrameSocket

log = logging.getLogger(__name__)

NOTE_MAX_CHARS = 4000


class AgentConsumer(FrameSocket):
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
    # What the console lists (agents_frame): the ids of the rows it was sent, and whether it loaded
    # the waiting section to its end (a conversation that starts waiting joins that end).
    listed: set[str]
    waiting_complete = False
    # Whether the console asked for Closed's first page (its tab was opened), and its Mine count.
    closed_loaded = False
    mine = 0
    in_agents_group = False
    # Highest owner epoch seen on a status event of the followed conversation (as the shopper
    # socket keeps it): bot deltas of older epochs still in flight are dropped.
    owner_epoch = 0

    async def connect(self) -> None:
        self.listed = set()
        await self.accept()
        user = self.scope.get("user")
        if not await database_sync_to_async(selectors.user_is_agent)(user):
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.user = user
        self.name = services.agent_display_name(user)
        # The router's words reach this agent in their language (chat.staff_text).
        self.language = staff_text.scope_language(self.scope)
        await database_sync_to_async(presence.lease_open)(agent_id=user.pk, channel_name=self.channel_name)
        team = await database_sync_to_async(assignment.team)()
        await assignment.publish_team(team)  # the others see this agent online (this socket: in ready)
        await self.join(events.AGENTS_GROUP)
        self.in_agents_group = True
        metrics.OPEN_SOCKETS.labels("agent").inc()
        page = settings.KEFU_CONSOLE_PAGE
        canned, (pages, nexts, counts), online = await database_sync_to_async(
            lambda: (
                selectors.canned_replies(owner_id=user.pk),
                selectors.console_first_pages(limit=page, user=user),
                presence.agents_online(),
            )
        )()
        away = any(a["away"] for a in team if a["id"] == user.pk)
        await self._send(
            {
                "type": "ready",
                "agent": self.name,
                "agent_id": user.pk,
                "agents_online": online,
                "heartbeat_s": settings.KEFU_AGENT_HEARTBEAT_S,
                "canned": canned,
                "max_chars": settings.KEFU_MAX_MESSAGE_CHARS,
                "away": away,
                "team": team,
            }
        )
        self.mine = counts.get("mine", 0)
        await self._send_rows({"type": "queue", "counts": counts, "page_size": page}, pages, nexts)
        if not away:
            await assignment.publish(await database_sync_to_async(assignment.auto_assign)())

    async def _send_rows(
        self,
        frame: dict[str, Any],
        pages: list[tuple[str, list[dict[str, Any]]]],
        nexts: dict[str, str | None],
    ) -> None:
        """Send ``frame`` (``queue`` or ``queue.page``) with the rows of ``pages`` (``[(section,
        rows)]``; a row in two sections, e.g. held by this agent: once) in ``conversations`` and
        ``next`` (each section's cursor, None at its end), built to fit the byte budget: rows
        that do not fit are left for the next page (their section's cursor moves back to the last
        row sent). Remembers what the console now lists (``listed``, ``waiting_complete``)."""
        rows: list[dict[str, Any]] = []
        where: dict[str, int] = {}
        placed: list[tuple[str, dict[str, Any], int]] = []  # (section, row, its index in rows)
        for section, page in pages:
            for r in page:
                if r["id"] not in where:
                    where[r["id"]] = len(rows)
                    rows.append(r)
                placed.append((section, r, where[r["id"]]))
        text, count = framing.fit_list({**frame, "next": nexts}, "conversations", rows, keep="head")
        if count < len(rows):
            nexts = dict(nexts)
            for section in {s for s, _, i in placed if i >= count}:
                sent = [r for s, r, i in placed if s == section and i < count]
                # The section's first rows that did not fit: ask again after the last one that did.
                nexts[section] = selectors.section_cursor(section, sent[-1] if sent else None)
            text, count = framing.fit_list({**frame, "next": nexts}, "conversations", rows[:count], keep="head")
        self.listed.update(r["id"] for r in rows[:count])
        if ConversationStatus.WAITING_AGENT in nexts:
            self.waiting_complete = nexts[ConversationStatus.WAITING_AGENT] is None
        await self._send_text(text)

    async def _release(self) -> None:
        # The lease is left to run out (chat.presence): a console that reconnects is not a leave.
        if self.in_agents_group:
            self.in_agents_group = False
            metrics.OPEN_SOCKETS.labels("agent").dec()
            await self.leave(events.AGENTS_GROUP)
        await self._unfollow()

    async def _unfollow(self) -> None:
        if self.following is not None:
            cid, self.following = self.following, None
            await self._collide(cid, "left")
            await self.leave(events.conversation_group(cid))
            await self.leave(events.staff_group(cid))

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
        if content["type"] == "heartbeat":
            await self.on_heartbeat()
            if self.following is not None:  # still looking at it (collision: "viewing" expires)
                await self._collide(self.following, "viewing")
            return
        if content["type"] == "away":
            try:
                await self.on_away(content)
            except ProtocolError as e:
                await self._send(self._error(e.code, e.message, content))
            return
        if content["type"] == "queue.more":
            try:
                await self.on_queue_more(content)
            except ProtocolError as e:
                await self._send(self._error(e.code, e.message, content))
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
        except framing.FrameTooLarge as e:
            log.error("a reply to %s could not be made to fit: %s", content["type"], e)
            await self._send(self._error("too_large", "the reply was too large to send", content))
        except errors.NotFound:
            await self._send(self._error("not_found", "no such conversation", content))
        except errors.NotOwner as e:
            err = self._error(
                "not_owner",
                f"{e.owner} is handling this conversation"
                if e.owner
                else f"take the conversation over first (it is {e.status})",
                content,
            )
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
        if content.get("type") in ("orders", "order.action"):
            # So the console knows which click (or which panel) was refused.
            try:
                frame["request_id"] = validate_request_id(content)
            except ProtocolError:
                pass
            order = content.get("order")
            if isinstance(order, str) and 0 < len(order) <= 32 and order.isprintable():  # no lone surrogate
                frame["order"] = order
        return frame

    async def on_heartbeat(self) -> None:
        """``heartbeat``: the console is still here; its lease runs ``KEFU_AGENT_LEASE_S`` more
        (a new one if it ran out meanwhile). Nothing is sent back."""

        def renew() -> None:
            if not presence.lease_renew(channel_name=self.channel_name):
                presence.lease_open(agent_id=self.user.pk, channel_name=self.channel_name)

        await database_sync_to_async(renew)()

    async def on_queue_more(self, content: dict[str, Any]) -> None:
        """``queue.more``: the next page of one section of the list (``status``), after the row
        the cursor ``after`` names (a ``next`` of ``queue`` or ``queue.page``). Reply to this
        socket only: ``queue.page`` with the rows, the section's next cursor and the counts.
        Errors: ``invalid`` (unknown section, a cursor this server did not make)."""
        status, after = content.get("status"), content.get("after")
        if status not in selectors.CONSOLE_SECTIONS:
            raise ProtocolError("invalid", "status must be one of " + ", ".join(selectors.CONSOLE_SECTIONS))
        if not isinstance(after, str) or not 0 < len(after) <= 200:
            raise ProtocolError("invalid", "after must be a cursor (the 'next' of the last page)")
        page = settings.KEFU_CONSOLE_PAGE

        def load() -> tuple[list[dict[str, Any]], str | None, dict[str, int]]:
            rows, cursor = selectors.console_page(status=status, after=after, limit=page, user=self.user)
            return rows, cursor, selectors.console_counts(self.user)

        try:
            rows, cursor, counts = await database_sync_to_async(load)()
        except selectors.BadCursor as e:
            raise ProtocolError("invalid", f"after: {e}") from None
        self.mine = counts["mine"]
        if status == ConversationStatus.CLOSED:
            self.closed_loaded = True  # a conversation closed from now on goes to the top of its list
        frame = {"type": "queue.page", "status": status, "after": after, "counts": counts}
        await self._send_rows(frame, [(status, rows)], {status: cursor})

    async def on_open(self, cid: uuid.UUID, content: dict[str, Any]) -> None:
        """Follow ``cid``: join its groups first, then send its ``history``: its newest
        ``KEFU_CONSOLE_PAGE`` messages (older ones on ``history.more``). A frame published in
        between reaches the console twice; it drops what it has, by id and stream ``pos``."""
        if self.following != cid:
            await self._unfollow()
            self.following = cid
            self.owner_epoch = 0
            await self.join(events.conversation_group(cid))
            await self.join(events.staff_group(cid))
            await self._collide(cid, "viewing")
        page = await database_sync_to_async(selectors.console_history)(
            conversation_id=cid, before=None, limit=settings.KEFU_CONSOLE_PAGE
        )
        if page is None:
            await self._unfollow()
            raise errors.NotFound(str(cid))
        info = page["conversation"]
        with translation.override(self.language):
            info["packet"] = staff_text.packet_for_staff(info.get("packet"))
        frame = {"type": "history", "conversation": str(cid), "info": info, "notes": page["notes"]}
        await self._send_history(frame, page)

    async def on_history_more(self, cid: uuid.UUID, content: dict[str, Any]) -> None:
        """``history.more``: the ``KEFU_CONSOLE_PAGE`` messages before seq ``before`` (the
        ``before`` of the last ``history`` or ``history.page``). Reply to this socket only:
        ``history.page``; ``more: false`` marks the conversation's first message. Errors:
        ``invalid`` (``before`` not a positive integer), ``not_found``."""
        before = content.get("before")
        if not isinstance(before, int) or isinstance(before, bool) or before <= 0:
            raise ProtocolError("invalid", "before must be a message seq (a positive integer)")
        page = await database_sync_to_async(selectors.console_history)(
            conversation_id=cid, before=before, limit=settings.KEFU_CONSOLE_PAGE
        )
        if page is None:
            raise errors.NotFound(str(cid))
        await self._send_history({"type": "history.page", "conversation": str(cid)}, page)

    async def _send_history(self, frame: dict[str, Any], page: dict[str, Any]) -> None:
        """Send a page of messages (``history`` or ``history.page``) built to fit the byte
        budget: the newest messages of the page are kept, and ``before``/``more`` say where the
        next older page starts. Streaming answers carry their text so far."""
        messages = page["messages"]
        with translation.override(self.language):
            for item in messages:
                if item.get("reason"):
                    item["reason"] = staff_text.reason_text(item["reason"])
        notes = frame.get("notes")
        if notes:
            # Notes are not paged: the newest that fit in a quarter of the budget (each is at most
            # NOTE_MAX_CHARS code points); the transcript page has them all.
            _, count = framing.fit_list({}, "notes", notes, keep="tail", budget=framing.frame_budget() // 4)
            if count < len(notes):
                frame = {**frame, "notes": notes[len(notes) - count :], "notes_trimmed": True}
        for item in messages:
            if item["state"] == MessageState.STREAMING:
                live = await streams.get(item["id"])
                if live is not None:
                    item["text"] = live.text
        full = {**frame, "more": page["more"], "before": page["before"]}
        text, count = framing.fit_list(full, "messages", messages, keep="tail")
        if count < len(messages):
            kept = messages[len(messages) - count :]
            full.update({"more": True, "before": kept[0]["seq"]})
            text, count = framing.fit_list(full, "messages", kept, keep="tail")
        await self._send_text(text)

    async def on_take_over(self, cid: uuid.UUID, content: dict[str, Any]) -> None:
        change = await database_sync_to_async(services.conversation_take_over)(conversation_id=cid, agent=self.user)
        if change.changed:
            await events.publish_owner_change(
                conversation_id=cid, status=change.status, agent=change.agent, epoch=change.epoch
            )
            # A take-over assigns (chat.assignment): every console learns the new assignee.
            await assignment.publish(
                [assignment.Assignment(cid, self.user.pk, self.name, None, self.name, "take_over")]
            )
        elif change.agent_id == self.user.pk:
            await self._send(
                {
                    "type": "conversation.update",
                    "conversation": str(cid),
                    "status": change.status,
                    "agent": change.agent,
                }
            )
        else:
            err = self._error("taken", f"{change.agent} is already handling this conversation", content)
            err["agent"] = change.agent
            await self._send(err)

    async def on_hand_back(self, cid: uuid.UUID, content: dict[str, Any]) -> None:
        back = await database_sync_to_async(services.conversation_hand_back)(conversation_id=cid, agent=self.user)
        await events.publish_owner_change(
            conversation_id=cid, status=back.change.status, agent="", epoch=back.change.epoch
        )
        answering.answer_as_one(messages=back.unanswered, conversation=back.conversation)

    async def on_close(self, cid: uuid.UUID, content: dict[str, Any]) -> None:
        change = await database_sync_to_async(services.conversation_close)(conversation_id=cid, agent=self.user)
        if change.changed:
            await events.publish_owner_change(conversation_id=cid, status=change.status, agent="", epoch=change.epoch)

    async def on_message(self, cid: uuid.UUID, content: dict[str, Any]) -> None:
        """An agent's message. With a ``client_id`` (the console always sends one) it is stored
        once however often it is resent; a resend is acknowledged to this socket only."""
        client_id = content.get("client_id")
        files: list[str] = []
        # Product cards the agent inserted (issue 36): SKUs, made into cards from the catalog here,
        # never taken from the frame; a message of cards alone carries their text too.
        skus = validate_cards(content)
        cards = await database_sync_to_async(selectors.product_cards)(conversation_id=cid, skus=skus) if skus else []
        if cards and is_blank(str(content.get("text", ""))):
            content = {**content, "text": selectors.cards_text(cards)}
        if client_id is not None:
            client_id, text, files = validate_message_files(content, max_chars=settings.KEFU_MAX_MESSAGE_CHARS)
        else:
            text = validate_text(content, max_chars=settings.KEFU_MAX_MESSAGE_CHARS)
        try:
            sent = await database_sync_to_async(services.agent_message_send)(
                conversation_id=cid, agent=self.user, text=text, client_id=client_id, attachments=files, cards=cards
            )
        except errors.AttachmentRefused as e:  # nothing was stored
            raise ProtocolError(e.code, e.message) from None
        if not sent.created:
            await self._send({**events.message_frame(sent.message), "conversation": str(cid)})
            return
        await events.publish(cid, events.message_frame(sent.message))

    async def on_typing(self, cid: uuid.UUID, content: dict[str, Any]) -> None:
        owner = await database_sync_to_async(selectors.conversation_owner)(conversation_id=cid)
        if owner is None:
            raise errors.NotFound(str(cid))
        status, agent_id, agent_name = owner
        if status != "agent" or agent_id != self.user.pk:
            raise errors.NotOwner(owner=agent_name if status == "agent" else "", status=status)
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
            raise errors.NotFound(str(cid))
        await self._send(
            {
                "type": "suggestion",
                "conversation": str(cid),
                "text": draft.text,
                "route": draft.route,
                "for_seq": draft.for_seq,
            }
        )

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
        except errors.NotAgent:
            raise ProtocolError("forbidden", "you are no longer an agent") from None
        except errors.NotFound as e:
            raise ProtocolError("not_found", str(e)) from None
        except errors.NotCached:
            raise ProtocolError("not_cached", "this message was not served from the answer cache") from None
        await self._send(
            {
                "type": "cache.wrong.done",
                "conversation": str(cid),
                "message": result.message_id,
                "evicted": result.evicted,
            }
        )

    async def on_orders(self, cid: uuid.UUID, content: dict[str, Any]) -> None:
        """``orders``: the conversation's shopper's orders (``services.console_orders``: a verified
        customer's recent orders, or those an anonymous shopper proved). Reply to this socket
        only: ``orders``. Errors: ``forbidden``, ``not_found``, ``upstream``, ``not_configured``."""
        try:
            view = await services.console_orders(conversation_id=cid, agent=self.user)
        except errors.NotAgent:
            raise ProtocolError("forbidden", "you are no longer an agent") from None
        except errors.OrderRefused as e:
            raise ProtocolError(e.code, e.message) from None
        frame: OrdersFrame = {
            "type": "orders",
            "conversation": str(cid),
            "orders": view.orders,
            "source": view.source,
        }
        await self._send(frame)

    async def on_order_action(self, cid: uuid.UUID, content: dict[str, Any]) -> None:
        """``order.action``: an action on one order of the conversation's shopper, on their
        behalf (``services.console_order_action``; a change only by the agent holding the
        conversation, once per ``request_id``). Reply to this socket only: ``order.action``; a
        change made now also stores and publishes the shopper's system message. Errors:
        ``invalid``, ``forbidden``, ``not_owner``, ``not_found``, ``not_allowed``, ``upstream``,
        ``not_configured``, each echoing ``request_id`` and ``order``."""
        number, action, request_id, address = validate_order_action(content)
        try:
            done = await services.console_order_action(
                conversation_id=cid,
                agent=self.user,
                number=number,
                action=action,
                request_id=request_id,
                address=address,
            )
        except errors.NotAgent:
            raise ProtocolError("forbidden", "you are no longer an agent") from None
        except errors.OrderRefused as e:
            raise ProtocolError(e.code, e.message) from None
        frame: OrderActionFrame = {
            "type": "order.action",
            "conversation": str(cid),
            "request_id": request_id,
            "ok": True,
            "action": done.action,
            "order": done.order,
            "repeated": done.repeated,
        }
        if done.return_id:
            frame["return_id"] = done.return_id
        await self._send(frame)
        if done.notice is not None:
            await events.publish(cid, events.message_frame(done.notice))

    # --- team work (issue 32: chat.assignment; docs/console.md#assignment) -------------------
    async def on_assign(self, cid: uuid.UUID, content: dict[str, Any]) -> None:
        """``assign``: give the conversation to agent ``agent`` (a user id; ``"me"``: this agent;
        null: Unassigned) with an optional ``note`` (a string, ≤ 1000 code points). Every console
        gets the ``assignment`` frame; a conversation this agent held is transferred (``status``
        frames). Errors: ``invalid``, ``not_agent`` (not an active agent), ``closed``,
        ``not_owner`` (another agent holds it), ``not_found``."""
        to = content.get("agent")
        if to == "me":
            to = self.user.pk
        if to is not None and (not isinstance(to, int) or isinstance(to, bool) or to <= 0):
            raise ProtocolError("invalid", 'agent must be an agent\'s id, "me" or null')
        note = content.get("note", "")
        if not isinstance(note, str) or len(note) > assignment.NOTE_MAX_CHARS or not note.isprintable():
            raise ProtocolError("invalid", f"note must be a line of text of at most {assignment.NOTE_MAX_CHARS}")
        try:
            change = await database_sync_to_async(assignment.conversation_assign)(
                conversation_id=cid, to=to, by=self.user, note=note
            )
        except errors.NotAgent:
            raise ProtocolError("not_agent", "that colleague is not an active agent") from None
        except ValueError:
            raise ProtocolError("closed", "a closed conversation cannot be assigned") from None
        if change is None:
            return
        await assignment.publish([change])
        if change.back is not None:  # transferred: the bot answers what the shopper sent since
            answering.answer_as_one(messages=change.back.unanswered, conversation=change.back.conversation)

    async def on_away(self, content: dict[str, Any]) -> None:
        """``away``: ``{"away": bool}``; away agents get no assignments and no alerts, and the
        conversations assigned to them (not held) are Unassigned. Every console gets ``team``
        (and the ``assignment`` frames). Errors: ``invalid``."""
        away = content.get("away")
        if not isinstance(away, bool):
            raise ProtocolError("invalid", "away must be true or false")
        released = await database_sync_to_async(assignment.agent_away_set)(agent=self.user, away=away)
        await assignment.publish(released)
        await assignment.publish_team()
        if not away:
            await assignment.publish(await database_sync_to_async(assignment.auto_assign)())

    async def on_collide(self, cid: uuid.UUID, content: dict[str, Any]) -> None:
        """``collide``: ``{"what": "typing" | "viewing"}``: this agent types in the conversation
        (a reply or a note), or says again that it is looking at it (to an agent who just opened
        it): the other agents following it get ``collision``. Errors: ``invalid``."""
        what = content.get("what")
        if what not in ("typing", "viewing"):
            raise ProtocolError("invalid", 'what must be "typing" or "viewing"')
        if self.following != cid:
            raise ProtocolError("invalid", "open the conversation first")
        await self._collide(cid, what)

    async def _collide(self, cid: uuid.UUID, what: str) -> None:
        """Tell the other agents following ``cid`` that this agent is ``viewing`` it, ``typing``
        in it, or ``left`` it: a ``collision`` frame, shown for ``ttl_s`` seconds unless renewed."""
        ttl = settings.KEFU_AGENT_HEARTBEAT_S * 3 if what == "viewing" else 6
        await events.publish_staff(
            cid,
            {
                "type": "collision",
                "agent_id": self.user.pk,
                "agent": self.name,
                "channel": self.channel_name[-12:],
                "what": what,
                "ttl_s": ttl,
            },
        )

    HANDLERS = {
        "open": on_open,
        "history.more": on_history_more,
        "take_over": on_take_over,
        "hand_back": on_hand_back,
        "close": on_close,
        "message": on_message,
        "typing": on_typing,
        "note": on_note,
        "suggest": on_suggest,
        "cache.wrong": on_cache_wrong,
        "orders": on_orders,
        "order.action": on_order_action,
        "assign": on_assign,
        "collide": on_collide,
    }

    # --- group events --------------------------------------------------------------------
    async def chat_frames(self, event: dict[str, Any]) -> None:
        """Several frames of the conversation in one group event (``chat.events.publish_answer``),
        handled in order as if each had come alone."""
        for one in events.frames_of(event):
            await self.chat_frame(one)

    async def chat_frame(self, event: dict[str, Any]) -> None:
        """A frame of the followed conversation (as its shopper gets it), with its id."""
        if event.get("conversation") != (str(self.following) if self.following else None):
            return  # an event of a conversation this socket just stopped following
        frame = {**event["frame"], "conversation": event["conversation"]}
        if frame["type"] == "status":
            self.owner_epoch = max(self.owner_epoch, int(event.get("epoch", 0)))
        elif frame["type"] == "stream.delta":
            if int(event.get("epoch", self.owner_epoch)) < self.owner_epoch:
                return  # a bot delta of a stream the owner change ended, still in flight
            frame["pos"] = int(event.get("pos", 0))
        await self._send(frame)

    async def staff_frame(self, event: dict[str, Any]) -> None:
        """Agents only: internal notes, the shopper's typing, the other agents' ``collision``."""
        if event.get("conversation") != (str(self.following) if self.following else None):
            return
        if event["frame"].get("type") == "collision" and event["frame"].get("channel") == self.channel_name[-12:]:
            return  # this socket's own
        await self._send({**event["frame"], "conversation": event["conversation"]})

    async def agents_frame(self, event: dict[str, Any]) -> None:
        """The console list: ``conversation.update`` and ``handoff``, for the rows this console
        lists (docs/console.md#paging). A conversation outside its loaded pages gets no row:

        * entering the waiting section (``handoff``, ``status`` ``waiting_agent``): it goes to the
          end of the waiting list, so its row is sent only when the console loaded that list to
          its end; otherwise a ``queue.counts`` frame (the new counts) goes instead;
        * ``status`` ``agent`` or ``bot``: it goes to the top of its section (most recent first),
          inside the first page: sent, and listed from now on;
        * ``status`` ``closed``: it goes to the top of Closed: sent when the console loaded Closed's
          first page (its tab was opened), else ``queue.counts`` only;
        * a new message of a conversation the console does not list: dropped (nothing it shows
          changes), except the first message of a new conversation (``seq`` 1), which opens the
          bot section's first page.

        Counts that came with the frame get this agent's own ``mine`` (one query: Mine is per
        agent, :func:`chat.selectors.mine_q`)."""
        frame = event["frame"]
        if frame["type"] == "handoff" and frame.get("packet"):
            with translation.override(self.language):
                frame = {**frame, "packet": staff_text.packet_for_staff(frame["packet"])}
        if frame.get("counts") is not None:
            self.mine = await database_sync_to_async(selectors.mine_count)(self.user)
            frame = {**frame, "counts": {**frame["counts"], "mine": self.mine}}
        cid = frame.get("conversation")
        if frame["type"] in ("assignment", "team"):  # every console: the assignee's alert, presence
            if cid is not None:
                self.listed.add(cid)
            await self._send(frame)
            return
        if cid in self.listed:
            await self._send(frame)
            return
        status = frame.get("status")
        if frame["type"] == "handoff" or status == ConversationStatus.WAITING_AGENT:
            show = self.waiting_complete
        elif status in (ConversationStatus.AGENT, ConversationStatus.BOT):
            show = True
        elif status == ConversationStatus.CLOSED:
            show = self.closed_loaded
        elif status is not None:
            show = False
        else:
            last = frame.get("last_message") or {}
            show = last.get("seq") == 1
        if show:
            self.listed.add(cid)
            await self._send(frame)
        elif frame.get("counts") is not None:
            await self._send({"type": "queue.counts", "counts": frame["counts"]})
