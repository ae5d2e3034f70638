"""The answering loop: answers a conversation's shopper messages one at a time, in seq order.

``kick(conversation_id)`` is called after a shopper message is stored. One asyncio task per
conversation (per process) drains the unanswered messages; each is claimed with a
compare-and-set (``services.answer_claim``) so that two workers never answer the same message.
A message sent while an answer streams is stored at once and answered after it.

The loop runs detached from any socket: a shopper who closes the tab mid-answer still finds the
whole answer stored when they come back.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from decimal import Decimal

from channels.db import database_sync_to_async

from routing import answers, context, singleflight, strategy
from routing.ledger import CallContext
from routing.providers.base import ProviderError, StreamDone, TextDelta

from . import events, fencing, handoff, services, streams
from .models import Conversation, ConversationStatus, Message

log = logging.getLogger(__name__)

_running: dict[uuid.UUID, asyncio.Task[None]] = {}
_pending: set[uuid.UUID] = set()
# Messages claimed by the consumer in the transaction that stored them (see
# ``services.message_receive(claim=True)``), waiting for this process's answering loop.
_claimed: dict[uuid.UUID, list[tuple[Message, Conversation]]] = {}


def is_idle(conversation_id: uuid.UUID) -> bool:
    """True when no answering loop of this process is working on the conversation."""
    task = _running.get(conversation_id)
    return task is None or task.done()


def enqueue_claimed(message: Message, conversation: Conversation) -> None:
    """Answer a message already claimed for this process (in order with the others), then drain."""
    _claimed.setdefault(conversation.id, []).append((message, conversation))
    kick(conversation.id)


def kick(conversation_id: uuid.UUID) -> None:
    """Make sure the conversation's unanswered messages get answered (idempotent, never blocks)."""
    task = _running.get(conversation_id)
    if task is not None and not task.done():
        _pending.add(conversation_id)
        return
    _running[conversation_id] = asyncio.get_running_loop().create_task(_drain(conversation_id))


async def _drain(conversation_id: uuid.UUID) -> None:
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
                claimed = await database_sync_to_async(services.answer_claim)(conversation_id=conversation_id)
            if claimed is None:
                if conversation_id in _pending or _claimed.get(conversation_id):
                    continue
                return
            message, conversation = claimed
            try:
                await answer_message(conversation, message)
            except Exception:  # the task edge: log it, tell the shopper, go on with the next message
                log.exception("answering message %s of %s failed", message.seq, conversation_id)
                await events.publish(
                    conversation_id,
                    {"type": "error", "code": "unavailable", "message": "Sorry, something went wrong answering that. Please try again."},
                )
    finally:
        if _running.get(conversation_id) is asyncio.current_task():
            del _running[conversation_id]


async def _cache_store(*, message: Message, decision: strategy.Decision, text: str, model: str) -> None:
    """Offer a finished remote answer to the answer cache (its policy refuses personal data,
    follow-ups and the like), keyed on the standalone rewrite of a follow-up when there is one.
    After stream.end: the shopper never waits for it."""
    from cache_layer import services as cache

    try:
        await database_sync_to_async(cache.store)(
            question=decision.cache_question or message.text, answer=text, scope=decision.cache_scope, embedding=decision.cache_vector,
            route=decision.route, model=model, grounded_on=decision.grounded_on,
            prompt_version=strategy.context.SYSTEM_PROMPT_VERSION, cut=False, locale=decision.locale,
        )
    except Exception:  # the cache is an optimisation: a failure to store is logged, not shown
        log.exception("storing answer %s in the cache failed", message.pk)


async def _fixed(text: str) -> AsyncIterator[TextDelta | StreamDone]:
    for piece in answers.chunks(text):
        yield TextDelta(piece)


async def answer_message(conversation: Conversation, message: Message) -> None:
    """Decide who answers ``message``, stream the answer to the conversation and store it.

    Frames published, in order: ``stream.start``, ``stream.delta``..., ``stream.end`` (then a
    ``status`` frame for a handoff, or an ``error`` frame when a failure cut the answer).

    Fencing (``chat.fencing``): the answer streams under the owner epoch read when its row was
    created; before every delta the fence is checked, and once an agent took over (or the
    conversation was handed back or closed) nothing more is sent: the answer is stored as cut
    and ends with ``stream.end`` ``cut: true`` (no ``error`` frame, no handoff).
    """
    if conversation.status == ConversationStatus.AGENT:
        return  # an agent holds the conversation: the bot stays silent
    cid = conversation.id
    received_at = message.created_at.timestamp()
    decision = await strategy.decide(conversation=conversation, message=message)

    source: AsyncIterator[TextDelta | StreamDone]
    first: asyncio.Future[TextDelta | StreamDone] | None = None
    if decision.request is not None and decision.provider is not None:
        # Identical cacheable questions in flight at once share one upstream call (routing.singleflight).
        source = singleflight.open_stream(decision, question=decision.cache_question or message.text,
                                          context=CallContext(conversation_id=cid, message_id=message.pk))
        # Open the upstream request now, while the bot row is written: saves a DB round trip of TTFT.
        first = asyncio.ensure_future(anext(source))
        await asyncio.sleep(0)  # let it send the request before the row write competes for the GIL
    else:
        source = _fixed(decision.text or "")

    try:
        bot, epoch = await database_sync_to_async(services.bot_message_begin)(
            conversation_id=cid, reply_to_seq=message.seq, route=decision.route
        )
    except services.AgentHolds:  # taken over since the message was claimed: the bot stays silent
        if first is not None:
            first.cancel()
        aclose = getattr(source, "aclose", None)
        if aclose is not None:
            await aclose()
        return
    await streams.begin(message_id=bot.pk, seq=bot.seq, route=decision.route)
    await events.publish(cid, {"type": "stream.start", "id": bot.pk, "seq": bot.seq, "role": "bot", "route": decision.route})

    parts: list[str] = []
    sent = 0  # code points streamed so far
    ttft_ms: float | None = None

    async def emit(piece: str) -> None:
        """Send one delta; ``pos`` (code points before it) lets a socket that joined mid-stream
        drop what it already has."""
        nonlocal sent, ttft_ms
        fence.check()
        if ttft_ms is None:
            ttft_ms = (time.time() - received_at) * 1000
        await streams.append(message_id=bot.pk, text=piece)
        fence.check()  # again: the owner may have changed while the buffer was written
        await events.publish(cid, {"type": "stream.delta", "id": bot.pk, "text": piece}, pos=sent, epoch=epoch)
        parts.append(piece)
        sent += len(piece)

    fence = fencing.watch(cid, epoch)  # released below, after the last possible delta
    done: StreamDone | None = None
    failure: ProviderError | None = None
    crashed = False
    fenced = False
    try:
        while True:
            try:
                item = await first if first is not None else await anext(source)
            except StopAsyncIteration:
                break
            first = None
            if isinstance(item, StreamDone):
                done = item
                continue
            if item.text:
                await emit(item.text)
    except fencing.Fenced:
        fenced = True
    except ProviderError as e:
        failure = e
        log.warning("remote model failed (%s, %s): %s", decision.route, e.code, e)
    except Exception:  # not the provider's fault: still end the stream (stored as cut), then report
        log.exception("answer stream of message %s failed", bot.pk)
        crashed = True
    finally:
        if first is not None:
            first.cancel()
        aclose = getattr(source, "aclose", None)
        if aclose is not None:
            await aclose()

    cut = crashed or fenced
    if failure is not None and not parts and not fenced:
        # Nothing reached the shopper yet: fall back to a polite handoff, streamed like any answer.
        decision = strategy.handoff_decision(locale=decision.locale, reason=f"remote model failed: {failure.code}")
        try:
            for piece in answers.chunks(decision.text or ""):
                await emit(piece)
        except fencing.Fenced:
            fenced = cut = True
    elif failure is not None:
        cut = True
    await fencing.release(fence)

    # decision.route is the route that answered: a tier fallback (routing.resilience) or the
    # handoff above changed it since stream.start, and stream.end is authoritative.
    route, text = decision.route, "".join(parts)
    record_args = dict(decision=decision, route=route, text=text, done=done, ttft_ms=ttft_ms,
                       latency_ms=(time.time() - received_at) * 1000, cut=cut)
    if route.startswith("llm.") and done is None:
        # No usage from the upstream: tokens are counted, and the tokenizer's first load takes
        # seconds, so not on the event loop.
        record = await asyncio.to_thread(strategy.answer_record, **record_args)
    else:
        record = strategy.answer_record(**record_args)
    if route.startswith("llm.") and singleflight.is_follower(source):
        # Another question's upstream call answered this one: no tokens or cost of its own; the
        # cost of that call is what this answer saved (routing.singleflight).
        record = replace(record, prompt_tokens=0, completion_tokens=0, cost_usd=Decimal("0"), saved_usd=record.cost_usd)
    bot = await database_sync_to_async(services.bot_message_finish)(message_id=bot.pk, record=record)
    await streams.end(bot.pk)
    await events.publish(cid, events.stream_end_frame(bot))
    if fenced:
        return  # an agent took over (or the owner changed): the stored cut answer is all
    # Turns that left the prompt window are folded into the rolling summary, in the background.
    try:
        await context.maybe_summarise_async(conversation_id=cid)
    except Exception:  # a summary serves later prompts: a failure to start one is logged, never shown
        log.exception("starting the summary of %s failed", cid)
    if cut:
        await events.publish(cid, {"type": "error", "code": "unavailable", "message": "The answer was interrupted. Please ask again."})
    elif route.startswith("llm.") and decision.cache_scope and text:
        await _cache_store(message=message, decision=decision, text=text, model=bot.model)
    elif route == "cache.semantic" and decision.cache_entry_id is not None:
        # A sampled share of semantic hits is re-answered in the background and compared: the
        # measured false-hit rate per intent (cache_layer.audit). Never waited for.
        from cache_layer import audit

        try:
            await audit.maybe_audit_async(entry_id=decision.cache_entry_id,
                                          question=decision.cache_question or message.text, message_id=message.pk)
        except Exception:  # an audit is a measurement: a failure is logged, never shown
            log.exception("sampling cache hit %s for audit failed", decision.cache_entry_id)
    if route == "handoff" or decision.queue_for_agent:
        # Queue it with the escalation packet; ``status`` ``waiting_agent`` is sent after every
        # handoff answer, even when the conversation was already waiting.
        await handoff.escalate(conversation_id=cid, message=message, route=route, reason=decision.reason, locale=decision.locale)
