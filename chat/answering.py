"""The answering loop: answers a conversation's shopper messages one at a time, in seq order.

``kick(conversation_id)`` is called after a shopper message is stored. One asyncio task per
conversation (per process) drains the unanswered messages; each is claimed with a
compare-and-set (``services.answer_claim``) so that two workers never answer the same message.
A message sent while an answer streams is stored at once and answered after it.

One answer at a time per conversation, across workers (issue 29): a message is claimed only
while no other answer of its conversation is in flight (claimed, or its row streaming), a
condition of the claim's own statement (``services.answer_claim``, ``message_receive``). A
message sent through another worker while an answer streams waits for that answer's end
(``AnswerInFlight``): its loop asks again after 50 ms, doubling to at most 500 ms
(:data:`TURN_WAITS_S`), and at once when this process sees the other answer's ``stream.end``
(its socket of the conversation gets it from the channel layer: :func:`answer_ended`). So its
prompt has the answer before it. When the worker that had the answer in flight is killed, its
lease or claim runs out (``KEFU_ANSWER_LEASE_S``) and a sweep (``chat.sweeper``) finishes it and
answers its question again first; the waiting message is answered after that.

Burst debounce: a shopper who goes on typing (``typing`` frames) after a message whose remote
answer has not shown any text yet is typing the rest of the question. That answer is dropped
(stored empty, cut and ``superseded``; its abandoned call is in the ledger), the loop waits until
neither typing nor a message came for ``KEFU_BURST_PAUSE_S``, at most ``KEFU_BURST_MAX_WAIT_S``
from the first drop, and answers every fragment as one question (the texts joined by line
breaks, replying to the last). A message with no typing after it is answered at once; FAQ and
cache answers show text at once and are never dropped. Typing is seen by the process that
serves the socket, which is the one answering what that socket sent.

The loop runs detached from any socket: a shopper who closes the tab mid-answer still finds the
whole answer stored when they come back.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing

from channels.db import database_sync_to_async
from django.conf import settings

from lib import metrics, sandbox
from lib.text import can_show_language, detect_language
from routing import services as router
from routing.types import AnswerRecord, History, HistoryLoader, Question

from . import errors, events, fencing, handoff, photos, selectors, services, streams, tasks
from .models import Conversation, ConversationStatus, Message
from .notices import notice_frame

log = logging.getLogger(__name__)

_running: dict[uuid.UUID, asyncio.Task[None]] = {}
_pending: set[uuid.UUID] = set()
# Messages claimed by the consumer in the transaction that stored them (see
# ``services.message_receive(claim=True)``), waiting for this process's answering loop.
_claimed: dict[uuid.UUID, list[tuple[Message, Conversation]]] = {}
# Conversations whose answer just stored took the seq right after its question's: no shopper
# message was stored between the claim and the answer, so every later one was either claimed by
# the process that stored it (nothing older waited) or kicked this loop (``_pending``). The loop
# then ends without asking the database for more (``_drain``).
_nothing_between: set[uuid.UUID] = set()


# Conversations whose loop waits for another answer in flight to end (issue 29): set when this
# process sees an answer of the conversation end (answer_ended), which cuts the wait short.
_turn_ended: dict[uuid.UUID, asyncio.Event] = {}

#: The waits between two claims of a message while another answer of its conversation is in
#: flight, seconds: 50 ms doubling to 500 ms, then 500 ms until it ends (issue 29's design: a
#: poll the database bears, the channel-layer wake-up being the fast path).
TURN_WAITS_S = (0.05, 0.1, 0.2, 0.4, 0.5)


def answer_ended(conversation_id: uuid.UUID) -> None:
    """An answer of the conversation ended (its ``stream.end`` was sent or received, in this
    process or through the channel layer from another): a loop of this process waiting for its
    turn asks for its claim at once. Cheap and idempotent (a dict lookup)."""
    event = _turn_ended.get(conversation_id)
    if event is not None:
        event.set()


async def _wait_turn(conversation_id: uuid.UUID, attempt: int) -> bool:
    """Wait before claiming again: :data:`TURN_WAITS_S` ``[attempt]`` (the last one after it),
    or less when :func:`answer_ended` is called meanwhile. True when woken by an answer's end."""
    event = _turn_ended.setdefault(conversation_id, asyncio.Event())
    try:
        await asyncio.wait_for(event.wait(), TURN_WAITS_S[min(attempt, len(TURN_WAITS_S) - 1)])
    except TimeoutError:
        return False
    return True


# Ids of the bot answers this process is streaming now (their rows are ``streaming``).
_streaming: set[int] = set()


class _Burst:
    """What this process saw of one conversation's shopper lately: ``typing_after`` (a typing
    frame since the latest message), ``last_activity`` (monotonic s of the latest typing frame or
    message) and ``typed`` (set by every typing frame)."""

    __slots__ = ("last_activity", "typed", "typing_after")

    def __init__(self) -> None:
        self.typing_after = False
        self.last_activity = time.monotonic()
        self.typed = asyncio.Event()


#: At most this many conversations' typing state per process (least recently active dropped).
BURSTS_KEPT = 10_000
_bursts: OrderedDict[uuid.UUID, _Burst] = OrderedDict()


def _burst(conversation_id: uuid.UUID) -> _Burst:
    b = _bursts.get(conversation_id)
    if b is None:
        b = _bursts[conversation_id] = _Burst()
        while len(_bursts) > BURSTS_KEPT:
            _bursts.popitem(last=False)
    else:
        _bursts.move_to_end(conversation_id)
    return b


def shopper_message(conversation_id: uuid.UUID) -> None:
    """A shopper message of the conversation arrived (before it is stored): typing from now on
    is typing after it."""
    b = _burst(conversation_id)
    b.typing_after = False
    b.typed.clear()
    b.last_activity = time.monotonic()


def shopper_typing(conversation_id: uuid.UUID) -> None:
    """A ``typing`` frame of the conversation's shopper arrived (burst debounce, module docstring)."""
    b = _burst(conversation_id)
    b.typing_after = True
    b.last_activity = time.monotonic()
    b.typed.set()


async def _pause(conversation_id: uuid.UUID, deadline: float) -> None:
    """Return once neither typing nor a message came for ``KEFU_BURST_PAUSE_S``, or at
    ``deadline`` (monotonic s), whichever is first."""
    b = _burst(conversation_id)
    pause = settings.KEFU_BURST_PAUSE_S
    while True:
        now = time.monotonic()
        quiet = now - b.last_activity
        if quiet >= pause or now >= deadline:
            return
        await asyncio.sleep(min(pause - quiet, deadline - now))


class _Superseded(Exception):
    """The shopper went on typing before the answer showed any text (burst debounce)."""


def running() -> set[asyncio.Task[None]]:
    """The answering loops of this process still running (graceful shutdown waits for them)."""
    return {t for t in _running.values() if not t.done()}


def streaming_answers() -> set[int]:
    """Message ids of the bot answers this process is streaming now."""
    return set(_streaming)


def is_idle(conversation_id: uuid.UUID) -> bool:
    """True when no answering loop of this process is working on the conversation."""
    task = _running.get(conversation_id)
    return task is None or task.done()


async def settled(conversation_id: uuid.UUID) -> None:
    """Return once no answering loop of this process works on the conversation (its messages
    stored so far are answered, or failed). Used by a bot test (``chat.sandbox``), which waits
    for each answer before the next turn."""
    while (task := _running.get(conversation_id)) is not None and not task.done():
        await asyncio.wait({task})


def enqueue_claimed(message: Message, conversation: Conversation) -> None:
    """Answer a message already claimed for this process (in order with the others), then drain."""
    _claimed.setdefault(conversation.id, []).append((message, conversation))
    kick(conversation.id)


def answer_as_one(*, messages: Sequence[Message], conversation: Conversation) -> None:
    """Answer ``messages`` (one conversation's shopper messages, oldest first, already past its
    answering claim) as one question after the others waiting: the texts joined by line breaks,
    answered as the last message (its seq, its time; the answer replies to it). Used when an agent
    hands a conversation back with questions nobody answered. Nothing when ``messages`` is empty."""
    if not messages:
        return
    last = messages[-1]
    joined = copy.copy(last)
    joined.text = "\n".join(m.text for m in messages)
    enqueue_claimed(joined, conversation)


def kick(conversation_id: uuid.UUID) -> None:
    """Make sure the conversation's unanswered messages get answered (idempotent, never blocks)."""
    task = _running.get(conversation_id)
    if task is not None and not task.done():
        _pending.add(conversation_id)
        return
    _running[conversation_id] = asyncio.get_running_loop().create_task(_drain(conversation_id))


async def _drain(conversation_id: uuid.UUID) -> None:
    waits = 0  # claims refused in a row because another answer was in flight
    try:
        while True:
            _pending.discard(conversation_id)
            queue = _claimed.get(conversation_id)
            if queue:
                queue.sort(key=lambda item: item[0].seq)
                claimed: tuple[Message, Conversation] | None = queue.pop(0)
                if not queue:
                    del _claimed[conversation_id]
            else:
                turn = _turn_ended.get(conversation_id)
                if turn is not None:
                    turn.clear()  # an end seen from here on wakes the next wait
                try:
                    claimed = await database_sync_to_async(services.answer_claim)(conversation_id=conversation_id)
                except errors.AnswerInFlight:
                    # Another answer of the conversation is in flight (another worker's, or a sweep's
                    # answer again): wait for its end, then ask again (module docstring, issue 29).
                    woken = await _wait_turn(conversation_id, waits)
                    waits = 0 if woken else waits + 1
                    continue
                _turn_ended.pop(conversation_id, None)
                waits = 0
            if claimed is None:
                if conversation_id in _pending or _claimed.get(conversation_id):
                    continue
                return
            message, conversation = claimed
            try:
                await _answer_burst(conversation, message)
                if (
                    conversation_id in _nothing_between
                    and conversation_id not in _pending
                    and not _claimed.get(conversation_id)
                ):
                    return  # nothing can be waiting: see _nothing_between
            except Exception:  # the task edge: log it, tell the shopper, go on with the next message
                log.exception("answering message %s of %s failed", message.seq, conversation_id)
                await events.publish(
                    conversation_id,
                    {
                        "type": "error",
                        "code": "unavailable",
                        "message": "Sorry, something went wrong answering that. Please try again.",
                    },
                )
    finally:
        _nothing_between.discard(conversation_id)
        _turn_ended.pop(conversation_id, None)
        if _running.get(conversation_id) is asyncio.current_task():
            del _running[conversation_id]


async def _answer_burst(conversation: Conversation, message: Message) -> None:
    """Answer ``message``; while the shopper goes on typing before its answer shows text, wait for
    their pause and answer all the fragments as one (module docstring)."""
    fragments = [message]
    deadline: float | None = None
    question = message
    while True:
        may_drop = settings.KEFU_BURST_PAUSE_S > 0 and (deadline is None or time.monotonic() < deadline)
        if not await answer_message(conversation, question, may_drop=may_drop, history_before=fragments[0].seq):
            return
        if deadline is None:
            deadline = time.monotonic() + settings.KEFU_BURST_MAX_WAIT_S
        await _pause(conversation.id, deadline)
        fragments += await database_sync_to_async(services.answer_claim_through)(
            conversation_id=conversation.id, after_seq=fragments[-1].seq
        )
        question = copy.copy(fragments[-1])
        question.text = "\n".join(m.text for m in fragments)


def keep_upstreams_warm() -> None:
    """Keep this process's connections to the remote tiers' upstreams open while no answer uses
    them (``routing.services.router_keep_upstreams_warm``), so a quiet store's next remote answer
    pays no new handshake. Call on the server's event loop (a socket connecting); idempotent."""
    router.router_keep_upstreams_warm()


def prepare(*, text: str, locale: str) -> None:
    """As a shopper message arrives, before it is stored: let the router start classifying it
    (``routing.services.answer_prepare``). ``locale``: the conversation's."""
    router.answer_prepare(text=text, locale=locale)


def question_of(message: Message, conversation: Conversation) -> Question:
    """The router's view of a stored shopper message: plain values only."""
    return Question(
        conversation_id=conversation.id,
        message_id=message.pk,
        seq=message.seq,
        text=message.text,
        locale=conversation.locale,
        customer_id=conversation.customer_id,
        address_key=conversation.address_key,
        session_from_seq=conversation.session_from_seq,
        complaint_at_seq=conversation.complaint_at_seq,
        complaint_kind=conversation.complaint_kind,
        complaint_question=conversation.complaint_question,
    )


def history_loader(conversation_id: uuid.UUID, *, before_seq: int | None = None) -> HistoryLoader:
    """The conversation's history for the router's prompt: its last turns before a seq and its
    rolling summary, in one thread hop (``chat.selectors.prompt_history``). ``before_seq``: never
    later than this seq (a question joined from fragments: the fragments are in its text, not
    in its history)."""

    async def load(*, before_seq: int, turns: int) -> History:
        upto = before_seq if cap is None else min(before_seq, cap)
        rows, past, older = await database_sync_to_async(selectors.prompt_history)(
            conversation_id=conversation_id, before_seq=upto, turns=turns
        )
        last_route = rows[-1].route if rows and rows[-1].role == "bot" else ""
        return History(
            turns=[(m.role, m.text) for m in rows if m.text],
            summary=past,
            older_unsummarised=older,
            last_route=last_route or "",
        )

    cap = before_seq
    return load


#: Waits before the attempts to store an answer's end again after the database failed, seconds.
FINISH_RETRY_S = (0.2, 1.0, 3.0)


async def _finish_row(message_id: int, record: AnswerRecord) -> Message | None:
    """Store the answer's end (``services.bot_message_finish``), trying again after a database
    failure; None when a sweep already finished it as an orphan, or when every attempt failed
    (logged; its lease then runs out and a sweep finishes it)."""
    for wait in (*FINISH_RETRY_S, None):
        try:
            return await database_sync_to_async(services.bot_message_finish)(message_id=message_id, record=record)
        except Exception:
            if wait is None:
                log.exception("storing the end of answer %s failed; its lease will run out", message_id)
                return None
            log.warning("storing the end of answer %s failed; again in %.1f s", message_id, wait, exc_info=True)
            await asyncio.sleep(wait)
    return None


async def _renew_lease(message_id: int, fence: fencing.Fence) -> None:
    """Renew the lease of a streaming answer every third of ``KEFU_ANSWER_LEASE_S`` until
    cancelled. When the row is found no longer streaming (a sweep took it for an orphan: this
    process was too slow to renew), the stream is stopped through its fence."""
    every = settings.KEFU_ANSWER_LEASE_S / 3
    while True:
        await asyncio.sleep(every)
        try:
            alive = await database_sync_to_async(services.answer_lease_renew)(message_id=message_id)
        except Exception:  # a database blip: try again at the next renewal
            log.warning("renewing the lease of answer %s failed", message_id, exc_info=True)
            continue
        if not alive:
            log.warning("answer %s was taken over by a sweep; stopping its stream", message_id)
            fence.broken = True
            return


class _Failed:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = object()


async def coalesced(pieces: AsyncIterator[str]) -> AsyncGenerator[str, None]:
    """The text of ``pieces``, each piece joined with those that arrived while the one before it
    was being sent. A reader task pulls ``pieces`` as fast as they come; every delta sent takes
    all that is waiting. A process that keeps up sends each piece alone, at once (nothing is held
    back to wait for more, unlike Nagle's algorithm); one that falls behind (many streams at once:
    each delta costs a stream-buffer write and a group send) sends fewer, longer deltas instead of
    a growing backlog. Measured in bench/stream_gap.py. An error of ``pieces`` is raised after the
    text that came before it was yielded. Use it under ``aclosing`` before closing ``pieces``:
    closing it cancels the reader first."""
    queue: asyncio.Queue[object] = asyncio.Queue()

    async def read() -> None:
        try:
            async for piece in pieces:
                queue.put_nowait(piece)
        except Exception as e:  # raised to the consumer after the text before it
            queue.put_nowait(_Failed(e))
        else:
            queue.put_nowait(_END)

    reader = asyncio.get_running_loop().create_task(read())
    try:
        while True:
            parts: list[str] = []
            item = await queue.get()
            while isinstance(item, str):
                parts.append(item)
                if queue.empty():
                    item = None
                    break
                item = queue.get_nowait()
            if parts:
                yield "".join(parts)
            if item is _END:
                return
            if isinstance(item, _Failed):
                raise item.error
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)


async def _first_unless_typing(pieces: AsyncIterator[str], burst: _Burst) -> str:
    """The answer's first piece, unless the shopper types before it comes: then the wait for it
    is cancelled (the upstream call is abandoned) and :class:`_Superseded` raised. Raises
    ``StopAsyncIteration`` for an answer with no text."""
    if burst.typing_after:
        raise _Superseded
    first = asyncio.ensure_future(anext(pieces))
    typed = asyncio.ensure_future(burst.typed.wait())
    try:
        await asyncio.wait({first, typed}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        typed.cancel()
        if not first.done():
            first.cancel()
            await asyncio.gather(first, return_exceptions=True)
    if first.cancelled():
        raise _Superseded
    return first.result()


async def answer_message(
    conversation: Conversation, message: Message, *, may_drop: bool = False, history_before: int | None = None
) -> bool:
    """Ask the router who answers ``message``, stream the answer to the conversation and store it.
    ``may_drop``: a remote answer is dropped when the shopper types before its first text
    (burst debounce, module docstring); True is returned then, and the caller waits for their
    pause and asks again with the fragments. ``history_before``: the prompt's history ends
    before this seq (the first fragment of a joined question). False otherwise.

    Frames published, in order: a ``notice`` (``starting``) first when the router is still loading
    (the answer then waits for it), ``stream.start``, ``stream.delta``..., ``stream.end`` (then a
    ``status`` frame for a handoff, or an ``error`` frame when a failure cut the answer).

    Fencing (``chat.fencing``): the answer streams under the owner epoch read when its row was
    created; before every delta the fence is checked, and once an agent took over (or the
    conversation was handed back or closed) nothing more is sent: the answer is stored as cut
    and ends with ``stream.end`` ``cut: true`` (no ``error`` frame, no handoff).
    """
    cid = conversation.id
    _nothing_between.discard(cid)  # set again below by this answer's own row, when it is so
    if conversation.status == ConversationStatus.AGENT:
        # An agent holds the conversation: the bot stays silent, and the message is theirs.
        await database_sync_to_async(services.claim_release)(conversation_id=cid, seq=message.seq)
        return False
    if not router.router_ready():
        # The process is starting: the message is stored and acknowledged; it is answered once
        # the router has its models, never by a half-loaded one. The claim is renewed meanwhile.
        await events.publish(cid, notice_frame("starting", conversation.locale))
        while not router.router_ready():
            try:
                await asyncio.wait_for(router.router_wait_ready(), settings.KEFU_ANSWER_LEASE_S / 3)
            except TimeoutError:
                await database_sync_to_async(services.claim_renew)(conversation_id=cid, seq=message.seq)
    if message.attachments and not message.text.strip():
        # Files alone: never asked of the router (no model sees a file); chat.photos answers.
        return await _answer_files_only(conversation, message)
    # The shopper's language follows what they write: a message that shows its language plainly
    # makes it the conversation's, for the short turns after it ("ok", "y el azul?"). A text too
    # short to show one is not detected here at all; a repeated one is remembered (lib.text).
    if can_show_language(message.text):
        detected = detect_language(message.text, conversation.locale)
        if detected.confident and detected.locale != conversation.locale:
            await database_sync_to_async(services.conversation_locale_set)(conversation_id=cid, locale=detected.locale)
            conversation.locale = detected.locale
    received_at = message.created_at.timestamp()
    answer = await router.answer_open(
        question=question_of(message, conversation), history=history_loader(cid, before_seq=history_before)
    )
    if answer.flags:  # rare (a message that tried to override the instructions): one UPDATE
        await database_sync_to_async(services.message_flags_set)(message_id=message.pk, flags=answer.flags)
    fixed = answer.fixed_text
    if fixed is not None:
        return await _answer_fixed(conversation, message, answer, fixed)
    await asyncio.sleep(0)  # let it send the request before the row write competes for the GIL

    try:
        bot, epoch = await database_sync_to_async(services.bot_message_begin)(
            conversation_id=cid, reply_to_seq=message.seq, route=answer.route, variant=answer.variant
        )
    except errors.AgentHolds:  # taken over since the message was claimed: the bot stays silent
        await answer.close()
        await database_sync_to_async(services.claim_release)(conversation_id=cid, seq=message.seq)
        return False
    except BaseException:
        await answer.close()
        raise
    if bot.seq == message.seq + 1:
        _nothing_between.add(cid)
    # From here on the answer always ends: whatever fails, the row is finished (cut when it is)
    # and stream.end published; if this process dies instead, the lease it renews while streaming
    # runs out and a live process's sweep finishes it (chat.sweeper).
    fence = fencing.watch(cid, epoch)  # released below, after the row is finished
    lease = asyncio.get_running_loop().create_task(_renew_lease(bot.pk, fence))
    _streaming.add(bot.pk)
    parts: list[str] = []
    sent = 0  # code points streamed so far
    ttft_ms: float | None = None
    cut = fenced = dropped = False
    burst = _burst(cid) if may_drop and answer.remote else None
    try:
        await streams.begin(message_id=bot.pk, seq=bot.seq, route=answer.route)
        await events.publish(
            cid, {"type": "stream.start", "id": bot.pk, "seq": bot.seq, "role": "bot", "route": answer.route}
        )

        async def emit(piece: str) -> None:
            """Send one delta; ``pos`` (code points before it) lets a socket that joined mid-stream
            drop what it already has."""
            nonlocal sent, ttft_ms
            fence.check()
            if ttft_ms is None:
                ttft_ms = (time.time() - received_at) * 1000
            if not await streams.append(message_id=bot.pk, text=piece, conversation_id=cid, epoch=epoch):
                fence.broken = True  # another process's take-over came first (chat.streams.append)
            fence.check()  # again: the owner may have changed while the buffer was written
            await events.publish(cid, {"type": "stream.delta", "id": bot.pk, "text": piece}, pos=sent, epoch=epoch)
            parts.append(piece)
            sent += len(piece)

        try:
            async with aclosing(answer.stream()) as pieces:
                if burst is not None:
                    try:
                        await emit(await _first_unless_typing(pieces, burst))
                    except StopAsyncIteration:
                        pass
                async with aclosing(coalesced(pieces)) as merged:
                    async for piece in merged:
                        await emit(piece)
        except _Superseded:
            cut = dropped = True
        except fencing.Fenced:
            cut = fenced = True
        except router.AnswerCut as e:
            log.warning("remote answer to message %s broke after its first token (%s)", message.seq, e.code)
            cut = True
        except Exception:  # not the provider's fault: still end the stream (stored as cut), then report
            log.exception("answer stream of message %s failed", bot.pk)
            cut = True
        finally:
            await answer.close()

        # answer.route is the route that answered: a tier fallback or a handoff after a failure
        # changed it since stream.start, and stream.end is authoritative.
        text, latency_ms = "".join(parts), (time.time() - received_at) * 1000
        record = await _record(answer, text=text, ttft_ms=ttft_ms, latency_ms=latency_ms, cut=cut)
        if dropped:
            stored = await database_sync_to_async(services.bot_message_supersede)(
                message_id=bot.pk, record=record, hold_s=settings.KEFU_BURST_MAX_WAIT_S
            )
        else:
            stored = await _finish_row(bot.pk, record)
    finally:
        _streaming.discard(bot.pk)
        await fencing.release(fence)
        lease.cancel()
        await asyncio.gather(lease, return_exceptions=True)
    if stored is None:
        return False  # a sweep took it for an orphan and answers again, or the database is down (the sweep will)
    bot = stored
    await streams.end(bot.pk)
    await events.publish(cid, events.stream_end_frame(bot))
    answer_ended(cid)
    if dropped:
        return True  # the shopper is typing the rest: the caller answers all the fragments
    if fenced:
        return False  # an agent took over (or the owner changed): the stored cut answer is all
    await _answered(conversation, message, answer, cut=cut)
    return False


async def _record(
    answer: router.Answer, *, text: str, ttft_ms: float | None, latency_ms: float, cut: bool
) -> AnswerRecord:
    """How the answer ended (``Answer.finish``: its cost or saving); when that cannot be worked
    out (logged), a record without them, so the shopper's answer is stored anyway."""
    try:
        record = await answer.finish(text=text, ttft_ms=ttft_ms, latency_ms=latency_ms, cut=cut)
    except Exception:
        log.exception("accounting for an answer (route %s) failed", answer.route)
        record = AnswerRecord(text=text, route=answer.route, ttft_ms=ttft_ms, latency_ms=latency_ms, cut=cut)
    metrics.observe_answer(route=record.route, ttft_ms=record.ttft_ms, latency_ms=record.latency_ms)
    return record


async def _answer_fixed(conversation: Conversation, message: Message, answer: router.Answer, text: str) -> bool:
    """The answer's whole ``text`` is known (FAQ, cache, decline, handoff): store it done in one
    write (``services.bot_message_answered``) and send it as one event (``stream.start``, its
    ~40-code-point deltas, ``stream.end``: ``events.publish_answer``). No streaming row, lease, fence or stream
    buffer: nothing is shown before the row is stored, and a take-over that committed first makes
    the write refuse (the bot stays silent). ``ttft_ms`` and ``latency_ms`` are from the message
    being stored to the moment the text was ready, just before its write. Returns False (no
    burst: a fixed answer is never dropped)."""
    cid = conversation.id
    ready_ms = (time.time() - message.created_at.timestamp()) * 1000
    ttft_ms = ready_ms if text else None
    record = await _record(answer, text=text, ttft_ms=ttft_ms, latency_ms=ready_ms, cut=False)
    try:
        bot, epoch = await database_sync_to_async(services.bot_message_answered)(
            conversation_id=cid, reply_to_seq=message.seq, record=record
        )
    except errors.AgentHolds:  # taken over since the message was claimed: the bot stays silent
        await database_sync_to_async(services.claim_release)(conversation_id=cid, seq=message.seq)
        return False
    if bot.seq == message.seq + 1:
        _nothing_between.add(cid)
    if answer.complaint:
        # "That's not what I asked": the question before it is the conversation's complaint
        # (routing.decide.repeat), stored before the answer is shown so the next question sees it.
        await database_sync_to_async(services.complaint_record)(
            conversation_id=cid, before_seq=message.seq, kind="phrase"
        )
    await events.publish_answer(cid, bot, epoch=epoch)
    answer_ended(cid)
    await _answered(conversation, message, answer, cut=False)
    return False


async def _answer_files_only(conversation: Conversation, message: Message) -> bool:
    """Answer a shopper message that is files with no text (``chat.photos``): acknowledged, and
    handed to a person when the conversation is about an order or a complaint. Stored and sent as
    a fixed answer (``_answer_fixed``'s way); the bot stays silent once an agent holds it.
    Returns False (never a burst to wait for)."""
    cid = conversation.id
    reply = await database_sync_to_async(photos.photo_reply)(conversation=conversation, message=message)
    ready_ms = (time.time() - message.created_at.timestamp()) * 1000
    record = AnswerRecord(
        text=reply.text, route=reply.route, ttft_ms=ready_ms, latency_ms=ready_ms, reason=reply.reason
    )
    try:
        bot, epoch = await database_sync_to_async(services.bot_message_answered)(
            conversation_id=cid, reply_to_seq=message.seq, record=record
        )
    except errors.AgentHolds:
        await database_sync_to_async(services.claim_release)(conversation_id=cid, seq=message.seq)
        return False
    if bot.seq == message.seq + 1:
        _nothing_between.add(cid)
    await events.publish_answer(cid, bot, epoch=epoch)
    answer_ended(cid)
    if reply.handoff:
        await handoff.escalate(
            conversation_id=cid, message=message, route=reply.route, reason=reply.reason, locale=conversation.locale
        )
    return False


async def _answered(conversation: Conversation, message: Message, answer: router.Answer, *, cut: bool) -> None:
    """After an answer's ``stream.end`` went out (not fenced, not dropped): start the summary of
    turns that left the prompt window when the answer's prompt left out turns no summary covers
    (``Answer.summary_due``: a remote answer only; a FAQ, cache or store answer never starts one,
    and checks nothing), tell the shopper when a failure ``cut`` it, else hand it to the router's
    after-work (cache, audit); queue the conversation for an agent when the answer says so
    (``handoff.escalate``)."""
    cid = conversation.id
    # Turns that left the prompt window are folded into the rolling summary, in the background;
    # not a bot test's (lib.sandbox): that work may run in another process, outside its sandbox.
    if answer.summary_due and not sandbox.active():
        try:
            await tasks.maybe_summarise_async(conversation_id=cid)
        except Exception:  # a summary serves later prompts: a failure to start one is logged, never shown
            log.exception("starting the summary of %s failed", cid)
    if cut:
        await events.publish(
            cid, {"type": "error", "code": "unavailable", "message": "The answer was interrupted. Please ask again."}
        )
    else:
        await answer.after_end()
    if answer.queue_for_agent:
        # Queue it with the escalation packet; ``status`` ``waiting_agent`` is sent after every
        # handoff answer, even when the conversation was already waiting.
        await handoff.escalate(
            conversation_id=cid, message=message, route=answer.route, reason=answer.reason, locale=answer.locale
        )
